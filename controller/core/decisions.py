"""Small pieces of a decision that the policies (controller/core/policies/common.py) and the
guarantee layer (controller/core/guarantees.py) both build: the plan launched, the kind of a
change, and the text of a reason. Apart from controller/core/policy.py so that the guarantee layer,
which `plan_round` calls, does not import it back."""

from __future__ import annotations

from collections.abc import Sequence

from tessera.controller.core.snapshot import Cell, CellEstimate, Change, JobView, PlanChoice, Slice


def where(slices: Sequence[Slice]) -> str:
    if len(slices) == 1:
        return f"node {slices[0].node_id}"
    return f"{len(slices)} nodes ({', '.join(s.node_id for s in slices[:3])}{', ...' if len(slices) > 3 else ''})"


def thr_text(job: JobView, est: CellEstimate | None) -> str:
    if est is None or est.iteration_s <= 0:
        return "no estimate"
    return f"est. {est.iteration_s:.3g} s/iter, {job.global_batch_size / est.iteration_s:.1f} samples/s"


def thr_part(job: JobView, est: CellEstimate | None, sep: str = "; ") -> str:
    """`sep` and `thr_text` for a reason, "" for an opaque job: its Cell's 1 s/iteration is a
    placeholder for the policies (controller/core/opaque.py), no estimate to show."""
    return "" if job.opaque else sep + thr_text(job, est)


def synth_plan(job: JobView, est: CellEstimate | None, cell: Cell) -> PlanChoice:
    """The estimate's plan, or a data-parallel stand-in where the estimate names none (tables)."""
    if est is not None and est.plan is not None:
        return est.plan
    pp = max(1, cell.stages)
    dp = max(1, cell.gpus // pp)
    mb = max(1, job.global_batch_size // dp)
    return PlanChoice(dp, 1, pp if dp * pp == cell.gpus else 1, mb, 1, cell.gpu_type,
                      est.memory_per_gpu_bytes if est else 0, (est.source if est else "") or "unknown")


def change_kind(prev: Cell, new: Cell) -> Change:
    if prev.gpu_type != new.gpu_type:
        return Change.TYPE_CHANGE
    if new.gpus > prev.gpus:
        return Change.SCALE_UP
    if new.gpus < prev.gpus:
        return Change.SCALE_DOWN
    return Change.MOVE
