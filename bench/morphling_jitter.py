"""How much the morphling policy's figures on the Morphling workloads owe to the exact arrival times:
each trace is replayed as it is and with every arrival moved by a seeded uniform draw in +-W seconds
(default 300 s, one round of the `morphling` rules, so a job lands at most one 300 s arrival chunk
away), on the same 8 x 8 A800 cluster, oracle and rules as bench/sim_morphling.py.

The policy's options were tuned on the exact traces (docs/scheduler-morphling.md); the jittered
ones are workloads of the same mix and load that nothing was tuned on. Per run: average JCT,
makespan, `sla_violations`, and the makespan over the fluid lower bound of that very workload (the
per-round guarantee bound on mt; bench/morphling_bounds.py); then per trace the exact run beside
the jittered runs' mean, min and max, and the issue's targets (the artifact's figures on the exact
files; JCT x 0.8). `--set NAME=VALUE` replays with a `MorphlingOptions` field changed, to compare
options on the mean rather than on one lucky trace. Writes bench/results/morphling_jitter.json.

    .venv/bin/python bench/morphling_jitter.py [--seeds 6] [--width 300] [--set grow_factor=2] [--workers 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from benchio import write_result
from morphling_bounds import ARTIFACT, replay

from tessera.controller.core.policies.morphling import MorphlingOptions, MorphlingPolicy
from tessera.controller.core.policies.morphling_curves import MorphlingInputError
from tessera.controller.sim.metrics import summarize
from tessera.controller.sim.traces import TraceJob


def jitter(jobs: Sequence[TraceJob], seed: int, width: float) -> list[TraceJob]:
    """Every job's submission moved by a uniform draw in [-width, width] (never before 0), in
    submission order again (the simulator starts its clock at the first one)."""
    rng = random.Random(seed)
    out = [dataclasses.replace(j, submit_time=max(0.0, j.submit_time + rng.uniform(-width, width))) for j in jobs]
    out.sort(key=lambda j: j.submit_time)
    return out


def options(sets: Sequence[str]) -> dict[str, float]:
    """`NAME=VALUE` pairs as MorphlingOptions fields (checked by the options themselves)."""
    names = {f.name for f in dataclasses.fields(MorphlingOptions)}
    out: dict[str, float] = {}
    for s in sets:
        name, sep, value = s.partition("=")
        if not sep or name not in names:
            raise SystemExit(f"--set {s!r}: want NAME=VALUE with NAME one of {', '.join(sorted(names))}")
        try:
            out[name] = float(value)
        except ValueError:
            raise SystemExit(f"--set {s!r}: {value!r} is not a number") from None
    try:
        MorphlingOptions(**out)  # type: ignore[arg-type]
    except MorphlingInputError as e:
        raise SystemExit(f"--set: {e}") from None
    return out


def run(trace: str, seed: int | None, width: float, opts: dict[str, float]) -> dict[str, Any]:
    """One run: the exact trace (seed None) or a jittered one."""
    r = replay(trace, None if seed is None else (lambda jobs: jitter(jobs, seed, width)))
    pol = MorphlingPolicy(MorphlingOptions(**opts))  # type: ignore[arg-type]
    s = summarize(r.simulator().run(pol, pol.mode))
    b = r.bounds()
    bound = b.get("fluid_guarantee_per_round_s", b["fluid_one_start_s"])
    return {"trace": trace, "seed": seed, "jobs": len(r.jobs), "finished": s["jobs_finished"],
            "jct_avg_s": s["jct_avg_s"], "makespan_s": s["makespan_s"], "sla_violations": s.get("sla_violations"),
            "bound_s": bound, "over_bound": s["makespan_s"] / bound - 1}


def spread(rows: Sequence[dict[str, Any]], key: str) -> dict[str, float]:
    vals = [float(r[key]) for r in rows]
    return {"mean": statistics.fmean(vals), "min": min(vals), "max": max(vals)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", default="base,mt")
    ap.add_argument("--seeds", type=int, default=6, help="jittered replays per trace")
    ap.add_argument("--width", type=float, default=300.0, help="seconds each arrival may move either way")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a MorphlingOptions field")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    opts = options(a.set)
    if not 0 <= a.width < float("inf"):
        raise SystemExit(f"--width: want a number of seconds >= 0, got {a.width}")
    traces = [t for t in a.traces.split(",") if t]
    for t in traces:
        if t not in ARTIFACT:
            raise SystemExit(f"--traces: {t!r} is not one of {', '.join(ARTIFACT)}")
    t0 = time.perf_counter()
    runs = [(t, s) for t in traces for s in [None, *range(a.seeds)]]
    with ProcessPoolExecutor(max_workers=max(1, a.workers)) as ex:
        rows = list(ex.map(run, [t for t, _ in runs], [s for _, s in runs], [a.width] * len(runs),
                           [opts] * len(runs)))
    summary: dict[str, Any] = {}
    print(f"morphling options: {opts or 'defaults'}; arrivals jittered by +-{a.width:g} s, {a.seeds} seeds")
    for t in traces:
        exact = next(r for r in rows if r["trace"] == t and r["seed"] is None)
        jit = [r for r in rows if r["trace"] == t and r["seed"] is not None]
        art_jct, art_mk = ARTIFACT[t]
        summary[t] = {"exact": exact, "targets": {"jct_avg_s": 0.8 * art_jct, "makespan_s": art_mk}}
        print(f"morphling-{t}: exact JCT {exact['jct_avg_s']:,.0f} s, makespan {exact['makespan_s']:,.0f} s "
              f"({exact['over_bound']:+.1%} over its bound), sla_violations {exact['sla_violations']}; "
              f"targets JCT <= {0.8 * art_jct:,.0f} s, makespan <= {art_mk:,.0f} s")
        if jit:
            agg = {k: spread(jit, k) for k in ("jct_avg_s", "makespan_s", "over_bound")}
            agg["sla_violations_max"] = {"max": max(int(r["sla_violations"] or 0) for r in jit)}
            agg["unfinished_max"] = {"max": max(r["jobs"] - r["finished"] for r in jit)}
            summary[t]["jittered"] = agg
            j, m, o = agg["jct_avg_s"], agg["makespan_s"], agg["over_bound"]
            print(f"  jittered: JCT mean {j['mean']:,.0f} s ({j['min']:,.0f}-{j['max']:,.0f}); makespan mean "
                  f"{m['mean']:,.0f} s ({m['min']:,.0f}-{m['max']:,.0f}); over bound mean {o['mean']:+.1%} "
                  f"({o['min']:+.1%} to {o['max']:+.1%}); sla_violations max {agg['sla_violations_max']['max']}, "
                  f"unfinished max {agg['unfinished_max']['max']}")
    wall = time.perf_counter() - t0
    write_result(a.out, "morphling_jitter.json", {"options": opts, "width_s": a.width, "seeds": a.seeds,
                                                  "summary": summary, "rows": rows, "wall_s": wall}, show=False)
    print(f"wrote {a.out}/morphling_jitter.json ({wall:.0f} s)")


if __name__ == "__main__":
    main()
