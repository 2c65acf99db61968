"""The execution plan and the model as the worker contract gives them (TESSERA_PLAN, TESSERA_MODEL).

Parsing is lenient where protobuf's JSON mapping is (camelCase keys, int64 as strings, enum names)
and strict otherwise: a present but malformed value raises ContractError.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from tessera.common.errors import InvalidInput


class ContractError(InvalidInput, ValueError):
    """A contract variable is present but malformed (bad JSON, not an integer, ...)."""



def _int_field(d: Mapping[str, Any], names: tuple[str, ...], what: str) -> int | None:
    """The first of `names` present in d as an int (proto JSON writes int64 as strings), else None."""
    for name in names:
        if name in d and d[name] is not None:
            value = d[name]
            if isinstance(value, bool):
                raise ContractError(f"{what}.{name} must be an integer, got {value!r}")
            try:
                as_int = int(value)
            except (TypeError, ValueError):
                raise ContractError(f"{what}.{name} must be an integer, got {value!r}") from None
            if isinstance(value, float) and value != as_int:
                raise ContractError(f"{what}.{name} must be an integer, got {value!r}")
            return as_int
    return None


def _str_field(d: Mapping[str, Any], names: tuple[str, ...]) -> str:
    for name in names:
        if name in d and d[name] is not None:
            return str(d[name])
    return ""


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def json_object(raw: str, var: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ContractError(f"{var} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ContractError(f"{var} must be a JSON object, got {type(value).__name__}")
    return value


PP_SCHEDULES = ("gpipe", "1f1b")
# The estimator's values (estimator/plans.py), all parsed so that a trainer can refuse by name what it
# cannot run ("frozen": LoRA's frozen base weights in host memory; "op": torchtitan's per-op checkpointing).
OFFLOADS = ("none", "optimizer", "optimizer+params", "frozen")
CHECKPOINTINGS = ("none", "selective", "op", "full")
# The estimator's sharding names (estimator/plans.py) and the ZeRO stage each means.
SHARDINGS = {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


def _enum_word(value: str, prefix: str) -> str:
    """A plan option's value in lower case, from its own spelling or protobuf's enum name in the JSON
    mapping of common.proto's ExecutionPlan (`SHARDING_ZERO3`, `OFFLOAD_OPTIMIZER_AND_PARAMS`,
    `PIPELINE_SCHEDULE_GPIPE`; `..._UNSPECIFIED` = "")."""
    v = value.strip().lower()
    if prefix and v.startswith(prefix):
        v = v[len(prefix):]
        v = "" if v == "unspecified" else v.replace("_and_", "+")
    return v


def _choice_field(d: Mapping[str, Any], names: tuple[str, ...], what: str, choices: tuple[str, ...],
                  true: str, prefix: str = "") -> str | None:
    """The first of `names` present in d as one of `choices` (any case, or its protobuf enum name
    with `prefix`); JSON true/false (or 1/0, "true"/"false") mean `true` / "none". None when absent."""
    for name in names:
        if name in d and d[name] is not None:
            value = d[name]
            if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
                return true if value else "none"
            if isinstance(value, str):
                v = _enum_word(value, prefix) or "none"
                if v in choices:
                    return v
                if v in _TRUE | _FALSE:
                    return true if v in _TRUE else "none"
            raise ContractError(f"{what}.{name} must be one of {', '.join(choices)} (or true/false), got {value!r}")
    return None


@dataclass(frozen=True)
class Plan:
    """The execution plan (common.proto Plan). Global batch = micro_batch * grad_accum * dp.

    `extra` holds keys this SDK does not know (future plan kinds), so a trainer can refuse what it
    cannot run instead of silently ignoring it.

    Optional keys beyond 3D parallelism (docs/worker-contract.md, "Execution plan options"), with
    defaults that mean plain 3D parallelism: `zero_stage` 0-3 (0 = replicated data parallelism; also
    read from the estimator's `sharding`: none/zero1/zero2/zero3/fsdp), `offload` (none/optimizer/
    optimizer+params: model state in CPU memory, ZeRO-Offload), `activation_checkpointing`
    (none/selective/full; also read from `checkpointing`), `pp_schedule` ("gpipe" or "1f1b"; "" = the
    trainer's default). With pp > 1, `grad_accum` is the pipeline's micro-batch count per step.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batch: int = 1
    grad_accum: int = 1
    gpu_model: str = ""
    memory_per_gpu_bytes: int = 0
    memory_source: str = ""
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), compare=False)
    zero_stage: int = 0
    offload: str = "none"
    activation_checkpointing: str = "none"
    pp_schedule: str = ""

    _KNOWN = ("dp", "tp", "pp", "micro_batch", "grad_accum", "gpu_model", "memory_per_gpu_bytes",
              "memory_source", "zero_stage", "offload", "activation_checkpointing", "pp_schedule")

    @property
    def world_size(self) -> int:
        """GPUs (processes) this plan uses: dp * tp * pp."""
        return self.dp * self.tp * self.pp

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.dp

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, default_dp: int = 1, default_micro_batch: int = 1) -> Plan:
        """Parse a plan from its JSON form.

        Accepts snake_case or camelCase keys and int64 values as strings (protobuf's JSON mapping).
        A missing or zero dp, tp, pp, micro_batch or grad_accum takes its default (proto JSON omits
        zero fields): tp = pp = grad_accum = 1, dp = `default_dp`, micro_batch = `default_micro_batch`.
        Negative values raise ContractError. `zero_stage` (alias `zero`) must be 0-3, or come from
        `sharding` (SHARDINGS); `offload` one of OFFLOADS, `activation_checkpointing` (aliases
        `checkpointing`, `gradient_checkpointing`) one of CHECKPOINTINGS, either also as a boolean
        (true = "optimizer" / "full"); `pp_schedule` (alias `schedule`) one of PP_SCHEDULES or
        empty. Any case; protobuf's enum names (common.proto ExecutionPlan: `SHARDING_ZERO3`,
        `OFFLOAD_OPTIMIZER_AND_PARAMS`, `CHECKPOINTING_FULL`, `PIPELINE_SCHEDULE_GPIPE`, `*_UNSPECIFIED`)
        are read too.
        """
        def names(*keys: str) -> tuple[str, ...]:
            return tuple(n for k in keys for n in (k, _camel(k)))

        def get_int(name: str, default: int, *aliases: str) -> int:
            v = _int_field(d, names(name, *aliases), "plan")
            if v is not None and v < 0:
                raise ContractError(f"plan.{name} must be >= 0, got {v}")
            return default if not v else v

        zero_stage = get_int("zero_stage", 0, "zero")
        if zero_stage > 3:
            raise ContractError(f"plan.zero_stage must be 0, 1, 2 or 3, got {zero_stage}")
        sharding = _enum_word(_str_field(d, ("sharding",)), "sharding_")
        if sharding:
            if sharding not in SHARDINGS:
                raise ContractError(f"plan.sharding must be one of {', '.join(SHARDINGS)}, got {sharding!r}")
            zero_stage = max(zero_stage, SHARDINGS[sharding])
        pp_schedule = _enum_word(_str_field(d, names("pp_schedule", "schedule")), "pipeline_schedule_")
        if pp_schedule not in ("", *PP_SCHEDULES):
            raise ContractError(f"plan.pp_schedule must be one of {', '.join(PP_SCHEDULES)}, got {pp_schedule!r}")
        offload = _choice_field(d, names("offload"), "plan", OFFLOADS, "optimizer", "offload_") or "none"
        ac = _choice_field(d, names("activation_checkpointing", "checkpointing", "gradient_checkpointing"), "plan",
                           CHECKPOINTINGS, "full", "checkpointing_") or "none"
        known = set(names(*cls._KNOWN, "zero", "sharding", "checkpointing", "gradient_checkpointing", "schedule"))
        return cls(
            dp=get_int("dp", default_dp),
            tp=get_int("tp", 1),
            pp=get_int("pp", 1),
            micro_batch=get_int("micro_batch", default_micro_batch),
            grad_accum=get_int("grad_accum", 1),
            gpu_model=_str_field(d, ("gpu_model", "gpuModel")),
            memory_per_gpu_bytes=get_int("memory_per_gpu_bytes", 0),
            memory_source=_str_field(d, ("memory_source", "memorySource")),
            extra=MappingProxyType({k: v for k, v in d.items() if k not in known}),
            zero_stage=zero_stage,
            offload=offload,
            activation_checkpointing=ac,
            pp_schedule=pp_schedule,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in self._KNOWN}
        out.update(self.extra)
        return out


@dataclass(frozen=True)
class ModelDims:
    """The model (common.proto ModelSpec). A zero dimension means "not given": a registered `name`
    is expected to supply it (the trainer resolves names it knows)."""

    name: str = ""
    hidden_size: int = 0
    num_layers: int = 0
    num_heads: int = 0
    vocab_size: int = 0
    seq_length: int = 0
    # The spec's family fields (family, gated, num_kv_heads, ffn_hidden, kv_channels, qkv_bias, ...), as
    # TESSERA_MODEL gives them, so a trainer can refuse a model it does not build.
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), compare=False)

    _DIMS = ("hidden_size", "num_layers", "num_heads", "vocab_size", "seq_length")

    @property
    def complete(self) -> bool:
        """True when every dimension is given (> 0)."""
        return all(getattr(self, k) > 0 for k in self._DIMS)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelDims:
        """Parse from JSON form (snake_case or camelCase keys, ints possibly as strings)."""
        dims: dict[str, int] = {}
        for k in cls._DIMS:
            v = _int_field(d, (k, _camel(k)), "model")
            if v is not None and v < 0:
                raise ContractError(f"model.{k} must be >= 0, got {v}")
            dims[k] = v or 0
        known = {"name", *cls._DIMS, *(_camel(k) for k in cls._DIMS)}
        return cls(name=_str_field(d, ("name",)), **dims,
                   extra=MappingProxyType({k: v for k, v in d.items() if k not in known}))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **{k: getattr(self, k) for k in self._DIMS}}


# A small model for runs by hand, when TESSERA_MODEL is absent.
DEFAULT_MODEL = ModelDims(name="tiny-gpt", hidden_size=64, num_layers=2, num_heads=4, vocab_size=128,
                          seq_length=64)
