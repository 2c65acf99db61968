"""Where the morphling policy's makespan goes on the Morphling workloads: each run's GPU-time split
into the least its jobs' work needs, what the jobs held over that (points dearer than their
cheapest, restarts), and GPUs idle, while jobs waited (packing) or while none did. Same cluster,
oracle and rules as bench/sim_morphling.py; the least is bench/morphling_bounds.py's: each job at
the point with the fewest GPU-seconds for its iterations and one start, a guaranteed job of mt only
at points as fast as its promise.

Prints per trace the split in cluster-seconds (GPU-seconds over the cluster's GPUs, so the parts add
up to about the run's length), per model and class (guaranteed or best-effort), and the jobs that
held most over their least, with their restarts. Also: the GPU-seconds charged for restarts
after the jobs' first starts, the GPU-seconds from each job's end to its round's (the rules free
GPUs at rounds), and the time from which no GPU sat idle while nothing waited. Writes bench/results/morphling_waste.json.

    .venv/bin/python bench/morphling_waste.py [--traces base,mt] [--top 10]
"""

from __future__ import annotations

import argparse
import math
import time
from collections import defaultdict
from typing import Any

from benchio import write_result
from morphling_bounds import least_gpu_s, per_gpu_count, promise_time, replay

from tessera.controller.core.policies.morphling import MorphlingPolicy
from tessera.controller.core.snapshot import Snapshot
from tessera.controller.sim.metrics import summarize


def split(trace: str, top: int) -> dict[str, Any]:
    r = replay(trace)
    gpus = r.cluster.total_gpus()
    start_s = r.rules.fixed_cost or 0.0
    held: dict[str, float] = defaultdict(float)
    last_t: list[float] = []

    def observe(snap: Snapshot) -> None:
        # A round's snapshot shows what the previous round decided, less the jobs that finished
        # in between (added below): that held the GPUs from the previous round's time to this one's.
        if last_t:
            for rv in snap.running:
                held[rv.job.id] += (snap.now - last_t[0]) * rv.cell.gpus
            last_t[0] = snap.now
        else:
            last_t.append(snap.now)

    pol = MorphlingPolicy()
    res = r.simulator().run(pol, pol.mode, observe=observe)
    s = summarize(res)
    interval = r.rules.interval_s
    t0 = res.rounds[0].time if res.rounds else 0.0
    round_ends = 0.0
    for j in res.jobs:
        if j.end is not None and j.cell is not None:
            held[j.t.id] += interval * j.cell.gpus  # its last round: GPUs free at the next one
            freed = t0 + math.ceil((j.end - t0) / interval) * interval
            round_ends += (freed - j.end) * j.cell.gpus
    # The records are taken after each round's decisions: exact GPUs in use and jobs waiting.
    idle = {"waiting": 0.0, "none_waiting": 0.0}
    for rec in res.rounds:
        idle["waiting" if rec.pending else "none_waiting"] += interval * (gpus - rec.gpus_used)
    # From `busy_from` to the run's end (its last jobs draining aside) no GPU was idle while nothing
    # waited: the run's length after it is the GPU-time held after it, over the cluster's GPUs.
    last_wait = max((k for k, rec in enumerate(res.rounds) if rec.pending), default=-1)
    busy_from = max((rec.time + interval for rec in res.rounds[:last_wait]
                     if not rec.pending and rec.gpus_used < gpus), default=t0)
    curves: dict[str, dict[int, float]] = {}
    groups: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    jobs = []
    for j in res.jobs:
        tj = j.t
        c = curves.setdefault(tj.model_key, per_gpu_count(r.truth.est, tj.model_key))
        t_p = promise_time(r.truth, tj, r.gpu_type, r.cluster.per_node(r.gpu_type)) if r.gpu_type else 0.0
        least = least_gpu_s(c, tj.iterations, t_p, start_s)
        g = groups[f"{tj.model_key} {'guaranteed' if t_p > 0 else 'best-effort'}"]
        g[0] += 1
        g[1] += held[tj.id]
        g[2] += least
        jobs.append({"job": tj.id, "held_s": held[tj.id] / gpus, "least_s": least / gpus,
                     "over_s": (held[tj.id] - least) / gpus, "restarts": j.changes})
    restarts = sum(j.restart_gpu_s for j in res.jobs) / gpus
    total_held = sum(v[1] for v in groups.values()) / gpus
    total_least = sum(v[2] for v in groups.values()) / gpus
    jobs.sort(key=lambda x: -x["over_s"])
    return {"trace": trace, "jct_avg_s": s["jct_avg_s"], "makespan_s": s["makespan_s"],
            "least_s": total_least, "held_over_least_s": total_held - total_least, "restarts_s": restarts,
            "round_ends_s": round_ends / gpus, "busy_from_s": busy_from - t0,
            "idle_while_waiting_s": idle["waiting"] / gpus, "idle_none_waiting_s": idle["none_waiting"] / gpus,
            "groups": {k: {"jobs": int(v[0]), "held_s": v[1] / gpus, "least_s": v[2] / gpus}
                       for k, v in sorted(groups.items(), key=lambda kv: kv[1][2] - kv[1][1])},
            "top": jobs[:top]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", default="base,mt")
    ap.add_argument("--top", type=int, default=10, help="jobs listed by what they held over their least")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    t0 = time.perf_counter()
    rows = [split(t, a.top) for t in a.traces.split(",")]
    for r in rows:
        parts = r["least_s"] + r["held_over_least_s"] + r["idle_while_waiting_s"] + r["idle_none_waiting_s"]
        print(f"morphling-{r['trace']}: JCT {r['jct_avg_s']:,.0f} s, makespan {r['makespan_s']:,.0f} s; in cluster-seconds: "
              f"least work {r['least_s']:,.0f} + held over it {r['held_over_least_s']:,.0f} + idle while jobs waited "
              f"{r['idle_while_waiting_s']:,.0f} + idle, none waiting {r['idle_none_waiting_s']:,.0f} = {parts:,.0f}")
        rest = r["held_over_least_s"] - r["restarts_s"] - r["round_ends_s"]
        print(f"  held over the least: restarts after the first start {r['restarts_s']:,.0f}, from the jobs' ends "
              f"to their rounds' {r['round_ends_s']:,.0f}, dearer points {rest:,.0f}; no GPU idle while nothing "
              f"waited from {r['busy_from_s']:,.0f} s on")
        for k, v in r["groups"].items():
            print(f"  {k:24} {v['jobs']:4} jobs  held {v['held_s']:8,.0f}  least {v['least_s']:8,.0f}  "
                  f"over {v['held_s'] - v['least_s']:+7,.0f}")
        for x in r["top"]:
            print(f"  {x['job']:14} over its least {x['over_s']:+7,.0f} s (held {x['held_s']:,.0f}), "
                  f"{x['restarts']} restarts")
    write_result(a.out, "morphling_waste.json", {"rows": rows, "wall_s": time.perf_counter() - t0}, show=False)
    print(f"wrote {a.out}/morphling_waste.json ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
