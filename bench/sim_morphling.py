"""Morphling's replay: its own 406-job workloads on its 8 x 8 A800 cluster with its measured
placements as the oracle, under its artifact's rules (60 s rounds, 260 s per placement change),
for the morphling policy and the other policies, beside the Morphling artifact's own figures on the
same files (issue 15: base 3,638 s average JCT and 58,680 s makespan; mt 4,017 s and 60,780 s; the
target is 0.8 x the artifact's average JCT: 2,910 s and 3,214 s).

Prints per trace and policy: finished jobs, average JCT, makespan, queueing, restarts, and
`sla_violations` where the simulator reports it (guaranteed jobs that fell behind their promise at
any round; the mt trace's tenants come from the simulator) over the guaranteed jobs admitted within
their tenant's quota (docs/tenants.md: a job's SLA clock starts at its admission, so a policy that
admitted few would look good on violations alone). Writes bench/results/sim_morphling.json.

    .venv/bin/python bench/sim_morphling.py [--traces base,bp,mt] [--policies morphling,crius,...] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchio import write_result

from tessera.controller.sim import cli

# The Morphling artifact's simulator on the same files (issue 15): average JCT, makespan (s).
ARTIFACT = {"base": (3638.0, 58680.0), "mt": (4017.0, 60780.0)}
TARGET_FACTOR = 0.8
POLICIES = "morphling,crius,fcfs,gavel,sia,frenzy"


def run_trace(trace: str, policies: str, out: Path) -> tuple[dict[str, Any], float]:
    t0 = time.perf_counter()
    args = cli.build_parser().parse_args(["--trace", f"morphling-{trace}", "--cluster", "morphling-64",
                                          "--rules", "morphling", "--policies", policies, "--out", str(out),
                                          "--quiet", "--no-plots"])
    doc = cli.run(args)
    return doc, time.perf_counter() - t0


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def table(trace: str, doc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    art = ARTIFACT.get(trace)
    head = ["policy", "finished", "JCT avg", "makespan", "queue avg", "restarts/job", "sla_viol/admitted",
            "| artifact JCT", "makespan", "target JCT"]
    rows = [head]
    figures: dict[str, Any] = {}
    for label, s in doc["policies"].items():
        viol = s.get("sla_violations")
        figures[label] = {"finished": s["jobs_finished"], "submitted": s["jobs_submitted"],
                          "jct_avg_s": s["jct_avg_s"], "makespan_s": s["makespan_s"],
                          "queue_avg_s": s["queue_avg_s"], "restarts_per_job": s["restarts_per_job"],
                          "sla_violations": viol, "guaranteed_admitted": s.get("guaranteed_jobs")}
        rows.append([label, f"{s['jobs_finished']}/{s['jobs_submitted']}", fmt(s["jct_avg_s"]), fmt(s["makespan_s"]),
                     fmt(s["queue_avg_s"]), f"{s['restarts_per_job']:.2f}", "n/a" if viol is None else f"{viol}/{s.get('guaranteed_jobs', '?')}",
                     "| " + fmt(art[0] if art else None), fmt(art[1] if art else None),
                     fmt(TARGET_FACTOR * art[0] if art else None)])
    w = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [f"== morphling-{trace}"] + ["  ".join(c.rjust(w[i]) for i, c in enumerate(r)) for r in rows]
    m = figures.get("morphling")
    if m and art:
        ok = m["finished"] == m["submitted"] and m["jct_avg_s"] <= TARGET_FACTOR * art[0]
        lines.append(f"morphling: JCT {m['jct_avg_s']:,.0f} s vs target {TARGET_FACTOR * art[0]:,.0f} s "
                     f"({'met' if ok else 'NOT met'}); makespan {m['makespan_s']:,.0f} s vs the artifact's {art[1]:,.0f} s")
    return "\n".join(lines), figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", default="base,bp,mt")
    p.add_argument("--policies", default=POLICIES)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    a = p.parse_args(argv)
    result: dict[str, Any] = {"artifact": {k: {"jct_avg_s": v[0], "makespan_s": v[1]} for k, v in ARTIFACT.items()},
                              "target_factor": TARGET_FACTOR, "policies": a.policies, "traces": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for trace in [t.strip() for t in a.traces.split(",") if t.strip()]:
            doc, secs = run_trace(trace, a.policies, Path(tmp) / trace)
            text, figures = table(trace, doc)
            print(text)
            print(f"({secs:.0f} s)\n", flush=True)
            result["traces"][trace] = {"policies": figures, "seconds": round(secs, 1)}
    write_result(a.out, "sim_morphling.json", result, show=False)
    print(f"wrote {Path(a.out) / 'sim_morphling.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
