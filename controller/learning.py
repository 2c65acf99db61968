"""Step-time learning: running jobs' rank-0 step times become measured Cell iteration times.

`StepTimes` (controller/core/step_times.py) keeps the per-attempt windows; `StepLearner` adds what
the live controller needs around it: which placements may be learned from, the measured times kept
across estimate rebuilds, the memoised Cell estimates over the registered GPU pools, and the text
of the MEASURED event. No I/O: the engine stores the event and forwards the steps to the estimator.
In memory: a restarted controller learns again from the next reports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tessera.common.gpus import CATALOG
from tessera.controller.cell_estimates import CellEstimates, MeasuredKey, MemoryNeed, measured_key
from tessera.controller.core.policy import CachedEstimates, CellEstimate
from tessera.controller.core.snapshot import Cell, JobView
from tessera.controller.core.step_times import PLAUSIBLE_FACTOR, Learned, StepTimeConfig, StepTimes, plausible
from tessera.controller.snapshots import gpu_pools
from tessera.controller.store import JobRecord, NodeRecord
from tessera.v1 import common_pb2

P = common_pb2


def learnable(job: JobRecord, records: Mapping[str, NodeRecord], mode: str) -> tuple[str, list[int]] | None:
    """(GPU type, GPUs per node) of the job's placement when its step times may be learned from.
    `mode`: "nvml" (only GPUs NVML probed), "all" (declared inventories too) or "off"."""
    if mode == "off" or job.plan is None or job.placement is None or job.plan.stages:
        return None  # (a staged pipeline's uneven split is no Cell of the estimates)
    if not job.spec.HasField("model"):
        return None  # an opaque job: no model, no Cell to learn for (docs/opaque-jobs.md)
    types: set[str] = set()
    per_node: list[int] = []
    for s in job.placement.slices:
        rec = records.get(s.node_id)
        if rec is None:
            return None
        if mode == "nvml" and rec.inventory.source != P.INVENTORY_SOURCE_NVML:
            return None  # a declared GPU: the worker's step time is not that GPU's
        by_index = {g.index: g.model for g in rec.inventory.gpus}
        types.update(by_index.get(i, "") for i in s.gpu_indices)
        per_node.append(len(s.gpu_indices))
    if len(types) != 1 or not (t := types.pop()) or t not in CATALOG:
        return None
    return t, per_node


def measured_text(cell: Cell, learned: Learned, before: list[CellEstimate]) -> str:
    text = f"Cell {cell}: measured {learned.seconds:.4g} s/iteration (median of {learned.samples} steps)"
    if before and before[0].source != "measured":
        est = before[0].iteration_s
        off = 100 * (est - learned.seconds) / learned.seconds
        text += f"; estimated {est:.4g} s ({before[0].source}), {abs(off):.0f}% too {'high' if off > 0 else 'low'}"
    return text + "; the next rounds use the measured time"



@dataclass(frozen=True)
class Lesson:
    """What one report taught: the learned median, where it ran, the MEASURED event's text (the
    attempt's first lesson only) and whether a Cell's estimate was replaced. `refused`: why the
    median was not learned (not plausible), "" when it was."""

    learned: Learned
    gpu_type: str
    per_node: list[int]
    view: JobView
    event: str | None
    replaced: bool
    refused: str = ""


class StepLearner:
    def __init__(self, config: StepTimeConfig, mode: str) -> None:
        self.mode = mode
        self.step_times = StepTimes(config)
        # Cells' measured iteration times, kept across estimate rebuilds.
        self.measured: dict[MeasuredKey, float] = {}
        # Each learned Cell's estimate before its first measurement: the measurements' yardstick,
        # so that reports cannot walk it off step by step (after a restart: the first one seen).
        self.reference: dict[MeasuredKey, float] = {}
        self._cache: tuple[object, CachedEstimates] | None = None

    def estimates(self, records: Iterable[NodeRecord]) -> CachedEstimates:
        """Cell estimates over the registered GPU pools, memoised across rounds until the pools change."""
        pools = gpu_pools(records)
        key = tuple(sorted(pools.items()))
        if self._cache is None or self._cache[0] != key:
            known = {m: v for m, v in pools.items() if m in CATALOG}
            self._cache = (key, CachedEstimates(CellEstimates(known, measured=self.measured)))
        return self._cache[1]

    def least_need(self, job: JobView) -> tuple[MemoryNeed, ...] | None:
        """What memory per GPU the job's plans need where none fits (CellEstimates.least_need), on the
        pools of the last round's estimates; None before any round."""
        if self._cache is None:
            return None
        inner = self._cache[1].inner
        return inner.least_need(job) if isinstance(inner, CellEstimates) else None

    def forget(self, job_id: str) -> None:
        self.step_times.forget(job_id)

    def observe(self, job: JobRecord, progress: common_pb2.Progress, view: JobView,
                records: Mapping[str, NodeRecord]) -> Lesson | None:
        """A new rank-0 report of the job's current attempt; a `Lesson` when the estimates learned."""
        where = learnable(job, records, self.mode)
        if where is None:
            return None
        learned = self.step_times.add(job.id, job.attempt, progress.iteration, progress.step_time_seconds,
                                      progress.time)
        if learned is None:
            return None
        gpu_type, per_node = where
        assert job.plan is not None
        p = job.plan
        cell = Cell(gpu_type, p.dp * p.tp * p.pp, p.pp)
        estimates = self.estimates(records.values())
        inner = estimates.inner
        assert isinstance(inner, CellEstimates)
        mkey = measured_key(view, cell, inner.flash_attention)
        # The estimate being replaced, for the event (the attempt's first lesson) and as the Cell's
        # yardstick (its first lesson): a Cell computation, so only then.
        before = ([c for c in estimates.cells(view, gpu_type, cell.gpus, len(per_node)) if c.cell == cell]
                  if learned.first or (mkey is not None and mkey not in self.reference) else [])
        if mkey is not None and before:
            self.reference.setdefault(mkey, before[0].iteration_s)
        ref = self.reference.get(mkey, 0.0) if mkey is not None else 0.0
        if not plausible(learned.seconds, ref):
            why = (f"Cell {cell}: measured {learned.seconds:.4g} s/iteration (median of {learned.samples} steps) is "
                   f"over {PLAUSIBLE_FACTOR:g}x off its estimate {ref:.4g} s: not learned (a broken or forged report)")
            return Lesson(learned, gpu_type, per_node, view, why if learned.first else None, False, why)
        key = inner.record_measured(view, cell, learned.seconds)
        if key is not None:
            self.measured[key] = learned.seconds
            estimates.forget(view.key)
        event = measured_text(cell, learned, before) if learned.first else None
        return Lesson(learned, gpu_type, per_node, view, event, key is not None)
