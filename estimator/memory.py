"""Memory per GPU for an execution plan: the fuller analytical formula (default) and Frenzy's MARP.

Modes of `estimate_memory(model, plan, mode=...)`:
- ``"formula"`` (default): parameters of the most loaded rank by model family, bytes per parameter by
  precision recipe, ZeRO-1/2/3 and FSDP sharding over dp, CPU offload, Korthikanti activations with
  TP/SP, selective or full recomputation, flash or plain attention, 1F1B in-flight micro-batches on
  the first pipeline stage, logits and cross-entropy on the last, and a stated ``other`` reserve.
- ``"marp"``: Frenzy's MARP (Sec. IV-A of "Frenzy: A Memory-Aware Serverless LLM Training System for
  Heterogeneous GPU Clusters", arXiv 2024), kept exactly as the controller's Frenzy policy uses it
  (`marp_params`, `marp_memory`, `MemoryEstimate`, `STATIC_BYTES_PER_PARAM`).
- ``"traced"`` is not here: tessera.estimator.torch.traced.traced_memory runs one training step of the
  rank's torch module under fake tensors with torch's MemTracker. The library never imports the torch
  layer; the service (and `tessctl estimate memory --mode traced`) calls it. Both modes count the
  resident state with the terms of memory_terms.py.

Sources: Korthikanti et al. 2022 (arXiv 2205.05198) Table 2; Rajbhandari et al. 2019 (ZeRO) Sec. 5;
Megatron-LM `theoretical_memory_usage.py` and its README's distributed-optimizer table;
docs/reference/estimation.md (which checks these against Korthikanti Fig. 1 and the ZeRO table).
docs/estimator-memory.md states every term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tessera.estimator.convnets import wide_resnet_operators
from tessera.estimator.memory_recipes import (
    NativeEstimate,
    model_params,
    native_candidates,
    native_state,
    recipe_warnings,
    stack_of,
    uses_native_stack,
)
from tessera.estimator.memory_terms import (
    DEFAULT_OTHER_BYTES,
    RECIPES,
    MemoryBreakdown,
    embedding_params,
    gpu_capacity,
    head_params,
    layer_params,
    local_vocab,
    stage_layers,
    state_bytes,
)
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError

# ------------------------------------------------------------------------------------------------
# MARP (Frenzy): unchanged API, golden-tested by the controller's Frenzy policy.

STATIC_BYTES_PER_PARAM = 20  # Frenzy: fp16 params+grads, fp32 master, Adam m and v (Megatron fp16 recipe)


def marp_params(m: ModelDims) -> int:
    """Frenzy's approximation of the weight count W."""
    h, l, v = m.hidden_size, m.num_layers, m.vocab_size
    return v * h + l * (12 * h * h + 13 * h)


@dataclass(frozen=True)
class MemoryEstimate:
    static_bytes: int
    activation_bytes: int
    source: str = "formula:marp"

    @property
    def total_bytes(self) -> int:
        return self.static_bytes + self.activation_bytes


def marp_memory(m: ModelDims, micro_batch: int, tp: int) -> MemoryEstimate:
    """Peak bytes per GPU under MARP for a micro-batch and a TP size (DP does not change it)."""
    m.require_transformer("the MARP formula")
    if micro_batch < 1 or tp < 1:
        raise ValueError("micro_batch and tp must be >= 1")
    s, h, l, a = m.seq_length, m.hidden_size, m.num_layers, m.num_heads
    static = STATIC_BYTES_PER_PARAM * marp_params(m) / tp
    act = s * micro_batch * h * l * (10 + 24 / tp + 5 * a * s / (h * tp))
    return MemoryEstimate(int(static), int(act))


# ------------------------------------------------------------------------------------------------
# The whole model's parameters (what one rank holds: memory_terms.py)


def num_params(m: ModelDims) -> int:
    """All parameters of the model (no parallelism)."""
    if not m.is_transformer:
        return int(sum(o.params for o in wide_resnet_operators(m.num_layers, m.width_factor, m.hidden_size,
                                                               m.vocab_size, m.seq_length)))
    if m.family == "encoder-decoder":
        return model_params(m, ExecutionPlan(), 0)[0]
    total = embedding_params(m) + head_params(m)
    for i in range(m.num_layers):
        d, e = layer_params(m, i)
        total += d + e
    return total


# ------------------------------------------------------------------------------------------------
# Activations


def korthikanti_layer_bytes(s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False,
                            recompute: str = "none") -> float:
    """Korthikanti et al. 2022 Table 2: activation bytes of one transformer layer (fp16, dropout, no flash).

    none: sbh(10 + 24/t + 5as/(ht)); sp: sbh(34/t + 5as/(ht)); selective drops the 5as/(ht) term;
    full recompute stores only the layer input, 2sbh (1/t of it with sp).
    """
    if recompute == "full":
        return 2 * s * b * h / (t if sp else 1)
    attn = 0.0 if recompute == "selective" else 5 * a * s / (h * t)
    linear = 34 / t if sp else 10 + 24 / t
    return s * b * h * (linear + attn)


def korthikanti_activation_bytes(s: int, b: int, h: int, a: int, layers: int, t: int = 1, p: int = 1,
                                 sp: bool = False, recompute: str = "none", v: int = 1,
                                 m: int | None = None) -> float:
    """Activation bytes on the first pipeline stage, as Megatron's theoretical estimator counts them.

    (layers / p) layers, p micro-batches in flight (1F1B; m/p of that when m < p), times the
    interleaving penalty 1 + (p-1)/(p v). Reproduces Korthikanti Fig. 1 (estimation.md 1.1).
    """
    act = korthikanti_layer_bytes(s, b, h, a, t, sp, recompute) * layers / p * p
    if v > 1:
        act *= 1 + (p - 1) / (p * v)
    if m is not None and m < p:
        act *= m / p
    return act


def zero_model_state_bytes(psi: float, nd: int, stage: int, k: int = 12) -> float:
    """The ZeRO paper's per-GPU model states (mixed precision, 2 + 2 + K bytes), for stage 0..3."""
    if stage == 0:
        return (4 + k) * psi
    if stage == 1:
        return 4 * psi + k * psi / nd
    if stage == 2:
        return 2 * psi + (2 + k) * psi / nd
    if stage == 3:
        return (4 + k) * psi / nd
    raise ValueError(f"ZeRO stage must be 0..3, got {stage}")


@dataclass(frozen=True)
class _ActShape:
    tokens: int  # s * b
    e: int  # bytes per activation element
    tp: int
    sp_div: int  # tp with sequence parallelism, else 1
    flash: bool
    ckpt: str
    ep: int = 1
    amp: bool = False  # autocast: fp32 residual stream and norms, bf16 weight copies kept for backward

    @property
    def resid(self) -> int:
        """Bytes per element of the residual stream (a layer's input and output)."""
        return 4 if self.amp else self.e


def _ln_bytes(m: ModelDims, x: _ActShape) -> float:
    """One norm: its input plus its statistics per token: RMSNorm an fp32 rstd; LayerNorm mean and
    rstd in the activation dtype, as PyTorch's CPU kernel keeps them (CUDA: fp32, +4 B/token, noise)."""
    n = x.tokens / x.sp_div
    if x.amp:  # autocast runs norms in fp32
        return n * (4 * m.hidden_size + (4 if m.gated else 8))
    return n * (x.e * m.hidden_size + (4 if m.gated else 2 * x.e))


def _attention_core_bytes(m: ModelDims, x: _ActShape, b: int) -> float:
    """Scores/softmax/dropout of plain attention, or flash's logsumexp."""
    a_l, s = m.num_heads // x.tp, m.seq_length
    if x.flash:
        return 4 * b * a_l * s
    per = x.e + (x.e + 1 if m.has_dropout else 0)  # softmax out (+ dropout mask and output)
    return per * b * a_l * s * s


def layer_stored_bytes(m: ModelDims, index: int, x: _ActShape, b: int) -> float:
    """Bytes one layer keeps for backward, per micro-batch (the reference module's program)."""
    t, n, e, h = x.tp, x.tokens, x.e, m.hidden_size
    a_l, kv_l, d, f_l = m.num_heads // t, m.kv_heads // t, m.head_dim, m.ffn // t
    mask = (n / x.sp_div) * h if m.has_dropout else 0  # 1-byte dropout mask
    total = 2 * _ln_bytes(m, x)
    if x.amp:  # the bf16 copies of the weight matrices that autocast made and the matmuls keep
        dense, expert = layer_params(m, index, t, x.ep)
        total += 2 * (dense + expert)
    # attention: QKV input, QKV output (Q, K, V views), core, output (= projection input), dropout mask
    total += e * n * h / x.sp_div + e * n * (a_l + 2 * kv_l) * d + e * n * a_l * d + mask
    if kv_l != a_l:
        total += 2 * e * n * a_l * d  # K and V repeated to all heads
    if not (x.ckpt == "selective" and not x.flash):
        total += _attention_core_bytes(m, x, b)
    if m.is_moe_layer(index):
        total += _moe_stored_bytes(m, x)
    elif m.gated:
        total += e * n * h / x.sp_div + 4 * e * n * f_l  # input; gate, silu(gate), up, product
        if x.amp:  # autocast casts the fp32 norm output once for each of the two input projections
            total += e * n * h / x.sp_div
    else:
        total += e * n * h / x.sp_div + 2 * e * n * f_l  # input; GELU input and output
    return total + mask


def _moe_slots(m: ModelDims, tokens: int) -> int:
    return math.ceil(m.capacity_factor * m.top_k * tokens / m.num_experts) * m.num_experts


def _moe_stored_bytes(m: ModelDims, x: _ActShape) -> float:
    """Router input, fp32 probabilities, top-k indices, two int64 slot indices, the dispatched rows
    received, through the expert MLP, returned and weighted (index_add keeps its source), the gates."""
    n, e, h, f_l = x.tokens, x.e, m.hidden_size, m.ffn // x.tp
    slots = _moe_slots(m, n)
    router = e * n * h + 4 * n * m.num_experts + 8 * n * m.top_k
    dispatch = 16 * slots + e * slots * (3 * h + 2 * f_l + 1)  # rows in, out, weighted; GELU in, out; gate
    return router + dispatch


def embedding_stored_bytes(m: ModelDims, x: _ActShape) -> float:
    """Token ids (int64, kept by the embedding's backward), and the encoder's LayerNorm / dropout mask."""
    n, h = x.tokens, m.hidden_size
    total: float = 8 * n  # input ids
    if m.family == "encoder":
        total += _ln_bytes(m, x)
    if m.has_dropout:
        total += n * h / x.sp_div
    return total


def head_stored_bytes(m: ModelDims, x: _ActShape) -> float:
    """Final norm, MLM transform (encoder), output projection input, the loss's fp32 softmax and
    targets: what the last stage keeps per micro-batch for backward."""
    n, e, h = x.tokens, x.e, m.hidden_size
    copy = 2 * local_vocab(m, x.tp) * h if x.amp else 0  # autocast's bf16 copy of the output weight
    loss = 4 * n * local_vocab(m, x.tp) + 8 * n  # the fp32 softmax the loss keeps; int64 targets
    if m.family == "encoder":
        return e * n * h * 3 + _ln_bytes(m, _ActShape(n, e, x.tp, 1, x.flash, x.ckpt, x.ep, x.amp)) + copy + loss
    return _ln_bytes(m, x) + e * n * h / x.sp_div + copy + loss


def loss_peak_bytes(m: ModelDims, x: _ActShape) -> float:
    """Cross-entropy (Megatron's: the fp32 softmax it keeps, in head_stored_bytes, becomes the
    gradient in place) at its peak, beyond what it keeps: the logits' gradient in the activation dtype
    (or the logits beside their fp32 copy in forward), or the output layer's backward after it."""
    n, v = x.tokens, local_vocab(m, x.tp)
    # fp32 logits: the softmax is computed in them and the gradient is the softmax (no copies)
    cast = x.e * n * v if x.e < 4 else 0
    freed = 4 * n * v if x.e < 4 else 0
    # then the output layer's backward: input and weight gradients beside the logits' gradient
    return max(cast, cast - freed + x.e * n * m.hidden_size + x.e * v * m.hidden_size)


# ------------------------------------------------------------------------------------------------
# The estimate


def estimate_memory(model: ModelDims, plan: ExecutionPlan, *, mode: str = "formula",
                    gpu: str | None = None, num_gpus: int | None = None,
                    other_bytes: int = DEFAULT_OTHER_BYTES) -> MemoryBreakdown:
    """Peak bytes on the most loaded GPU of `plan` for one training step of `model`.

    mode: "formula" (default) or "marp" (Frenzy's MARP: static + activations, tp and the micro-batch
    only); the traced mode is tessera.estimator.torch.traced.traced_memory, with the same arguments.
    `gpu` (a catalog name) sets capacity_bytes and fits; an unknown name is a PlanInputError on field "gpu".
    `num_gpus`, when given, must equal dp*tp*pp. Errors name the field (PlanInputError, a ValueError).
    """
    model.validate()
    model.require_transformer("the memory estimate")
    plan.check(num_gpus=num_gpus, model=model)
    capacity = gpu_capacity(gpu)
    if mode == "formula":
        est = _formula(model, plan, other_bytes)
    elif mode == "marp":
        mm = marp_memory(model, plan.micro_batch, plan.tp)
        est = MemoryBreakdown(mm.static_bytes, 0, 0, mm.activation_bytes, other_bytes, "formula:marp",
                              notes=("MARP: static 20 B/param over tp, Korthikanti TP activations",))
    elif mode == "traced":
        # torch code sits in a layer above this library: the caller picks it (the service does)
        raise PlanInputError("mode", "traced mode runs torch: call tessera.estimator.torch.traced.traced_memory")
    else:
        raise PlanInputError("mode", f"{mode!r} is not one of formula, marp, traced")
    warnings = recipe_warnings(model, plan)
    if capacity is not None or warnings:
        est = replace(est, capacity_bytes=capacity, warnings=warnings)
    return est


def _zero3_working_set(model: ModelDims, plan: ExecutionPlan, stage: int) -> int:
    """ZeRO-3/FSDP gather the parameters of the running layer (and prefetch the next): two layers'
    full parameters in the param dtype, plus one layer's unsharded gradient before reduce-scatter."""
    if plan.zero_stage < 3:
        return 0
    r = RECIPES[plan.precision]
    layers = stage_layers(model, plan)[stage]
    biggest = max(sum(layer_params(model, i, plan.tp, plan.ep)) for i in layers)
    return 2 * biggest * r.param + biggest * r.grad


def _stage_activations(model: ModelDims, plan: ExecutionPlan, stage: int) -> float:
    r = RECIPES[plan.precision]
    b = plan.micro_batch
    x = _ActShape(model.seq_length * b, r.activation, plan.tp,
                  plan.tp if plan.sequence_parallel and plan.tp > 1 else 1, plan.flash_attention,
                  plan.checkpointing, plan.ep, plan.precision == "amp")
    layers = stage_layers(model, plan)[stage]
    first, last = stage == 0, stage == plan.pp - 1
    full = plan.checkpointing == "full"
    inflight = plan.grad_accum if plan.schedule == "gpipe" else min(plan.grad_accum, plan.pp - stage)
    per_layer = [layer_stored_bytes(model, i, x, b) for i in layers]
    stored = sum(per_layer) if not full else len(layers) * x.resid * x.tokens * model.hidden_size / x.sp_div
    if first:
        stored += embedding_stored_bytes(model, x)
    head = head_stored_bytes(model, x) if last else 0.0
    # full recomputation rebuilds the head and loss too: each micro-batch keeps its input and targets
    head_kept = x.resid * x.tokens * model.hidden_size / x.sp_div + 8 * x.tokens if full else head
    if last:
        stored += head_kept
    if plan.virtual_stages > 1 and stage == 0:
        p, v = plan.pp, plan.virtual_stages
        mb = min(plan.grad_accum, p) * (1 + (p - 1) / (p * v))
    else:
        mb = inflight
    acts = stored * mb
    # The peak comes at the start of a backward: the loss on the last stage; elsewhere the incoming
    # gradient plus the backward working set of the stage's last layer (rebuilt first when recomputed).
    g_in = x.resid * x.tokens * model.hidden_size / x.sp_div
    layer_bump = g_in + (_layer_backward_bytes(model, layers[-1], x, b) if layers else 0)
    if full and per_layer:  # rebuilt activations; the layer input is the one kept
        layer_bump += per_layer[-1] - x.resid * x.tokens * model.hidden_size / x.sp_div
    if last:  # by the first layer's backward, the head's stored tensors are gone
        bump = max(layer_bump - head_kept, head - head_kept + loss_peak_bytes(model, x))
    else:
        bump = layer_bump
    return acts + bump


def _layer_backward_bytes(m: ModelDims, index: int, x: _ActShape, b: int) -> float:
    """The working set at the start of one layer's backward, beyond its stored activations and the
    incoming gradient: the dropout gradient (or, with SP, the all-gathered gradient), the MLP output
    projection's weight gradient before it reaches the gradient buffer, and its input gradient;
    SwiGLU's two product gradients; MoE's expert weight gradient and dispatched-row gradients; the
    attention core rebuilt under selective recomputation of plain attention."""
    t, n, e, h = x.tp, x.tokens, x.e, m.hidden_size
    f_l = m.ffn // t
    drop = m.has_dropout
    pre = 0.0
    if x.sp_div > 1:
        pre = e * n * h - (n * h / t if drop else 0)  # gathered gradient; the sharded one is freed
    elif drop:
        pre = e * n * h - n * h  # dropout gradient, mask freed
    if m.is_moe_layer(index):
        slots = _moe_slots(m, n)
        e_l = m.num_experts // x.ep
        # at the second expert matmul's backward: its weight and input gradients, the returned-row
        # gradient; the weighted and returned rows it kept are freed by then (and the dropout grad)
        work = e * (e_l * h * f_l) + e * slots * f_l - e * slots * h - (n * h / x.sp_div if drop else 0)
    else:
        work = pre + e * h * f_l + e * n * f_l
        if m.gated:
            work = max(work, 2 * e * n * f_l)
    if x.ckpt == "selective" and not x.flash:
        work = max(work, _attention_core_bytes(m, _ActShape(n, e, t, x.sp_div, False, "none"), b))
    return work


def fsdp_stream_pools(model: ModelDims, plan: ExecutionPlan, stage: int, moments: list[NativeEstimate]) -> int:
    """Bytes FSDP2's side streams hold cached but free at the peak of reserved memory, where the compute
    stream cannot reuse them (the caching allocator keeps a pool per stream and never returns a cached
    block unasked, so reserved memory peaks at the step's end, at the sum of its pools' highs).

    FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py) allocates each reduce-scatter's
    output on its reduce-scatter stream, and the sharded gradients are views of it: that pool's high is
    every gradient, and the compute stream's is its largest moment without them (`moments`: the
    candidates of native_candidates). The all-gather outputs come from the all-gather stream's pool,
    which keeps its largest use: the root unit gathered, or a layer and its prefetched successor.
    Without resharding (FSDP2 under PP) the layers' all-gathers are not counted."""
    if plan.sharding != "fsdp":
        return 0
    s = native_state(model, plan, stage, stack_of(model, plan))
    peak = max(e.total for e in moments)
    compute_high = max(e.total - e.gradients for e in moments)
    return int(max(0.0, compute_high + s.gradients - peak) + max(s.layer_ws, s.head_ws))


def _native(model: ModelDims, plan: ExecutionPlan, other_bytes: int) -> MemoryBreakdown:
    """The PyTorch-native recipes (memory_recipes.py): the first or last stage, whichever is larger;
    FSDP2's communication buffers at the peak count as activations (transient)."""
    best: MemoryBreakdown | None = None
    for st in sorted({0, plan.pp - 1}):
        moments = native_candidates(model, plan, st)
        n = max(moments, key=lambda e: e.total)
        notes = (*n.notes, f"peak: {n.moment}; stage {st} of {plan.pp}",
                 f"other = {other_bytes} B reserve (CUDA context, workspaces)")
        est = MemoryBreakdown(n.parameters, n.gradients, n.optimizer, n.activations + n.comm, other_bytes,
                              "formula", st, n.cpu, None, notes,
                              stream_pools=fsdp_stream_pools(model, plan, st, moments))
        if best is None or est.total > best.total:
            best = est
    assert best is not None
    return best


def _formula(model: ModelDims, plan: ExecutionPlan, other_bytes: int) -> MemoryBreakdown:
    if uses_native_stack(model, plan):
        return _native(model, plan, other_bytes)
    r = RECIPES[plan.precision]
    best: MemoryBreakdown | None = None
    stages = {0, plan.pp - 1}
    for st in sorted(stages):
        params, grads, opt, cpu, shard = state_bytes(model, plan, st)
        acts = _stage_activations(model, plan, st) + _zero3_working_set(model, plan, st)
        # The optimizer step's temporaries (sqrt(v) + eps per tensor, an fp32 gradient copy where
        # the recipe casts) when they exceed the activations; after backward, activations are gone.
        state_elem = 2 if r.name == "bf16" else 4
        opt_tmp = 0 if plan.offload != "none" else shard * (state_elem + (4 if r.cast_grad else 0))
        acts = max(acts, opt_tmp)
        notes = (f"recipe {r.name}: {r.description}", f"stage {st} of {plan.pp}",
                 f"other = {other_bytes} B reserve (CUDA context, workspaces)")
        est = MemoryBreakdown(params, grads, opt, int(acts), other_bytes, "formula", st, cpu, None, notes)
        if best is None or est.total > best.total:
            best = est
    assert best is not None
    return best
