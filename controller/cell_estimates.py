"""The live controller's `Estimates` (controller/core/policy.py): Crius's Cell estimator
(estimator/cells.py) over the GPU types the registered nodes have.

Only Cells whose best plan has one (dp, tp) layout in every stage are offered: that is what a worker
can run from a single `Plan` (dp x tp x pp ranks, global batch = micro_batch x grad_accum x dp).

The Cells' memory is a quick figure (estimator/cells.py), below tessera.estimator.memory's for some
plans (pipelined stages above all: docs/estimator-cells.md, "Cell memory against the formula"). So a
Cell is offered only when the plan the worker is launched with (the Cell's plan with the job's recipe
on top) also fits by the memory formula, and its memory is the larger of the two figures: a Cell
marked as fitting never launches a plan the formula says runs out of memory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tessera.controller.core.policy import CellEstimate
from tessera.controller.core.snapshot import Cell, JobView, PlanChoice
from tessera.estimator.cell_recipe import recipe_cell_model, recipe_on
from tessera.estimator.cells import Cell as EstimatedCell
from tessera.estimator.cells import CellEstimator, CellInputError, CellModel, GpuPool
from tessera.estimator.memory import estimate_memory
from tessera.estimator.plans import ExecutionPlan, PlanInputError

# (tenant, Cell model signature, GPU type, GPUs, stages): what a measured iteration time belongs to.
# Per tenant: a job's workers run its tenant's code, so what they report may steer the estimates of
# that tenant's jobs only (docs/security.md).
MeasuredKey = tuple[str, str, str, int, int]


# The attention the jobs Tessera launches run: the reference trainer calls F.scaled_dot_product_attention
# (is_causal=True: flash kernels on GPUs that have them) and ExecutionPlan's flash_attention defaults to
# True; their Cells are timed so (estimator/layer_costs.py: no score traffic, causal halving, GQA) and
# their plans say so. The Crius artifact's jobs ran Alpa without flash attention: the simulator's
# estimator oracle over them passes False (controller/sim/oracles.py).
JOB_FLASH_ATTENTION = True


def job_cell_model(job: JobView, flash_attention: bool = JOB_FLASH_ATTENTION) -> CellModel | None:
    """The job's CellModel with its recipe (estimator/cell_recipe.py: the fields the job's plan sets
    replace the Cells' own mixed precision, full recomputation and flash attention); None when the
    Cells cannot estimate the model or the recipe (that job has no Cells: it waits with the reason the
    policy gives, and `recipe_refusal` says which field)."""
    try:
        return recipe_cell_model(job.model, job.global_batch_size, job.recipe, flash_attention=flash_attention).model
    except (CellInputError, PlanInputError):
        return None


def recipe_refusal(job: JobView) -> str:
    """Why the Cells cannot estimate the job: the recipe field they refuse ("plan.cp: ...") or the
    model field ("model.capacity_factor: ..."), or "" when they take it. Without it a job the Cells
    refuse waits on "fits nowhere" with no cause (a live audit: dropless MoE)."""
    try:
        recipe_cell_model(job.model, job.global_batch_size, job.recipe)
    except PlanInputError as exc:
        return str(exc)
    except CellInputError as exc:
        return f"model.{exc.field}: {exc.reason}"
    return ""


# What the memory formula says of a launched plan: (fits, bytes per GPU incl. its reserve), or None
# when the formula does not cover the plan (then the Cells' figure stands alone).
FormulaFit = tuple[bool, int] | None
MAX_FORMULA_CHECKS = 20_000  # (model, plan, GPU type) answers kept; a round asks the same again


def formula_fit(job: JobView, plan: ExecutionPlan, gpu_type: str) -> FormulaFit:
    """tessera.estimator.memory's verdict on the plan the job's workers would run on `gpu_type`: the
    Cell's plan with the job's recipe on top (controller/convert.py plan_pb launches it so)."""
    try:
        m = estimate_memory(job.model, recipe_on(job.recipe, plan), gpu=gpu_type)
    except PlanInputError:
        return None
    return bool(m.fits), m.reserved + m.other


@dataclass(frozen=True)
class MemoryNeed:
    """The least memory per GPU any plan the Cells consider needs on `gpus` GPUs of a type (in
    `stages` pipeline stages), where none fits: what a job that fits nowhere is told (the memory
    formula's figure for a plan that fits by the Cells' alone)."""

    gpu_type: str
    gpus: int
    stages: int
    bytes_per_gpu: float
    usable_bytes: float  # what a GPU of the type gives a plan: the Cells' usable fraction of its memory


FITS = object()  # (least_need's memo: a plan of that count fits)


def measured_key(job: JobView, cell: Cell, flash_attention: bool = JOB_FLASH_ATTENTION) -> MeasuredKey | None:
    model = job_cell_model(job, flash_attention)
    if model is None:
        return None
    return (job.tenant, model.signature, cell.gpu_type, cell.gpus, cell.stages)


class CellEstimates:
    """Estimates over the cluster's GPU pools: {type: (total GPUs, GPUs per node, NVLink)}."""

    def __init__(self, pools: dict[str, tuple[int, int, bool]], max_gpus: int = 64,
                 measured: Mapping[MeasuredKey, float] | None = None,
                 flash_attention: bool = JOB_FLASH_ATTENTION, formula_check: bool | None = None) -> None:
        self.flash_attention = flash_attention
        # The formula checks the plans Tessera launches (PyTorch stacks with flash attention); the
        # simulator's replay of the Crius artifact (flash_attention False) ran Alpa, which it does not model.
        self.formula_check = flash_attention if formula_check is None else formula_check
        self._formula: dict[tuple[object, ...], FormulaFit] = {}
        self.pools = {t: GpuPool(t, n, per, "nvlink" if nv else "pcie") for t, (n, per, nv) in pools.items()}
        self.est = CellEstimator()
        self.max_gpus = max_gpus
        self.measured: dict[MeasuredKey, float] = dict(measured or {})
        self._needs: dict[tuple[object, ...], MemoryNeed | object | None] = {}
        # Its own estimator: the round's event loop asks while a forecast thread may use `est`.
        self._need_est: CellEstimator | None = None

    def record_measured(self, job: JobView, cell: Cell, seconds: float) -> MeasuredKey | None:
        """A running job's measured iteration time for its Cell: later answers for that Cell, for
        the jobs of the job's tenant, carry it (source "measured"). Returns the key it is kept under,
        None if the job's model has no Cells."""
        key = measured_key(job, cell, self.flash_attention)
        if key is not None:
            self.measured[key] = seconds
        return key

    def cells(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> Sequence[CellEstimate]:
        pool = self.pools.get(gpu_type)
        if pool is None or nodes < 1 or gpus % nodes or gpus > pool.num_gpus:
            return ()
        model = job_cell_model(job, self.flash_attention)
        if model is None:
            return ()
        out = []
        stages = 1
        while stages <= min(gpus, model.num_layers):  # a t5 CellModel counts both stacks
            try:
                c = self.est.cell(model, pool, gpus, stages, nodes=nodes, gpus_per_node=gpus // nodes)
            except CellInputError:
                c = None
            ep = c.execution_plan if c is not None and c.iter_time is not None else None
            got = self._checked(job, c) if c is not None and ep is not None else None
            if c is not None and c.iter_time is not None and ep is not None and got is not None:
                mem, mem_source = got
                plan = PlanChoice(ep.dp, ep.tp, ep.pp, ep.micro_batch, ep.grad_accum, gpu_type, mem, mem_source,
                                  ep)
                it, source = c.iter_time.value, c.iter_time.source
                if (seen := self.measured.get((job.tenant, model.signature, gpu_type, gpus, stages))) is not None:
                    it, source = seen, "measured"
                out.append(CellEstimate(Cell(gpu_type, gpus, stages), it, mem, plan, source))
            stages *= 2
        return out

    def _checked(self, job: JobView, c: EstimatedCell) -> tuple[int, str] | None:
        """(memory per GPU, its source) of a fitting Cell with a plan that also fits by the memory
        formula (`formula_fit`), the larger figure of the two; None when either says it does not fit."""
        if not c.fits or c.execution_plan is None:
            return None
        mem = int(c.memory_per_gpu.value) if c.memory_per_gpu else 0
        source = c.memory_per_gpu.source if c.memory_per_gpu else ""
        verdict = self._formula_fit(job, c.execution_plan, c.gpu_type)
        if verdict is None:
            return mem, source
        fits, need = verdict
        if not fits:
            return None
        return (need, "formula") if need > mem else (mem, source)

    def _formula_fit(self, job: JobView, plan: ExecutionPlan, gpu_type: str) -> FormulaFit:
        if not self.formula_check:
            return None
        key = (job.model, job.recipe.key if job.recipe is not None else "", plan, gpu_type)
        if key not in self._formula:
            if len(self._formula) >= MAX_FORMULA_CHECKS:
                self._formula.clear()
            self._formula[key] = formula_fit(job, plan, gpu_type)
        return self._formula[key]

    def gpu_counts(self, job: JobView, gpu_type: str) -> Sequence[int]:
        pool = self.pools.get(gpu_type)
        if pool is None:
            return ()
        out = []
        n = 1
        while n <= min(pool.num_gpus, self.max_gpus):
            nodes = math.ceil(n / pool.gpus_per_node)
            if n % nodes == 0 and self.cells(job, gpu_type, n, nodes):
                out.append(n)
            n *= 2
        return out

    def least_need(self, job: JobView) -> tuple[MemoryNeed, ...] | None:
        """Per GPU type the job may use, the least memory per GPU its plans need on the most GPUs it
        may have there (its `gpus` hint, else the largest count the Cells consider), over every
        stage count, where no plan of that count fits. () when memory is not why it waits (a plan
        fits on a type, or no type has its hint's GPUs); None when the Cells give no figure (they
        cannot estimate the job, or lay out its count). Memoised: the round asks again for every
        job that fits nowhere."""
        model = job_cell_model(job, self.flash_attention)
        if model is None:
            return None
        out = []
        over = 0  # types its hint is larger than: the count is why, not memory
        pools = [(t, pool) for t, pool in sorted(self.pools.items()) if not job.gpu_types or t in job.gpu_types]
        for t, pool in pools:
            if job.gpus_hint > pool.num_gpus:
                over += 1
                continue
            n = self._count(job, pool)
            if n < 1:
                continue
            k = (model.signature, job.model, job.recipe.key if job.recipe is not None else "", t, n)
            if k not in self._needs:
                self._needs[k] = self._need(job, model, pool, n)
            got = self._needs[k]
            if got is FITS:
                return ()
            if isinstance(got, MemoryNeed):
                out.append(got)
        if not out and not (pools and over == len(pools)):
            return None  # no figure of the Cells (no pool, a count past their cap or layout): MARP's stands
        return tuple(out)

    def _count(self, job: JobView, pool: GpuPool) -> int:
        """The most GPUs of the pool the job may have in one Cell: its hint (0 when the Cells would
        not lay it out: past their cap, or no even share per node), else the largest power of two
        the Cells offer."""
        most = min(pool.num_gpus, self.max_gpus)
        if job.gpus_hint:
            n = job.gpus_hint
            return n if n <= most and n % math.ceil(n / pool.gpus_per_node) == 0 else 0
        n = 1 << (most.bit_length() - 1) if most > 0 else 0
        while n > 1 and n % math.ceil(n / pool.gpus_per_node):
            n //= 2
        return n

    def _need(self, job: JobView, model: CellModel, pool: GpuPool, gpus: int) -> MemoryNeed | object | None:
        """The least need over the stage counts of `gpus` GPUs; FITS when a plan fits (by the Cells and
        by the memory formula, as `cells` offers it), None when no Cell of that count could be formed.
        A Cell the formula refuses needs what the formula says."""
        nodes = math.ceil(gpus / pool.gpus_per_node)
        est = self._need_est = self._need_est or CellEstimator()
        usable = pool.gpu_type.memory_bytes * est.config.usable_memory_fraction
        best: MemoryNeed | None = None
        stages = 1
        while stages <= min(gpus, model.num_layers):
            try:
                c = est.cell(model, pool, gpus, stages, nodes=nodes, gpus_per_node=gpus // nodes)
            except CellInputError:
                c = None
            need = c.memory_needed_per_gpu if c is not None else 0.0
            if c is not None and c.fits:
                if c.execution_plan is None or self._checked(job, c) is not None:
                    return FITS
                verdict = self._formula_fit(job, c.execution_plan, c.gpu_type)
                need = float(verdict[1]) if verdict is not None else 0.0
            if need > 0 and (best is None or need < best.bytes_per_gpu):
                best = MemoryNeed(pool.gpu, gpus, stages, need, usable)
            stages *= 2
        return best
