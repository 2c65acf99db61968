"""How far the morphling policy's makespan on the Morphling workloads is from what any schedule can
reach on the same oracle and rules, and what the Morphling artifact's own guarantee rule changes on
morphling-mt (docs/scheduler-morphling.md, "How far from the bound").

Lower bounds on the makespan (each job alone on the 8 x 8 A800 cluster's measured table; no packing,
no waiting, no reconfiguration but one start):
- arrival + fastest: the latest (arrival + all its iterations at the job's fastest GPU count);
- fluid: max over t of (t + the least GPU-seconds of the jobs arriving at or after t / 64 GPUs),
  the least GPU-seconds of a job being its iterations at its cheapest GPU count; "+ one start"
  adds the rules' start cost (260 s on every GPU the job starts on: the artifact's simulator and
  Tessera's `morphling` rules charge it on a first start too);
- on morphling-mt, a guaranteed job's least GPU-seconds under Tessera's guarantee: every round at
  a point at least as fast as its promise (t_P, the promised plan on the promised GPUs), so its
  cheapest such point ("per round"); and, weaker, under the SLA metric alone, which counts
  cumulative progress, the cheapest mix of two points whose average is t_P, two starts paid
  ("cumulative"; a mix saves GPU-seconds only where its saving beats the second start).

Runs: `morphling` with its defaults on both traces; on mt also under the artifact's guarantee rule
(its policy, sched/morphling_sched/policy/morphling.py of AlibabaPAI/reconfigurable-dl-scheduler,
holds an SLA job to `1.5 * throughput >= sla_perf`, i.e. 2/3 of the promised throughput): the
scheduler is given t_P x 1.5, the SLA metric stays Tessera's (the strict t_P), so `sla_violations`
counts the guaranteed jobs that rule leaves behind their promise. Writes
bench/results/morphling_bounds.json.

    .venv/bin/python bench/morphling_bounds.py [--slack 1.5] [--out bench/results]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from benchio import write_result

from tessera.controller.core.policies.morphling import MorphlingPolicy
from tessera.controller.core.policy import CachedEstimates, Estimates, RoundConfig
from tessera.controller.core.snapshot import CellEstimate, JobView, Promise, TenantQuota
from tessera.controller.sim import cli
from tessera.controller.sim import tenants as tn
from tessera.controller.sim.clusters import Cluster
from tessera.controller.sim.engine import Rules, Simulator, Truth
from tessera.controller.sim.metrics import summarize
from tessera.controller.sim.oracles import MorphlingOracle
from tessera.controller.sim.tenants import morphling_mt, tenancy
from tessera.controller.sim.traces import TraceJob

# The Morphling artifact's own figures on these files (issue 15): average JCT and makespan, seconds.
ARTIFACT = {"base": (3638.0, 58680.0), "mt": (4017.0, 60780.0)}
GPUS = 64


def per_gpu_count(oracle: MorphlingOracle, model: str) -> dict[int, float]:
    """The fastest measured seconds per iteration of `model` at each GPU count."""
    out: dict[int, float] = {}
    for (m, place), (it, _) in oracle.best.items():
        g = sum(int(c) for c in place)
        if m == model and (g not in out or it < out[g]):
            out[g] = it
    return out


def mix_cost(curve: dict[int, float], t_p: float) -> float:
    """The least GPU-seconds per iteration at an average of at most t_P seconds per iteration, one
    point or a share of iterations on each of two points (one faster than t_P, one slower)."""
    fast = [(g, it) for g, it in curve.items() if it <= t_p]
    best = min((g * it for g, it in fast), default=float("inf"))
    for ga, ia in fast:
        for gb, ib in curve.items():
            if ib > t_p:
                x = (t_p - ia) / (ib - ia)  # the share of iterations on the slower point
                best = min(best, (1 - x) * ga * ia + x * gb * ib)
    return best


def per_round_gpu_s(curve: dict[int, float], iterations: float, t_p: float, start_s: float) -> float:
    """The least GPU-seconds of a guaranteed job held every round to t_P: its cheapest point as fast
    as t_P, with its one start; inf if no point is."""
    return min((g * (iterations * it + start_s) for g, it in curve.items() if it <= t_p), default=float("inf"))


def least_gpu_s(curve: dict[int, float], iterations: float, t_p: float, start_s: float) -> float:
    """A job's least GPU-seconds with its one start: at its cheapest point, or for a guaranteed job
    (t_p > 0) held every round to t_P, at its cheapest point as fast as that (the promise's own point
    compares as fast as t_P)."""
    if t_p > 0:
        return per_round_gpu_s(curve, iterations, t_p * (1 + 1e-9), start_s)
    return min(g * (iterations * it + start_s) for g, it in curve.items())


def cumulative_gpu_s(curve: dict[int, float], iterations: float, t_p: float, start_s: float) -> float:
    """The least GPU-seconds of a guaranteed job held only to its cumulative progress (an average of
    at most t_P s/iteration): one point as fast as t_P (`per_round_gpu_s`), or a mix (`mix_cost`),
    which runs on two points at least and so pays two starts, one on a point as fast as t_P."""
    fast = [g for g, it in curve.items() if it <= t_p]
    if not fast:
        return float("inf")
    mix = iterations * mix_cost(curve, t_p) + start_s * (min(fast) + min(curve))
    return min(per_round_gpu_s(curve, iterations, t_p, start_s), mix)


def fluid(work: Sequence[tuple[float, float]], gpus: int) -> float:
    """max over t of (t + the GPU-seconds of the jobs arriving at or after t / gpus)."""
    out, later = 0.0, sum(w for _, w in work)
    for t, w in sorted(work):
        out = max(out, t + later / gpus)
        later -= w
    return out


def promise_time(truth: Truth, tj: TraceJob, gpu_type: str, per_node: int) -> float:
    """t_P of a guaranteed trace job, by the SLA metric's own function (0: not guaranteed)."""
    _, _, promise = tenancy(tj, gpu_type)
    if promise is None:
        return 0.0
    view = JobView(tj.id, tj.submit_time, tj.model, tj.global_batch_size, promise=promise,
                   estimate_key=tj.model_key)
    return tn.promise_time(view, gpu_type, per_node, truth)


def bounds(jobs: Sequence[TraceJob], truth: Truth, gpus: int, start_s: float = 0.0,
           gpu_type: str = "", per_node: int = 8, slack: float = 1.0) -> dict[str, Any]:
    """The least GPU-seconds of the jobs' work and lower bounds on the makespan (module docstring),
    on the Morphling oracle of `truth`; with `gpu_type` (morphling-mt) also those under the
    guarantee of each guaranteed job, its promise `slack` times slower."""
    oracle = truth.est
    assert isinstance(oracle, MorphlingOracle)
    curves = {m: per_gpu_count(oracle, m) for m in {j.model_key for j in jobs}}
    plain, started, per_round, cumulative = [], [], [], []
    mix_saves: list[tuple[float, str]] = []  # guaranteed jobs a sprint and coast would make cheaper
    for j in jobs:
        c = curves[j.model_key]
        least = min(g * j.iterations * it for g, it in c.items())
        once = least_gpu_s(c, j.iterations, 0.0, start_s)
        plain.append((j.submit_time, least))
        started.append((j.submit_time, once))
        t_p = promise_time(truth, j, gpu_type, per_node) * slack if gpu_type else 0.0
        if t_p > 0:
            per_round.append((j.submit_time, least_gpu_s(c, j.iterations, t_p, start_s)))
            cumulative.append((j.submit_time, cumulative_gpu_s(c, j.iterations, t_p * (1 + 1e-9), start_s)))
            if cumulative[-1][1] < per_round[-1][1]:
                mix_saves.append((per_round[-1][1] - cumulative[-1][1], j.id))
        else:
            per_round.append((j.submit_time, once))
            cumulative.append((j.submit_time, once))
    out = {
        "least_gpu_s": sum(w for _, w in plain),
        "arrival_plus_fastest_s": max(j.submit_time + j.iterations * min(curves[j.model_key].values()) for j in jobs),
        "fluid_s": fluid(plain, gpus),
        "fluid_one_start_s": fluid(started, gpus),
    }
    if gpu_type:
        out["fluid_guarantee_per_round_s"] = fluid(per_round, gpus)
        out["fluid_guarantee_cumulative_s"] = fluid(cumulative, gpus)
        mix_saves.sort(reverse=True)
        out["mix_jobs"] = len(mix_saves)
        out["mix_saves_gpu_s"] = sum(w for w, _ in mix_saves)
        out["mix_saves_top"] = [[jid, w] for w, jid in mix_saves[:2]]
    return out


class SlackPromises:
    """The replay's oracle with every promise `factor` times slower for the scheduler (the
    artifact's guarantee rule at 1.5); everything else is the oracle's."""

    def __init__(self, oracle: MorphlingOracle, factor: float) -> None:
        self.oracle = oracle
        self.factor = factor

    def cells(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> Sequence[CellEstimate]:
        return self.oracle.cells(job, gpu_type, gpus, nodes)

    def gpu_counts(self, job: JobView, gpu_type: str) -> Sequence[int]:
        return self.oracle.gpu_counts(job, gpu_type)

    def promise_time(self, job: JobView, promise: Promise) -> float:
        return self.oracle.promise_time(job, promise) * self.factor


@dataclass
class Replay:
    """One Morphling workload as the benches replay it: 8 x 8 A800, the measured placements as the
    oracle, the `morphling` rules; on mt, the MT trace's tenants (controller/sim/tenants.py)."""

    trace: str
    cluster: Cluster
    jobs: list[TraceJob]
    est: Estimates
    truth: Truth
    rules: Rules
    tenants: tuple[TenantQuota, ...]
    gpu_type: str  # the guaranteed jobs' type on mt, "" on base
    config: RoundConfig
    by_short: dict[str, str]

    def simulator(self, est: Estimates | None = None) -> Simulator:
        return Simulator(self.cluster, self.jobs, est or self.est, self.truth, self.rules, f"morphling-{self.trace}",
                         self.config, type_of=lambda s: self.by_short.get(s, s), tenants=self.tenants)

    def bounds(self, slack: float = 1.0) -> dict[str, Any]:
        """This workload's bounds with the rules' start cost, and on mt those under the guarantee."""
        return bounds(self.jobs, self.truth, self.cluster.total_gpus(), self.rules.fixed_cost or 0.0, self.gpu_type,
                      self.cluster.per_node(self.gpu_type) if self.gpu_type else 8, slack)


def replay(trace: str, perturb: Callable[[list[TraceJob]], list[TraceJob]] | None = None) -> Replay:
    """morphling-`trace` (base or mt), its jobs changed by `perturb` (a sample, a jitter) before
    the tenants are set."""
    args = cli.build_parser().parse_args(["--trace", f"morphling-{trace}", "--cluster", "morphling-64",
                                          "--rules", "morphling", "--out", "unused"])
    cluster, jobs, est, truth, rules, by_short = cli.load_inputs(args)
    assert isinstance(truth.est, MorphlingOracle)
    if perturb is not None:
        jobs = perturb(list(jobs))
    tenants: tuple[TenantQuota, ...] = ()
    gpu_type = ""
    if trace == "mt":
        gpu_type = cluster.gpu_types()[0]
        jobs, tenants = morphling_mt(jobs, gpu_type)
    return Replay(trace, cluster, list(jobs), est, truth, rules, tenants, gpu_type,
                  RoundConfig(search_depth=args.depth, interval_s=rules.interval_s), dict(by_short))


def run(trace: str, slack: float = 1.0) -> dict[str, Any]:
    r = replay(trace)
    assert isinstance(r.truth.est, MorphlingOracle)
    est = CachedEstimates(SlackPromises(r.truth.est, slack)) if slack != 1.0 else None
    pol = MorphlingPolicy()
    s = summarize(r.simulator(est).run(pol, pol.mode))
    return {"trace": trace, "promise_slack": slack, "jct_avg_s": s["jct_avg_s"], "makespan_s": s["makespan_s"],
            "finished": s["jobs_finished"], "jobs": len(r.jobs), "sla_violations": s.get("sla_violations"),
            **r.bounds(slack)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slack", type=float, default=1.5, help="the artifact's guarantee rule (t_P x this)")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    t0 = time.perf_counter()
    rows = [run("base"), run("mt"), run("mt", a.slack)]
    for r in rows:
        art_jct, art_mk = ARTIFACT[r["trace"]]
        rule = "Tessera's guarantee" if r["promise_slack"] == 1.0 else f"promises x {r['promise_slack']:g}"
        tight = r.get("fluid_guarantee_per_round_s", r["fluid_one_start_s"])
        r["tightest_bound_s"] = tight
        print(f"morphling-{r['trace']} ({rule}): {r['finished']}/{r['jobs']} finished, JCT {r['jct_avg_s']:,.0f} s, "
              f"makespan {r['makespan_s']:,.0f} s, sla_violations {r['sla_violations']}")
        print(f"  bounds: arrival + fastest {r['arrival_plus_fastest_s']:,.0f} s; fluid {r['fluid_s']:,.0f} s; "
              f"fluid + one start {r['fluid_one_start_s']:,.0f} s", end="")
        if "fluid_guarantee_per_round_s" in r:
            print(f"; under the guarantee ({rule}), per round {r['fluid_guarantee_per_round_s']:,.0f} s, "
                  f"cumulative {r['fluid_guarantee_cumulative_s']:,.0f} s", end="")
        print()
        if "mix_jobs" in r:
            top = ", ".join(f"{jid} {w:,.0f}" for jid, w in r["mix_saves_top"])
            print(f"  a sprint and coast (two points, two starts) beats one point for {r['mix_jobs']} guaranteed "
                  f"jobs, saving {r['mix_saves_gpu_s']:,.0f} GPU-seconds ({r['mix_saves_gpu_s'] / GPUS:,.0f} s of "
                  f"the cluster); most: {top}")
        print(f"  makespan over the bound that holds for this rule ({tight:,.0f} s): morphling "
              f"{r['makespan_s'] / tight - 1:+.1%}; the artifact's {art_mk:,.0f} s (JCT {art_jct:,.0f} s) "
              f"{art_mk / tight - 1:+.1%}")
    write_result(a.out, "morphling_bounds.json", {"rows": rows, "artifact": ARTIFACT,
                                                   "wall_s": time.perf_counter() - t0}, show=False)
    print(f"wrote {a.out}/morphling_bounds.json ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
