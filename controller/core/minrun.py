"""A minimum run time before a round may restart a best-effort job (`--min-run`, docs/tenants.md):
Slurm's PreemptExemptTime, applied to every restart a round can cause.

Without it, a guaranteed job may preempt a best-effort job every round, and the churn guard
(controller/core/churn.py) does not see a tenant whose preempting jobs run just past its
`--churn-quick`, or succeed after a few iterations: each victim pays a checkpoint, a stop and a
restart per such job. With it, a best-effort job placed (started or moved) less than `min_run_s` ago
is out of the round: the round keeps it where it is, and no policy or guarantee sees it or its
GPUs (they stay busy, as GPUs held by something the round may not touch). So each best-effort job
restarts at most once per `min_run_s`, whoever asks: a guaranteed job's reclaim, a throughput
policy's move, grow or shrink, or the suspension of an opportunistic start. The price is paid by
the guaranteed jobs, which may wait up to `min_run_s` for quota that best-effort work borrowed; their
reason names the jobs they wait for and when the first is free, and the round runs again then.

That wait is bounded: when the round leaves an admitted guaranteed job short of its promise
(waiting, or running on less), the best-effort jobs placed since it was admitted
(`JobView.admitted_at`) lose their exemption and the round is planned again, so work started on
GPUs freed meanwhile cannot hold the waiting job off for another `min_run_s` (a review saw a
guaranteed job wait 4,800 s behind a chain of such starts with a 600 s minimum).

Exempt are the jobs the round sees as best-effort (a guaranteed job running as best-effort while
its tenant cools off, controller/core/churn.py, too), never one it sees as guaranteed: hidden from
the round, it would be hidden from admission, and its tenant's quota would look free. A placement
of unknown time (made before `Placement.placed_at` was recorded: 0 there, None here), or dated more
than MAX_SKEW_S ahead of the round's clock (another controller's clock, a clock stepped back), is
never exempt. Jobs on nodes that are not READY are not in the round at all
(controller/snapshots.py), so a drain is never held back.

Pure: no I/O, no clock (`Snapshot.now`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tessera.common.utctime import utc_text
from tessera.controller.core.guarantee_texts import NO_ROOM_RUNNING
from tessera.controller.core.snapshot import (
    Action,
    Decision,
    JobView,
    PendingKind,
    Priority,
    RoundPlan,
    RunningView,
    Snapshot,
)

SHOWN = 3  # exempt jobs a waiting job's reason names
MAX_SKEW_S = 60.0  # a placement dated further ahead of the round's clock is of unknown time


@dataclass(frozen=True)
class Exempt:
    run: RunningView
    until: float


def plan(snap: Snapshot, min_run_s: float, inner: Callable[[Snapshot], RoundPlan]) -> RoundPlan:
    """The round planned by `inner` without the exempt jobs, then merged with them; planned once
    more without those placed since a guaranteed job it leaves short was admitted."""
    before = math.inf
    while True:
        rest, exempt = split(snap, min_run_s, before)
        if not exempt:
            return inner(snap)
        out = inner(rest)
        short = [j.admitted_at if j.admitted_at is not None else snap.now for j in _short(out, snap)]
        bound = min(short, default=math.inf)
        if not any(e.run.placed_at is not None and e.run.placed_at >= bound for e in exempt):
            return merge(out, exempt, snap, min_run_s)
        before = bound  # lower at each pass (none placed since is exempt again), so it ends


def split(snap: Snapshot, min_run_s: float, before: float = math.inf) -> tuple[Snapshot, tuple[Exempt, ...]]:
    """The round's snapshot without the exempt jobs, and those jobs (soonest free first); only
    jobs placed before `before` may be."""
    if min_run_s <= 0:
        return snap, ()
    out = sorted((Exempt(r, r.placed_at + min_run_s) for r in snap.running
                  if r.job.priority is Priority.BEST_EFFORT and r.placed_at is not None
                  and r.placed_at < before and r.placed_at <= snap.now + MAX_SKEW_S
                  and snap.now < r.placed_at + min_run_s), key=lambda e: (e.until, e.run.job.id))
    if not out:
        return snap, ()
    ids = {e.run.job.id for e in out}
    return dataclasses.replace(snap, running=tuple(r for r in snap.running if r.job.id not in ids)), tuple(out)


def merge(plan: RoundPlan, exempt: Sequence[Exempt], snap: Snapshot, min_run_s: float) -> RoundPlan:
    """The round's plan with the exempt jobs kept; the guaranteed jobs left short of GPUs told which
    exempt jobs on a type they may use hold them, and when the first is free. The round runs again
    when the first exemption ends (`RoundPlan.wakes`), whoever waits: the plan may change then."""
    if not exempt:
        return plan
    keeps = [Decision(e.run.job.id, Action.KEEP, f"running; not restarted by a round before {_when(e.until)} "
                      f"(--min-run {_secs(min_run_s)} after its placement)", e.run.plan, e.run.slices, e.run.cell,
                      opportunistic=e.run.opportunistic) for e in exempt]
    short = {j.id: j for j in _short(plan, snap)}
    out: list[Decision] = []
    for d in plan.decisions:
        job = short.get(d.job_id)
        usable = [e for e in exempt if _usable(job, e.run.cell.gpu_type)] if job is not None else []
        if usable:
            d = dataclasses.replace(d, reason=f"{d.reason}; {_note(usable, min_run_s)}")
        out.append(d)
    return dataclasses.replace(plan, decisions=(*out, *keeps), wakes=(*plan.wakes, exempt[0].until))


def _short(plan: RoundPlan, snap: Snapshot) -> list[JobView]:
    """The guaranteed jobs the plan leaves short of GPUs: waiting for room, or kept on less than
    their promise because no best-effort work holds enough (the guarantee layer's reasons)."""
    guaranteed = {j.id: j for j in (*snap.pending, *(r.job for r in snap.running))
                  if j.priority is Priority.GUARANTEED}
    return [guaranteed[d.job_id] for d in plan.decisions if d.job_id in guaranteed and (
        (d.action is Action.PENDING and d.pending is PendingKind.NO_ROOM_NOW) or NO_ROOM_RUNNING in d.reason)]


def _usable(job: JobView, gpu_type: str) -> bool:
    """Whether `job` may run on `gpu_type` (its allowed types, and its promise's type if it names one)."""
    promised = job.promise.gpu_type if job.promise is not None else ""
    return job.may_use(gpu_type) and (not promised or promised == gpu_type)


def _note(exempt: Sequence[Exempt], min_run_s: float) -> str:
    gpus: dict[str, int] = {}
    for e in exempt:
        gpus[e.run.cell.gpu_type] = gpus.get(e.run.cell.gpu_type, 0) + e.run.cell.gpus
    held = ", ".join(f"{n} x {t}" for t, n in sorted(gpus.items()))
    names = ", ".join(e.run.job.id for e in exempt[:SHOWN]) + (", ..." if len(exempt) > SHOWN else "")
    return (f"best-effort jobs placed less than --min-run {_secs(min_run_s)} ago may not be preempted yet: "
            f"{names} ({held}); the first is free at {_when(exempt[0].until)}")


def _secs(s: float) -> str:
    """Seconds as the flag was given: 600 s, 1,234,567 s (not 1.23457e+06), 0.5 s."""
    return f"{s:,.0f} s" if s >= 1 and s == int(s) else f"{s:g} s"


def _when(t: float) -> str:
    return utc_text(t) or f"t={t:.0f}"
