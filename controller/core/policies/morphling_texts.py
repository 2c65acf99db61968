"""The morphling policy's words for what it does to make room (controller/core/policies/morphling.py),
in the tenants' terms where a guaranteed job is served (docs/tenants.md, "Reasons").

A live audit read, under morphling, a victim's "preempted for j-..., guaranteed within its tenant's
quota" where every other policy's read "preempted: guaranteed job j-... of tenant team-a reclaims
N x T of its quota; back to the queue from its checkpoint"; "shrunk to 1 GPUs"; and a best-effort
job waiting behind a guaranteed job at its minimum read "gains less than shrinking running jobs
would lose", though no running job could be shrunk at all. Texts only: no decision depends on them.
"""

from __future__ import annotations

from tessera.controller.core.guarantee_texts import reclaims_of, requeue_text
from tessera.controller.core.policies.morphling_curves import Point
from tessera.controller.core.snapshot import JobView

CRITICAL = "on the makespan's critical path"


def gpus(n: int) -> str:
    return f"{n} GPU{'s' * (n != 1)}"


def victim(what: str, for_job: JobView, reclaimed: Point | None, critical: bool, gives: int,
           job: JobView | None = None) -> str:
    """`what` ("preempted", "shrunk to ...", "moved") said of `job`, which makes room for `for_job`:
    with `reclaimed` (the point a guaranteed job within quota is placed at, Algorithm 1 lines 2-3)
    as the guarantee layer says it (guarantee_texts.reclaims): what its tenant reclaims and, where
    this job gives up less, how much of it comes from this one; a preempted job goes back to the
    queue as guarantee_texts.requeue_text says (an opaque job from no checkpoint of Tessera's)."""
    if reclaimed is None:
        return f"{what} for {for_job.id}, {CRITICAL if critical else 'whose slope is higher'}"
    if what == "moved":  # a guaranteed job with lead, moved off a node a larger one needs whole
        return (f"moved to make room for guaranteed job {for_job.id} of tenant {for_job.tenant} ({reclaimed.gpus} x "
                f"{reclaimed.gpu_type} within its quota)")
    text = f"{what}: {reclaims_of(for_job, for_job.tenant, reclaimed.gpus, reclaimed.gpu_type, gives)}"
    back = requeue_text(job) if job is not None else "back to the queue from its checkpoint"
    return f"{text}; {back}" if what == "preempted" else text


def held_at_minimum(best: Point, guaranteed_only: bool) -> str:
    """Why a job waits whose best step no running job can make room for (none may be shrunk or
    preempted: each is at its minimum, on the makespan's critical path, or without lead for a
    restart)."""
    who = ("guaranteed jobs hold at their minimum demand (as fast as their promise), below which they are never "
           "shrunk" if guaranteed_only else
           "running jobs hold and none may give up (guaranteed jobs at their minimum demand, jobs on the makespan's "
           "critical path, jobs without the lead a restart costs)")
    return f"morphling: waiting; its best step ({best.gpus} x {best.gpu_type}, plan {best.plan or 'best'}) needs GPUs {who}"
