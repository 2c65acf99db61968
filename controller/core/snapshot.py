"""What a scheduling round sees and what it decides."""

from __future__ import annotations

from dataclasses import dataclass, field

from estimator.models import ModelDims


@dataclass(frozen=True)
class GpuView:
    index: int
    model: str
    memory_bytes: int
    foreign_used_bytes: int = 0


@dataclass(frozen=True)
class NodeView:
    """A node that may receive work this round (READY), with the GPU indices already held."""

    id: str
    gpus: tuple[GpuView, ...]
    busy: frozenset[int] = frozenset()

    def idle(self) -> tuple[GpuView, ...]:
        return tuple(g for g in self.gpus if g.index not in self.busy)


@dataclass(frozen=True)
class JobView:
    id: str
    submit_time: float
    model: ModelDims
    global_batch_size: int
    gpus_hint: int = 0
    gpu_types: tuple[str, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[NodeView, ...]
    # Jobs waiting for a placement, in no particular order (the policy orders them).
    pending: tuple[JobView, ...]
    # GPU models that exist in the cluster at all, READY or not: a pending reason names them.
    cluster_gpus: tuple[tuple[str, int, int], ...] = ()  # (model, memory_bytes, count)


@dataclass(frozen=True)
class PlanChoice:
    dp: int
    tp: int
    pp: int
    micro_batch: int
    grad_accum: int
    gpu_model: str
    memory_per_gpu_bytes: int
    memory_source: str

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp


@dataclass(frozen=True)
class Slice:
    node_id: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class Decision:
    job_id: str
    # "start": place now; "pending": leave waiting, reason says why.
    action: str
    reason: str
    plan: PlanChoice | None = None
    slices: tuple[Slice, ...] = ()


@dataclass(frozen=True)
class RoundPlan:
    decisions: tuple[Decision, ...] = field(default_factory=tuple)

    def starts(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.action == "start")
