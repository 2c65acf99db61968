"""Tenants and guarantees in replay: every policy on Morphling's MT trace (tenant A, 64 x A800 of quota,
guaranteed; tenant B best-effort) beside the same jobs without tenants (morphling-base), on the
Morphling cluster and rules. Prints per policy the finished jobs, average JCT (all, guaranteed,
best-effort), restarts, suspensions and sla_violations (docs/tenants.md), and writes them to
bench/results/sim_tenants.json.

    .venv/bin/python bench/sim_tenants.py [--policies crius,fcfs,...] [--out DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from benchio import write_result

from tessera.controller.sim import cli

POLICIES = "crius,fcfs,sia,gavel,gandiva,elasticflow-l,frenzy"
KEYS = ("jobs_finished", "jobs_submitted", "jct_avg_s", "jct_avg_guaranteed_s", "jct_avg_best_effort_s",
        "makespan_s", "restarts_per_job", "suspensions", "guaranteed_jobs", "sla_violations")


def run(trace: str, policies: str, out: Path) -> tuple[dict[str, Any], float]:
    t0 = time.perf_counter()
    args = cli.build_parser().parse_args(["--trace", trace, "--cluster", "morphling-64", "--rules", "morphling",
                                          "--policies", policies, "--no-plots", "--quiet", "--out", str(out)])
    return cli.run(args), time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--policies", default=POLICIES)
    p.add_argument("--out", default=str(Path(__file__).with_name("results")))
    a = p.parse_args()
    result: dict[str, Any] = {"policies": a.policies, "traces": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for trace in ("morphling-mt", "morphling-base"):
            doc, secs = run(trace, a.policies, Path(tmp) / trace)
            result["traces"][trace] = {"seconds": round(secs, 1),
                                       "policies": {k: {x: s[x] for x in KEYS} for k, s in doc["policies"].items()}}
    head = ("policy", "trace", "finished", "JCT avg", "JCT guar.", "JCT BE", "makespan", "restarts", "suspended",
            "SLA viol")
    rows = [head]
    for label in result["traces"]["morphling-mt"]["policies"]:
        for trace in ("morphling-mt", "morphling-base"):
            s = result["traces"][trace]["policies"][label]
            rows.append((label, trace[10:], f"{s['jobs_finished']}/{s['jobs_submitted']}", f"{s['jct_avg_s']:,.0f}",
                         f"{s['jct_avg_guaranteed_s']:,.0f}", f"{s['jct_avg_best_effort_s']:,.0f}",
                         f"{s['makespan_s']:,.0f}", f"{s['restarts_per_job']:.2f}", str(s["suspensions"]),
                         f"{s['sla_violations']}/{s['guaranteed_jobs']}"))
    w = [max(len(r[i]) for r in rows) for i in range(len(head))]
    print("\n".join("  ".join(c.rjust(w[i]) for i, c in enumerate(r)) for r in rows))
    write_result(a.out, "sim_tenants.json", result, show=False)


if __name__ == "__main__":
    main()
