"""The guarantee layer's words (controller/core/guarantees.py): what a guaranteed job's decision,
its victims' and its wait say (`describe job`, docs/tenants.md)."""

from __future__ import annotations

from tessera.controller.core.quotas import UNGUARDED, Charge
from tessera.controller.core.snapshot import JobView

# Why a guaranteed job is left short of its promise's GPUs; controller/core/minrun.py looks for it.
NO_ROOM_RUNNING = "no best-effort work holds enough GPUs to restore its promise"


def tag(job: JobView) -> str:
    return f"guaranteed (tenant {job.tenant})"


def plan_text(charge: Charge) -> str:
    return f", plan {charge.promise.plan}" if charge.promise.plan else ""


def jobs_text(ids: set[str]) -> str:
    """"job j-1" or "jobs j-1, j-2" (five at most): with the noun, a hidden id still reads
    (controller/redact.py: "job (another tenant's)")."""
    vs = sorted(ids)
    return f"job{'s' * (len(vs) > 1)} {', '.join(vs[:5])}{', ...' if len(vs) > 5 else ''}"


def victims_text(victims: set[str]) -> str:
    return f"; preempts best-effort {jobs_text(victims)}" if victims else ""


def no_room(job: JobView, charge: Charge) -> str:
    return (f"waiting: {tag(job)} within quota, needs {charge.gpus} x {charge.gpu_type} on the fewest "
            f"nodes as fast as its promise; the free GPUs and the best-effort work on {charge.gpu_type} are "
            f"not enough (others are held by guaranteed jobs, by jobs checkpointing to stop, or unavailable)")


def reclaims(job: JobView, charge: Charge, gives: int, unguarded: str = "", held: bool = True) -> str:
    """What a victim of guaranteed `job` reads: what its tenant reclaims and, where this victim
    gives up less, how much of it comes from this one (a victim of 1 GPU read "reclaims 2 x ...",
    the other being free: a live audit); `unguarded`: why the victim, guaranteed, ran as
    best-effort (quotas.unguarded_reason), so that it does not read as a guarantee broken; `held`
    False: a victim the policy was only about to start holds nothing yet, and reads "where it
    would have run" (a live audit read "1 of them from this job" of a job already stopped)."""
    return reclaims_of(job, charge.tenant, charge.gpus, charge.gpu_type, gives, unguarded, held)


def reclaims_of(job: JobView, tenant: str, gpus: int, gpu_type: str, gives: int, unguarded: str = "",
                held: bool = True) -> str:
    """`reclaims` from the guaranteed job's tenant and need as plain values (morphling's victims
    know its point, not a Charge)."""
    whose = "from this job" if held else "where it would have run"
    part = f", {gives} of them {whose}" if 0 < gives < gpus else ""
    why = f" ({unguarded.replace(UNGUARDED, 'it ran as best-effort: ', 1)})" if unguarded else ""
    return f"guaranteed job {job.id} of tenant {tenant} reclaims {gpus} x {gpu_type} of its quota{part}{why}"


def requeue_text(job: JobView) -> str:
    """Where a preempted victim goes: an opaque job (docs/opaque-jobs.md) has no checkpoint Tessera
    takes or knows of (whether its program saves one on SIGTERM is its own: the MIGRATING event's
    stop says so), and "from its checkpoint" was said of one that had none (a live audit)."""
    return "back to the queue" if job.opaque else "back to the queue from its checkpoint"
