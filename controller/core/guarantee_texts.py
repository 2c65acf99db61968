"""The guarantee layer's words (controller/core/guarantees.py): what a guaranteed job's decision,
its victims' and its wait say (`describe job`, docs/tenants.md)."""

from __future__ import annotations

from tessera.controller.core.quotas import Charge
from tessera.controller.core.snapshot import JobView

# Why a guaranteed job is left short of its promise's GPUs; controller/core/minrun.py looks for it.
NO_ROOM_RUNNING = "no best-effort work holds enough GPUs to restore its promise"


def tag(job: JobView) -> str:
    return f"guaranteed (tenant {job.tenant})"


def plan_text(charge: Charge) -> str:
    return f", plan {charge.promise.plan}" if charge.promise.plan else ""


def victims_text(victims: set[str]) -> str:
    if not victims:
        return ""
    vs = sorted(victims)
    return f"; preempts best-effort {', '.join(vs[:5])}{', ...' if len(vs) > 5 else ''}"


def no_room(job: JobView, charge: Charge) -> str:
    return (f"waiting: {tag(job)} within quota, needs {charge.gpus} x {charge.gpu_type} on the fewest "
            f"nodes as fast as its promise; the free GPUs and the best-effort work on {charge.gpu_type} are "
            f"not enough (others are held by guaranteed jobs, by jobs checkpointing to stop, or unavailable)")
