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
reason names the jobs they wait for and when the first is free, and the round plans again then.

Only best-effort jobs (as submitted) are exempt: a guaranteed job hidden from the round would be
hidden from admission too, and its tenant's quota would look free. A placement made before
`Placement.placed_at` was recorded (0 there, None here) is never exempt. Jobs on nodes that are not READY are not in
the round at all (controller/snapshots.py), so a drain is never held back.

Pure: no I/O, no clock (`Snapshot.now`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.common.utctime import utc_text
from tessera.controller.core.snapshot import (
    Action,
    Decision,
    PendingKind,
    Priority,
    RoundPlan,
    RunningView,
    Snapshot,
)

SHOWN = 3  # exempt jobs a waiting job's reason names


@dataclass(frozen=True)
class Exempt:
    run: RunningView
    until: float


def split(snap: Snapshot, min_run_s: float) -> tuple[Snapshot, tuple[Exempt, ...]]:
    """The round's snapshot without the exempt jobs, and those jobs (soonest free first)."""
    if min_run_s <= 0:
        return snap, ()
    out = sorted((Exempt(r, r.placed_at + min_run_s) for r in snap.running
                  if r.job.priority is Priority.BEST_EFFORT and r.placed_at is not None
                  and snap.now < r.placed_at + min_run_s), key=lambda e: (e.until, e.run.job.id))
    if not out:
        return snap, ()
    ids = {e.run.job.id for e in out}
    return dataclasses.replace(snap, running=tuple(r for r in snap.running if r.job.id not in ids)), tuple(out)


def merge(plan: RoundPlan, exempt: Sequence[Exempt], snap: Snapshot, min_run_s: float) -> RoundPlan:
    """The round's plan with the exempt jobs kept, and the guaranteed jobs left waiting for room
    told which exempt jobs hold GPUs and when the first is free (`RoundPlan.wakes`: then)."""
    if not exempt:
        return plan
    keeps = [Decision(e.run.job.id, Action.KEEP, f"running; not restarted by a round before {_when(e.until)} "
                      f"(--min-run {min_run_s:g} s after its placement)", e.run.plan, e.run.slices, e.run.cell,
                      opportunistic=e.run.opportunistic) for e in exempt]
    guaranteed = {j.id for j in snap.pending if j.priority is Priority.GUARANTEED}
    note = _note(exempt, min_run_s)
    waits = False
    out: list[Decision] = []
    for d in plan.decisions:
        if d.action is Action.PENDING and d.job_id in guaranteed and d.pending is PendingKind.NO_ROOM_NOW:
            d = dataclasses.replace(d, reason=f"{d.reason}; {note}")
            waits = True
        out.append(d)
    wakes = (*plan.wakes, exempt[0].until) if waits else plan.wakes
    return dataclasses.replace(plan, decisions=(*out, *keeps), wakes=wakes)


def _note(exempt: Sequence[Exempt], min_run_s: float) -> str:
    gpus: dict[str, int] = {}
    for e in exempt:
        gpus[e.run.cell.gpu_type] = gpus.get(e.run.cell.gpu_type, 0) + e.run.cell.gpus
    held = ", ".join(f"{n} x {t}" for t, n in sorted(gpus.items()))
    names = ", ".join(e.run.job.id for e in exempt[:SHOWN]) + (", ..." if len(exempt) > SHOWN else "")
    return (f"best-effort jobs placed less than --min-run {min_run_s:g} s ago may not be preempted yet: "
            f"{names} ({held}); the first is free at {_when(exempt[0].until)}")


def _when(t: float) -> str:
    return utc_text(t) or f"t={t:.0f}"
