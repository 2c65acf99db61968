"""Quality on the whole Philly trace with the seeded generator: every policy, the same table of figures.

data/traces/philly.csv from its dense start (2017-09-24) to its end, 82,178 jobs with the artifact's
families, sizes, batches, GPU counts and types drawn with seed 1, the measured arena table as the
oracle, the fair rules (every start and change of GPUs costs 260 s), 5-minute rounds until every job
is done. One tessera-sim process per policy (`--jobs` at a time), then the comparison of `crius`
against each, both ways of averaging JCT (finished jobs; the artifact's padding of unfinished jobs
with the largest JCT seen), as `tessera-sim` computes it for policies run together.

    .venv/bin/python bench/sim_philly_full.py [--jobs 2] [--policies ...] [--hours 2400] [--out DIR]

A policy whose DIR/<policy>/metrics.json exists is not run again (`--fresh` to rerun). Writes
bench/results/sim_philly_full.json and prints the table.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tessera.controller.sim.metrics import compare_lists

POLICIES = "crius,gavel,elasticflow-l,gandiva,sia,fcfs"


def command(policy: str, hours: float, out: Path) -> list[str]:
    return [sys.executable, "-m", "tessera.controller.sim.cli", "--trace", "philly", "--cluster", "crius-1280",
            "--oracle", "arena", "--rules", "fair", "--policies", policy, "--hours", f"{hours:g}", "--seed", "1",
            "--until-done", "--out", str(out), "--no-plots", "--quiet"]


def run_one(policy: str, hours: float, out: Path, fresh: bool) -> dict[str, Any]:
    done = out / "metrics.json"
    wall_path = out / "wall_seconds.json"
    if done.exists() and not fresh:
        wall = json.loads(wall_path.read_text())["seconds"] if wall_path.exists() else None
        return {"policy": policy, "seconds": wall, "reused": True}
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cp = subprocess.run(command(policy, hours, out), check=False, cwd=REPO, capture_output=True, text=True)
    secs = time.perf_counter() - t0
    if cp.returncode != 0:
        raise SystemExit(f"{policy}: tessera-sim exited {cp.returncode}:\n{cp.stderr[-3000:]}")
    wall_path.write_text(json.dumps({"seconds": round(secs, 1)}))
    return {"policy": policy, "seconds": round(secs, 1), "reused": False}


def jcts(jobs_csv: Path) -> list[float]:
    with jobs_csv.open(newline="") as f:
        return [float(r["jct_s"]) for r in csv.DictReader(f) if r["state"] == "done" and r["jct_s"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--hours", type=float, default=2400.0, help="trace window from its dense start (default: all)")
    ap.add_argument("--jobs", type=int, default=2, help="policies simulated at once (one process each)")
    ap.add_argument("--out", default=str(Path("/tmp") / "sim_philly_full"))
    ap.add_argument("--fresh", action="store_true", help="rerun policies whose results exist")
    args = ap.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    base = Path(args.out)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        runs = list(pool.map(lambda p: run_one(p, args.hours, base / p, args.fresh), policies))
    summaries: dict[str, dict[str, Any]] = {}
    timings: dict[str, dict[str, Any]] = {}
    lists: dict[str, list[float]] = {}
    config: dict[str, Any] = {}
    for p in policies:
        doc = json.loads((base / p / "metrics.json").read_text())
        config = doc["config"]
        summaries[p] = doc["policies"][p]
        timings[p] = json.loads((base / p / "timing.json").read_text())[p]
        lists[p] = jcts(base / p / p.replace("@", "_") / "jobs.csv")
    ref = "crius" if "crius" in policies else policies[0]
    comp = compare_lists(lists, summaries, ref)
    result = {"benchmark": "sim_philly_full", "command": " ".join(command("<policy>", args.hours, base / "<policy>")),
              "config": {**config, "policies": policies}, "runs": runs, "policies": summaries, "round_seconds": timings, "comparison": comp}
    path = REPO / "bench" / "results" / "sim_philly_full.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")

    head = ("policy", "finished", "JCT avg", "JCT p50", "JCT p99", "queue avg", "thr avg", "thr peak",
            "makespan h", "restarts/job", "s/round avg", "s/round p99", "wall s")
    rows = [head]
    for r in runs:
        s = summaries[r["policy"]]
        rows.append((r["policy"], f"{s['jobs_finished']}/{s['jobs_submitted']}", f"{s['jct_avg_s']:,.0f}",
                     f"{s['jct_median_s']:,.0f}", f"{s['jct_p99_s']:,.0f}", f"{s['queue_avg_s']:,.0f}",
                     f"{s['throughput_avg']:,.0f}", f"{s['throughput_peak']:,.0f}", f"{s['makespan_s'] / 3600:,.0f}",
                     f"{s['restarts_per_job']:.2f}", f"{timings[r['policy']]['round_s_avg']:.4f}",
                     f"{timings[r['policy']]['round_s_p99']:.4f}",
                     "-" if r["seconds"] is None else f"{r['seconds']:,.0f}"))
    w = [max(len(row[i]) for row in rows) for i in range(len(head))]
    print(f"== Philly, seeded generator (seed 1), {config.get('jobs_in_trace')} jobs, fair rules ==")
    print("\n".join("  ".join(c.rjust(w[i]) for i, c in enumerate(row)) for row in rows))
    print(f"\n{ref} against each policy:")
    for k, c in comp.items():
        if isinstance(c, dict):
            print(f"  vs {k:<14} JCT {100 * c['jct_reduction_finished']:6.1f}% (finished jobs), "
                  f"{100 * c['jct_reduction_padded']:6.1f}% (artifact padding); throughput {c['throughput_ratio']:.2f}x")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
