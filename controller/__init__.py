"""The Tessera controller: durable state, scheduling rounds, node registry, agent calls."""
