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

The recipes of PyTorch-native stacks (torchtitan; transformers + PEFT), docs/estimator-memory.md:
- ``cp``: context parallelism (ring attention over cp ranks, each holding seq/cp tokens of every
  sample; load-balanced causal split); ``num_gpus = dp * tp * pp * cp``.
- ``checkpointing``: ``none``; ``selective`` is Megatron's attention-core recompute (refused under
  flash attention, which never stores the scores); ``op`` is torchtitan's per-op selective
  checkpointing (saves matmul outputs but every second one, and the attention outputs); ``full``.
  ``checkpoint_every`` = n applies ``op``/``full`` to every n-th layer only (torchtitan's layer SAC).
- ``reshard_after_forward``: FSDP2's option (sharding ``fsdp`` only); ``auto`` is torchtitan's
  default: reshard without PP, keep unsharded (and accumulate unsharded gradients) with PP.
- ``loss``: ``fused`` (Megatron's vocab-parallel fused cross-entropy), ``fp32`` (logits upcast to
  fp32 with the log-softmax kept: torchtitan's and transformers' default), ``chunked`` (the loss
  computed over sequence chunks, never materialising all logits).
- ``float8``: torchao Float8 linears (tensorwise scaling), ``linear+allgather`` also all-gathers FSDP2
  parameters in float8. ``compile``: torch.compile (fused elementwise ops store less, run faster).
  ``async_tp``: torch's micro-pipelined TP (needs tp > 1, sequence_parallel and compile).
- ``lora_rank`` > 0: LoRA (PEFT) on ``lora_targets`` (``qv``, ``attention``, ``all-linear``): the base
  weights are frozen (no gradients or optimizer state), adapters train with the precision recipe;
  ``base_quant`` ``nf4``/``int8`` is QLoRA's quantized base; ``offload: frozen`` keeps the frozen base
  weights in host memory.

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
Offload = Literal["none", "optimizer", "optimizer+params", "frozen"]
Checkpointing = Literal["none", "selective", "op", "full"]
Schedule = Literal["1f1b", "gpipe"]
Precision = Literal["fp32", "amp", "mixed", "megatron-bf16", "megatron-fp16", "bf16", "mixed-adafactor"]
Reshard = Literal["auto", "always", "never"]
Loss = Literal["fused", "fp32", "chunked"]
Float8 = Literal["none", "linear", "linear+allgather"]
LoraTargets = Literal["qv", "attention", "all-linear"]
BaseQuant = Literal["none", "nf4", "int8"]

SHARDINGS: tuple[str, ...] = get_args(Sharding)
OFFLOADS: tuple[str, ...] = get_args(Offload)
CHECKPOINTINGS: tuple[str, ...] = get_args(Checkpointing)
PRECISIONS: tuple[str, ...] = get_args(Precision)
SCHEDULES: tuple[str, ...] = get_args(Schedule)
RESHARDS: tuple[str, ...] = get_args(Reshard)
LOSSES: tuple[str, ...] = get_args(Loss)
FLOAT8S: tuple[str, ...] = get_args(Float8)
LORA_TARGETS: tuple[str, ...] = get_args(LoraTargets)
BASE_QUANTS: tuple[str, ...] = get_args(BaseQuant)


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
    # The recipes of PyTorch-native stacks (torchtitan, transformers + PEFT); docs/estimator-memory.md.
    cp: int = 1
    checkpoint_every: int = 1
    reshard_after_forward: Reshard = "auto"
    loss: Loss = "fused"
    float8: Float8 = "none"
    compile: bool = False
    async_tp: bool = False
    lora_rank: int = 0
    lora_targets: LoraTargets = "all-linear"
    base_quant: BaseQuant = "none"

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "micro_batch", "grad_accum", "ep", "virtual_stages", "cp",
                     "checkpoint_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PlanInputError(f"plan.{name}", f"must be an integer >= 1, got {v!r}")
        for name, allowed in (("sharding", SHARDINGS), ("offload", OFFLOADS),
                              ("checkpointing", CHECKPOINTINGS), ("precision", PRECISIONS),
                              ("schedule", SCHEDULES), ("reshard_after_forward", RESHARDS),
                              ("loss", LOSSES), ("float8", FLOAT8S), ("lora_targets", LORA_TARGETS),
                              ("base_quant", BASE_QUANTS)):
            v = getattr(self, name)
            if v not in allowed:
                raise PlanInputError(f"plan.{name}", f"{v!r} is not one of {', '.join(allowed)}")
        for name in ("sequence_parallel", "flash_attention", "compile", "async_tp"):
            if not isinstance(getattr(self, name), bool):
                raise PlanInputError(f"plan.{name}", f"must be true or false, got {getattr(self, name)!r}")
        if self.dp % self.ep:
            raise PlanInputError("plan.ep", f"ep {self.ep} must divide dp {self.dp} (experts shard over DP ranks)")
        if self.offload == "optimizer+params" and self.zero_stage < 3:
            raise PlanInputError("plan.offload", "offloading parameters needs sharding zero3 or fsdp")
        if self.virtual_stages > 1 and self.pp == 1:
            raise PlanInputError("plan.virtual_stages", "interleaving needs pp > 1")
        self._check_recipe()

    def _check_recipe(self) -> None:
        """Combinations that do not exist, and fields that would change nothing, are refused by name."""
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise PlanInputError("plan.lora_rank", f"must be an integer >= 0 (0: full fine-tuning), got {self.lora_rank!r}")
        if self.checkpointing == "selective" and self.flash_attention:
            raise PlanInputError("plan.checkpointing",
                                 "'selective' is Megatron's attention-core recompute: under flash attention the "
                                 "scores are never stored, so it changes nothing; use 'op' (per-op selective), "
                                 "'full', or flash_attention: false")
        if self.checkpoint_every > 1 and self.checkpointing not in ("op", "full"):
            raise PlanInputError("plan.checkpoint_every", "checkpointing every n-th layer needs checkpointing "
                                                          "'op' or 'full'")
        if self.cp > 1 and not self.flash_attention:
            raise PlanInputError("plan.cp", "context parallelism runs ring attention over flash/efficient "
                                            "attention kernels; set flash_attention: true")
        if self.cp > 1 and self.ep > 1:
            raise PlanInputError("plan.cp", "context parallelism with expert parallelism is not modelled")
        if self.reshard_after_forward != "auto" and self.sharding != "fsdp":
            raise PlanInputError("plan.reshard_after_forward", "is FSDP2's option: needs sharding fsdp")
        if self.float8 == "linear+allgather" and self.sharding != "fsdp":
            raise PlanInputError("plan.float8", "Float8 all-gather is FSDP2's: needs sharding fsdp")
        if self.float8 != "none" and self.precision not in ("amp", "megatron-bf16", "bf16", "mixed"):
            raise PlanInputError("plan.float8", f"Float8 linears run under a bf16/fp16 recipe, not {self.precision!r}")
        if self.async_tp and (self.tp == 1 or not self.sequence_parallel or not self.compile):
            raise PlanInputError("plan.async_tp", "async TP needs tp > 1, sequence_parallel and compile "
                                                  "(torch's micro-pipelined TP is a compiler pass)")
        if self.lora_rank == 0:
            for name, default in (("base_quant", "none"), ("lora_targets", "all-linear")):
                if getattr(self, name) != default:
                    raise PlanInputError(f"plan.{name}", "applies to LoRA only: set lora_rank > 0")
            if self.offload == "frozen":
                raise PlanInputError("plan.offload", "'frozen' offloads LoRA's frozen base weights: set lora_rank > 0")
        else:
            if self.ep > 1 or self.float8 != "none":
                field = "plan.ep" if self.ep > 1 else "plan.float8"
                raise PlanInputError(field, "is not modelled with LoRA")
            if self.base_quant != "none" and self.sharding in ("zero3", "fsdp") and self.tp > 1:
                raise PlanInputError("plan.base_quant", "quantized base weights with tensor parallelism are "
                                                        "not supported by PEFT/bitsandbytes")
            if self.offload in ("optimizer+params",):
                raise PlanInputError("plan.offload", "with LoRA offload the frozen base weights: 'frozen'")

    @property
    def num_gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def reshards_after_forward(self) -> bool:
        """FSDP2's reshard_after_forward as torchtitan sets it by default: True without PP, False with
        PP (the parameters stay unsharded between a stage's forward and backward micro-batches)."""
        if self.reshard_after_forward == "auto":
            return self.pp == 1
        return self.reshard_after_forward == "always"

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
                sizes = ("dp*tp*pp", f"{self.dp}*{self.tp}*{self.pp}") if self.cp == 1 else \
                    ("dp*tp*pp*cp", f"{self.dp}*{self.tp}*{self.pp}*{self.cp}")
                raise PlanInputError("num_gpus", f"plan {sizes[0]} = {sizes[1]} = {self.num_gpus} "
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
        if self.cp > 1 and model.seq_length % (2 * self.cp * (self.tp if self.sequence_parallel else 1)):
            raise PlanInputError("plan.cp", f"model.seq_length {model.seq_length} is not divisible by 2*cp"
                                            f"{'*tp' if self.sequence_parallel else ''} (load-balanced causal split)")
        if self.lora_rank and model.family == "wresnet":
            raise PlanInputError("plan.lora_rank", "LoRA adapts transformer linears")
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
        """A stable, compact cache key (fields at their defaults add nothing, so old keys stay)."""
        base = ("dp{dp}-tp{tp}-pp{pp}-mb{micro_batch}-ga{grad_accum}-{sharding}-off:{offload}-"
                "ac:{checkpointing}-sp{sp}-fa{fa}-{precision}-ep{ep}-v{virtual_stages}").format(
            sp=int(self.sequence_parallel), fa=int(self.flash_attention), **self.to_dict()) + \
            ("-gpipe" if self.schedule == "gpipe" else "")
        defaults = ExecutionPlan()
        extra = [f"{f.name}={getattr(self, f.name)}" for f in fields(self)[_FIRST_RECIPE_FIELD:]
                 if getattr(self, f.name) != getattr(defaults, f.name)]
        return "-".join([base, *extra])


_FIRST_RECIPE_FIELD = [f.name for f in fields(ExecutionPlan)].index("cp")
