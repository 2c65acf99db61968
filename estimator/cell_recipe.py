"""The job's recipe in the Cells: one pure map from (ModelDims, global batch, recipe) to the CellModel
the Cell estimator costs, used wherever a job's Cells or memory are estimated (the live controller's
Cells, GetCells/PlaceStages, `tessctl estimate cells|stages`).

A job's `plan:` (JobSpec.plan) fixes how it trains, not where: the Cells still choose the GPUs, the
stages and the dp x tp layout, and the worker runs their plan with the recipe's fields on top
(controller/convert.py plan_pb: a field counts when the job sets it). So a field the job does not
set keeps the Cells' own choice (the caller's `precision`, `recompute`, `flash_attention`), and a
field it sets replaces it:

- precision: weight/gradient/optimizer bytes (memory_terms.RECIPES), activation bytes;
- checkpointing none | op | full (+ checkpoint_every n: every n-th layer): CellModel.recompute,
  op_checkpoint, checkpoint_every (stage memory: what each layer keeps; time: the recomputed forward,
  all of it under full, half the weight GEMMs under op as plan_time.py counts it);
- flash_attention: CellModel.flash_attention (attention costs, layer_costs.py);
- lora_rank / lora_targets / base_quant / offload frozen: a frozen base (weights only, at the
  recipe's parameter bytes, QLoRA's quantized bytes, or none on the GPU when offloaded), adapters
  trained with the recipe's bytes; the base's linears skip their weight gradient and the adapters add
  lora_costs.py's FLOPs (`lora_cell_operators`, the rule plan_time.py times);
- float8 / compile: compute.stage_compute_time's factors (a GPU without FP8 gets no Cell:
  cells.check_recipe_cell names plan.float8);
- sharding none | zero1 | fsdp (zero3 = fsdp, the same bytes) and reshard_after_forward: the
  optimizer sharding of every stage, and one-stage Cells shard with FSDP at every dp > 1;
- loss fp32: the head keeps the fp32 log-softmax for backward.

What the Cells cannot express is refused by name (PlanInputError "plan.X"): the parallel sizes (the
Cells choose them; `tessctl estimate time` times a given plan), context parallelism, zero2,
Megatron's selective recompute, optimizer offload, async TP, the GPipe schedule, LoRA on MoE models.
What they express only in part comes back as a stated warning: the chunked loss (counted as whole
fp32 logits), Float8's casts and compile's smaller activations (not counted), QLoRA's dequantization
and the frozen offload's host traffic (not timed), sequence parallelism (activations not sharded over
TP in the Cells).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, fields, replace

from tessera.estimator.cells import CellInputError, CellModel
from tessera.estimator.memory_terms import RECIPES
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError

# Bytes per frozen base parameter under QLoRA: NF4 is 4 bits (Dettmers et al. 2023, arXiv 2305.14314,
# Sec. 3; plan_time.QUANT_BYTES), LLM.int8 one byte.
QUANT_BYTES = {"nf4": 0.5, "int8": 1.0}

# The parallel sizes: the Cells choose them (common/jobspec.py PLAN_SIZES: a job may not set them).
SIZES = ("dp", "tp", "pp", "micro_batch", "grad_accum", "ep", "virtual_stages")


@dataclass(frozen=True)
class JobRecipe:
    """A job's recipe: the plan as the library reads it, and the fields the job set (the rest are
    the Cells' own choices)."""

    plan: ExecutionPlan
    given: frozenset[str]
    # (field, reason) when the job's stored plan is not a valid recipe (validated at submission, so
    # only a record from an older vocabulary): every estimate refuses it by that field
    refused: tuple[str, str] | None = None

    @property
    def key(self) -> str:
        """A cache key: the set fields and their values, sorted."""
        if self.refused is not None:
            return f"refused:{self.refused[0]}"
        return ",".join(f"{k}={getattr(self.plan, k)}" for k in sorted(self.given))

    @classmethod
    def of(cls, plan: ExecutionPlan, given: Collection[str] | None = None) -> JobRecipe:
        """`given` None: a whole plan, every recipe field as it says (sizes only where they are not 1)."""
        if given is None:
            given = [f.name for f in fields(plan) if f.name not in SIZES + ("cp",) or getattr(plan, f.name) != 1]
        unknown = sorted(set(given) - {f.name for f in fields(plan)})
        if unknown:
            raise PlanInputError(f"plan.{unknown[0]}", "unknown field")
        return cls(plan, frozenset(given))


@dataclass(frozen=True)
class RecipeCells:
    """The CellModel of a job with its recipe, and what the Cells estimate only in part."""

    model: CellModel
    warnings: tuple[str, ...] = ()


def recipe_cell_model(dims: ModelDims, global_batch: int, recipe: JobRecipe | ExecutionPlan | None = None, *,
                      precision: str = "mixed", recompute: bool = True, flash_attention: bool = False,
                      expert_group_size: int = 2048, name: str | None = None) -> RecipeCells:
    """The CellModel the Cell estimator needs for `dims` at `global_batch` trained with `recipe` (the
    module doc). `precision`, `recompute` and `flash_attention` are the Cells' own choices, kept for
    the fields the recipe does not set. PlanInputError names a recipe field the Cells cannot express;
    CellInputError comes from the model itself."""
    base = CellModel.from_dims(dims, global_batch, precision=precision, recompute=recompute,
                               expert_group_size=expert_group_size, name=name, flash_attention=flash_attention)
    if recipe is None:
        return RecipeCells(base)
    job = recipe if isinstance(recipe, JobRecipe) else JobRecipe.of(recipe)
    if job.refused is not None:
        raise PlanInputError(*job.refused)
    p, given = job.plan, job.given
    if not given:
        return RecipeCells(base)
    if dims.family == "wresnet":
        raise PlanInputError(f"plan.{min(given)}", "a Wide-ResNet's Cells train with the Crius artifact's "
                                                         "recipe (float32, SGD with momentum); leave plan unset")
    _refuse(dims, p, given)
    warnings: list[str] = []
    changes: dict[str, object] = {}

    if "precision" in given:
        r = RECIPES[p.precision]
        changes.update(precision=p.precision, dtype_bytes=r.activation, weight_grad_bytes=float(r.param + r.grad),
                       optimizer_bytes_per_param=float(r.optimizer))
    if "flash_attention" in given:
        changes["flash_attention"] = p.flash_attention
    if "checkpointing" in given:
        changes["recompute"] = p.checkpointing in ("op", "full")
        changes["op_checkpoint"] = p.checkpointing == "op"
    if "checkpoint_every" in given:
        changes["checkpoint_every"] = p.checkpoint_every
    if p.checkpointing == "op" and "checkpointing" in given:
        changes.update(ffn_hidden=dims.ffn, gated=dims.gated)  # which MLP outputs per-op SAC saves
    if "sharding" in given:
        changes["sharding"] = {"none": "none", "zero1": "zero1", "zero3": "fsdp", "fsdp": "fsdp"}[p.sharding]
    if "reshard_after_forward" in given:
        changes["reshard"] = p.reshard_after_forward
    if "loss" in given and p.loss == "fp32":
        changes["loss"] = "fp32"
    if "loss" in given and p.loss == "chunked":
        warnings.append("plan.loss: chunked is estimated as whole fp32 logits (the Cells' head), an upper bound")
    if "float8" in given and p.float8 != "none":
        changes["float8"] = p.float8
        warnings.append("plan.float8: the Cells time the Float8 GEMMs but not torchao's casts, and count no "
                        "memory change")
    if "compile" in given and p.compile:
        changes["compiled"] = True
        warnings.append("plan.compile: the Cells time compile's fused traffic but count the uncompiled activations")
    if "sequence_parallel" in given and p.sequence_parallel:
        warnings.append("plan.sequence_parallel: the Cells' tensor-parallel stages do not shard the norm and "
                        "dropout activations; estimated without it")
    if p.lora_rank:
        prec = str(changes.get("precision", base.precision))
        frozen = float(RECIPES[prec].param)  # PEFT keeps the base in the model's dtype
        if p.base_quant != "none":
            frozen = QUANT_BYTES[p.base_quant]
            warnings.append(f"plan.base_quant: {p.base_quant} weights are counted, their dequantization per "
                            "pass is not timed in the Cells (tessctl estimate time does)")
        if p.offload == "frozen":
            frozen = 0.0
            warnings.append("plan.offload: the frozen base is held in host memory; its host-to-GPU traffic is not "
                            "timed")
        changes.update(lora_rank=p.lora_rank, lora_targets=p.lora_targets, ffn_hidden=dims.ffn, gated=dims.gated,
                       frozen_bytes=frozen)
    try:
        model = replace(base, **changes)  # type: ignore[arg-type]
    except CellInputError as exc:
        raise PlanInputError(f"plan.{exc.field}", exc.reason) from None
    return RecipeCells(model, tuple(warnings))


def _refuse(dims: ModelDims, p: ExecutionPlan, given: frozenset[str]) -> None:
    """The recipe fields the Cells cannot express, by name."""
    if "cp" in given and p.cp != 1:
        raise PlanInputError("plan.cp", "context parallelism is not among the Cells' layouts (dp x tp stages); "
                                        "tessctl estimate time times a plan with cp")
    for f in SIZES:
        if f in given and getattr(p, f) != 1:
            raise PlanInputError(f"plan.{f}", "a parallel size is what the Cells choose; tessctl estimate time times "
                                              "a given plan")
    if "sharding" in given and p.sharding == "zero2":
        raise PlanInputError("plan.sharding", "zero2 is not among the Cells' stage options (none, zero1, fsdp/zero3)")
    if "checkpointing" in given and p.checkpointing == "selective":
        raise PlanInputError("plan.checkpointing", "Megatron's selective recompute is not in the Cells; use op or full")
    if "offload" in given and p.offload in ("optimizer", "optimizer+params"):
        raise PlanInputError("plan.offload", f"{p.offload!r}: the Cells neither hold state in host memory nor time "
                                             "the CPU optimizer step")
    if "async_tp" in given and p.async_tp:
        raise PlanInputError("plan.async_tp", "micro-pipelined TP is not timed in the Cells")
    if "schedule" in given and p.schedule == "gpipe":
        raise PlanInputError("plan.schedule", "the Cells hold 1F1B's in-flight micro-batches, not GPipe's")
    if p.lora_rank and dims.family not in ("decoder", "encoder"):
        raise PlanInputError("plan.lora_rank", f"LoRA Cells are for dense transformers, not {dims.family!r}")


def recipe_on(recipe: JobRecipe | None, base: ExecutionPlan) -> ExecutionPlan:
    """`base` (a scheduler's plan: its sizes and own recipe) with the job's recipe fields on top, as
    the controller launches it (controller/convert.py plan_pb); the sizes stay the scheduler's.
    PlanInputError when the combination does not exist."""
    if recipe is None:
        return base
    if recipe.refused is not None:
        raise PlanInputError(*recipe.refused)
    changes = {f: getattr(recipe.plan, f) for f in recipe.given if f not in SIZES + ("cp",)}
    return replace(base, **changes)
