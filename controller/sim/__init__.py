"""The trace simulator: same plan_round, simulated clock, nodes and throughput oracles (docs/simulator.md)."""
