"""The shared model and plan vocabulary between the tessera.v1 messages and the estimator library.

`ModelSpec` <-> `ModelDims` and `ExecutionPlan` (message) <-> `ExecutionPlan` (dataclass). Used by the
estimator API (estimator/service/handlers.py), tessctl, and the controller's job validation, so a job spec
and an estimator call mean the same model. Imports protobuf messages, never grpc or torch.

Errors are `PlanInputError(field, reason)` (tessera.estimator.plans), with the field as a request path
(``model.hidden_size``, ``plan.dp``).
"""

from __future__ import annotations

import math
from typing import Any

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
}
FAMILY_VALUE: dict[str, int] = {"decoder": pb.MODEL_FAMILY_DECODER, "encoder": pb.MODEL_FAMILY_ENCODER,
                                "moe": pb.MODEL_FAMILY_MOE, "wresnet": pb.MODEL_FAMILY_WIDE_RESNET}

# enum value <-> the library's spelling; UNSPECIFIED reads as the library's default.
SHARDING: dict[int, str] = {pb.SHARDING_UNSPECIFIED: "none", pb.SHARDING_NONE: "none", pb.SHARDING_ZERO1: "zero1",
                            pb.SHARDING_ZERO2: "zero2", pb.SHARDING_ZERO3: "zero3", pb.SHARDING_FSDP: "fsdp"}
OFFLOAD: dict[int, str] = {pb.OFFLOAD_UNSPECIFIED: "none", pb.OFFLOAD_NONE: "none",
                           pb.OFFLOAD_OPTIMIZER: "optimizer", pb.OFFLOAD_OPTIMIZER_AND_PARAMS: "optimizer+params"}
CHECKPOINTING: dict[int, str] = {pb.CHECKPOINTING_UNSPECIFIED: "none", pb.CHECKPOINTING_NONE: "none",
                                 pb.CHECKPOINTING_SELECTIVE: "selective", pb.CHECKPOINTING_FULL: "full"}
PRECISION: dict[int, str] = {
    pb.PRECISION_FP32: "fp32", pb.PRECISION_AMP: "amp", pb.PRECISION_MIXED: "mixed",
    pb.PRECISION_MEGATRON_BF16: "megatron-bf16", pb.PRECISION_MEGATRON_FP16: "megatron-fp16",
    pb.PRECISION_BF16: "bf16", pb.PRECISION_MIXED_ADAFACTOR: "mixed-adafactor",
}
SCHEDULE: dict[int, str] = {pb.PIPELINE_SCHEDULE_UNSPECIFIED: "1f1b", pb.PIPELINE_SCHEDULE_1F1B: "1f1b",
                            pb.PIPELINE_SCHEDULE_GPIPE: "gpipe"}
DEFAULT_PRECISION = "megatron-bf16"  # tessera.estimator.plans.ExecutionPlan's default

PLAN_INT_FIELDS = ("dp", "tp", "pp", "micro_batch", "grad_accum", "ep", "virtual_stages")


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


# -- models -----------------------------------------------------------------------------------------


def model_refinements(m: pb.ModelSpec) -> dict[str, Any]:
    """ModelDims keyword arguments of a spec's family fields (ModelSpec fields 7-16); every default
    maps to ModelDims's own default, so a spec without them is the GPT-2-style decoder it always was."""
    if m.family not in FAMILY_OF:
        raise PlanInputError("model.family", f"unknown family value {m.family}")
    if not math.isfinite(m.capacity_factor) or m.capacity_factor < 0:
        raise PlanInputError("model.capacity_factor", f"must be a number > 0 (0 = 1.0), got {m.capacity_factor!r}")
    for f in ("top_k", "moe_every", "width_factor"):
        if getattr(m, f) < 0:
            raise PlanInputError(f"model.{f}", f"must be >= 1 (0 = 2), got {getattr(m, f)}")
    family = FAMILY_OF[m.family]
    return {
        "family": family, "ffn_hidden": m.ffn_hidden, "gated": m.gated,
        "num_kv_heads": m.num_kv_heads, "tied_embeddings": not m.untied_embeddings,
        "num_experts": m.num_experts, "top_k": m.top_k or 2, "moe_every": m.moe_every or 2,
        "capacity_factor": m.capacity_factor or 1.0,
        "width_factor": (m.width_factor or 2) if family == "wresnet" else m.width_factor,
    }


def model_dims(m: pb.ModelSpec) -> ModelDims:
    """The ModelDims of a spec: its explicit dimensions, else its registered name.

    With explicit dimensions all five are required and each must be >= 1; the family fields refine
    them. A name alone must be registered (the family fields are then ignored: the registry says).
    PlanInputError naming the field on anything else.
    """
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
        top_k=d.top_k, moe_every=d.moe_every, capacity_factor=d.capacity_factor,
        untied_embeddings=not d.tied_embeddings, width_factor=d.width_factor,
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
        if v < 0:
            raise PlanInputError(f"plan.{f}", f"must be an integer >= 1, got {v}")
    for name, table in (("sharding", SHARDING), ("offload", OFFLOAD), ("checkpointing", CHECKPOINTING),
                        ("schedule", SCHEDULE)):
        if getattr(p, name) not in table:
            raise PlanInputError(f"plan.{name}", f"unknown value {getattr(p, name)}")
    if p.precision and p.precision not in PRECISION:
        raise PlanInputError("plan.precision", f"unknown value {p.precision}")
    dp, mb = p.dp or 1, p.micro_batch or 1
    ga = p.grad_accum
    if global_batch < 0:
        raise PlanInputError("global_batch_size", f"must be >= 1, got {global_batch}")
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
    )


def plan_fields(text_pairs: dict[str, str]) -> pb.ExecutionPlan:
    """An ExecutionPlan message from `key=value` texts in the library's spelling (tessctl --plan):
    ``dp=2,tp=2,micro_batch=4,sharding=zero2,flash_attention=false,precision=bf16``.
    Sizes must be integers >= 1; PlanInputError naming ``plan.KEY`` otherwise."""
    msg = pb.ExecutionPlan()
    tables = {"sharding": SHARDING_VALUE, "offload": OFFLOAD_VALUE, "checkpointing": CHECKPOINTING_VALUE,
              "precision": PRECISION_VALUE, "schedule": SCHEDULE_VALUE}
    for key, raw in text_pairs.items():
        value = raw.strip()
        field = f"plan.{key}"
        if key in PLAN_INT_FIELDS:
            try:
                n = int(value)
            except ValueError:
                raise PlanInputError(field, f"must be an integer >= 1, got {value!r}") from None
            if n < 1:
                raise PlanInputError(field, f"must be an integer >= 1, got {n}")
            setattr(msg, key, n)
        elif key in tables:
            table = tables[key]
            if value.lower() not in table:
                raise PlanInputError(field, f"{value!r} is not one of {', '.join(table)}")
            setattr(msg, key, table[value.lower()])
        elif key in ("sequence_parallel", "flash_attention"):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise PlanInputError(field, f"must be true or false, got {value!r}")
            setattr(msg, key, value.lower() in ("true", "1", "yes"))
        else:
            known = (*PLAN_INT_FIELDS, *tables, "sequence_parallel", "flash_attention")
            raise PlanInputError(field, f"unknown field; known: {', '.join(sorted(known))}")
    return msg
