"""What one layer of a PyTorch-native stack keeps for backward, tensor by tensor (memory_recipes.py
assembles them into the estimate; docs/estimator-memory.md, "PyTorch-native recipes").

Each layer is listed as the tensors autograd saves when nothing is recomputed (`Saved`, with the op
that produced it), so that the checkpointing policies can pick from the same list:
- ``none`` keeps all of them;
- ``op`` (torchtitan's per-op selective checkpointing, torchtitan/distributed/activation_checkpoint.py
  `_get_custom_policy`) keeps the layer's input and the outputs of the ops in its save list: every
  matmul but every second one (a per-layer counter: the 1st, 3rd, 5th... are kept), the attention
  kernel's outputs (its output and logsumexp) and the reduce-scatter outputs of sequence parallelism;
- ``full`` keeps the layer's input.

A linear keeps its input only when its weight is trained (autograd saves mm's `self` only when the
weight needs a gradient: derivatives.yaml, `should_compute_output`); a frozen LoRA base linear
therefore keeps nothing, its adapter keeps the input x (shared with any other user of x) and the r
values per token of lora_A's output.

The norms differ by stack: torchtitan's nn.RMSNorm runs torch's fused rms_norm kernel (its input plus
an fp32 rstd per token); transformers' eager RMSNorm (Llama, Qwen2, Mistral) upcasts to fp32 and
keeps that copy, the rstd and the normalised bf16 tensor (the weight's multiplication), Gemma's
keeps the fp32 copy and the fp32 normalised tensor ((1 + w) is applied in fp32), T5's keeps the fp32
copy, its bf16 input and the normalised tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tessera.estimator.models import ModelDims

Op = Literal["input", "mm", "attn", "rs", "other"]
Stack = Literal["torchtitan", "transformers"]


@dataclass(frozen=True)
class Saved:
    """One tensor a layer keeps for backward: its name, bytes and the op that produced it."""

    name: str
    nbytes: float
    op: Op = "other"


@dataclass(frozen=True)
class Shape:
    """What the per-layer terms need from the plan: tokens per rank, element bytes, the TP split."""

    tokens: int  # tokens of one micro-batch on this rank (b * s / cp)
    batch: int  # sequences in the micro-batch
    seq: int  # local sequence length (s / cp)
    e: int  # compute dtype bytes (2 for bf16)
    tp: int
    sp: int  # tp with sequence parallelism, else 1
    flash: bool
    stack: Stack
    lora: frozenset[str] = frozenset()  # the linears that carry a LoRA adapter
    rank: int = 0  # LoRA rank
    frozen: bool = False  # LoRA: the base weights (and norms, embeddings) are frozen
    compile: bool = False
    kv_seq: int = 0  # cross attention: the encoder's tokens per sequence (0: self attention)
    enc_seq: int = 0  # encoder-decoder: the encoder's tokens per sequence (a decoder layer's cross attention)
    device: str = "cuda"  # "cpu": torch's composite kernels where CUDA has fused ones (rms_norm)
    storage: int = 4  # bytes of the stored parameters (T5's position bias comes out in this dtype)
    # fp32 weights under torch.autocast, no FSDP2 (memory_recipes.uses_autocast): the residual stream and
    # the norms stay fp32, each linear casts its weight, and its fp32 input, to the compute dtype
    autocast: bool = False

    @property
    def r(self) -> int:
        """Bytes per element of the residual stream: fp32 under autocast (the embedding's output is fp32,
        and a norm returns its input's dtype), else the compute dtype."""
        return 4 if self.autocast else self.e


def norm_saved(m: ModelDims, x: Shape, name: str, elems: float, is_input_kept: bool = True) -> list[Saved]:
    """One RMSNorm/LayerNorm over `elems` elements (tokens * hidden) of this rank, as its stack runs it.

    `is_input_kept`: the norm's input is a tensor no other op keeps (the residual stream); the fused
    kernel keeps it, the eager norms keep an fp32 copy instead. Under autocast the input is fp32 (the
    eager norms' upcast is then the input itself), and so is the Llama norm's normalised tensor."""
    tokens = elems / m.hidden_size
    e = x.e
    r = x.r
    trained_w = not x.frozen
    if x.stack == "torchtitan" and x.device == "cpu" and not x.compile:
        # torch's rms_norm off CUDA is the composite (aten rms_norm_composite): an fp32 copy of the input,
        # the rstd, and the fp32 normalised tensor the weight's multiplication keeps (8 B/element)
        return [Saved(f"{name}.fp32", 4 * elems), Saved(f"{name}.rstd", 4 * tokens),
                Saved(f"{name}.normed", 4 * elems if trained_w else 0.0)]
    if x.stack == "torchtitan" or x.compile:
        # fused kernel (CUDA's _fused_rms_norm, or inductor's fused norm): the input and fp32 rstd
        # (LayerNorm: mean and rstd)
        stats = 4 if m.gated or m.family == "encoder-decoder" else 8
        return [Saved(f"{name}.input", r * elems if is_input_kept else 0.0), Saved(f"{name}.stats", stats * tokens)]
    if m.family == "encoder-decoder":  # T5LayerNorm: fp32 copy (pow), bf16 input and rstd (mul), output (weight)
        return [Saved(f"{name}.fp32", 4 * elems), Saved(f"{name}.input", e * elems), Saved(f"{name}.rstd", 4 * tokens),
                Saved(f"{name}.normed", e * elems if trained_w else 0.0)]
    if m.sandwich_norm:  # GemmaRMSNorm: fp32 copy, rstd, fp32 normalised output (times 1 + w in fp32)
        return [Saved(f"{name}.fp32", 4 * elems), Saved(f"{name}.rstd", 4 * tokens),
                Saved(f"{name}.normed", 4 * elems if trained_w else 0.0)]
    if not m.gated:  # nn.LayerNorm: its input, fp32 mean and rstd
        return [Saved(f"{name}.input", r * elems), Saved(f"{name}.stats", 8 * tokens)]
    # LlamaRMSNorm (Llama, Qwen2, Mistral): fp32 copy, rstd, the normalised tensor (weight's mul) in the
    # input's dtype
    return [Saved(f"{name}.fp32", 4 * elems), Saved(f"{name}.rstd", 4 * tokens),
            Saved(f"{name}.normed", r * elems if trained_w else 0.0)]


def _linear(x: Shape, name: str, in_elems: float, out_per_token: float, input_name: str,
            mm: list[Saved], saved: list[Saved], input_owned: dict[str, float]) -> None:
    """A linear (mm) of this rank: its output goes to `mm` (for the op policy), its input is kept once
    per storage when its weight trains or it carries a LoRA adapter (plus lora_A's output).

    Under autocast the linear keeps its weight's cast for its input's gradient (a layer checkpoint
    recomputes it instead: stored_bytes counts it under no checkpointing only), and an input from the
    fp32 residual stream (a norm's output) is cast at each call: every linear keeps its own copy
    (torch.compile's graph shares one)."""
    trains = not x.frozen
    lora = name in x.lora
    if x.autocast:
        saved.append(Saved(f"{name}.weight_cast", x.e * in_elems / x.tokens * out_per_token))
        fused = x.stack == "torchtitan" and not x.lora and input_name.endswith("qkv_in")  # one wqkv, one cast
        if input_name.endswith(("qkv_in", "mlp_in")) and not (x.compile or fused):
            input_name = f"{input_name}.{name}"
    if (trains or lora) and input_name not in input_owned:
        input_owned[input_name] = x.e * in_elems
        saved.append(Saved(f"{input_name}", x.e * in_elems))
    mm.append(Saved(f"{name}.out", x.e * x.tokens * out_per_token, "mm"))
    if lora:  # lora_A's mm and lora_B's: lora_A's output (r per token) is lora_B's kept input
        mm.append(Saved(f"{name}.lora_a", x.e * x.tokens * x.rank, "mm"))
        saved.append(Saved(f"{name}.lora_a", x.e * x.tokens * x.rank))
        mm.append(Saved(f"{name}.lora_b", x.e * x.tokens * out_per_token, "mm"))


def attention_saved(m: ModelDims, x: Shape, prefix: str, causal_kv_tokens: int) -> tuple[list[Saved], list[Saved]]:
    """(kept, matmul outputs in order) of one attention block after its norm: q, k, v projections,
    rotary (keeps only its cos/sin buffers), the attention kernel, the output projection."""
    t, h, d = x.tp, m.hidden_size, m.head_dim
    a_l, kv_l = m.num_heads // t, m.kv_heads // t
    n, e = x.tokens, x.e
    saved: list[Saved] = []
    mm: list[Saved] = []
    owned: dict[str, float] = {}
    # With SP the column-parallel linears keep the all-gathered input (tokens * h); else the norm output.
    kv_src_tokens = n if not x.kv_seq else x.batch * x.kv_seq
    _linear(x, f"{prefix}q", n * h, a_l * d, f"{prefix}qkv_in", mm, saved, owned)
    kv_in = f"{prefix}qkv_in" if not x.kv_seq else f"{prefix}enc_out"
    kx = Shape(kv_src_tokens, x.batch, x.kv_seq or x.seq, e, t, x.sp, x.flash, x.stack, x.lora, x.rank, x.frozen,
               x.compile, autocast=x.autocast)
    _linear(kx, f"{prefix}k", kv_src_tokens * h, kv_l * d, kv_in, mm, saved, owned)
    _linear(kx, f"{prefix}v", kv_src_tokens * h, kv_l * d, kv_in, mm, saved, owned)
    if x.stack == "torchtitan" and not x.lora:  # torchtitan's Llama 3 fuses q, k, v into one matmul (fuse_qkv)
        mm[:3] = [Saved(f"{prefix}qkv.out", sum(s.nbytes for s in mm[:3]), "mm")]
    if x.kv_seq:  # the encoder output is kept once for all decoder layers (memory_recipes counts it)
        saved = [s for s in saved if s.name != f"{prefix}enc_out"]
    # the attention kernel keeps q, k, v (after rotary: fresh tensors), its output and logsumexp
    saved += [Saved(f"{prefix}q_rot", e * n * a_l * d), Saved(f"{prefix}k_rot", e * kv_src_tokens * kv_l * d),
              Saved(f"{prefix}v", e * kv_src_tokens * kv_l * d)]
    if x.stack == "transformers" and x.device == "cpu" and kv_l != a_l:
        # transformers passes SDPA an explicit mask off CUDA (below), so it repeats K and V to every
        # head (repeat_kv) instead of enable_gqa: the kernel keeps the repeated copies
        saved = [s for s in saved if s.name not in (f"{prefix}k_rot", f"{prefix}v")]
        saved += [Saved(f"{prefix}k_rep", e * kv_src_tokens * a_l * d), Saved(f"{prefix}v_rep", e * kv_src_tokens * a_l * d)]
    s_q, s_k = x.seq, (x.kv_seq or causal_kv_tokens)
    if m.family == "encoder-decoder" and not x.kv_seq and x.storage > x.e:
        # T5's self-attention adds its relative position bias to the scores; from fp32 parameters the bias
        # is fp32, and SDPA, with no fused kernel for a mask of another dtype, runs its math path in fp32,
        # keeping fp32 q, k, v and the fp32 softmax (transformers' T5 on sdpa); the output comes back in
        # bf16 for o. From bf16 parameters the bias is bf16 and the math path stays in bf16 (below).
        saved = [s for s in saved if s.name not in (f"{prefix}q_rot", f"{prefix}k_rot", f"{prefix}v")]
        saved += [Saved(f"{prefix}q32", 4 * n * a_l * d), Saved(f"{prefix}k32", 4 * n * a_l * d),
                  Saved(f"{prefix}v32", 4 * n * a_l * d),
                  Saved(f"{prefix}softmax32", 4 * x.batch * a_l * s_q * s_k, "attn")]
        _linear(x, f"{prefix}o", n * a_l * d, h, f"{prefix}attn_in", mm, saved, owned)
        return saved, mm
    if m.family == "encoder-decoder" and not x.kv_seq:
        # from bf16 parameters T5's bias is a bf16 mask: SDPA's math path in bf16 keeps the bf16 softmax
        core = [Saved(f"{prefix}attn_out", e * n * a_l * d, "attn"),
                Saved(f"{prefix}softmax", e * x.batch * a_l * s_q * s_k, "attn")]
    elif x.flash:
        core = [Saved(f"{prefix}attn_out", e * n * a_l * d, "attn"), Saved(f"{prefix}lse", 4 * x.batch * a_l * s_q, "attn")]
    else:
        # plain attention: torchtitan's math SDPA keeps the bf16 softmax; transformers' eager attention the
        # fp32 softmax and its bf16 cast (the matmul with V); T5's also its dropout mask and output
        scores = x.batch * a_l * s_q * s_k
        per = e if x.stack == "torchtitan" else 4 + e
        if m.family == "encoder-decoder":
            per += 1 + e
        core = [Saved(f"{prefix}attn_out", e * n * a_l * d, "attn"), Saved(f"{prefix}scores", per * scores, "attn")]
    saved += core
    _linear(x, f"{prefix}o", n * a_l * d, h, f"{prefix}attn_out", mm, saved, owned)
    if not (x.stack == "transformers" and x.device == "cpu"):
        # the kernel's output, laid out (b, s, heads, d), is o's input after a free transpose; the CPU
        # kernel's is (b, heads, s, d), so transformers' .transpose(1, 2).contiguous() copies it
        saved = [s for s in saved if s.name != f"{prefix}attn_out" or s.op == "attn"]
    return saved, mm


def mlp_saved(m: ModelDims, x: Shape, prefix: str, ffn: int) -> tuple[list[Saved], list[Saved]]:
    """(kept, matmul outputs in order) of the MLP after its norm. SwiGLU/GeGLU: w1 and w3 outputs,
    the activation's output and the product (w2's input); under torch.compile inductor fuses the
    activation and product and keeps only w1's and w3's outputs (it recomputes the cheap pointwise
    ops in backward). GELU/ReLU MLP: fc1's output (the activation's input) and the activation's
    output (fc2's input); compiled: fc1's output only."""
    n, e, h = x.tokens, x.e, m.hidden_size
    f_l = ffn // x.tp
    saved: list[Saved] = []
    mm: list[Saved] = []
    owned: dict[str, float] = {}
    if m.gated:
        _linear(x, f"{prefix}w1", n * h, f_l, f"{prefix}mlp_in", mm, saved, owned)
        _linear(x, f"{prefix}w3", n * h, f_l, f"{prefix}mlp_in", mm, saved, owned)
        saved += [Saved(f"{prefix}w1.out.kept", e * n * f_l), Saved(f"{prefix}w3.out.kept", e * n * f_l)]
        if not x.compile:
            saved.append(Saved(f"{prefix}act", e * n * f_l))
            if m.family == "encoder-decoder":
                # T5 v1.1 / mT5's gated-gelu is transformers' NewGELUActivation, written out in elementwise
                # ops: 0.5 x (1 + tanh(...)) keeps tanh's output, 0.5 x and 1 + tanh beside its input
                saved.append(Saved(f"{prefix}gelu_new", 3 * e * n * f_l))
        prod = f"{prefix}prod"
        _linear(x, f"{prefix}w2", n * f_l, h, prod, mm, saved, owned)
        if x.compile:  # the product is recomputed from w1's and w3's outputs
            saved = [s for s in saved if s.name != prod]
    else:
        _linear(x, f"{prefix}w1", n * h, f_l, f"{prefix}mlp_in", mm, saved, owned)
        saved.append(Saved(f"{prefix}w1.out.kept", e * n * f_l))
        act = f"{prefix}act"
        _linear(x, f"{prefix}w2", n * f_l, h, act, mm, saved, owned)
        if x.compile:
            saved = [s for s in saved if s.name != act]
    return saved, mm


def moe_saved(m: ModelDims, x: Shape) -> tuple[list[Saved], list[Saved]]:
    """Mixtral-style dropless MoE (top-k of E SwiGLU experts): router input and logits, fp32 routing
    probabilities, top-k indices, the tokens*top_k expert rows through each expert's SwiGLU (as the
    dense MLP, per row), the combined output's weights."""
    n, e, h = x.tokens, x.e, m.hidden_size
    f_l = m.ffn // x.tp
    rows = n * m.top_k
    saved = [Saved("moe.router_in", e * n * h), Saved("moe.probs", 4 * n * m.num_experts),
             Saved("moe.topk", 8 * n * m.top_k + 4 * n * m.top_k), Saved("moe.rows_in", e * rows * h),
             Saved("moe.w1", e * rows * f_l), Saved("moe.w3", e * rows * f_l), Saved("moe.act", e * rows * f_l),
             Saved("moe.prod", e * rows * f_l), Saved("moe.rows_out", e * rows * h)]
    mm = [Saved("moe.router", e * n * m.num_experts, "mm"), Saved("moe.w1", e * rows * f_l, "mm"),
          Saved("moe.w3", e * rows * f_l, "mm"), Saved("moe.w2", e * rows * h, "mm")]
    return saved, mm


def layer_saved(m: ModelDims, x: Shape, index: int, kind: str = "decoder") -> list[Saved]:
    """Everything layer `index` keeps for backward with no recomputation (the first entry, op
    "input", is the layer's input, which only a checkpoint keeps as such).
    kind: "decoder" (decoder-only, or T5's encoder layer with bidirectional self attention),
    "cross" (T5's decoder layer: self attention, cross attention over the encoder output, MLP)."""
    n, h = x.tokens, m.hidden_size
    out: list[Saved] = [Saved("input", x.r * n * h / x.sp, "input")]
    norm_elems = n * h / x.sp

    def block(prefix: str, kept: list[Saved]) -> None:
        # the pre-norm keeps its input: the layer's input or the residual after the previous block
        out.extend(norm_saved(m, x, f"{prefix}norm", norm_elems))
        out.extend(kept)
        if m.sandwich_norm:  # Gemma 2: a norm after the block too, which keeps the block's output
            out.extend(norm_saved(m, x, f"{prefix}post_norm", norm_elems))

    block("attn.", attention_saved(m, x, "attn.", x.seq)[0])
    if kind == "cross":
        block("cross.", attention_saved(m, _cross(x), "cross.", x.seq)[0])
    block("mlp.", (moe_saved(m, x) if m.is_moe_layer(index) and m.gated else mlp_saved(m, x, "mlp.", m.ffn))[0])
    return out


def _cross(x: Shape) -> Shape:
    return Shape(x.tokens, x.batch, x.seq, x.e, x.tp, x.sp, x.flash, x.stack, x.lora, x.rank, x.frozen,
                 x.compile, kv_seq=x.enc_seq, autocast=x.autocast)


def mm_outputs(m: ModelDims, x: Shape, index: int, kind: str = "decoder") -> list[Saved]:
    """The layer's matmul outputs in execution order (the op policy's counter runs over them), with
    the reduce-scatter outputs."""
    rs = [Saved("rs", x.e * x.tokens * m.hidden_size / x.sp, "rs")] if x.sp > 1 else []
    parts = [attention_saved(m, x, "attn.", x.seq)[1] + rs]
    if kind == "cross":
        parts.append(attention_saved(m, _cross(x), "cross.", x.seq)[1] + rs)
    parts.append((moe_saved(m, x)[1] if m.is_moe_layer(index) and m.gated else mlp_saved(m, x, "mlp.", m.ffn)[1]) + rs)
    return [s for p in parts for s in p]


def stored_bytes(m: ModelDims, x: Shape, index: int, policy: str, kind: str = "decoder") -> float:
    """Bytes layer `index` keeps for backward under `policy` ("none", "op", "full", "selective")."""
    kept = layer_saved(m, x, index, kind)
    layer_in = kept[0].nbytes
    if policy == "full":
        return layer_in
    if policy == "op":
        total = layer_in + sum(s.nbytes for s in kept if s.op == "attn")
        count = 0
        for s in mm_outputs(m, x, index, kind):
            if s.op == "rs":
                total += s.nbytes
                continue
            count += 1
            if count % 2:  # torchtitan keeps the 1st, 3rd, ... matmul output of each layer
                total += s.nbytes
        return total
    total = sum(s.nbytes for s in kept[1:])
    if policy == "selective" and not x.flash:  # Megatron's: the attention core is recomputed
        total -= sum(s.nbytes for s in kept if s.name.endswith("scores"))
    return total
