"""The shared model and plan vocabulary between the tessera.v1 messages and the estimator library.

`ModelSpec` <-> `ModelDims` and `ExecutionPlan` (message) <-> `ExecutionPlan` (dataclass). Used by the
estimator API (estimator/service/handlers.py), tessctl, and the controller's job validation, so a job spec
and an estimator call mean the same model. Imports protobuf messages, never grpc or torch.

Errors are `PlanInputError(field, reason)` (tessera.estimator.plans), with the field as a request path
(``model.hidden_size``, ``plan.dp``).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from tessera.common.jobspec import MAX_GLOBAL_BATCH, MAX_LORA_RANK, model_bound_errors
from tessera.estimator.models import REGISTERED, Family, ModelDims, registered
from tessera.estimator.plans import ExecutionPlan, PlanInputError
from tessera.v1 import common_pb2 as pb

DIM_FIELDS = ("hidden_size", "num_layers", "num_heads", "vocab_size", "seq_length")

FAMILY_OF: dict[int, Family] = {
    pb.MODEL_FAMILY_UNSPECIFIED: "decoder",
    pb.MODEL_FAMILY_DECODER: "decoder",
    pb.MODEL_FAMILY_ENCODER: "encoder",
    pb.MODEL_FAMILY_MOE: "moe",
    pb.MODEL_FAMILY_WIDE_RESNET: "wresnet",
    pb.MODEL_FAMILY_ENCODER_DECODER: "encoder-decoder",
}
FAMILY_VALUE: dict[str, int] = {"decoder": pb.MODEL_FAMILY_DECODER, "encoder": pb.MODEL_FAMILY_ENCODER,
                                "moe": pb.MODEL_FAMILY_MOE, "wresnet": pb.MODEL_FAMILY_WIDE_RESNET,
                                "encoder-decoder": pb.MODEL_FAMILY_ENCODER_DECODER}

# enum value <-> the library's spelling; UNSPECIFIED reads as the library's default.
SHARDING: dict[int, str] = {pb.SHARDING_UNSPECIFIED: "none", pb.SHARDING_NONE: "none", pb.SHARDING_ZERO1: "zero1",
                            pb.SHARDING_ZERO2: "zero2", pb.SHARDING_ZERO3: "zero3", pb.SHARDING_FSDP: "fsdp"}
OFFLOAD: dict[int, str] = {pb.OFFLOAD_UNSPECIFIED: "none", pb.OFFLOAD_NONE: "none",
                           pb.OFFLOAD_OPTIMIZER: "optimizer", pb.OFFLOAD_OPTIMIZER_AND_PARAMS: "optimizer+params",
                           pb.OFFLOAD_FROZEN: "frozen"}
CHECKPOINTING: dict[int, str] = {pb.CHECKPOINTING_UNSPECIFIED: "none", pb.CHECKPOINTING_NONE: "none",
                                 pb.CHECKPOINTING_SELECTIVE: "selective", pb.CHECKPOINTING_FULL: "full",
                                 pb.CHECKPOINTING_OP: "op"}
PRECISION: dict[int, str] = {
    pb.PRECISION_FP32: "fp32", pb.PRECISION_AMP: "amp", pb.PRECISION_MIXED: "mixed",
    pb.PRECISION_MEGATRON_BF16: "megatron-bf16", pb.PRECISION_MEGATRON_FP16: "megatron-fp16",
    pb.PRECISION_BF16: "bf16", pb.PRECISION_MIXED_ADAFACTOR: "mixed-adafactor",
}
SCHEDULE: dict[int, str] = {pb.PIPELINE_SCHEDULE_UNSPECIFIED: "1f1b", pb.PIPELINE_SCHEDULE_1F1B: "1f1b",
                            pb.PIPELINE_SCHEDULE_GPIPE: "gpipe"}
RESHARD: dict[int, str] = {pb.RESHARD_UNSPECIFIED: "auto", pb.RESHARD_AUTO: "auto", pb.RESHARD_ALWAYS: "always",
                           pb.RESHARD_NEVER: "never"}
LOSS: dict[int, str] = {pb.LOSS_UNSPECIFIED: "fused", pb.LOSS_FUSED: "fused", pb.LOSS_FP32: "fp32",
                        pb.LOSS_CHUNKED: "chunked"}
FLOAT8: dict[int, str] = {pb.FLOAT8_UNSPECIFIED: "none", pb.FLOAT8_NONE: "none", pb.FLOAT8_LINEAR: "linear",
                          pb.FLOAT8_LINEAR_ALLGATHER: "linear+allgather"}
LORA_TARGETS: dict[int, str] = {pb.LORA_TARGETS_UNSPECIFIED: "all-linear", pb.LORA_TARGETS_QV: "qv",
                                pb.LORA_TARGETS_ATTENTION: "attention", pb.LORA_TARGETS_ALL_LINEAR: "all-linear"}
BASE_QUANT: dict[int, str] = {pb.BASE_QUANT_UNSPECIFIED: "none", pb.BASE_QUANT_NONE: "none",
                              pb.BASE_QUANT_NF4: "nf4", pb.BASE_QUANT_INT8: "int8"}
DEFAULT_PRECISION = "megatron-bf16"  # tessera.estimator.plans.ExecutionPlan's default

# Sizes: 0 in a message means 1 (grad_accum: derived from the global batch when one is given).
PLAN_INT_FIELDS = ("dp", "tp", "pp", "micro_batch", "grad_accum", "ep", "virtual_stages", "cp", "checkpoint_every")
# The parallel sizes a scheduler chooses; a job's recipe (JobSpec.plan) leaves them unset.
PLAN_SIZE_FIELDS = ("dp", "tp", "pp", "cp", "micro_batch", "grad_accum", "ep", "virtual_stages")
PLAN_BOOL_FIELDS = ("sequence_parallel", "flash_attention", "compile", "async_tp")
# Enum fields of the message and their tables (precision aside: its UNSPECIFIED depends on the API).
PLAN_ENUMS: dict[str, dict[int, str]] = {
    "sharding": SHARDING, "offload": OFFLOAD, "checkpointing": CHECKPOINTING, "schedule": SCHEDULE,
    "reshard_after_forward": RESHARD, "loss": LOSS, "float8": FLOAT8, "lora_targets": LORA_TARGETS,
    "base_quant": BASE_QUANT,
}


def _inverse(table: dict[int, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for value, name in table.items():
        if value:  # the explicit value, not UNSPECIFIED
            out.setdefault(name, value)
    return out


SHARDING_VALUE = _inverse(SHARDING)
OFFLOAD_VALUE = _inverse(OFFLOAD)
CHECKPOINTING_VALUE = _inverse(CHECKPOINTING)
PRECISION_VALUE = _inverse(PRECISION)
SCHEDULE_VALUE = _inverse(SCHEDULE)
PLAN_ENUM_VALUES: dict[str, dict[str, int]] = {name: _inverse(t) for name, t in PLAN_ENUMS.items()}
PLAN_ENUM_VALUES["precision"] = PRECISION_VALUE


# -- models -----------------------------------------------------------------------------------------


def model_refinements(m: pb.ModelSpec) -> dict[str, Any]:
    """ModelDims keyword arguments of a spec's family fields (ModelSpec fields 7-24); every default
    maps to ModelDims's own default, so a spec without them is the GPT-2-style decoder it always was.
    `dropless` is ModelDims's capacity_factor 0 (a 0 capacity_factor in the message means 1.0)."""
    if m.family not in FAMILY_OF:
        raise PlanInputError("model.family", f"unknown family value {m.family}")
    if not math.isfinite(m.capacity_factor) or m.capacity_factor < 0:
        raise PlanInputError("model.capacity_factor", f"must be a number > 0 (0 = 1.0), got {m.capacity_factor!r}")
    for f in ("top_k", "moe_every", "width_factor"):
        if getattr(m, f) < 0:
            raise PlanInputError(f"model.{f}", f"must be >= 1 (0 = 2), got {getattr(m, f)}")
    if not math.isfinite(m.logit_softcap) or m.logit_softcap < 0:
        raise PlanInputError("model.logit_softcap", f"must be a number >= 0 (0 = none), got {m.logit_softcap!r}")
    family = FAMILY_OF[m.family]
    if m.dropless and family != "moe":
        raise PlanInputError("model.dropless", f"only the moe family routes tokens (family {family!r})")
    return {
        "family": family, "ffn_hidden": m.ffn_hidden, "gated": m.gated,
        "num_kv_heads": m.num_kv_heads, "tied_embeddings": not m.untied_embeddings,
        "num_experts": m.num_experts, "top_k": m.top_k or 2, "moe_every": m.moe_every or 2,
        "capacity_factor": 0.0 if m.dropless else (m.capacity_factor or 1.0),
        "width_factor": (m.width_factor or 2) if family == "wresnet" else m.width_factor,
        "kv_channels": m.kv_channels, "qkv_bias": m.qkv_bias, "num_decoder_layers": m.num_decoder_layers,
        "decoder_seq_length": m.decoder_seq_length, "sliding_window": m.sliding_window,
        "logit_softcap": m.logit_softcap, "sandwich_norm": m.sandwich_norm,
    }


def model_dims(m: pb.ModelSpec) -> ModelDims:
    """The ModelDims of a spec: its explicit dimensions, else its registered name.

    With explicit dimensions all five are required and each must be >= 1; the family fields refine
    them. A name alone must be registered (the family fields are then ignored: the registry says).
    PlanInputError naming the field on anything else.
    """
    bound = model_bound_errors(m)  # the bounds SubmitJob applies: they also bound this service's work
    if bound:
        raise PlanInputError(*bound[0])
    if not any(getattr(m, f) for f in DIM_FIELDS):
        if not m.name:
            raise PlanInputError("model", "give a registered name or hidden_size, num_layers, num_heads, "
                                          "vocab_size and seq_length")
        dims = registered(m.name)
        if dims is None:
            raise PlanInputError("model.name", f"unknown model {m.name!r}; registered: {', '.join(sorted(REGISTERED))}")
        return dims
    for f in DIM_FIELDS:
        v = getattr(m, f)
        if v < 1:
            raise PlanInputError(f"model.{f}", "required, must be >= 1" if v == 0 else f"must be >= 1, got {v}")
    return ModelDims(m.hidden_size, m.num_layers, m.num_heads, m.vocab_size, m.seq_length, m.name,
                     **model_refinements(m)).validate()


def model_spec(d: ModelDims) -> pb.ModelSpec:
    """The explicit ModelSpec of dimensions (name kept as a label)."""
    return pb.ModelSpec(
        name=d.name, hidden_size=d.hidden_size, num_layers=d.num_layers, num_heads=d.num_heads,
        vocab_size=d.vocab_size, seq_length=d.seq_length, family=FAMILY_VALUE[d.family],
        ffn_hidden=d.ffn_hidden, gated=d.gated, num_kv_heads=d.num_kv_heads, num_experts=d.num_experts,
        top_k=d.top_k, moe_every=d.moe_every,
        capacity_factor=d.capacity_factor if d.family != "moe" or d.capacity_factor else 1.0,
        dropless=d.family == "moe" and d.capacity_factor == 0,
        untied_embeddings=not d.tied_embeddings, width_factor=d.width_factor,
        kv_channels=d.kv_channels, qkv_bias=d.qkv_bias, num_decoder_layers=d.num_decoder_layers,
        decoder_seq_length=d.decoder_seq_length, sliding_window=d.sliding_window,
        logit_softcap=d.logit_softcap, sandwich_norm=d.sandwich_norm,
    )


# -- plans ------------------------------------------------------------------------------------------


def execution_plan(p: pb.ExecutionPlan, global_batch: int = 0, default_precision: str = DEFAULT_PRECISION
                   ) -> ExecutionPlan:
    """The library plan of a message: sizes 0 mean 1, except grad_accum, which is derived from
    `global_batch` when that is > 0 (it must then be a multiple of dp * micro_batch); enums
    UNSPECIFIED mean the library default (precision: `default_precision`). With `global_batch` > 0
    an explicit plan must keep it: dp * micro_batch * grad_accum == global_batch."""
    for f in PLAN_INT_FIELDS:
        v = getattr(p, f)
        if not 0 <= v <= MAX_GLOBAL_BATCH:
            raise PlanInputError(f"plan.{f}", f"must be an integer 1..{MAX_GLOBAL_BATCH:,}, got {v}")
    if not 0 <= p.lora_rank <= MAX_LORA_RANK:  # a job file's bound (common/jobspec.py)
        raise PlanInputError("plan.lora_rank", f"must be an integer 0..{MAX_LORA_RANK:,} (0: full fine-tuning), "
                                               f"got {p.lora_rank:,}")
    for name, table in PLAN_ENUMS.items():
        if getattr(p, name) not in table:
            raise PlanInputError(f"plan.{name}", f"unknown value {getattr(p, name)}")
    if p.precision and p.precision not in PRECISION:
        raise PlanInputError("plan.precision", f"unknown value {p.precision}")
    dp, mb = p.dp or 1, p.micro_batch or 1
    gpus = dp * (p.tp or 1) * (p.pp or 1) * (p.cp or 1)
    if gpus > MAX_GLOBAL_BATCH:  # a GPU count the answers' int32 fields hold, past any cluster
        raise PlanInputError("plan", f"dp*tp*pp*cp = {gpus:,} GPUs, over {MAX_GLOBAL_BATCH:,}")
    ga = p.grad_accum
    if not 0 <= global_batch <= MAX_GLOBAL_BATCH:
        raise PlanInputError("global_batch_size", f"must be 1..{MAX_GLOBAL_BATCH:,}, got {global_batch}")
    if not ga:
        if global_batch:
            if global_batch % (dp * mb):
                raise PlanInputError("plan.grad_accum", f"global_batch_size {global_batch} is not a multiple of "
                                                        f"dp*micro_batch = {dp}*{mb}; give grad_accum or another plan")
            ga = global_batch // (dp * mb)
        else:
            ga = 1
    elif global_batch and dp * mb * ga != global_batch:
        raise PlanInputError("plan", f"dp*micro_batch*grad_accum = {dp}*{mb}*{ga} = {dp * mb * ga} does not equal "
                                     f"global_batch_size {global_batch}")
    return ExecutionPlan(
        dp=dp, tp=p.tp or 1, pp=p.pp or 1, micro_batch=mb, grad_accum=ga,
        sharding=SHARDING[p.sharding],  # type: ignore[arg-type]
        offload=OFFLOAD[p.offload],  # type: ignore[arg-type]
        checkpointing=CHECKPOINTING[p.checkpointing],  # type: ignore[arg-type]
        sequence_parallel=p.sequence_parallel,
        flash_attention=p.flash_attention if p.HasField("flash_attention") else True,
        precision=PRECISION.get(p.precision, default_precision),  # type: ignore[arg-type]
        ep=p.ep or 1, virtual_stages=p.virtual_stages or 1,
        schedule=SCHEDULE[p.schedule],  # type: ignore[arg-type]
        cp=p.cp or 1, checkpoint_every=p.checkpoint_every or 1,
        reshard_after_forward=RESHARD[p.reshard_after_forward],  # type: ignore[arg-type]
        loss=LOSS[p.loss],  # type: ignore[arg-type]
        float8=FLOAT8[p.float8],  # type: ignore[arg-type]
        compile=p.compile, async_tp=p.async_tp, lora_rank=p.lora_rank,
        lora_targets=LORA_TARGETS[p.lora_targets],  # type: ignore[arg-type]
        base_quant=BASE_QUANT[p.base_quant],  # type: ignore[arg-type]
    )


def plan_message(plan: ExecutionPlan) -> pb.ExecutionPlan:
    """The message of a library plan, every field explicit."""
    return pb.ExecutionPlan(
        dp=plan.dp, tp=plan.tp, pp=plan.pp, micro_batch=plan.micro_batch, grad_accum=plan.grad_accum,
        sharding=SHARDING_VALUE[plan.sharding],
        offload=OFFLOAD_VALUE[plan.offload],
        checkpointing=CHECKPOINTING_VALUE[plan.checkpointing],
        sequence_parallel=plan.sequence_parallel, flash_attention=plan.flash_attention,
        precision=PRECISION_VALUE[plan.precision],
        ep=plan.ep, virtual_stages=plan.virtual_stages,
        schedule=SCHEDULE_VALUE[plan.schedule],
        cp=plan.cp, checkpoint_every=plan.checkpoint_every,
        reshard_after_forward=PLAN_ENUM_VALUES["reshard_after_forward"][plan.reshard_after_forward],
        loss=PLAN_ENUM_VALUES["loss"][plan.loss], float8=PLAN_ENUM_VALUES["float8"][plan.float8],
        compile=plan.compile, async_tp=plan.async_tp, lora_rank=plan.lora_rank,
        lora_targets=PLAN_ENUM_VALUES["lora_targets"][plan.lora_targets],
        base_quant=PLAN_ENUM_VALUES["base_quant"][plan.base_quant],
    )


def plan_fields(text_pairs: dict[str, str]) -> pb.ExecutionPlan:
    """An ExecutionPlan message from `key=value` texts in the library's spelling (tessctl --plan):
    ``dp=2,tp=2,micro_batch=4,sharding=zero2,flash_attention=false,precision=bf16,lora_rank=16``.
    Sizes must be integers >= 1 (lora_rank >= 0); PlanInputError naming ``plan.KEY`` otherwise."""
    msg = pb.ExecutionPlan()
    for key, raw in text_pairs.items():
        value = raw.strip()
        field = f"plan.{key}"
        if key in PLAN_INT_FIELDS or key == "lora_rank":
            lo = 0 if key == "lora_rank" else 1
            try:
                n = int(value)
            except ValueError:
                raise PlanInputError(field, f"must be an integer >= {lo}, got {value!r}") from None
            if n < lo:
                raise PlanInputError(field, f"must be an integer >= {lo}, got {n}")
            setattr(msg, key, n)
        elif key in PLAN_ENUM_VALUES:
            table = PLAN_ENUM_VALUES[key]
            if value.lower() not in table:
                raise PlanInputError(field, f"{value!r} is not one of {', '.join(table)}")
            setattr(msg, key, table[value.lower()])
        elif key in PLAN_BOOL_FIELDS:
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise PlanInputError(field, f"must be true or false, got {value!r}")
            setattr(msg, key, value.lower() in ("true", "1", "yes"))
        else:
            raise PlanInputError(field, f"unknown field; known: {', '.join(sorted(PLAN_KEYS))}")
    return msg


PLAN_KEYS: tuple[str, ...] = (*PLAN_INT_FIELDS, "lora_rank", *PLAN_ENUM_VALUES, *PLAN_BOOL_FIELDS)


def merged_plan(base: pb.ExecutionPlan, override: pb.ExecutionPlan, given: Collection[str] = ()) -> pb.ExecutionPlan:
    """`base` with every field `override` sets replaced (a job's recipe under tessctl's --plan, or under
    the plan a scheduler chose). A field counts as set when it is non-zero, present for the optional
    flash_attention, or named in `given`: proto3 keeps no presence for a 0 or false, so a caller that
    knows which keys were written (PlanOverride) names them, and ``lora_rank=0`` or ``compile=false``
    replaces the base's value instead of vanishing."""
    unknown = sorted(set(given) - set(PLAN_KEYS))
    if unknown:
        raise PlanInputError(f"plan.{unknown[0]}", f"unknown field; known: {', '.join(sorted(PLAN_KEYS))}")
    out = pb.ExecutionPlan()
    out.CopyFrom(base)
    for desc, value in override.ListFields():
        setattr(out, desc.name, value)
    for name in given:
        setattr(out, name, getattr(override, name))
    return out


@dataclass(frozen=True)
class PlanOverride:
    """Fields written on top of a plan (tessctl's --plan): the message and the keys written, so a
    written 0 or false, which the message cannot tell from unset, still overrides (merged_plan)."""

    plan: pb.ExecutionPlan
    given: frozenset[str]

    def on(self, base: pb.ExecutionPlan) -> pb.ExecutionPlan:
        return merged_plan(base, self.plan, self.given)
