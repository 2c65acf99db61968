"""What the reference trainer will run, decided from the worker contract before torch is imported.

Pure: `resolve(ctx, options)` turns a TrainerContext into a TrainConfig or raises Unsupported with the
one-line reason the trainer prints before exiting with EXIT_UNSUPPORTED.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.clients.trainer import ModelDims, Plan, TrainerContext
from tessera.clients.trainer.reference.architecture import (
    Arch,
    Unsupported,
    registered_fields,
    resolve_arch,
    tp_divides,
)
from tessera.common.contract import TRAINER_REFUSED_EXIT

EXIT_OK = 0
EXIT_ERROR = 1
# The configuration cannot be run by this trainer (plan kind, batch layout, model): retrying the same
# launch cannot help.
EXIT_UNSUPPORTED = TRAINER_REFUSED_EXIT  # the controller fails such a job without a retry

DEFAULT_SEED = 1234
DEFAULT_LR = 3e-3
DEFAULT_WEIGHT_DECAY = 0.01
DEFAULT_CHECKPOINT_EVERY = 10
DEFAULT_KEEP_CHECKPOINTS = 2
DEFAULT_DIST_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Options:
    """Knobs outside the worker contract: argv flags and TESSERA_TRAINER_* / TESSERA_TORCH_THREADS."""

    seed: int = DEFAULT_SEED
    lr: float = DEFAULT_LR
    weight_decay: float = DEFAULT_WEIGHT_DECAY
    tied_head: bool = True
    keep_checkpoints: int = DEFAULT_KEEP_CHECKPOINTS
    # torch intra-op threads per process (TESSERA_TORCH_THREADS); 1 keeps many ranks on few cores sane.
    torch_threads: int = 1
    # Pad every step to at least this long (TESSERA_TRAINER_MIN_STEP_SECONDS): demos and tests that
    # need a tiny run to last long enough to be stopped, migrated or killed. Numerics are unchanged.
    min_step_seconds: float = 0.0
    # Timeout of the rendezvous and of every collective (TESSERA_DIST_TIMEOUT_SECONDS).
    dist_timeout_s: float = DEFAULT_DIST_TIMEOUT_S


DEFAULT_PP_SCHEDULE = "1f1b"


@dataclass(frozen=True)
class TrainConfig:
    model: ModelDims
    plan: Plan
    world_size: int
    iterations: int
    global_batch: int
    micro_batch: int
    # Micro-batches per optimizer step on each data-parallel replica (the pipeline's micro-batch count
    # when pp > 1).
    grad_accum: int
    checkpoint_every: int
    options: Options
    # Human-readable notes on what was derived (printed at start).
    notes: tuple[str, ...] = ()
    # What is run, after the plan's options were reconciled (see resolve): 0 = replicated data
    # parallelism (DDP), 2 = FSDP2 without resharding after forward, 3 = FSDP2 resharding.
    zero_stage: int = 0
    # "none", or "optimizer" / "optimizer+params" (both run as FSDP2's CPUOffloadPolicy).
    offload: str = "none"
    # "none", "selective" (the attention core) or "full" (every block).
    activation_checkpointing: str = "none"
    # "gpipe" or "1f1b" when pp > 1, else "".
    pp_schedule: str = ""
    # The plan's flash_attention (the estimator's default True): False runs plain attention.
    flash_attention: bool = True
    # Each pipeline stage's layers [start, end) when the plan gives them (a pipeline over mixed GPU
    # types: uneven splits, TESSERA_PLAN "stages"); empty = as even as possible.
    stage_ranges: tuple[tuple[int, int], ...] = ()
    # The structure built for the model (architecture.py); None: GPT-2 style.
    arch: Arch | None = None

    @property
    def structure(self) -> Arch:
        return self.arch if self.arch is not None else Arch.gpt2(self.model)

    @property
    def per_rank_batch(self) -> int:
        return self.micro_batch * self.grad_accum

    @property
    def dp(self) -> int:
        return self.plan.dp

    @property
    def tp(self) -> int:
        return self.plan.tp

    @property
    def pp(self) -> int:
        return self.plan.pp

    def describe(self) -> str:
        """One line naming the plan kind, e.g. `dp=2 tp=2 pp=1 fsdp=zero3 offload ac`."""
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}"]
        parts.append(f"zero{self.zero_stage}(fsdp2)" if self.zero_stage else ("ddp" if self.dp > 1 else "replicated"))
        if self.pp > 1:
            parts.append(f"schedule={self.pp_schedule}")
        if self.offload != "none":
            parts.append(f"offload={self.offload}")
        if self.activation_checkpointing != "none":
            parts.append(f"activation-checkpointing={self.activation_checkpointing}")
        if not self.flash_attention:
            parts.append("plain-attention")
        return " ".join(parts)


def parse_options(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Options:
    """Options from argv flags and the environment (flags win). Raises SystemExit(2) on bad flags."""
    e = os.environ if env is None else env
    p = argparse.ArgumentParser(prog="python -m tessera.clients.trainer.reference",
                                description="Tessera's reference trainer (GPT-2, LLaMA or Mixtral style, on synthetic data). "
                                            "Everything else comes from the worker contract's environment.")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="model init and data seed")
    p.add_argument("--lr", type=float, default=DEFAULT_LR, help="AdamW learning rate (constant)")
    p.add_argument("--weight-decay", type=float, default=DEFAULT_WEIGHT_DECAY)
    p.add_argument("--untied-head", action="store_true", help="do not tie the LM head to the embedding")
    p.add_argument("--keep-checkpoints", type=int, default=DEFAULT_KEEP_CHECKPOINTS)
    # Launchers in the torch.distributed.launch tradition (DeepSpeed's) pass the local rank as a flag;
    # the trainer reads LOCAL_RANK from the environment, which they set too.
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(list(argv))

    def env_num(name: str, default: float, cast: type) -> float:
        raw = e.get(name, "").strip()
        if not raw:
            return default
        try:
            return cast(raw)
        except ValueError:
            p.error(f"{name} must be a number, got {raw!r}")
            raise  # unreachable: p.error exits

    return Options(
        seed=args.seed,
        lr=args.lr,
        weight_decay=args.weight_decay,
        tied_head=not args.untied_head,
        keep_checkpoints=max(1, args.keep_checkpoints),
        torch_threads=max(1, int(env_num("TESSERA_TORCH_THREADS", 1, int))),
        min_step_seconds=max(0.0, float(env_num("TESSERA_TRAINER_MIN_STEP_SECONDS", 0.0, float))),
        dist_timeout_s=max(1.0, float(env_num("TESSERA_DIST_TIMEOUT_SECONDS", DEFAULT_DIST_TIMEOUT_S, float))),
    )


def resolve_model(model: ModelDims) -> ModelDims:
    """Fill a registered model's missing dimensions; Unsupported if some are still missing or invalid, or
    if the model is not one this trainer builds (architecture.py)."""
    return resolve_model_arch(model)[0]


def resolve_model_arch(model: ModelDims) -> tuple[ModelDims, Arch]:
    """The model's dimensions (a registered name's filling those left at 0) and the structure to build
    for it: the registered name's family fields when its dimensions came from the registry, else the
    family fields TESSERA_MODEL carries. Unsupported with the reason otherwise."""
    by_name = not model.complete and bool(model.name)
    fields: dict[str, Any] = dict(model.extra)
    if by_name:
        known = _registered(model.name)
        if known is not None:
            model = ModelDims(
                name=model.name,
                hidden_size=model.hidden_size or known.hidden_size,
                num_layers=model.num_layers or known.num_layers,
                num_heads=model.num_heads or known.num_heads,
                vocab_size=model.vocab_size or known.vocab_size,
                seq_length=model.seq_length or known.seq_length,
                extra=model.extra,
            )
            fields = registered_fields(model.name) or fields
    if not model.complete:
        raise Unsupported(f"model {model.name or '(unnamed)'!r} has missing dimensions and is not a registered "
                          f"name: {model.to_dict()}")
    if model.vocab_size < 2:
        raise Unsupported(f"model vocab_size={model.vocab_size} is too small (need >= 2)")
    return model, resolve_arch(model, fields)


def _registered(name: str) -> ModelDims | None:
    try:
        from tessera.estimator.models import registered
    except ImportError:
        return None
    m = registered(name)
    if m is None:
        return None
    return ModelDims(name=name, hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                     vocab_size=m.vocab_size, seq_length=m.seq_length)


def batch_layout(global_batch: int, dp: int, micro_batch: int, grad_accum: int) -> tuple[int, int, str]:
    """(micro_batch, grad_accum, note) such that micro_batch * grad_accum * dp == global_batch exactly.

    Keeps the plan's pair when it is exact. Otherwise takes the largest micro batch that divides the
    per-rank batch and is no larger than the plan's (the plan's micro batch bounds memory), and the
    accumulation that makes up the rest. Unsupported when the global batch is not a positive multiple
    of dp.
    """
    if global_batch <= 0:
        raise Unsupported(f"global batch size must be > 0, got {global_batch}")
    if global_batch % dp:
        raise Unsupported(f"global batch {global_batch} is not divisible by dp={dp}")
    per_rank = global_batch // dp
    if micro_batch * grad_accum == per_rank:
        return micro_batch, grad_accum, ""
    mb = max(1, min(micro_batch, per_rank))
    while per_rank % mb:
        mb -= 1
    ga = per_rank // mb
    note = (f"plan micro_batch={micro_batch} grad_accum={grad_accum} dp={dp} does not give the global batch "
            f"{global_batch}; using micro_batch={mb} grad_accum={ga}")
    return mb, ga, note


def pipeline_layout(per_rank: int, micro_batch: int, grad_accum: int, pp: int, schedule: str,
                    explicit: bool) -> tuple[int, int, str, str]:
    """(micro_batch, micro-batch count, schedule, note) for a pipeline of `pp` stages.

    1F1B needs at least `pp` micro-batches per step (torch's Schedule1F1B refuses fewer): with fewer,
    the micro batch shrinks to the largest divisor of the per-replica batch that gives enough of them.
    When even single-sample micro-batches are too few, a default schedule falls back to GPipe and an
    explicitly requested 1F1B is Unsupported.
    """
    if schedule != "1f1b" or grad_accum >= pp:
        return micro_batch, grad_accum, schedule, ""
    if per_rank < pp:
        if explicit:
            raise Unsupported(f"pp_schedule 1f1b with pp={pp} needs at least {pp} micro-batches per step, but each "
                              f"data-parallel replica trains on only {per_rank} samples per step")
        return micro_batch, grad_accum, "gpipe", (f"{per_rank} samples per replica cannot make {pp} micro-batches "
                                                  f"for 1F1B: running GPipe")
    mb = min(micro_batch, per_rank // pp)
    while per_rank % mb:
        mb -= 1
    return mb, per_rank // mb, schedule, (f"1F1B with pp={pp} needs >= {pp} micro-batches: using micro_batch={mb} "
                                          f"x {per_rank // mb} micro-batches")


# The recipe fields of an execution plan (estimator/plans.py) this trainer does not run, each with the
# values that ask for nothing (the proto's JSON names them LOSS_FUSED, FLOAT8_NONE, ...; "" = unset).
# The loss is computed on fp32 logits here whatever it says: "fused" (the estimator's default, what a
# plan without the field means) and "fp32" both run, "chunked" does not.
_RECIPE_DEFAULTS: tuple[tuple[str, str, str, frozenset[str]], ...] = (
    ("reshard_after_forward", "reshard_", "FSDP2's reshard_after_forward other than auto", frozenset({"", "auto"})),
    ("loss", "loss_", "a chunked loss", frozenset({"", "fused", "fp32"})),
    ("float8", "float8_", "Float8 training (torchao)", frozenset({"", "none"})),
    ("base_quant", "base_quant_", "a quantized LoRA base (QLoRA)", frozenset({"", "none"})),
)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _refuse_recipe(plan: Plan) -> None:
    """The training recipes of PyTorch-native stacks (context parallelism, per-op checkpointing, Float8,
    torch.compile, async TP, LoRA): Unsupported naming the field, never a silent full fine-tune."""
    e = plan.extra
    if plan.activation_checkpointing == "op":
        raise Unsupported("plan checkpointing=op (per-op selective checkpointing) is not supported by the reference "
                          "trainer (none, selective or full)")
    if plan.offload == "frozen":
        raise Unsupported("plan offload=frozen (LoRA's frozen base weights in host memory) is not supported by the "
                          "reference trainer")
    for key, what in (("cp", "context parallelism (cp > 1)"), ("checkpoint_every", ("checkpointing every n-th layer "
                                                                                   "(checkpoint_every > 1)")),
                      ("lora_rank", "LoRA (lora_rank > 0)")):
        raw = e.get(key, e.get(_camel(key), 0))
        try:
            value = int(raw or 0)
        except (TypeError, ValueError):
            raise Unsupported(f"plan {key}={raw!r} is not an integer") from None
        if value > (0 if key == "lora_rank" else 1):
            raise Unsupported(f"plan {what} is not supported by the reference trainer: {key}={value}")
    for key, what in (("compile", "torch.compile"), ("async_tp", "async tensor parallelism")):
        raw = e.get(key, e.get(_camel(key), False))
        if raw not in (False, 0, None, "", "false", "none"):
            raise Unsupported(f"plan {key}={raw!r}: {what} is not supported by the reference trainer")
    for key, prefix, what, fine in _RECIPE_DEFAULTS:
        raw = e.get(key, e.get(_camel(key), ""))
        word = str(raw or "").strip().lower()
        word = word.removeprefix(prefix)
        if word not in fine:
            raise Unsupported(f"plan {key}={raw!r}: {what} is not supported by the reference trainer")


def _refuse_unsupported_extras(plan: Plan) -> None:
    """Plan options the estimator knows (estimator/plans.py) that this trainer cannot run: Unsupported
    when they ask for something, rather than running a different plan under their name."""
    _refuse_recipe(plan)
    e = plan.extra
    sp = e.get("sequence_parallel", e.get("sequenceParallel", False))
    if sp not in (False, 0, None, "", "false", "none"):
        raise Unsupported("plan sequence_parallel is not supported by the reference trainer (tensor parallelism "
                          "without sequence parallelism only)")
    if _plan_int(plan, "virtual_stages", "virtualStages") > 1:
        raise Unsupported("plan interleaved 1F1B (virtual_stages > 1) is not supported by the reference trainer: "
                          f"virtual_stages={_plan_int(plan, 'virtual_stages', 'virtualStages')}")


def _plan_int(plan: Plan, key: str, camel: str) -> int:
    raw = plan.extra.get(key, plan.extra.get(camel, 1))
    try:
        return int(raw or 1)
    except (TypeError, ValueError):
        raise Unsupported(f"plan {key}={raw!r} is not an integer") from None


def _expert_parallel_note(plan: Plan, arch: Arch) -> str:
    """The plan's ep (the Cells choose ep = dp for a MoE: the experts over the data-parallel ranks),
    run with every expert on every rank: with dropless routing each token meets the same experts and
    the gradients are the same averages, so only the memory per rank differs (higher than the
    plan's), as ZeRO-1 runs as ZeRO-2. Before, ep > 1 exited 3, and every MoE job the scheduler
    gave two data-parallel GPUs failed all its attempts (a live audit). "" for ep 1."""
    ep = _plan_int(plan, "ep", "ep")
    if ep <= 1:
        return ""
    if not arch.moe:
        raise Unsupported(f"plan ep={ep}: expert parallelism needs a mixture of experts (model.family: moe)")
    if plan.dp % ep:
        raise Unsupported(f"plan ep={ep} does not divide dp={plan.dp}: experts are split over data-parallel ranks")
    return (f"ep={ep} runs with every expert on every data-parallel rank (no expert parallelism): dropless "
            "routing makes the arithmetic the same; the memory per rank is higher than the plan's")


_FLASH_KEYS = ("flash_attention", "flashAttention")


def _flash_attention(plan: Plan) -> bool:
    """The plan's flash_attention (absent: True, the estimator's default, estimator/plans.py)."""
    for key in _FLASH_KEYS:
        if key in plan.extra and plan.extra[key] is not None:
            raw = plan.extra[key]
            if isinstance(raw, bool) or raw in (0, 1):
                return bool(raw)
            if isinstance(raw, str) and raw.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
                return raw.strip().lower() in ("true", "1", "yes")
            raise Unsupported(f"plan {key}={raw!r} is not true or false")
    return True


def resolve(ctx: TrainerContext, options: Options) -> TrainConfig:
    """The run this trainer will do for `ctx`, or Unsupported with the reason."""
    plan = ctx.plan
    if plan.world_size != ctx.world_size:
        if plan.tp == plan.pp == 1:
            raise Unsupported(f"plan dp={plan.dp} does not match WORLD_SIZE={ctx.world_size} (tp=pp=1)")
        raise Unsupported(f"plan dp={plan.dp} x tp={plan.tp} x pp={plan.pp} = {plan.world_size} processes does "
                          f"not match WORLD_SIZE={ctx.world_size}")
    if ctx.iterations < 0:
        raise Unsupported(f"iterations must be >= 0, got {ctx.iterations}")
    model, arch = resolve_model_arch(ctx.model)
    tp_divides(arch, model, plan.tp)
    if plan.pp > model.num_layers:
        raise Unsupported(f"plan pp={plan.pp} has more pipeline stages than the model has layers "
                          f"({model.num_layers})")
    micro, accum, note = batch_layout(ctx.global_batch_size, plan.dp, plan.micro_batch, plan.grad_accum)
    notes = [note] if note else []
    schedule = ""
    if plan.pp > 1:
        micro, accum, schedule, note = pipeline_layout(micro * accum, micro, accum, plan.pp,
                                                       plan.pp_schedule or DEFAULT_PP_SCHEDULE,
                                                       explicit=bool(plan.pp_schedule))
        if note:
            notes.append(note)
    elif plan.pp_schedule:
        notes.append(f"pp_schedule={plan.pp_schedule} ignored: pp=1")
    zero = plan.zero_stage
    if zero == 1:
        zero = 2
        notes.append("zero_stage=1 runs as ZeRO-2 (FSDP2 shards gradients with the optimizer state; it has no "
                     "optimizer-only sharding)")
    if plan.offload != "none":
        if zero < 2:
            zero = 2
            notes.append(f"offload={plan.offload} runs on sharded data parallelism: using ZeRO-2 (FSDP2 with "
                         f"CPUOffloadPolicy)")
        if plan.offload == "optimizer":
            notes.append("offload=optimizer runs as FSDP2's CPUOffloadPolicy, which offloads the sharded "
                         "parameters and gradients too")
    _refuse_unsupported_extras(plan)
    if note := _expert_parallel_note(plan, arch):
        notes.append(note)
    flash = _flash_attention(plan)
    if plan.activation_checkpointing == "selective" and flash:
        # The estimator refuses the same plan (estimator/plans.py): under flash attention there are no
        # scores to recompute, so 'selective' would run 'none' under another name.
        raise Unsupported("plan activation_checkpointing 'selective' is Megatron's attention-core recompute: "
                          "under flash attention it changes nothing; use 'full', or flash_attention: false")
    ranges = stage_ranges(plan, model.num_layers)
    if ranges:
        notes.append("pipeline stages of the plan: " + ", ".join(
            f"{s}: layers {a}-{b - 1}" + (f" ({t})" if t else "") for s, (a, b, t) in enumerate(ranges)))
    ignored = sorted(k for k in plan.extra if k not in (*_FLASH_KEYS, "stages", "ep"))
    if ignored:
        notes.append(f"ignoring plan fields this trainer does not use: {ignored}")
    return TrainConfig(
        model=model,
        arch=arch,
        plan=plan,
        world_size=ctx.world_size,
        iterations=ctx.iterations,
        global_batch=ctx.global_batch_size,
        micro_batch=micro,
        grad_accum=accum,
        checkpoint_every=ctx.checkpoint_interval(DEFAULT_CHECKPOINT_EVERY),
        options=options,
        notes=tuple(notes),
        zero_stage=zero,
        offload=plan.offload,
        activation_checkpointing=plan.activation_checkpointing,
        pp_schedule=schedule,
        flash_attention=flash,
        stage_ranges=tuple((a, b) for a, b, _ in ranges),
    )


def stage_ranges(plan: Plan, num_layers: int) -> list[tuple[int, int, str]]:
    """The plan's `stages` (TESSERA_PLAN; a pipeline over mixed GPU types) as (start, end, GPU type),
    checked: one per pipeline stage, contiguous, each at least one layer, covering the model; []
    when the plan has none. Unsupported naming the stage otherwise."""
    raw = plan.extra.get("stages")
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(s, dict) for s in raw):
        raise Unsupported("plan stages must be a list of {layer_start, layer_end} objects")
    if len(raw) != plan.pp:
        raise Unsupported(f"plan stages lists {len(raw)} stages for pp={plan.pp}")
    out: list[tuple[int, int, str]] = []
    start = 0
    for i, s in enumerate(raw):
        try:
            a, b = int(s.get("layer_start", s.get("layerStart", 0))), int(s.get("layer_end", s.get("layerEnd", 0)))
        except (TypeError, ValueError):
            raise Unsupported(f"plan stages[{i}]: layer_start and layer_end must be integers") from None
        if a != start or b <= a:
            raise Unsupported(f"plan stages[{i}]: layers [{a}, {b}) do not follow on from layer {start} with at "
                              "least one layer")
        out.append((a, b, str(s.get("gpu_model", s.get("gpuModel", "")))))
        start = b
    if start != num_layers:
        raise Unsupported(f"plan stages cover layers 0-{start - 1}, the model has {num_layers}")
    return out
