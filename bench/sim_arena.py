"""Quality figures side by side with the Crius artifact's own simulator, on its own inputs.

Runs tessera-sim on data/arena (trace_philly.csv, cluster_1280.json, iter_time_optimal.json) under
the artifact's rules for 500 and 2,000 rounds, then under the fair rules, and on Philly with the
seeded generator; prints each table beside the artifact's published numbers (issue 4) with both
ways of averaging JCT. Writes each run's metrics to bench/results/sim_arena.json.

    .venv/bin/python bench/sim_arena.py [--rounds 500,2000] [--fair] [--philly-hours 24] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from tessera.controller.sim import cli

# The artifact's simulator, 500 rounds on a 2-core CPU machine (issue 4): finished, average JCT
# over finished jobs, average cluster throughput, peak.
PUBLISHED_500 = {
    "crius": (222, 17551, 4704, 10994),
    "fcfs": (123, 22205, 2742, None),
    "elasticflow-l": (138, 21863, 2703, None),
    "gavel": (159, 22904, 3343, None),
}
PUBLISHED_500_RATIOS = {"fcfs": (0.769, 1.72), "elasticflow-l": (0.741, 1.74), "gavel": (0.692, 1.41)}
PUBLISHED_2000 = {"fcfs": (590, 83192), "elasticflow-l": (565, 60220), "gavel": (608, 56276)}
# The paper (arXiv): JCT reduction of crius; the artifact README in brackets.
PAPER_2000 = {"fcfs": "81.3%", "gandiva": "80.1%", "elasticflow-l": "75.8% (README 80.5%)",
              "gavel": "66.4% (README 76.6%)", "sia": "(README 75.2%)"}
POLICIES = "crius,crius@artifact,fcfs,elasticflow-l,gavel,gandiva,sia"


def run(out: Path, *argv: str) -> tuple[dict[str, Any], float]:
    t0 = time.perf_counter()
    args = cli.build_parser().parse_args([*argv, "--out", str(out), "--quiet"])
    doc = cli.run(args)
    return doc, time.perf_counter() - t0


def fmt(x: float | None, nd: int = 0) -> str:
    if x is None:
        return "-"
    return f"{x:,.{nd}f}"


def table(doc: dict[str, Any], published: dict[str, tuple[Any, ...]] | None, rounds: int) -> str:
    pol = doc["policies"]
    comp = doc["comparison"]
    tim = doc["timing"]
    head = ["policy", "finished", "JCT avg (fin.)", "JCT p50", "JCT p99", "queue avg", "thr avg", "thr busy",
            "thr peak", "restarts/job", "s/round", "| artifact: fin.", "JCT", "thr", "peak"]
    rows = [head]
    for label, s in pol.items():
        pub = (published or {}).get(label) if "@" not in label else None
        rows.append([label, str(s["jobs_finished"]), fmt(s["jct_avg_s"]), fmt(s["jct_median_s"]), fmt(s["jct_p99_s"]),
                     fmt(s["queue_avg_s"]), fmt(s["throughput_avg"]), fmt(s["throughput_avg_busy"]),
                     fmt(s["throughput_peak"]), f"{s['restarts_per_job']:.2f}", f"{tim[label]['round_s_avg']:.4f}",
                     "| " + (str(pub[0]) if pub else "-"), fmt(pub[1]) if pub else "-",
                     fmt(pub[2]) if pub and len(pub) > 2 else "-", fmt(pub[3]) if pub and len(pub) > 3 else "-"])
    w = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w[i]) for i, c in enumerate(r)) for r in rows]
    ref = comp.get("reference")
    lines.append("")
    lines.append(f"{ref} against each policy (JCT reduction; throughput ratio):")
    for k, c in comp.items():
        if not isinstance(c, dict):
            continue
        pub = PUBLISHED_500_RATIOS.get(k) if rounds == 500 else None
        paper = PAPER_2000.get(k) if rounds == 2000 else None
        extra = f"   artifact: {100 * pub[0]:.1f}% / {pub[1]:.2f}x" if pub else ""
        if paper:
            extra = f"   paper: {paper}"
        lines.append(f"  vs {k:<15} finished-jobs avg {100 * c['jct_reduction_finished']:6.1f}%   "
                     f"artifact padding {100 * c['jct_reduction_padded']:6.1f}%   "
                     f"throughput {c['throughput_ratio']:.2f}x (busy rounds: {c['throughput_ratio_busy']:.2f}x), "
                     f"peak {c['peak_ratio']:.2f}x{extra}")
    lines.append(f"thr busy: the average over busy rounds ({doc.get('busy_rounds_are', '?')})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", default="500,2000")
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--fair", action="store_true", help="also the fair rules (2,000 rounds)")
    ap.add_argument("--philly-hours", type=float, default=0.0, help="also Philly with the seeded generator")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    base = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="sim_arena-"))
    results: dict[str, Any] = {"benchmark": "sim_arena", "published_500": PUBLISHED_500,
                               "published_2000": PUBLISHED_2000, "runs": {}}
    common = ["--trace", "arena-philly", "--cluster", "crius-1280", "--oracle", "arena", "--no-plots",
              "--policies", args.policies]
    for r in [int(x) for x in args.rounds.split(",") if x]:
        doc, secs = run(base / f"arena-{r}", *common, "--rules", "arena", "--rounds", str(r))
        print(f"== Crius artifact inputs and rules, {r} rounds ({secs:.0f} s) ==")
        print(table(doc, PUBLISHED_500 if r == 500 else
                    ({k: v for k, v in PUBLISHED_2000.items()} if r == 2000 else None), r))
        print()
        (base / f"arena-{r}.json").write_text(json.dumps(doc, indent=1, sort_keys=True))
        results["runs"][f"arena-{r}"] = {"seconds": round(secs, 1), **doc}
    if args.fair:
        doc, secs = run(base / "fair-2000", *common, "--rules", "fair", "--rounds", "2000")
        print(f"== Crius artifact inputs, fair rules (every restart costs 260 s), 2000 rounds ({secs:.0f} s) ==")
        print(table(doc, None, 0))
        print()
        results["runs"]["fair-2000"] = {"seconds": round(secs, 1), **doc}
    if args.philly_hours:
        doc, secs = run(base / "philly", "--trace", "philly", "--cluster", "crius-1280", "--oracle", "arena",
                        "--rules", "fair", "--hours", str(args.philly_hours), "--seed", "1", "--no-plots",
                        "--policies", args.policies)
        print(f"== Philly, seeded generator (seed 1), {args.philly_hours:g} h, fair rules ({secs:.0f} s) ==")
        print(table(doc, None, 0))
        results["runs"][f"philly-{args.philly_hours:g}h"] = {"seconds": round(secs, 1), **doc}
    path = Path(__file__).resolve().parent / "results" / "sim_arena.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(f"\noutputs under {base}; wrote {path}")


if __name__ == "__main__":
    main()
