"""The memory formula for the recipes of PyTorch-native stacks (torchtitan; transformers + PEFT):
FSDP2, per-op selective checkpointing, context parallelism, LoRA/QLoRA, Float8, torch.compile, the
loss implementations, and the current model families (Llama 3, Mistral/Mixtral, Qwen2.5, Gemma 2,
T5/mT5). memory.py hands a plan here when `uses_native_stack(model, plan)`; docs/estimator-memory.md
("PyTorch-native recipes") states every term and its measured error.

The stack: a plan whose loss is 'fp32' or 'chunked', or whose sharding is 'fsdp', or that trains LoRA,
uses Float8, compile, per-op checkpointing or context parallelism, or an encoder-decoder model, runs
the way FSDP2 runs it (torch.distributed.fsdp.fully_shard, the data-parallel wrapper of torchtitan and of
transformers' FSDP2 path; unsharded, a one-rank shard group as HSDP's replicas; AMP unsharded: autocast):
- one stored copy of each parameter, sharded over dp*cp (torchtitan folds cp into the FSDP mesh,
  'dp_shard_cp'), in the storage dtype: fp32 for every recipe with an fp32 master (amp, mixed,
  megatron-bf16, megatron-fp16: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), torchtitan's
  default), bf16 for 'bf16', fp32 for 'fp32'; AdamW's m and v in the storage dtype;
- gradients sharded, in the reduce dtype, and not kept between steps (zero_grad(set_to_none=True)):
  with one micro-batch and no pipeline they do not exist at the start of backward;
- the all-gathered (unsharded) compute-dtype parameters of the layers in flight: reshard_after_forward
  keeps two layers (the running one and the prefetched next), plus the output layer (torchtitan does
  not reshard [norm, output] after forward: backward needs them at once), plus, in a layer's backward,
  its unsharded gradient (param dtype) and the reduce-scatter input (reduce dtype); without resharding
  (FSDP2 under PP) the stage's parameters stay unsharded and an unsharded fp32 gradient accumulates
  over the micro-batches (FSDPParam.to_accumulated_grad_if_needed upcasts to reduce_dtype).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tessera.estimator.memory_layers import Shape, Stack, norm_saved, stored_bytes
from tessera.estimator.memory_lora import INT8_BYTES, NF4_BYTES, largest_tensor, lora_state
from tessera.estimator.memory_params import (
    LORA_LINEARS,
    _encdec_layer_params,
    _layer_linears,
    adapter_params,
    model_params,
)
from tessera.estimator.memory_terms import local_vocab, stage_layers, state_bytes
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError


def uses_native_stack(model: ModelDims, plan: ExecutionPlan) -> bool:
    """Whether the plan runs the PyTorch-native recipes (module docstring) rather than Megatron's."""
    return (plan.sharding == "fsdp" or plan.loss != "fused" or plan.lora_rank > 0 or plan.cp > 1
            or plan.checkpointing == "op" or plan.float8 != "none" or plan.compile
            or model.family == "encoder-decoder")


def stack_of(model: ModelDims, plan: ExecutionPlan) -> Stack:
    """The stack that trains this model: torchtitan trains Llama-style decoders (and Mixtral-style
    MoE); transformers (+ PEFT) trains everything with LoRA, encoder-decoders, Gemma 2 (sandwich norms,
    soft-capping) and the families torchtitan has no model for (GPT-2/BERT style, Qwen2.5's biases)."""
    if plan.lora_rank or model.family == "encoder-decoder" or model.sandwich_norm or model.logit_softcap \
            or model.qkv_bias or not model.gated or model.family == "encoder":
        return "transformers"
    return "torchtitan"


@dataclass(frozen=True)
class Dtypes:
    """Bytes per element: stored (master) parameter, gradient (reduce dtype), optimizer state per
    parameter, compute (all-gathered parameters, activations)."""

    storage: int
    grad: int
    optimizer: int
    compute: int


def native_dtypes(plan: ExecutionPlan) -> Dtypes:
    if plan.precision == "fp32":
        return Dtypes(4, 4, 8, 4)
    if plan.precision == "bf16":
        return Dtypes(2, 2, 4, 2)
    if plan.precision == "mixed-adafactor":
        raise PlanInputError("plan.precision", "the PyTorch-native recipes train with AdamW; 'mixed-adafactor' "
                                               "is the Crius artifact's Alpa recipe")
    return Dtypes(4, 4, 8, 2)


def uses_autocast(plan: ExecutionPlan) -> bool:
    """PyTorch AMP without FSDP2 (one GPU, DDP): fp32 weights, torch.autocast casting each op's inputs, as
    torchtitan's maybe_enable_amp does when FSDP (which CP turns on), TP and PP are off. Not LoRA (bf16 base)."""
    return plan.precision == "amp" and plan.sharding == "none" and not plan.lora_rank and plan.cp == plan.tp == plan.pp == 1


def check_native(model: ModelDims, plan: ExecutionPlan) -> None:
    """Combinations the native formula cannot mean, refused by the field."""
    if model.family == "encoder-decoder" and plan.pp > 1:
        raise PlanInputError("plan.pp", "pipelining an encoder-decoder (T5) is not modelled: its decoder "
                                        "needs the encoder's output in every layer")
    if model.family == "encoder-decoder" and plan.cp > 1:
        raise PlanInputError("plan.cp", "context parallelism is for causal decoders (ring attention's "
                                        "load-balanced causal split); an encoder-decoder is not modelled")
    if plan.offload != "none" and plan.offload != "frozen" and plan.sharding == "fsdp" and plan.pp > 1:
        raise PlanInputError("plan.offload", "CPU offload with FSDP2 under pipelining is not modelled")
    if model.family == "moe" and not model.gated and plan.lora_rank:
        raise PlanInputError("plan.lora_rank", "LoRA on GShard-style MoE experts is not modelled")


def recipe_warnings(model: ModelDims, plan: ExecutionPlan) -> tuple[str, ...]:
    """Fields that change nothing (or nothing the formula counts) under the plan's other settings."""
    out: list[str] = []
    if model.sliding_window:
        out.append("model.sliding_window: no memory change: flash attention stores no scores whatever the "
                   "window, and plain attention masks a full s x s score matrix")
    if plan.async_tp:
        out.append("plan.async_tp: no memory change counted (the micro-pipelined TP overlaps the same "
                   "all-gather/reduce-scatter buffers in chunks); it changes time only")
    if plan.compile and not uses_native_stack(model, ExecutionPlan()) and plan.checkpointing == "full":
        out.append("plan.compile: under full checkpointing only the recomputed layer's intermediates shrink")
    if plan.float8 == "linear" and plan.sharding != "fsdp":
        out.append("plan.float8: 'linear' keeps the bf16 inputs and weights for backward (torchao casts "
                   "inside the matmul): stored activations do not change, only transient float8 copies")
    if plan.sharding == "fsdp" and plan.dp * plan.cp == 1 and plan.reshard_after_forward != "auto":
        out.append("plan.reshard_after_forward: one rank holds every parameter: resharding frees only the "
                   "compute-dtype copies")
    if plan.lora_rank and plan.checkpointing == "op":
        out.append("plan.checkpointing: 'op' with LoRA counts the adapters' matmuls in torchtitan's "
                   "every-second-matmul rule")
    return tuple(out)


# ------------------------------------------------------------------------------------------------
# Resident state and FSDP2's working set


@dataclass(frozen=True)
class NativeState:
    parameters: float  # sharded (stored) parameters, frozen base included
    gradients: float  # sharded gradients after backward
    optimizer: float
    cpu: float
    unsharded_params: float  # FSDP2 without resharding (PP): the stage's compute-dtype parameters
    unsharded_grads: float  # FSDP2 without resharding: the accumulated reduce-dtype gradient
    layer_ws: float  # a layer's all-gathered params x 2 (in flight + prefetched)
    layer_grad_ws: float  # a layer's unsharded gradient (compute dtype) in its backward
    layer_rs: float  # and the reduce-scatter input (reduce dtype)
    head_ws: float  # the output layer's unsharded weight (kept from forward to backward)
    head_grad_ws: float  # its unsharded gradient (compute dtype)
    head_rs: float  # and its reduce-scatter input
    opt_tmp: float  # AdamW's temporary for the largest tensor shard
    notes: tuple[str, ...]


def native_state(m: ModelDims, plan: ExecutionPlan, stage: int, stack: Stack = "torchtitan") -> NativeState:
    dt = native_dtypes(plan)
    dense, expert, largest_layer, _ = model_params(m, plan, stage)
    total = dense + expert
    if plan.lora_rank:  # only the adapters train, under every sharding (memory_lora.py)
        ls = lora_state(m, plan, stage, stack, dt.storage, dt.grad, dt.optimizer, dt.compute)
        return NativeState(ls.parameters, ls.gradients, ls.optimizer, ls.cpu, 0, 0, ls.layer_ws, 0, 0, ls.head_ws, 0,
                           0, ls.opt_tmp, ls.notes)
    if plan.sharding in ("zero1", "zero2"):  # DeepSpeed ZeRO-1/2 (transformers), full fine-tuning: the recipe's bytes
        p, g, o, host, _ = state_bytes(m, plan, stage)
        zshards = plan.dp * plan.cp
        return NativeState(p, g * (1 if plan.zero_stage < 2 else 1 / plan.cp), o / plan.cp, host, 0, 0, 0, 0, 0, 0,
                           0, 0, 4 * largest_tensor(m, plan) / zshards, ("ZeRO-1/2: the recipe's bytes per parameter",))
    shards = plan.dp * plan.cp if plan.sharding in ("fsdp", "zero3") else 1
    c = dt.compute
    v_l = local_vocab(m, plan.tp)
    h = m.hidden_size
    head = v_l * h
    notes: list[str] = []
    params: float
    grads: float
    opt: float
    cpu: float
    head_ws: float
    layer_ws: float
    params = total * dt.storage / shards
    grads = total * dt.grad / shards
    opt = total * dt.optimizer / shards
    cpu = 0.0
    if plan.offload in ("optimizer", "optimizer+params"):  # FSDP2's CPUOffloadPolicy: params, grads, states on host
        cpu = params + grads + opt
        params = grads = opt = 0.0
    w8 = 1 if plan.float8 == "linear+allgather" else c  # torchao all-gathers float8 linear weights
    layer_gathered = largest_layer * c if w8 == c else (largest_layer * c - _layer_linear(m, plan) * (c - 1))
    unsharded_p = unsharded_g = 0.0
    layer_ws = layer_grad_ws = layer_rs = head_ws = head_grad_ws = head_rs = 0.0
    if plan.sharding == "fsdp" and not plan.reshards_after_forward:
        stage_params = total
        unsharded_p = stage_params * c
        # the accumulated gradient exists once a micro-batch's backward has run before the peak: in 1F1B's
        # steady state, when the stage runs more micro-batches than it holds in flight
        unsharded_g = stage_params * dt.grad if plan.grad_accum > inflight(plan, stage) else 0.0
        layer_rs = largest_layer * dt.grad
        notes.append("FSDP2 without resharding: the stage's parameters stay unsharded (compute dtype) and an "
                     "unsharded reduce-dtype gradient accumulates until the last micro-batch")
    else:
        autocast = uses_autocast(plan)
        layer_ws = 0.0 if autocast else 2 * layer_gathered  # autocast: the casts are kept activations
        layer_grad_ws = largest_layer * c
        layer_rs = largest_layer * dt.grad
        if stage == plan.pp - 1:
            # torchtitan shards [norm, output] as one unit it never reshards after forward; transformers
            # (accelerate's FSDP2) leaves the embedding, final norm and head to the root unit, which FSDP2
            # does not reshard after forward either: all of them stay gathered until backward. Under
            # autocast the output layer's weight cast is kept likewise (the embedding reads its fp32 weight).
            root = head if (stack == "torchtitan" or m.tied_embeddings or autocast) else 2 * head
            head_ws = c * root
            head_grad_ws = c * head
            head_rs = dt.grad * head
        notes.append("autocast without FSDP2: fp32 residual stream and norms; every linear keeps its weight's "
                     "cast, and its own cast of a norm's output, until its backward" if autocast else
                     "FSDP2 resharding after forward: two layers' compute-dtype parameters in flight, the "
                     "output layer unsharded from its forward to its backward")
    return NativeState(params, grads, opt, cpu, unsharded_p, unsharded_g, layer_ws, layer_grad_ws, layer_rs, head_ws,
                       head_grad_ws, head_rs, 4 * largest_tensor(m, plan) / shards, tuple(notes))


def inflight(plan: ExecutionPlan, stage: int) -> int:
    """Micro-batches stage `stage` holds at its peak: 1F1B min(m, pp - stage), GPipe all m."""
    return plan.grad_accum if plan.schedule == "gpipe" else min(plan.grad_accum, plan.pp - stage)


def _layer_linear(m: ModelDims, plan: ExecutionPlan) -> int:
    return sum(i * o for _, i, o, _ in _layer_linears(m, plan.tp, 0, False))


# ------------------------------------------------------------------------------------------------
# Activations


def shape_of(m: ModelDims, plan: ExecutionPlan, stack: Stack, tokens_seq: int, enc_seq: int = 0,
             device: str = "cuda") -> Shape:
    dt = native_dtypes(plan)
    s_local = tokens_seq // plan.cp
    b = plan.micro_batch
    lora = frozenset(LORA_LINEARS[plan.lora_targets]) if plan.lora_rank else frozenset()
    lora_names = frozenset(f"{p}{n}" for p in ("attn.", "cross.", "mlp.") for n in lora)
    return Shape(b * s_local, b, s_local, dt.compute, plan.tp, plan.tp if plan.sequence_parallel and plan.tp > 1 else 1,
                 plan.flash_attention, stack, lora_names, plan.lora_rank, plan.lora_rank > 0, plan.compile,
                 enc_seq=enc_seq, device=device, storage=dt.storage, autocast=uses_autocast(plan))


def _policy(plan: ExecutionPlan, index: int) -> str:
    """The checkpointing of layer `index` (0-based): every `checkpoint_every`-th layer (torchtitan's
    counter: layers n-1, 2n-1, ...) gets the plan's policy, the others keep everything."""
    if plan.checkpointing in ("op", "full") and (index + 1) % plan.checkpoint_every:
        return "none"
    return plan.checkpointing


def loss_terms(m: ModelDims, plan: ExecutionPlan, x: Shape, head_trains: bool) -> tuple[float, float, str]:
    """(kept for backward, extra at the loss's peak, what was assumed) of the output layer and loss.

    fused: Megatron's vocab-parallel cross-entropy keeps an fp32 softmax (4 T V/t) that becomes the
    gradient in place; its peak adds the bf16 logits beside it.
    fp32 (torchtitan, transformers): bf16 logits -> .float() -> log_softmax, which keeps its fp32
    output (4 T V/t; the bf16 logits and fp32 copy are freed); backward holds the kept output, NLL's
    fp32 gradient and log_softmax's fp32 gradient at once (8 T V/t beyond what is kept).
    chunked (torchtitan's ChunkedLossWrapper, 8 chunks): the output layer and loss run chunk by chunk,
    each chunk's backward at once: nothing logits-sized is kept, the peak is one chunk's (12 T V / 8t
    beyond the detached hidden states and their accumulated gradient, 2 e T h).
    Gemma 2's soft-capping (tanh(logits / c) * c in bf16) keeps tanh's output (e T V/t) too."""
    n, e, v = x.tokens, x.e, local_vocab(m, plan.tp)
    targets = 8 * n
    cap = e * n * v if m.logit_softcap else 0.0
    if m.family == "encoder-decoder" and plan.loss == "fp32":
        # transformers' T5 computes CrossEntropyLoss on the bf16 logits (no upcast): log_softmax keeps
        # e T V, and backward holds NLL's and log_softmax's gradients in bf16 beside it
        return e * n * v + targets, 2 * e * n * v, "T5's cross-entropy on bf16 logits"
    if plan.loss == "fused":
        return 4 * n * v + targets + cap, e * n * v + cap, "fused vocab-parallel cross-entropy"
    if plan.loss == "fp32" and plan.tp > 1 and x.stack == "torchtitan":
        # torchtitan's loss parallel (torch.distributed.tensor.parallel.loss): nll_loss's backward handler
        # computes (zeros_like(x) with the target's -1 + exp(x)) * grad on the kept fp32 log-softmax x,
        # holding the zeros, exp(x) and their sum beside it (12 T V/t beyond what is kept)
        return 4 * n * v + targets + cap, 12 * n * v, "fp32 log-softmax kept, loss parallel"
    if plan.loss == "fp32":
        return 4 * n * v + targets + cap, 8 * n * v, "fp32 log-softmax kept"
    chunks = 8
    # the hidden states, their contiguous chunk copies and the fp32 gradient accumulator (GradAccumulator)
    kept = targets + (2 * e + 4) * n * m.hidden_size
    # a chunk's peak, in its backward: its bf16 logits and their fp32 copy (still referenced by the loop),
    # the kept log-softmax, NLL's and log-softmax's fp32 gradients (measured on the trace: 18 T V / 8 at
    # the first chunk; later chunks add the head's gradient, counted with it)
    return kept, (16 + e + (2 * e if m.logit_softcap else 0)) * n * v / chunks, f"chunked loss ({chunks} chunks)"


def layer_backward_ws(m: ModelDims, plan: ExecutionPlan, x: Shape, index: int, kind: str) -> float:
    """The transient of one layer's backward beyond what it keeps: the incoming gradient (e T h), the
    largest intermediate's gradient (e T f), the rebuilt tensors of a recomputed layer, CP's ring
    buffers (one more K, V block in flight and fp32 accumulators of dq, dk, dv) and Float8's copies."""
    n, e, h = x.tokens, x.e, m.hidden_size
    f_l = m.ffn // x.tp
    a_l, kv_l, d = m.num_heads // x.tp, m.kv_heads // x.tp, m.head_dim
    work = e * n * h / x.sp + 2 * e * n * f_l
    policy = _policy(plan, index)
    if policy in ("op", "full"):
        work += stored_bytes(m, x, index, "none", kind) - stored_bytes(m, x, index, policy, kind)
    if plan.cp > 1:
        work += 2 * e * n * kv_l * d + 4 * n * (a_l + 2 * kv_l) * d
    if plan.float8 != "none":
        work += n * max(h, f_l) + h * f_l  # float8 copies of the largest linear's input and weight
    return work


@dataclass(frozen=True)
class NativeActivations:
    stored: float  # kept by all in-flight micro-batches at the start of backward
    loss_peak: float  # extra at the loss's backward
    head_bwd: float  # extra at the output layer's backward (beyond its weight's gradient)
    layer_peak: float  # extra in the first layer's backward
    note: str
    # encoder-decoder: all activations at the top encoder layer's attention backward (the decoder's
    # freed by then), and the share of the parameters whose gradients exist by then
    enc_bwd: float = 0.0
    enc_grad_share: float = 0.0
    top_layer: float = 0.0  # what the stage's last layer keeps for one micro-batch
    layers: int = 0  # the stage's layers
    layer_params: int = 0  # the largest layer's parameters on the rank
    head_tokens: int = 0  # tokens of one micro-batch through the output layer
    # encoder-decoder: all activations at the bottom encoder layer's backward (the layers above freed,
    # the bottom one's recomputed or kept tensors live) and that layer's parameters on the rank
    enc_bottom: float = 0.0
    enc_layer_params: int = 0
    # what one micro-batch keeps for the final norm, the output layer and the loss (freed once their
    # backward has run, before any layer's)
    head_kept: float = 0.0


def native_activations(m: ModelDims, plan: ExecutionPlan, stage: int, stack: Stack,
                       device: str = "cuda") -> NativeActivations:
    first, last = stage == 0, stage == plan.pp - 1
    trains = plan.lora_rank == 0
    if m.family == "encoder-decoder":
        xe = shape_of(m, plan, stack, m.seq_length, device=device)
        xd = shape_of(m, plan, stack, m.target_length, enc_seq=m.seq_length, device=device)
        enc = sum(stored_bytes(m, xe, i, _policy(plan, i)) for i in range(m.num_layers))
        dec = sum(stored_bytes(m, xd, i, _policy(plan, i + m.num_layers), "cross") for i in range(m.decoder_layers))
        a_l = m.num_heads // plan.tp
        # the encoder output (kept by every decoder layer's cross-attention K, V projections), the final
        # norms, each stack's relative position bias (kept by the attention kernel as its additive mask;
        # the bucket indices by the bias embedding's backward), the embeddings' token ids
        s, t = m.seq_length, m.target_length
        # the relative-position bucket indices (int64, kept by the bias embedding's backward) of the encoder
        # (s x s) and decoder (t x t) self-attention; the cross-attention's zero bias mask (a x t x s, bf16),
        # which SDPA keeps; the decoder's causal mask (bool)
        bias: float = 8 * (s * s + t * t) + xe.e * a_l * t * s + t * t
        extra: float = xe.e * xe.tokens * m.hidden_size + bias + 8 * (xe.tokens + xd.tokens)
        extra += sum(n.nbytes for n in norm_saved(m, xe, "enc.final", xe.tokens * m.hidden_size))
        extra += sum(n.nbytes for n in norm_saved(m, xd, "dec.final", xd.tokens * m.hidden_size))
        kept, peak, what = loss_terms(m, plan, xd, trains)
        head_in = xd.e * xd.tokens * m.hidden_size if trains else 0.0
        dec_norm = sum(n.nbytes for n in norm_saved(m, xd, "dec.final", xd.tokens * m.hidden_size))
        stored = enc + dec + extra + kept + head_in
        layer_peak = layer_backward_ws(m, plan, xd, m.num_layers + m.decoder_layers - 1, "cross")
        # the encoder's math-path attention backward: the fp32 gradient of the softmax, softmax's backward
        # output and the relative bias's gradient (b x heads x s x s each, fp32) beside what is kept
        enc_kept = enc + xe.e * xe.tokens * m.hidden_size + 8 * (s * s + xe.tokens) + \
            sum(n.nbytes for n in norm_saved(m, xe, "enc.final", xe.tokens * m.hidden_size))
        math = xe.storage > xe.e  # the fp32 math path (above); else SDPA's math path in bf16
        enc_bwd = enc_kept + xe.e * xe.tokens * m.hidden_size + (12 * plan.micro_batch * a_l * s * s if math else 0)
        if not math:  # the bf16 math path's backward: the softmax's and the bias's gradients in bf16
            enc_bwd += 3 * xe.e * plan.micro_batch * a_l * s * s
        total_p, _, _, _ = model_params(m, plan, 0)
        enc_p = sum(_encdec_layer_params(m, plan.tp, False, i == 0) for i in range(m.num_layers))
        top = stored_bytes(m, xd, m.decoder_layers - 1, _policy(plan, m.num_layers + m.decoder_layers - 1), "cross")
        # the same attention backward in the bottom encoder layer: the layers above have freed what they
        # kept; the bottom layer holds everything (recomputed under checkpointing)
        enc_bottom = enc_bwd - enc + stored_bytes(m, xe, 0, "none")
        return NativeActivations(stored, peak, head_backward(m, plan, xd), layer_peak, f"encoder-decoder; {what}",
                                 enc_bwd, 1 - enc_p / total_p, top_layer=top, layers=m.decoder_layers,
                                 layer_params=model_params(m, plan, 0)[2], head_tokens=xd.tokens,
                                 enc_bottom=enc_bottom, enc_layer_params=_encdec_layer_params(m, plan.tp, False, False),
                                 head_kept=kept + head_in + dec_norm)
    x = shape_of(m, plan, stack, m.seq_length, device=device)
    layers = stage_layers(m, plan)[stage]
    per_mb = sum(stored_bytes(m, x, i, _policy(plan, i)) for i in layers)
    if first:
        per_mb += 8 * x.tokens if trains else 0  # token ids (the embedding's backward)
    peak = 0.0
    what = ""
    head_kept = 0.0
    if last:
        head_kept += sum(n.nbytes for n in norm_saved(m, x, "final", x.tokens * m.hidden_size / x.sp))
        if trains and plan.loss != "chunked":  # the chunked loss's chunk copies are the output layer's input
            head_kept += x.e * x.tokens * m.hidden_size  # the output layer's input (gathered under SP)
        kept, peak, what = loss_terms(m, plan, x, trains)
        head_kept += kept
        if plan.pp > 1 and plan.loss != "chunked":
            # torch.distributed.pipelining keeps the last stage's output (the logits, e T V/t) in its
            # fwd_cache until that micro-batch's backward (stage.py forward_one_chunk); without PP
            # torchtitan's trainer drops it before loss.backward() (`del pred`). Under the chunked loss
            # the output is the hidden states the loss wrapper keeps anyway.
            head_kept += x.e * x.tokens * local_vocab(m, plan.tp)
        per_mb += head_kept
    layer_peak = layer_backward_ws(m, plan, x, layers[-1], "decoder") if layers else 0.0
    top = stored_bytes(m, x, layers[-1], _policy(plan, layers[-1])) if layers else 0.0
    biggest = model_params(m, plan, stage)[2]
    return NativeActivations(per_mb * inflight(plan, stage), peak, head_backward(m, plan, x) if last else 0.0,
                             layer_peak, what, top_layer=top, layers=len(layers), layer_params=biggest,
                             head_tokens=x.tokens, head_kept=head_kept)


def head_backward(m: ModelDims, plan: ExecutionPlan, x: Shape) -> float:
    """The output layer's backward: the logits' gradient in the compute dtype and the input's gradient,
    the fp32 log-softmax (fp32 loss) freed by then; the chunked loss has run its backward already."""
    if plan.loss == "chunked":
        return 0.0
    n, e, v = x.tokens, x.e, local_vocab(m, plan.tp)
    return e * n * v + e * n * m.hidden_size - (4 * n * v if plan.loss == "fp32" else 0)


# ------------------------------------------------------------------------------------------------
# The estimate


@dataclass(frozen=True)
class NativeEstimate:
    parameters: int
    gradients: int
    optimizer: int
    activations: int
    comm: int  # FSDP2's all-gather / reduce-scatter buffers at the peak (in activations of MemoryBreakdown)
    cpu: int
    moment: str
    notes: tuple[str, ...]

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.comm


def native_estimate(m: ModelDims, plan: ExecutionPlan, stage: int, stack: Stack | None = None,
                    device: str = "cuda") -> NativeEstimate:
    """Peak bytes of one rank of `stage` under the native recipes, by category, at the largest of the
    moments native_candidates weighs."""
    return max(native_candidates(m, plan, stage, stack, device), key=lambda e: e.total)


def native_candidates(m: ModelDims, plan: ExecutionPlan, stage: int, stack: Stack | None = None,
                      device: str = "cuda") -> list[NativeEstimate]:
    """Bytes of one rank of `stage` under the native recipes, by category, at each moment that can be
    the peak: the start of backward (activations kept, the loss's or the first layer's backward
    transient, FSDP2's working set; gradients only if they persist across micro-batches or under PP)
    and the optimizer step (all gradients, AdamW's temporary)."""
    check_native(m, plan)
    stk = stack or stack_of(m, plan)
    st = native_state(m, plan, stage, stk)
    if stk == "torchtitan":
        # each attention's rotary table (complex64 per position and head-dim pair), a buffer FSDP2 does not
        # shard: sized to the trained sequence (torchtitan's model registry sizes it to its max_seq_len)
        rope = len(stage_layers(m, plan)[stage]) * m.seq_length * (m.head_dim // 2) * 8
        st = replace(st, parameters=st.parameters + rope)
    act = native_activations(m, plan, stage, stk, device)
    # Sharded gradients at the start of a backward: without PP, FSDP2 reduce-scatters every micro-batch,
    # so they exist from the second one on; under PP the pipeline schedule defers gradient sync to the
    # last micro-batch (the stage's unsharded accumulated gradient stands in: NativeState).
    grads_persist = (plan.grad_accum > 1 and plan.pp == 1) or plan.sharding in ("zero1", "zero2")
    g0 = st.gradients if grads_persist else 0.0
    notes = (*st.notes, f"stack {stk}; {act.note}")
    cands: list[NativeEstimate] = []

    def cand(params: float, grads: float, acts: float, comm: float, moment: str) -> None:
        cands.append(NativeEstimate(int(params), int(grads), int(st.optimizer), int(acts), int(comm), int(st.cpu),
                                    moment, notes))

    base_p = st.parameters + st.unsharded_params
    base_g = g0 + st.unsharded_grads
    sharded = plan.sharding == "fsdp" and plan.dp * plan.cp > 1
    # The loss's backward: the output layer (with transformers the root unit) still gathered; the chunked
    # loss runs the output layer's backward per chunk, its gradient sync off until the last chunk, so
    # its unsharded gradient exists at the chunk's peak; transformers' layers are FSDP2 units under the
    # root: by the loss the last layer's all-gather (prefetched for its backward) is in flight.
    chunk_grads = st.head_grad_ws if plan.loss == "chunked" else 0.0
    prefetch = st.layer_ws / 2 if stk == "transformers" and sharded else 0.0
    cand(base_p + st.head_ws, base_g + chunk_grads, act.stored + act.loss_peak, prefetch, "the loss's backward")
    # The output layer's backward: during its matmul's backward, the logits' and input's gradients
    # beside its unsharded weight gradient; after it (FSDP2's post-backward), that gradient and its
    # reduce-scatter input, the logits' gradient freed.
    cand(base_p + st.head_ws, base_g + st.head_grad_ws, act.stored + act.head_bwd, 0.0,
         "the output layer's backward")
    freed = act.head_bwd - (native_dtypes(plan).compute * act.head_tokens * (local_vocab(m, plan.tp) + m.hidden_size))
    cand(base_p + st.head_ws, base_g + st.head_grad_ws, act.stored + freed, st.head_rs,
         "the output layer's reduce-scatter")
    # The k-th layer's backward (counted from the top): what the final norm, output layer and loss kept
    # for this micro-batch is freed (their backward has run); the kept tensors of the k-1 layers above are
    # freed and their sharded gradients exist (reduce-scattered per layer without PP); the running layer
    # is gathered and the next one's all-gather is in flight; the previous layer's reduce-scatter input
    # has not been freed yet (the output unit's has: measured on the trace). Linear in k: k = 1, 2 and
    # the last two suffice.
    # torchtitan reshards the output unit after its backward; transformers' root stays gathered.
    one = st.layer_ws / 2
    per_grad = native_dtypes(plan).grad * act.layer_params / (plan.dp * plan.cp) if sharded and plan.pp == 1 else 0.0
    root = st.head_ws if stk == "transformers" else 0.0
    # The last layer prefetches the embedding (torchtitan's own unit on the first stage; transformers'
    # root is gathered already), not another layer.
    c = native_dtypes(plan).compute
    emb_unit = c * local_vocab(m, plan.tp) * m.hidden_size if stk == "torchtitan" and stage == 0 and sharded else 0.0
    n = act.layers
    for k in sorted({1, 2, n - 1, n} & set(range(1, n + 1))):
        pending = 0.0 if k == 1 else st.layer_rs
        ahead = one if k < n else emb_unit
        cand(base_p + root + one, base_g + (k - 1) * per_grad + (st.layer_grad_ws if one == 0 else 0.0),
             act.stored - act.head_kept - (k - 1) * act.top_layer + act.layer_peak, ahead + pending,
             f"layer {k}'s backward")
    if act.enc_bwd:
        enc_grads = st.gradients * act.enc_grad_share + st.layer_grad_ws
        cands.append(NativeEstimate(int(st.parameters + st.layer_ws + st.head_ws), int(enc_grads), int(st.optimizer),
                                    int(act.enc_bwd), int(st.layer_rs), int(st.cpu), "the encoder's backward", notes))
    if act.enc_bottom and plan.lora_rank == 0 and plan.sharding not in ("zero1", "zero2"):
        # The bottom encoder layer's backward, the last layer backward of a T5 step: every gradient is
        # reduce-scattered but the root unit's (embedding, head: its post-backward runs at the end of
        # backward) and the two bottom layers' (the running one's, and the one above, whose reduce-scatter
        # is in flight); the root holds its unsharded gradients meanwhile: the head's and the shared
        # embedding's from the decoder's embedding backward (one accumulated gradient when tied), which the
        # tracker counts as temporaries. The running layer is gathered, its all-gather buffer still held.
        c = native_dtypes(plan).compute
        g = native_dtypes(plan).grad
        shards = plan.dp * plan.cp if plan.sharding in ("fsdp", "zero3") else 1
        enc_one = c * act.enc_layer_params
        root_p = st.head_ws / c
        sharded_g = st.gradients - g * (root_p + 2 * act.enc_layer_params) / shards
        cands.append(NativeEstimate(int(st.parameters + st.head_ws + enc_one), int(sharded_g), int(st.optimizer),
                                    int(act.enc_bottom + c * root_p), int(enc_one + g * act.enc_layer_params),
                                    int(st.cpu), "the bottom encoder layer's backward", notes))
    # after backward FSDP2 has resharded (reshard_after_backward) and reduce-scattered everything: the
    # first stage's last backward is the embedding's: the dense gradient's fp32 accumulation and its
    # cast (embedding_dense_backward); transformers' root unit (embedding and head) is still gathered,
    # torchtitan's embedding is its own unit, whose unsharded gradient is separate. Then the optimizer
    # step's temporary.
    if stage == 0 and not plan.lora_rank and plan.sharding not in ("zero1", "zero2"):
        c = native_dtypes(plan).compute
        vh = local_vocab(m, plan.tp) * m.hidden_size
        emb = (4 + c) * vh + (c * vh if stk == "torchtitan" else 0)
        emb_params = st.head_ws if stk == "transformers" else 0.0
        cands.append(NativeEstimate(int(st.parameters + emb_params), int(st.gradients), int(st.optimizer), int(emb), 0,
                                    int(st.cpu), "end of backward (the embedding's)", notes))
    cands.append(NativeEstimate(int(st.parameters), int(st.gradients), int(st.optimizer), int(st.opt_tmp), 0,
                                int(st.cpu), "optimizer step", notes))
    return cands


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = [
    "INT8_BYTES",
    "LORA_LINEARS",
    "NF4_BYTES",
    "adapter_params",
    "check_native",
    "math",
    "model_params",
    "native_activations",
    "native_candidates",
    "native_dtypes",
    "native_estimate",
    "native_state",
    "recipe_warnings",
    "stack_of",
    "uses_autocast",
    "uses_native_stack",
]
