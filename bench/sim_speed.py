"""Simulator speed: a week of the Philly trace (seeded generator, seed 1) on the 1,280-GPU cluster
with 5-minute rounds (2,016 rounds), one policy at a time. Prints wall and CPU time per policy.

    .venv/bin/python bench/sim_speed.py [--policies crius,fcfs] [--hours 168] [--rules fair]

Target (issue 4): under 5 minutes on a 2-core machine. Writes bench/results/sim_speed.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from tessera.controller.sim import cli


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policies", default="crius")
    ap.add_argument("--hours", type=float, default=168.0)
    ap.add_argument("--rules", default="fair", choices=["fair", "arena"])
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rounds = int(args.hours * 3600 / 300)
    base = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="sim_speed-"))
    print(f"Philly, {args.hours:g} h, seed 1, crius-1280, {args.rules} rules, {rounds} rounds of 300 s")
    print(f"{'policy':<16} {'wall s':>8} {'cpu s':>8} {'jobs':>6} {'finished':>9} {'s/round avg':>12} "
          f"{'s/round p99':>12} {'s/round max':>12}")
    rows = []
    for p in [x for x in args.policies.split(",") if x]:
        w0, c0 = time.perf_counter(), time.process_time()
        a = cli.build_parser().parse_args(["--trace", "philly", "--cluster", "crius-1280", "--oracle", "arena",
                                           "--rules", args.rules, "--hours", str(args.hours), "--seed", "1",
                                           "--rounds", str(rounds), "--policies", p, "--no-plots", "--quiet",
                                           "--out", str(base / p.replace("@", "_"))])
        doc = cli.run(a)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        s = doc["policies"][p]
        t = doc["timing"][p]
        print(f"{p:<16} {wall:>8.1f} {cpu:>8.1f} {s['jobs_submitted']:>6} {s['jobs_finished']:>9} "
              f"{t['round_s_avg']:>12.4f} {t['round_s_p99']:>12.4f} {t['round_s_max']:>12.4f}")
        rows.append({"policy": p, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
                     "jobs": s["jobs_submitted"], "finished": s["jobs_finished"], **t})
    path = Path(__file__).resolve().parent / "results" / "sim_speed.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": "sim_speed", "hours": args.hours, "rounds": rounds,
                                "rules": args.rules, "target_s": 300, "policies": rows}, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
