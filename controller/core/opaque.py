"""Opaque jobs in a round (docs/opaque-jobs.md): jobs that name only resources and a program.

They have no model dims, so the estimator has no Cells for them. `OpaqueAware` wraps the round's
`Estimates`: an opaque job gets exactly one Cell on each GPU type it allows, of exactly the GPUs it
asked for, with a nominal iteration time and no memory figure (nothing is checked: the user asked
for these GPUs); every other job is answered by the inner estimates. Every policy that asks the
estimates (Crius, FCFS, Gandiva, Gavel, Sia, ElasticFlow) thus places an opaque job as it asked, and
never scales it. Pure, like the rest of the core.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera.controller.core.policy import CachedEstimates, CellEstimate, DataParallelMemory, Estimates
from tessera.controller.core.snapshot import Cell, JobView, PlanChoice
from tessera.estimator.models import ModelDims

# A placeholder for the model of a job without one: never estimated (the wrapper answers first).
PLACEHOLDER_MODEL = ModelDims(1, 1, 1, 1, 1, "opaque")
# What an opaque job's Cell is worth to a policy: one "iteration" per second, every GPU count alike
# (no policy may prefer to scale it: it has one Cell only).
NOMINAL_ITERATION_S = 1.0
SOURCE = "opaque"


def gpus_of(job: JobView) -> int:
    """The GPUs an opaque job runs on: what it asked, 1 when it named no count."""
    return job.gpus_hint or 1


def opaque_key(gpus: int, gpu_types: Sequence[str]) -> str:
    """The estimate cache key of an opaque job (never a model signature)."""
    return f"opaque-{gpus}-{'+'.join(gpu_types) or 'any'}"


def opaque_cell(job: JobView, gpu_type: str, gpus: int) -> CellEstimate | None:
    """The one Cell of an opaque job on this type and count, None when it is not what the job asked."""
    if gpus != gpus_of(job) or not job.may_use(gpu_type):
        return None
    plan = PlanChoice(gpus, 1, 1, 1, 1, gpu_type, 0, SOURCE)
    return CellEstimate(Cell(gpu_type, gpus, 1), NOMINAL_ITERATION_S, 0, plan, SOURCE)


class OpaqueAware:
    """`Estimates` that answers opaque jobs itself and passes every other job to `inner`."""

    def __init__(self, inner: Estimates) -> None:
        self.inner = inner

    def cells(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> Sequence[CellEstimate]:
        if not job.opaque:
            return self.inner.cells(job, gpu_type, gpus, nodes)
        if nodes < 1 or gpus % nodes:
            return ()
        c = opaque_cell(job, gpu_type, gpus)
        return (c,) if c is not None else ()

    def gpu_counts(self, job: JobView, gpu_type: str) -> Sequence[int]:
        if not job.opaque:
            return self.inner.gpu_counts(job, gpu_type)
        n = gpus_of(job)
        return (n,) if opaque_cell(job, gpu_type, n) is not None else ()

    def dp_fits(self, job: JobView, gpu_type: str, gpus: int) -> bool:
        if job.opaque:
            return True  # no memory check: the user asked for these GPUs
        inner = self.inner
        if isinstance(inner, CachedEstimates | DataParallelMemory):
            return inner.dp_fits(job, gpu_type, gpus)
        return True


def fits_nowhere(job: JobView, cluster: Sequence[tuple[str, int, int]]) -> str:
    """Why an opaque job can never run on a cluster of (model, memory, count) pools, "" when it can."""
    n = gpus_of(job)
    pools: dict[str, int] = {}
    for model, _mem, count in cluster:
        pools[model] = pools.get(model, 0) + count
    allowed = [t for t in pools if job.may_use(t)]
    if not allowed:
        want = ", ".join(job.gpu_types)
        have = ", ".join(sorted(pools)) or "none"
        return f"opaque job asks for {want}: no such GPU in the cluster (it has {have})"
    if max(pools[t] for t in allowed) < n:
        most = max(pools[t] for t in allowed)
        return f"opaque job asks for {n} GPUs of one type; the most the cluster has of {'/'.join(allowed)} is {most}"
    return ""
