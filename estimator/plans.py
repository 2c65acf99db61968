"""Execution plans: how one training job is laid out on its GPUs, shared by every estimator module.

An `ExecutionPlan` is a frozen value: data parallel (dp), tensor parallel (tp), pipeline parallel
(pp) sizes, the micro-batch and the number of micro-batches accumulated per optimizer step, the
ZeRO/FSDP sharding of model state over dp, CPU offload, activation checkpointing, sequence
parallelism, flash attention, and the precision recipe (which fixes the bytes per parameter).

Conventions (stated once, used everywhere):
- `num_gpus = dp * tp * pp`; `global_batch = dp * micro_batch * grad_accum` (sequences).
- With pp > 1, `grad_accum` is also the number of micro-batches m in the pipeline (1F1B).
- `ep` (expert parallel, MoE only) shards the experts over ep of the dp ranks (GShard: ep = dp).
- `virtual_stages` > 1 is Megatron's interleaved 1F1B (v model chunks per pipeline rank).
- `schedule`: "1f1b" (a stage holds at most pp - stage micro-batches in flight) or "gpipe" (all
  forwards, then all backwards: every stage holds all grad_accum micro-batches; Alpa's default).

Precision recipes (bytes per parameter = params + grads + optimizer state, for Adam; the memory
module states each in full): ``fp32`` 4+4+8 = 16 with fp32 activations; ``amp`` (PyTorch AMP) fp32
params, grads and Adam = 16 with bf16 autocast activations; ``mixed`` (ZeRO paper, DeepSpeed fp16)
2+2+12 = 16; ``megatron-bf16`` (Megatron's default) 2+4+12 = 18; ``megatron-fp16`` (Frenzy's MARP)
2+2+16 = 20; ``bf16`` (pure bf16, bf16 Adam states) 2+2+4 = 8; ``mixed-adafactor`` (fp16 params,
fp32 grads, fp32 master, Adafactor's factored second moment, no momentum; GShard) 2+4+4 = 10.

`PlanInputError` (an InvalidArgument and a ValueError, defined in errors.py) names the offending
field in `.field`, e.g. ``plan.tp: model.num_heads 12 is not divisible by tp 8``. Construction checks
the plan by itself; `plan.check(num_gpus=..., model=...)` checks it against a GPU count and a model.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

from tessera.estimator.errors import PlanInputError as PlanInputError  # noqa: PLC0414 (re-exported)

if TYPE_CHECKING:
    from tessera.estimator.models import ModelDims

Sharding = Literal["none", "zero1", "zero2", "zero3", "fsdp"]
Offload = Literal["none", "optimizer", "optimizer+params"]
Checkpointing = Literal["none", "selective", "full"]
Schedule = Literal["1f1b", "gpipe"]
Precision = Literal["fp32", "amp", "mixed", "megatron-bf16", "megatron-fp16", "bf16", "mixed-adafactor"]

SHARDINGS: tuple[str, ...] = get_args(Sharding)
OFFLOADS: tuple[str, ...] = get_args(Offload)
CHECKPOINTINGS: tuple[str, ...] = get_args(Checkpointing)
PRECISIONS: tuple[str, ...] = get_args(Precision)
SCHEDULES: tuple[str, ...] = get_args(Schedule)


@dataclass(frozen=True)
class ExecutionPlan:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batch: int = 1
    grad_accum: int = 1
    sharding: Sharding = "none"
    offload: Offload = "none"
    checkpointing: Checkpointing = "none"
    sequence_parallel: bool = False
    flash_attention: bool = True
    precision: Precision = "megatron-bf16"
    ep: int = 1
    virtual_stages: int = 1
    schedule: Schedule = "1f1b"

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "micro_batch", "grad_accum", "ep", "virtual_stages"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PlanInputError(f"plan.{name}", f"must be an integer >= 1, got {v!r}")
        for name, allowed in (("sharding", SHARDINGS), ("offload", OFFLOADS),
                              ("checkpointing", CHECKPOINTINGS), ("precision", PRECISIONS),
                              ("schedule", SCHEDULES)):
            v = getattr(self, name)
            if v not in allowed:
                raise PlanInputError(f"plan.{name}", f"{v!r} is not one of {', '.join(allowed)}")
        for name in ("sequence_parallel", "flash_attention"):
            if not isinstance(getattr(self, name), bool):
                raise PlanInputError(f"plan.{name}", f"must be true or false, got {getattr(self, name)!r}")
        if self.dp % self.ep:
            raise PlanInputError("plan.ep", f"ep {self.ep} must divide dp {self.dp} (experts shard over DP ranks)")
        if self.offload == "optimizer+params" and self.zero_stage < 3:
            raise PlanInputError("plan.offload", "offloading parameters needs sharding zero3 or fsdp")
        if self.virtual_stages > 1 and self.pp == 1:
            raise PlanInputError("plan.virtual_stages", "interleaving needs pp > 1")

    @property
    def num_gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step."""
        return self.dp * self.micro_batch * self.grad_accum

    @property
    def zero_stage(self) -> int:
        """0 (plain DP), 1, 2 or 3; FSDP full sharding counts as 3."""
        return {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}[self.sharding]

    def check(self, num_gpus: int | None = None, model: ModelDims | None = None) -> ExecutionPlan:
        """Raise PlanInputError if the plan does not fit `num_gpus` or `model`; return the plan otherwise."""
        if num_gpus is not None:
            if num_gpus < 1:
                raise PlanInputError("num_gpus", f"must be >= 1, got {num_gpus}")
            if self.num_gpus != num_gpus:
                raise PlanInputError("num_gpus", f"plan dp*tp*pp = {self.dp}*{self.tp}*{self.pp} = {self.num_gpus} "
                                                 f"does not equal num_gpus {num_gpus}")
        if model is None:
            return self
        model.validate()
        heads = model.num_heads
        if heads % self.tp:
            raise PlanInputError("plan.tp", f"model.num_heads {heads} is not divisible by tp {self.tp}")
        kv = model.kv_heads
        if kv % self.tp:
            raise PlanInputError("plan.tp", f"model.num_kv_heads {kv} is not divisible by tp {self.tp}")
        ffn = model.ffn
        if ffn % self.tp:
            raise PlanInputError("plan.tp", f"model ffn_hidden {ffn} is not divisible by tp {self.tp}")
        chunks = self.pp * self.virtual_stages
        if model.num_layers < chunks:
            raise PlanInputError("plan.pp", f"model.num_layers {model.num_layers} is fewer than "
                                            f"pp*virtual_stages = {chunks} pipeline chunks")
        if self.sequence_parallel and model.seq_length % self.tp:
            raise PlanInputError("plan.sequence_parallel",
                                 f"model.seq_length {model.seq_length} is not divisible by tp {self.tp}")
        experts = model.num_experts if model.family == "moe" else 0
        if self.ep > 1 and not experts:
            raise PlanInputError("plan.ep", "expert parallelism needs a mixture-of-experts model")
        if experts and experts % self.ep:
            raise PlanInputError("plan.ep", f"model.num_experts {experts} is not divisible by ep {self.ep}")
        return self

    def with_(self, **changes: Any) -> ExecutionPlan:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExecutionPlan:
        """From a mapping such as a job file's `plan:`; unknown keys are a PlanInputError naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise PlanInputError(f"plan.{unknown[0]}", f"unknown field; known: {', '.join(sorted(known))}")
        return cls(**d)

    @property
    def key(self) -> str:
        """A stable, compact cache key."""
        return ("dp{dp}-tp{tp}-pp{pp}-mb{micro_batch}-ga{grad_accum}-{sharding}-off:{offload}-"
                "ac:{checkpointing}-sp{sp}-fa{fa}-{precision}-ep{ep}-v{virtual_stages}").format(
            sp=int(self.sequence_parallel), fa=int(self.flash_attention), **self.to_dict()) + \
            ("-gpipe" if self.schedule == "gpipe" else "")
