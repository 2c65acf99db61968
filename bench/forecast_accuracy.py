"""Forecast accuracy: Tessera's replay forecast beside a naive Slurm-style forecast (docs/forecasts.md).

A replay of Philly (the seeded generator, `tessera-sim --trace philly`) on the Crius cluster
(crius-1280) under the fair rules. In each round where jobs arrive, the round's snapshot is
forecast (controller/core/forecast.py: the same policy and estimates, no future arrivals) before the
policy decides; the arrivals' forecast start and finish are then compared with their actual start
and finish in the same replay. Beside it, the naive forecast made from the same snapshot:

- walltime of a job = (its runtime on the GPUs and type it requested, the oracle's iteration time x
  its iterations, + the rules' start cost: 260 s under the fair rules) x an overestimate factor (users ask for more than they use; `--overestimate`,
  several comma-separated: 1 = exact walltimes, the naive forecast's best case);
- the schedule of `squeue --start` under conservative backfill: every running job holds its GPUs
  until its start + walltime; pending jobs in submission order each reserve the earliest interval
  where its requested GPUs of its requested type are free for its walltime (a later job may take an
  earlier gap only if it fits there without moving any reservation); GPUs are counted per type
  (no node fragmentation). Forecast start = the reservation, finish = start + walltime.

Errors are absolute (seconds; printed in minutes) over the jobs that started and finished in the
replay: median and p90, start and finish, both forecasts; plus the forecast's cost per round.

    .venv/bin/python bench/forecast_accuracy.py [--hours 3] [--policy crius] [--overestimate 1.5,1]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchio import write_result

from tessera.controller.core.forecast import ForecastConfig, JobForecast, forecast
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import RoundConfig
from tessera.controller.core.snapshot import JobView, Snapshot
from tessera.controller.sim import cli
from tessera.controller.sim.engine import Simulator, Truth


class NoisyTruth(Truth):
    """The oracle with each job's iteration time on each GPU type off by a fixed factor drawn from
    [1 - noise, 1 + noise] (seeded by job and type): estimates that err as the estimator's do, so
    that the band is put to the test. The forecast still reads the unperturbed estimates."""

    def __init__(self, inner: Truth, noise: float) -> None:
        super().__init__(inner.est)
        self.inner, self.noise = inner, noise

    def factor(self, job: JobView, gpu_type: str) -> float:
        return 1.0 + self.noise * (2.0 * random.Random(f"{job.id}/{gpu_type}").random() - 1.0)

    def iteration_s(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> float:
        return self.inner.iteration_s(job, gpu_type, gpus, nodes) * self.factor(job, gpu_type)

    def throughput(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> float:
        return self.inner.throughput(job, gpu_type, gpus, nodes) / self.factor(job, gpu_type)


@dataclass
class Seen:
    now: float
    forecasts: dict[str, JobForecast]
    naive: dict[float, dict[str, tuple[float, float]]]
    seconds: float


def walltime(truth: Truth, view: JobView, per_node: dict[str, int], factor: float, left: float,
             start_cost: float) -> float:
    t, n = view.gpu_type_hint, max(1, view.gpus_hint)
    cap = per_node.get(t, 8)
    it = truth.iteration_s(view, t, n, 1 if n <= cap else n // cap)
    return (it * left + start_cost if it > 0 else 0.0) * factor


def naive_schedule(snap: Snapshot, truth: Truth, per_node: dict[str, int], totals: dict[str, int],
                   started: dict[str, float], factor: float, start_cost: float) -> dict[str, tuple[float, float]]:
    """squeue --start under conservative backfill (see the module docstring), per GPU type."""
    # Per type: (time, +-GPUs) changes of the free count, from now on.
    held: dict[str, list[tuple[float, int]]] = defaultdict(list)
    busy0: dict[str, int] = defaultdict(int)
    for r in snap.running:
        w = walltime(truth, r.job, per_node, factor, float(r.job.iterations), start_cost)
        end = max(snap.now, started.get(r.job.id, snap.now) + w)
        busy0[r.cell.gpu_type] += r.cell.gpus
        held[r.cell.gpu_type].append((end, r.cell.gpus))
    out: dict[str, tuple[float, float]] = {}
    # Reservations: per type, a list of (start, end, gpus).
    res: dict[str, list[tuple[float, float, int]]] = defaultdict(list)

    def free_over(t: str, a: float, b: float) -> int:
        points = sorted({a, *(e for e, _ in held[t] if a < e < b), *(s for s, _, _ in res[t] if a < s < b),
                         *(e for _, e, _ in res[t] if a < e < b)})
        worst = totals.get(t, 0)
        for p in points:
            used = sum(g for e, g in held[t] if e > p) + sum(g for s, e, g in res[t] if s <= p < e)
            worst = min(worst, totals.get(t, 0) - used)
        return worst

    for j in sorted(snap.pending, key=lambda v: (v.submit_time, v.id)):
        t, n = j.gpu_type_hint, max(1, j.gpus_hint)
        w = walltime(truth, j, per_node, factor, j.remaining_iterations, start_cost)
        if w <= 0 or n > totals.get(t, 0):
            continue  # Slurm would reject it: no forecast
        cands = sorted({snap.now, *(e for e, _ in held[t] if e > snap.now), *(e for _, e, _ in res[t])})
        for c in cands:
            if free_over(t, c, c + w) >= n:
                res[t].append((c, c + w, n))
                out[j.id] = (c, c + w)
                break
    return out


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=3.0)
    ap.add_argument("--start-hour", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--load", type=float, default=1.0, help="arrival-rate multiplier (tessera-sim --load)")
    ap.add_argument("--cluster", default="crius-1280")
    ap.add_argument("--policy", default="crius")
    ap.add_argument("--overestimate", default="1.5,1", help="walltime factors of the naive forecast")
    ap.add_argument("--max-rounds", type=int, default=64)
    ap.add_argument("--noise", type=float, default=0.0, help="true iteration times off the estimates by up to "
                    "this fraction, per job and type (0: the oracle is the estimates)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    a = ap.parse_args()
    factors = [float(x) for x in a.overestimate.split(",") if x.strip()]
    if not factors or min(factors) <= 0:
        ap.error("--overestimate: factors > 0, comma-separated")
    with tempfile.TemporaryDirectory() as tmp:
        args = cli.build_parser().parse_args(["--trace", "philly", "--cluster", a.cluster, "--hours", str(a.hours),
                                              "--start-hour", str(a.start_hour), "--seed", str(a.seed), "--load", str(a.load),
                                              "--out", tmp, "--quiet"])
        cluster, jobs, est, truth, rules, by_short = cli.load_inputs(args)
    if not 0 <= a.noise < 1:
        ap.error("--noise: a fraction in [0, 1)")
    if a.noise:
        truth = NoisyTruth(truth, a.noise)
    rcfg = RoundConfig(search_depth=3, interval_s=rules.interval_s, max_gpus_per_job=16)
    sim = Simulator(cluster, jobs, est, truth, rules, "philly", rcfg, type_of=lambda s: by_short.get(s, s))
    policy = make_policy(a.policy, "paper")
    fcfg = ForecastConfig(max_rounds=a.max_rounds, interval_s=rules.interval_s, band=True)
    per_node = {t: cluster.per_node(t) for t in cluster.gpu_types()}
    totals: dict[str, int] = defaultdict(int)
    for nv in cluster.nodes():
        for g in nv.gpus:
            totals[g.model] += 1
    seen: list[Seen] = []
    first_seen_running: dict[str, float] = {}

    def observe(snap: Snapshot) -> None:
        for r in snap.running:
            # Started in the round before it shows as running (rounds every interval).
            first_seen_running.setdefault(r.job.id, snap.now - rules.interval_s)
        if not snap.arrivals:
            return
        c0 = time.perf_counter()
        fc = forecast(snap, est, policy, rcfg, fcfg)
        dt = time.perf_counter() - c0
        nvs = {f: naive_schedule(snap, truth, per_node, totals, first_seen_running, f, rules.fixed_cost or 0.0)
               for f in factors}
        seen.append(Seen(snap.now, {k: fc[k] for k in snap.arrivals if k in fc},
                         {f: {k: nv[k] for k in snap.arrivals if k in nv} for f, nv in nvs.items()}, dt))

    t0 = time.perf_counter()
    res = sim.run(policy, "paper", until_done=True, observe=observe)
    wall = time.perf_counter() - t0
    actual = {j.t.id: (j.first_start, j.end) for j in res.jobs}
    errs: dict[str, list[float]] = defaultdict(list)
    inband = {"start": 0, "end": 0}
    missing = {"tessera": 0, **{f"naive_x{f:g}": 0 for f in factors}}
    n = 0
    for s in seen:
        for jid, f in s.forecasts.items():
            st, en = actual.get(jid, (None, None))
            if st is None or en is None:
                continue
            n += 1
            if f.start is None or f.end is None:
                missing["tessera"] += 1
            else:
                errs["tessera_start"].append(abs(f.start - st))
                errs["tessera_end"].append(abs(f.end - en))
                inband["start"] += int((f.start_low or f.start) - 1e-6 <= st <= (f.start_high or f.start) + 1e-6)
                inband["end"] += int((f.end_low or f.end) - 1e-6 <= en <= (f.end_high or f.end) + 1e-6)
            for f in factors:
                nv = s.naive[f].get(jid)
                if nv is None:
                    missing[f"naive_x{f:g}"] += 1
                else:
                    errs[f"naive_x{f:g}_start"].append(abs(nv[0] - st))
                    errs[f"naive_x{f:g}_end"].append(abs(nv[1] - en))
    costs = [s.seconds for s in seen]
    rounds = [max((f.rounds for f in s.forecasts.values()), default=0) for s in seen]
    doc: dict[str, Any] = {
        "config": {"trace": "philly", "hours": a.hours, "start_hour": a.start_hour, "seed": a.seed, "load": a.load,
                   "cluster": a.cluster, "rules": rules.name, "interval_s": rules.interval_s, "policy": a.policy,
                   "overestimate": factors, "noise": a.noise, "max_rounds": a.max_rounds, "band": [fcfg.measured_error,
                                                                                       fcfg.estimate_error]},
        "jobs_compared": n, "jobs_in_trace": len(jobs), "no_forecast": missing,
        "errors_min": {k: {"median": round(statistics.median(v) / 60, 1), "p90": round(pct(v, 0.9) / 60, 1),
                           "n": len(v)} for k, v in sorted(errs.items()) if v},
        "tessera_in_band": {k: round(v / max(1, len(errs["tessera_start"])), 3) for k, v in inband.items()},
        "forecast_cost": {"forecasts": len(costs), "median_s": round(statistics.median(costs), 3) if costs else 0,
                          "max_s": round(max(costs), 3) if costs else 0,
                          "median_policy_rounds": statistics.median(rounds) if rounds else 0,
                          # Three replays (nominal, low, high) per forecast.
                          "ms_per_policy_round": round(1000 * sum(costs) / max(1, 3 * sum(rounds)), 1)},
        "replay_wall_s": round(wall, 1), "replay_end": res.end,
    }
    print(f"forecast accuracy, philly {a.hours:g} h on {a.cluster}, {a.policy}, {n} jobs "
          f"(absolute error, minutes: median / p90)", file=sys.stderr)
    for k in ("start", "end"):
        for who in ("tessera", *(f"naive_x{f:g}" for f in factors)):
            e = doc["errors_min"].get(f"{who}_{k}")
            if e:
                print(f"  {k:5s} {who:12s} {e['median']:8.1f} / {e['p90']:8.1f}  (n={e['n']})", file=sys.stderr)
    write_result(a.out, f"forecast_accuracy_{a.policy}{f'_noise{a.noise:g}' if a.noise else ''}.json", doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
