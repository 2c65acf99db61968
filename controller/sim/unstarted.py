"""Jobs a run ended without ever starting, split into those the cluster could run and those it
never could (docs/simulator.md, "Jobs never started").

A job *can run on the cluster* when the estimates (the oracle of the run) have a Cell for it on some
GPU type of the cluster that it allows: a GPU count they know, no more than the type has, on some
even spread over that type's nodes. A job that arrived, was never started and was not dropped is
`never_started` when it can run (the policy, or the run's end, left it waiting) and `infeasible`
when it cannot (no policy could have started it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tessera.controller.core.policy import Estimates
from tessera.controller.core.snapshot import JobView, NodeView

RUNNABLE = "runnable"
INFEASIBLE = "infeasible"


def pools(nodes: Sequence[NodeView]) -> dict[str, tuple[int, int, int]]:
    """GPU type -> (GPUs, nodes, most GPUs on one node)."""
    out: dict[str, list[int]] = {}
    for n in nodes:
        per: dict[str, int] = {}
        for g in n.gpus:
            per[g.model] = per.get(g.model, 0) + 1
        for t, c in per.items():
            tot = out.setdefault(t, [0, 0, 0])
            tot[0] += c
            tot[1] += 1
            tot[2] = max(tot[2], c)
    return {t: (v[0], v[1], v[2]) for t, v in out.items()}


def can_run(est: Estimates, job: JobView, pool: dict[str, tuple[int, int, int]]) -> bool:
    """Whether the estimates have a Cell for the job on some allowed type of the cluster."""
    for t in sorted(pool):
        if job.gpu_types and t not in job.gpu_types:
            continue
        total, nodes, per = pool[t]
        for n in est.gpu_counts(job, t):
            if n <= 0 or n > total:
                continue
            lo = -(-n // per)  # the fewest nodes that hold n GPUs
            for k in range(lo, min(n, nodes) + 1):
                if n % k == 0 and est.cells(job, t, n, k):
                    return True
    return False


def classify(jobs: Iterable[tuple[JobView, bool]], est: Estimates, nodes: Sequence[NodeView]) -> list[str]:
    """For each (job, never started and not dropped): RUNNABLE, INFEASIBLE, or "" (it started or
    was dropped)."""
    pool = pools(nodes)
    memo: dict[tuple[str, tuple[str, ...]], bool] = {}
    out: list[str] = []
    for view, unstarted in jobs:
        if not unstarted:
            out.append("")
            continue
        k = (view.key, view.gpu_types)
        if k not in memo:
            memo[k] = can_run(est, view, pool)
        out.append(RUNNABLE if memo[k] else INFEASIBLE)
    return out


def warning(label: str, summary: dict[str, object], until_done: bool = False) -> str:
    """The stderr lines for a run that left runnable jobs unstarted, or jobs on GPUs the oracle
    cannot run them on, or (`until_done`) that hit its round cap with jobs not done; "" when it did
    none of these."""
    lines = []
    left = sum(v for k in ("jobs_running_at_end", "jobs_pending_at_end")
               if isinstance(v := summary.get(k, 0), int))
    if until_done and summary.get("end") == "rounds" and left > 0:
        # --until-done promised a finished run; a cap reached silently reads as one (a 1e300 s
        # restart cost ran 100,000 rounds and printed a table of unfinished jobs).
        lines.append(f"warning: {label}: the run stopped at its round cap ({summary.get('rounds')} rounds) "
                     f"with {left} jobs not done; raise --rounds or check the restart cost and the trace")
    stuck = summary.get("jobs_placed_unrunnable", 0)
    if isinstance(stuck, int) and stuck > 0:
        lines.append(f"warning: {label}: {stuck} jobs were placed on GPUs the oracle cannot run them on "
                     f"and held them without progress; see unrunnable_placements in metrics.json")
    if unstarted := _unstarted(label, summary):
        lines.append(unstarted)
    return "\n".join(lines)


def _unstarted(label: str, summary: dict[str, object]) -> str:
    n = summary.get("never_started", 0)
    if not isinstance(n, int) or n <= 0:
        return ""
    why = {"rounds": f"the run stopped at its round limit ({summary.get('rounds')} rounds)",
           "stuck": "nothing could change any more: the policy left them waiting on an idle cluster"}
    end = str(summary.get("end", ""))
    return (f"warning: {label}: {n} jobs that can run on the cluster were never started, of "
            f"{summary.get('jobs_submitted')} submitted: {why.get(end, end)}; see never_started in "
            f"summary.csv and the jobs' last_reason in {label}/jobs.csv")
