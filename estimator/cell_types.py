"""The Cell estimator's plan types and pipeline latency (Crius Sec. 5.1), below the search and the
estimator that share them (estimator/cells.py re-exports every name here).

A stage option is a `StagePlan` (operators, dp x tp, sharding) with its `StageCost`; a Cell's plan is
a `CellPlan` (one per stage, and the micro-batch count B); `iteration_time` is Sec. 5.1's

    T_iter = sum_i T_i + (B - 1) * max_i (T_i - Tcomm_i) + max_i (Tsync_i + Topt_i)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tessera.common.errors import InvalidArgument


class CellInputError(InvalidArgument, ValueError):
    """Bad input to the Cell estimator; `field` names the offending field, `reason` says why."""


@dataclass(frozen=True)
class StagePlan:
    """One stage: operators [start, end), its GPUs and their (dp, tp) layout (tp ranks innermost);
    `sharding` "fsdp" when its DP ranks shard weights, gradients and optimizer (cell_fsdp.py)."""

    start: int
    end: int
    dp: int
    tp: int
    sharding: str = "none"

    @property
    def gpus(self) -> int:
        return self.dp * self.tp

    @property
    def kind(self) -> str:
        if self.tp == 1:
            return "dp"
        return "tp" if self.dp == 1 else "hybrid"


@dataclass(frozen=True)
class CellPlan:
    stages: tuple[StagePlan, ...]
    num_microbatches: int

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def num_gpus(self) -> int:
        return sum(s.gpus for s in self.stages)

    def describe(self) -> str:
        """e.g. pp2[tp4,dp2xtp2]xmb8; an FSDP stage reads fsdp8 or fsdp4xtp2."""
        def one(s: StagePlan) -> str:
            d = "fsdp" if s.sharding == "fsdp" else "dp"
            return f"{d}{s.dp}" if s.tp == 1 else f"tp{s.tp}" if s.dp == 1 else f"{d}{s.dp}xtp{s.tp}"
        return f"pp{self.num_stages}[{','.join(one(s) for s in self.stages)}]xmb{self.num_microbatches}"


@dataclass(frozen=True)
class StageCost:
    """Costs of one stage option, per micro-batch unless said otherwise (seconds, bytes)."""

    plan: StagePlan
    compute: float
    intra_comm: float  # TP all-reduces + MoE all-to-all, on the critical path
    inter_comm: float  # activation + gradient from/to the previous stage (overlapped in steady state)
    sync: float  # per iteration: DP gradient all-reduce + optimizer step
    memory_bytes: float
    fits: bool
    compute_source: str
    comm_source: str

    @property
    def latency(self) -> float:
        """T_i of Sec. 5.1: compute + intra-stage + inter-stage communication."""
        return self.compute + self.intra_comm + self.inter_comm

    @property
    def busy(self) -> float:
        """T_i - Tcomm_i: what the stage occupies in the steady state."""
        return self.compute + self.intra_comm


@dataclass(frozen=True)
class PlanEstimate:
    plan: CellPlan
    iter_time: float
    stages: tuple[StageCost, ...]

    @property
    def memory_bytes(self) -> float:
        return max(s.memory_bytes for s in self.stages)

    @property
    def fits(self) -> bool:
        return all(s.fits for s in self.stages)

    def breakdown(self) -> dict[str, float]:
        """Totals over the pipeline in the authors' split: computation, intra-, inter-stage comm."""
        b = self.plan.num_microbatches
        k = max(range(len(self.stages)), key=lambda i: self.stages[i].busy)
        comp = sum(s.compute for s in self.stages) + (b - 1) * self.stages[k].compute
        intra = sum(s.intra_comm for s in self.stages) + (b - 1) * self.stages[k].intra_comm
        inter = sum(s.inter_comm for s in self.stages)
        sync = max(s.sync for s in self.stages)
        return {"compute": comp, "intra_comm": intra, "inter_comm": inter, "sync": sync,
                "total": self.iter_time}


def pipeline_latency(latencies: Sequence[float], inter_comm: Sequence[float], num_microbatches: int) -> float:
    """Sec. 5.1: sum_i T_i + (B - 1) * max_i (T_i - Tcomm_i).

    `latencies[i]` is T_i (stage compute + its communication for one micro-batch) and `inter_comm[i]`
    the part of it spent receiving from the previous stage, overlapped in the steady state.
    """
    if len(latencies) != len(inter_comm) or not latencies:
        raise CellInputError("latencies", "need one latency and one inter-stage time per stage")
    if num_microbatches < 1:
        raise CellInputError("num_microbatches", f"must be >= 1, got {num_microbatches}")
    return sum(latencies) + (num_microbatches - 1) * max(t - c for t, c in zip(latencies, inter_comm))


def iteration_time(stages: Sequence[StageCost], num_microbatches: int) -> float:
    """Pipeline latency plus the once-per-iteration gradient sync and optimizer step (max over stages)."""
    lat = pipeline_latency([s.latency for s in stages], [s.inter_comm for s in stages], num_microbatches)
    return lat + max(s.sync for s in stages)
