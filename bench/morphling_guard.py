"""The morphling policy's makespan guard (docs/scheduler-morphling.md, "Critical jobs") on workloads
it was not tuned on: its two options were chosen on morphling-base and mt; here the Morphling
workloads are down-sampled, as Morphling's Fig. 10 varies load by down-sampling its traces (a
seeded random share of the jobs, arrival times kept), and each sample runs with the guard off
(`critical_factor=0`, Algorithm 1 alone) and on (the defaults), on the same 8 x 8 A800 cluster,
oracle and rules as bench/sim_morphling.py.

Prints per sample: jobs, average JCT and makespan off and on, the change, and the GPU-seconds the
jobs held (restarts included) against the least their work needs (each job at its cheapest measured
point); then the mean and worst change per trace, and two lower bounds on each full trace's
makespan that no policy beats on this oracle: the latest (arrival + the job's time at its fastest
point), and the fluid bound max over t of (t + the cheapest GPU-seconds of the jobs arriving at or
after t / 64). Writes bench/results/morphling_guard.json.

    .venv/bin/python bench/morphling_guard.py [--traces base,mt] [--shares 1.0,0.5,0.7,0.9] [--seeds 1,2,3]
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from benchio import write_result
from morphling_bounds import bounds, replay

from tessera.controller.core.policies.morphling import MorphlingOptions, MorphlingPolicy
from tessera.controller.core.snapshot import Snapshot
from tessera.controller.sim.metrics import summarize


def run_sample(trace: str, share: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    r = replay(trace, lambda jobs: [j for j in jobs if rng.random() < share])
    jobs, truth = r.jobs, r.truth
    sim = r.simulator()
    row: dict[str, Any] = {"trace": trace, "share": share, "seed": seed, "jobs": len(jobs),
                           **bounds(jobs, truth, r.cluster.total_gpus())}
    for label, opts in (("off", MorphlingOptions(critical_factor=0.0)), ("on", MorphlingOptions())):
        pol = MorphlingPolicy(opts)
        held = {"gpu_s": 0.0, "t": 0.0}

        def observe(snap: Snapshot, held: dict[str, float] = held) -> None:
            # GPUs held from the previous round's end to this one's (rounds are the rules' interval).
            held["gpu_s"] += (snap.now - held["t"]) * sum(r.cell.gpus for r in snap.running)
            held["t"] = snap.now

        s = summarize(sim.run(pol, pol.mode, observe=observe))
        row[label] = {"jct_avg_s": s["jct_avg_s"], "makespan_s": s["makespan_s"], "finished": s["jobs_finished"],
                      "sla_violations": s.get("sla_violations"), "held_gpu_s": held["gpu_s"]}
    row["jct_change"] = row["on"]["jct_avg_s"] / row["off"]["jct_avg_s"] - 1
    row["makespan_change"] = row["on"]["makespan_s"] / row["off"]["makespan_s"] - 1
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", default="base,mt")
    ap.add_argument("--shares", default="1.0,0.5,0.7,0.9")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    t0 = time.perf_counter()
    rows = []
    print(f"{'trace':>5} {'share':>5} {'seed':>4} {'jobs':>4} | {'JCT off':>8} {'JCT on':>8} {'change':>7} | "
          f"{'mksp off':>8} {'mksp on':>8} {'change':>7} | viol on | held/least off, on")
    for trace in a.traces.split(","):
        for share in (float(x) for x in a.shares.split(",")):
            seeds = [int(x) for x in a.seeds.split(",")]
            for seed in seeds[:1] if share >= 1.0 else seeds:  # all jobs: the seed draws nothing
                r = run_sample(trace, share, seed)
                rows.append(r)
                print(f"{trace:>5} {share:>5} {seed:>4} {r['jobs']:>4} | {r['off']['jct_avg_s']:>8,.0f} "
                      f"{r['on']['jct_avg_s']:>8,.0f} {r['jct_change']:>+7.1%} | {r['off']['makespan_s']:>8,.0f} "
                      f"{r['on']['makespan_s']:>8,.0f} {r['makespan_change']:>+7.1%} | {r['on']['sla_violations']} | "
                      f"{r['off']['held_gpu_s'] / r['least_gpu_s']:.2f}, {r['on']['held_gpu_s'] / r['least_gpu_s']:.2f}",
                      flush=True)
    summary = {}
    for trace in a.traces.split(","):
        mine = [r for r in rows if r["trace"] == trace]
        summary[trace] = {
            "samples": len(mine),
            "makespan_change_mean": sum(r["makespan_change"] for r in mine) / len(mine),
            "makespan_change_worst": max(r["makespan_change"] for r in mine),
            "makespan_shorter": sum(r["makespan_change"] < 0 for r in mine),
            "jct_change_mean": sum(r["jct_change"] for r in mine) / len(mine),
            "jct_change_worst": max(r["jct_change"] for r in mine),
        }
        s = summary[trace]
        full = [r for r in mine if r["share"] == 1.0]
        if full:
            print(f"{trace}, all jobs: makespan lower bounds {full[0]['arrival_plus_fastest_s']:,.0f} s (arrival + "
                  f"fastest) and {full[0]['fluid_s']:,.0f} s (fluid)")
        print(f"{trace}: makespan {s['makespan_change_mean']:+.1%} on average (worst {s['makespan_change_worst']:+.1%}, "
              f"shorter in {s['makespan_shorter']} of {s['samples']}); JCT {s['jct_change_mean']:+.1%} "
              f"(worst {s['jct_change_worst']:+.1%})")
    write_result(a.out, "morphling_guard.json", {"rows": rows, "summary": summary,
                                                  "wall_s": time.perf_counter() - t0}, show=False)
    print(f"wrote {a.out}/morphling_guard.json ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
