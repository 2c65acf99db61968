"""Metrics of a simulated run, and the comparison of policies side by side.

Everything in `summarize` and `compare` is deterministic (no wall-clock time): a replay from the
same seed writes the same metrics.json. Round times (wall clock) are in `timing`, a separate file.

Two ways of averaging JCT are printed (docs/simulator.md):
- "finished": the mean over the jobs each policy finished within the horizon;
- "artifact": the Crius artifact's plot/plotter.py: each other policy's list is padded with the
  largest JCT any policy saw, up to the number of jobs the reference (crius) finished, and
  compared with the reference's mean over its finished jobs.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tessera.controller.sim.engine import RoundRecord, SimJob, SimResult

# Busy rounds, which `throughput_avg_busy` averages over (docs/simulator.md, "Metrics per policy").
# Under the rules that count samples/s (arena, fair): rounds above BUSY_THRESHOLD, the cut of the
# artifact's plotter (plot_cluster_thr), which leaves out the idle start and the drained end. The
# morphling rules count iterations/s (~13 on morphling-64), so no round passed 100 and the average
# read 0; a cut in iterations/s would sort rounds by which jobs run (their rates differ a
# hundredfold), not by load: there a round is busy when a job is left waiting at its end.
BUSY_THRESHOLD = 100.0
ITERATION_RULES = frozenset({"morphling"})


def busy_rounds_are(rules: str) -> str:
    """What makes a round busy under `rules`: the label of the busy figures."""
    if rules in ITERATION_RULES:
        return "a job left waiting"
    return f"throughput > {BUSY_THRESHOLD:g} samples/s"


def is_busy(rules: str, r: RoundRecord) -> bool:
    return r.pending > 0 if rules in ITERATION_RULES else r.throughput > BUSY_THRESHOLD


def _pct(xs: Sequence[float], p: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    k = (len(s) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _r(x: float, nd: int = 3) -> float:
    return round(x, nd)


def jct_list(res: SimResult) -> list[float]:
    return [j.end - j.arrive_time for j in res.jobs if j.state == "done" and j.end is not None]


def summarize(res: SimResult) -> dict[str, Any]:
    horizon = len(res.rounds)
    arrived = [j for j in res.jobs if j.arrive_round < horizon]
    done = [j for j in arrived if j.state == "done" and j.end is not None]
    jct = sorted(j.end - j.arrive_time for j in done if j.end is not None)
    started = [j for j in arrived if j.first_start is not None]
    kept = [j.queue_s for j in arrived if j.state != "dropped"]
    thr = [r.throughput for r in res.rounds]
    busy = [r.throughput for r in res.rounds if is_busy(res.rules, r)]
    total_gpus = max((r.gpus_used for r in res.rounds), default=0)
    first = min((j.arrive_time for j in arrived), default=0.0)
    last_end = max((j.end for j in done if j.end is not None), default=first)
    return {
        "policy": res.policy,
        "mode": res.mode,
        "rules": res.rules,
        "trace": res.trace,
        "cluster": res.cluster,
        "rounds": horizon,
        "jobs_submitted": len(arrived),
        "jobs_finished": len(done),
        "jobs_dropped": sum(1 for j in arrived if j.state == "dropped"),
        "jobs_running_at_end": sum(1 for j in arrived if j.state == "running"),
        "jobs_pending_at_end": sum(1 for j in arrived if j.state == "pending"),
        # Never started, not dropped: could run on the cluster / could not (controller/sim/unstarted.py).
        "never_started": sum(1 for j in arrived if j.unstarted == "runnable"),
        "infeasible": sum(1 for j in arrived if j.unstarted == "infeasible"),
        "end": res.end,
        "jct_avg_s": _r(statistics.fmean(jct)) if jct else 0.0,
        "jct_median_s": _r(_pct(jct, 50)),
        "jct_p99_s": _r(_pct(jct, 99)),
        "jct_max_s": _r(max(jct, default=0.0)),
        "queue_avg_s": _r(statistics.fmean([j.queue_s for j in done])) if done else 0.0,
        "queue_avg_all_s": _r(statistics.fmean(kept)) if kept else 0.0,
        "throughput_avg": _r(statistics.fmean(thr)) if thr else 0.0,
        "throughput_avg_busy": _r(statistics.fmean(busy)) if busy else 0.0,
        "busy_rounds": len(busy),
        "throughput_peak": _r(max(thr, default=0.0)),
        "makespan_s": _r(last_end - first) if done else 0.0,
        "all_finished": len(done) == len(arrived),
        "restarts_per_job": _r(statistics.fmean([j.changes for j in started])) if started else 0.0,
        "launches_per_job": _r(statistics.fmean([j.launches for j in started])) if started else 0.0,
        "suspensions": sum(j.suspensions for j in arrived),
        "unrunnable_placements": sum(j.unrunnable for j in arrived),
        "jobs_placed_unrunnable": sum(1 for j in arrived if j.unrunnable),
        # Guaranteed jobs admitted within quota, and those behind their promise at some round end
        # (docs/tenants.md); 0 and 0 without tenants.
        "guaranteed_jobs": sum(1 for j in arrived if j.sla_since is not None),
        # JCT of the admitted guaranteed jobs and of the others (Morphling Table 4's "Guar." and "BE").
        "jct_avg_guaranteed_s": _mean_jct([j for j in done if j.sla_since is not None]),
        "jct_avg_best_effort_s": _mean_jct([j for j in done if j.sla_since is None]),
        "sla_violations": sum(1 for j in arrived if j.sla_behind),
        "gpus_used_peak": total_gpus,
        "choices_evaluated": sum(r.evaluations for r in res.rounds),
    }


def _mean_jct(jobs: Sequence[SimJob]) -> float:
    xs = [j.end - j.arrive_time for j in jobs if j.end is not None]
    return _r(statistics.fmean(xs)) if xs else 0.0


def timing(res: SimResult) -> dict[str, float]:
    s = res.round_seconds
    return {
        "rounds": len(s),
        "round_s_avg": statistics.fmean(s) if s else 0.0,
        "round_s_p50": _pct(s, 50),
        "round_s_p99": _pct(s, 99),
        "round_s_max": max(s, default=0.0),
        "total_s": sum(s),
    }


def compare(results: dict[str, SimResult], ref: str) -> dict[str, Any]:
    """JCT reduction and throughput ratio of `ref` against every other policy, both averagings."""
    return compare_lists({k: jct_list(v) for k, v in results.items()},
                         {k: summarize(v) for k, v in results.items()}, ref)


def compare_lists(lists: dict[str, list[float]], summaries: dict[str, dict[str, Any]], ref: str) -> dict[str, Any]:
    """`compare` from each policy's JCTs of finished jobs and its summary (policies simulated apart)."""
    if ref not in lists:
        return {}
    max_jct = max((max(x) for x in lists.values() if x), default=0.0)
    ref_l = lists[ref]
    ref_avg = statistics.fmean(ref_l) if ref_l else 0.0
    ref_s = summaries[ref]
    out: dict[str, Any] = {"reference": ref, "max_jct_s": _r(max_jct)}
    for k, lst in lists.items():
        if k == ref:
            continue
        avg = statistics.fmean(lst) if lst else 0.0
        padded = lst + [max_jct] * max(0, len(ref_l) - len(lst))
        pavg = statistics.fmean(padded) if padded else 0.0
        s = summaries[k]
        out[k] = {
            "jct_avg_finished_s": _r(avg),
            "jct_reduction_finished": _r((avg - ref_avg) / avg, 4) if avg else 0.0,
            "jct_avg_padded_s": _r(pavg),
            "jct_reduction_padded": _r((pavg - ref_avg) / pavg, 4) if pavg else 0.0,
            "padding_applies": len(lst) <= len(ref_l),
            "throughput_ratio": _r(ref_s["throughput_avg"] / s["throughput_avg"], 4) if s["throughput_avg"] else 0.0,
            "throughput_ratio_busy": _r(ref_s["throughput_avg_busy"] / s["throughput_avg_busy"], 4)
            if s["throughput_avg_busy"] else 0.0,
            "peak_ratio": _r(ref_s["throughput_peak"] / s["throughput_peak"], 4) if s["throughput_peak"] else 0.0,
        }
    return out


def write_rounds_csv(res: SimResult, path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["round", "time_s", "throughput", "running", "pending", "gpus_used", "started", "migrated",
                    "suspended", "finished", "choices_evaluated"])
        for r in res.rounds:
            w.writerow([r.index, _r(r.time), _r(r.throughput), r.running, r.pending, r.gpus_used, r.started,
                        r.migrated, r.suspended, r.finished, r.evaluations])


def write_jobs_csv(res: SimResult, path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job", "model", "gpus_asked", "type_asked", "arrive_s", "state", "first_start_s", "end_s",
                    "jct_s", "queue_s", "restarts", "suspensions", "last_reason"])
        for j in res.jobs:
            if j.arrive_round >= len(res.rounds):
                continue
            jct = _r(j.end - j.arrive_time) if j.end is not None else ""
            w.writerow([j.t.id, j.t.model_key, j.t.gpus, j.t.gpu_type, _r(j.arrive_time), j.state,
                        _r(j.first_start) if j.first_start is not None else "", _r(j.end) if j.end else "",
                        jct, _r(j.queue_s), j.changes, j.suspensions, j.reason])


SUMMARY_FIELDS = ("policy", "mode", "rules", "rounds", "jobs_submitted", "jobs_finished", "jobs_dropped",
                  "jct_avg_s", "jct_median_s", "jct_p99_s", "queue_avg_s", "queue_avg_all_s", "throughput_avg",
                  "throughput_avg_busy", "throughput_peak", "makespan_s", "restarts_per_job", "launches_per_job",
                  "sla_violations", "never_started", "infeasible")


def write_summary_csv(summaries: dict[str, dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label", *SUMMARY_FIELDS])
        for label, s in summaries.items():
            w.writerow([label, *(s[k] for k in SUMMARY_FIELDS)])
