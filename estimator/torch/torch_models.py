"""The torch modules that traced mode runs: one pipeline stage of one rank, with per-rank shard shapes.

Imported only by tessera.estimator.torch.traced (this module imports torch at the top, as only the
modules of estimator/torch/ may). A `RankShape` says which part of the model one rank holds: the
layers of its pipeline stage, the embedding if it is the first stage, the final norm, head and loss
if it is the last, with the tensor-parallel dimensions divided by tp (heads, kv heads, ffn,
vocabulary: Megatron's column- and row-parallel split) and the experts divided by ep.

What each module stores for backward is chosen to match Megatron-LM's layer (Korthikanti et al. 2022
Table 2), so that the analytical formula and the trace describe the same program:
- the attention core keeps Q, K, V as views of one QKV output, the softmax output and a 1-byte
  dropout mask (plain attention), or q/k/v/out and a logsumexp (flash attention, torch SDPA);
- scaling is done in place on the score matrix (no scaled copy of Q);
- sequence parallelism: the LayerNorms, dropouts and residuals work on s/tp tokens; a column-parallel
  linear saves its sharded input and all-gathers it again in backward (Megatron's
  `LinearWithGradAccumulationAndAsyncCommunication`); a row-parallel linear reduce-scatters its output.
- Collectives are simulated by allocations of the same size (an all-gather makes a full-size tensor,
  a reduce-scatter a 1/tp one, an all-reduce is in place, an all-to-all makes a same-size tensor).

Approximations (stated in docs/estimator-memory.md): the vocabulary-parallel embedding looks up the
local table without Megatron's masking temporaries; the vocabulary-parallel cross-entropy keeps what
Megatron's does (an fp32 softmax of the local logits, turned into the gradient in place) without its
all-reduces of the max and the sum; MoE dispatch uses index gather/scatter (token indices are
arbitrary: memory does not depend on which token goes where, only on the capacity).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from tessera.estimator.memory_terms import local_vocab
from tessera.estimator.models import ModelDims


@dataclass(frozen=True)
class RankShape:
    """The part of the model one rank holds (see module docstring)."""

    model: ModelDims
    layers: tuple[int, ...]  # global indices of this stage's layers
    first: bool
    last: bool
    tp: int = 1
    sp: bool = False
    ep: int = 1
    flash: bool = True
    checkpointing: str = "none"  # none | selective | full
    micro_batch: int = 1
    dtype: torch.dtype = torch.bfloat16  # parameter and activation dtype of the module

    @property
    def seq(self) -> int:
        return self.model.seq_length


# ---------------------------------------------------------------------------------------------------
# Simulated collectives (memory-equivalent)


def _apply(fn: type[torch.autograd.Function], *args: Any) -> torch.Tensor:
    out: torch.Tensor = fn.apply(*args)  # type: ignore[no-untyped-call]
    return out


class _GatherSeq(torch.autograd.Function):
    """All-gather along the sequence (dim 1): [b, s/t, h] -> [b, s, h]; backward reduce-scatters."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: int) -> torch.Tensor:
        ctx.tp = tp
        return x.repeat(1, tp, 1)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        n = g.shape[1] // ctx.tp
        return g[:, :n].contiguous(), None


class _ScatterSeq(torch.autograd.Function):
    """Reduce-scatter along the sequence: [b, s, h] -> [b, s/t, h]; backward all-gathers."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: int) -> torch.Tensor:
        ctx.tp = tp
        return x[:, : x.shape[1] // tp].contiguous()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g.repeat(1, ctx.tp, 1), None


class _AllToAll(torch.autograd.Function):
    """An all-to-all: a new tensor of the same size, both ways."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g.clone()


class _GatherLinear(torch.autograd.Function):
    """Column-parallel linear under sequence parallelism: saves the sharded input, re-gathers in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                tp: int) -> torch.Tensor:
        ctx.tp = tp
        ctx.has_bias = b is not None
        ctx.save_for_backward(x, w)
        full = x.repeat(1, tp, 1)
        return F.linear(full, w, b)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                     torch.Tensor | None, None]:
        x, w = ctx.saved_tensors
        full = x.repeat(1, ctx.tp, 1)
        gw = g.flatten(0, 1).t().mm(full.flatten(0, 1))
        del full
        gb = g.sum((0, 1)) if ctx.has_bias else None
        gx_full = g.matmul(w)
        gx = gx_full[:, : x.shape[1]].contiguous()
        return gx, gw, gb, None


# ---------------------------------------------------------------------------------------------------


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout keeping a 1-byte mask, as the CUDA kernel does (CPU's F.dropout keeps an x-sized mask)."""
    if not p or not training:
        return x
    out: torch.Tensor = torch.ops.aten.native_dropout(x, p, True)[0]
    return out


class _CrossEntropy(torch.autograd.Function):
    """Megatron's (vocabulary-parallel) cross-entropy: an fp32 softmax computed in place in the
    upcast logits is all it keeps, and its backward turns that buffer into the gradient in place."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = logits.float()
        x.sub_(x.amax(dim=-1, keepdim=True))
        x.exp_()
        x.div_(x.sum(dim=-1, keepdim=True))
        picked = x.gather(-1, targets.unsqueeze(-1))
        ctx.save_for_backward(x, targets)
        ctx.dtype = logits.dtype
        return -picked.log().mean()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        softmax, targets = ctx.saved_tensors
        softmax.scatter_add_(-1, targets.unsqueeze(-1),
                             torch.full_like(targets, -1, dtype=softmax.dtype).unsqueeze(-1))
        softmax.mul_(g / targets.numel())
        return softmax.to(ctx.dtype), None


class _RMSNormFn(torch.autograd.Function):
    """RMSNorm that keeps its input and an fp32 rstd per token, as fused CUDA kernels do (PyTorch's
    CPU rms_norm decomposes and keeps two fp32 copies of the input)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        rstd = x.float().pow(2).mean(-1, keepdim=True).add_(1e-5).rsqrt_()
        ctx.save_for_backward(x, w, rstd)
        return (x * rstd.to(x.dtype)) * w

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w, rstd = ctx.saved_tensors
        xn = x.float() * rstd
        gw = (g.float() * xn).sum(dim=tuple(range(g.dim() - 1))).to(w.dtype)
        gxn = g.float() * w.float()
        gx = rstd * (gxn - xn * (gxn * xn).mean(-1, keepdim=True))
        return gx.to(x.dtype), gw


class RMSNorm(nn.Module):
    def __init__(self, h: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _apply(_RMSNormFn, x, self.weight)
        return out


def _norm(m: ModelDims, dtype: torch.dtype) -> nn.Module:
    return RMSNorm(m.hidden_size, dtype) if m.gated else nn.LayerNorm(m.hidden_size, dtype=dtype)


class ColumnLinear(nn.Module):
    """h -> out/tp; with sequence parallelism its input is [b, s/tp, h]."""

    def __init__(self, h: int, out: int, bias: bool, r: RankShape) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out, h, dtype=r.dtype))
        self.bias = nn.Parameter(torch.zeros(out, dtype=r.dtype)) if bias else None
        nn.init.normal_(self.weight, std=0.02)
        self.sp = r.sp and r.tp > 1
        self.tp = r.tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sp:
            out: torch.Tensor = _apply(_GatherLinear, x, self.weight, self.bias, self.tp)
            return out
        return F.linear(x, self.weight, self.bias)


class RowLinear(nn.Module):
    """in/tp -> h, all-reduce (in place) or reduce-scatter (sequence parallel); bias replicated."""

    def __init__(self, inp: int, h: int, bias: bool, r: RankShape) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(h, inp, dtype=r.dtype))
        self.bias = nn.Parameter(torch.zeros(h, dtype=r.dtype)) if bias else None
        nn.init.normal_(self.weight, std=0.02)
        self.sp = r.sp and r.tp > 1
        self.tp = r.tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.sp:
            y = _apply(_ScatterSeq, y, self.tp)
        if self.bias is not None:
            y = y + self.bias
        return y


class Attention(nn.Module):
    def __init__(self, r: RankShape) -> None:
        super().__init__()
        m = r.model
        self.heads = m.num_heads // r.tp
        self.kv = m.kv_heads // r.tp
        self.d = m.head_dim
        self.causal = m.family != "encoder"
        self.flash = r.flash
        self.selective = r.checkpointing == "selective"
        self.p_drop = 0.1 if m.has_dropout else 0.0
        self.qkv = ColumnLinear(m.hidden_size, (self.heads + 2 * self.kv) * self.d, m.has_bias, r)
        self.proj = RowLinear(self.heads * self.d, m.hidden_size, m.has_bias, r)
        # Created before tracking starts, so not counted (Megatron masks inside a fused kernel).
        self.mask = torch.ones(m.seq_length, m.seq_length, dtype=torch.bool).triu(1) \
            if not self.flash and self.causal else None

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-1, -2))
        scores.mul_(1.0 / math.sqrt(self.d))
        if self.mask is not None:
            scores.masked_fill_(self.mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if self.p_drop and self.training:
            probs = dropout(probs, self.p_drop, True)
        return torch.matmul(probs, v)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)
        b, s = qkv.shape[0], qkv.shape[1]
        q, k, v = qkv.split([self.heads * self.d, self.kv * self.d, self.kv * self.d], dim=-1)
        q = q.view(b, s, self.heads, self.d).transpose(1, 2)
        k = k.view(b, s, self.kv, self.d).transpose(1, 2)
        v = v.view(b, s, self.kv, self.d).transpose(1, 2)
        if self.kv != self.heads:
            rep = self.heads // self.kv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if self.flash:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        elif self.selective:
            o = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            o = self._core(q, k, v)
        o = o.transpose(1, 2).reshape(b, s, self.heads * self.d)
        return self.proj(o)  # type: ignore[no-any-return]


class MLP(nn.Module):
    def __init__(self, r: RankShape) -> None:
        super().__init__()
        m = r.model
        f = m.ffn // r.tp
        self.gated = m.gated
        if m.gated:
            self.gate = ColumnLinear(m.hidden_size, f, False, r)
        self.fc1 = ColumnLinear(m.hidden_size, f, m.has_bias, r)
        self.fc2 = RowLinear(f, m.hidden_size, m.has_bias, r)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            a = F.silu(self.gate(x)) * self.fc1(x)
        else:
            a = F.gelu(self.fc1(x))
        return self.fc2(a)  # type: ignore[no-any-return]


class MoE(nn.Module):
    """GShard-style top-k MoE: router, E/ep local experts (ffn split by tp), capacity-bounded dispatch."""

    def __init__(self, r: RankShape) -> None:
        super().__init__()
        m = r.model
        h, f = m.hidden_size, m.ffn // r.tp
        self.e_local = m.num_experts // r.ep
        self.top_k = m.top_k
        self.ep = r.ep
        self.tokens = r.micro_batch * m.seq_length
        self.cap = math.ceil(m.capacity_factor * m.top_k * self.tokens / m.num_experts)
        self.router = nn.Linear(h, m.num_experts, bias=False, dtype=r.dtype)
        self.w1 = nn.Parameter(torch.empty(self.e_local, h, f, dtype=r.dtype))
        self.b1 = nn.Parameter(torch.zeros(self.e_local, 1, f, dtype=r.dtype))
        self.w2 = nn.Parameter(torch.empty(self.e_local, f, h, dtype=r.dtype))
        self.b2 = nn.Parameter(torch.zeros(self.e_local, 1, h, dtype=r.dtype))
        nn.init.normal_(self.w1, std=0.02)
        nn.init.normal_(self.w2, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        flat = x.reshape(b * s, h)
        probs = torch.softmax(self.router(flat).float(), dim=-1)
        gate, _ = torch.topk(probs, self.top_k, dim=-1)
        slots = self.e_local * self.cap * self.ep  # dispatched rows sent from this rank
        # Which token fills each (expert, capacity) slot: arbitrary under fake tensors; fixed shapes.
        idx = torch.arange(slots, device=x.device) % (b * s)
        send = flat.index_select(0, idx)
        recv = _apply(_AllToAll, send).view(self.e_local, self.cap * self.ep, h)
        y = torch.baddbmm(self.b1, recv, self.w1)
        y = F.gelu(y)
        y = torch.baddbmm(self.b2, y, self.w2)
        back = _apply(_AllToAll, y.view(slots, h))
        w = gate.reshape(-1).index_select(0, idx % gate.numel()).to(x.dtype)
        out = torch.zeros_like(flat).index_add(0, idx, back * w.unsqueeze(1))
        return out.view(b, s, h)


class Block(nn.Module):
    def __init__(self, r: RankShape, index: int) -> None:
        super().__init__()
        m = r.model
        self.post_ln = m.family == "encoder"
        self.ln1 = _norm(m, r.dtype)
        self.attn = Attention(r)
        self.ln2 = _norm(m, r.dtype)
        self.mlp: nn.Module = MoE(r) if m.is_moe_layer(index) else MLP(r)
        self.p_drop = 0.1 if m.has_dropout else 0.0
        self.sp_moe = r.sp and r.tp > 1 and m.is_moe_layer(index)
        self.tp = r.tp

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p_drop, self.training)

    def _ffn(self, x: torch.Tensor) -> torch.Tensor:
        if self.sp_moe:  # experts see the whole sequence: gather, then scatter back
            y: torch.Tensor = _apply(_ScatterSeq, self.mlp(_apply(_GatherSeq, x, self.tp)), self.tp)
            return y
        return self.mlp(x)  # type: ignore[no-any-return]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.post_ln:  # BERT
            x = self.ln1(x + self._drop(self.attn(x)))
            return self.ln2(x + self._drop(self._ffn(x)))  # type: ignore[no-any-return]
        x = x + self._drop(self.attn(self.ln1(x)))
        return x + self._drop(self._ffn(self.ln2(x)))


class Embedding(nn.Module):
    def __init__(self, r: RankShape) -> None:
        super().__init__()
        m = r.model
        self.word = nn.Parameter(torch.empty(local_vocab(m, r.tp), m.hidden_size, dtype=r.dtype))
        nn.init.normal_(self.word, std=0.02)
        self.pos = nn.Parameter(torch.zeros(m.seq_length, m.hidden_size, dtype=r.dtype)) \
            if m.learned_positions else None
        self.types = nn.Parameter(torch.zeros(2, m.hidden_size, dtype=r.dtype)) if m.family == "encoder" else None
        self.ln = nn.LayerNorm(m.hidden_size, dtype=r.dtype) if m.family == "encoder" else None
        self.p_drop = 0.1 if m.has_dropout else 0.0
        self.sp = r.sp and r.tp > 1
        self.tp = r.tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = F.embedding(ids, self.word)
        if self.pos is not None:
            x = x + self.pos
        if self.types is not None:
            x = x + self.types[0]
        if self.sp:
            x = _apply(_ScatterSeq, x, self.tp)
        if self.ln is not None:
            x = self.ln(x)
        return dropout(x, self.p_drop, self.training)


class Head(nn.Module):
    """Final norm (decoder) or MLM transform (encoder), output projection over V/tp, cross-entropy."""

    def __init__(self, r: RankShape, tied: nn.Parameter | None) -> None:
        super().__init__()
        m = r.model
        v_local = local_vocab(m, r.tp)
        self.encoder = m.family == "encoder"
        if self.encoder:
            self.dense = nn.Linear(m.hidden_size, m.hidden_size, dtype=r.dtype)
            self.bias = nn.Parameter(torch.zeros(v_local, dtype=r.dtype))
        self.norm = _norm(m, r.dtype)
        self.tied = tied
        self.out = None if tied is not None else nn.Parameter(torch.empty(v_local, m.hidden_size, dtype=r.dtype))
        if self.out is not None:
            nn.init.normal_(self.out, std=0.02)
        self.sp = r.sp and r.tp > 1
        self.tp = r.tp

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        w = self.tied if self.tied is not None else self.out
        assert w is not None
        if self.encoder:
            if self.sp:
                x = _apply(_GatherSeq, x, self.tp)
            x = self.norm(F.gelu(self.dense(x)))
            logits = F.linear(x, w, self.bias)
        else:
            x = self.norm(x)
            logits = _apply(_GatherLinear, x, w, None, self.tp) if self.sp else F.linear(x, w)
        return _apply(_CrossEntropy, logits, targets)


class Stage(nn.Module):
    """One rank's pipeline stage. `forward(inp, targets)`: token ids (first stage) or hidden states."""

    def __init__(self, r: RankShape) -> None:
        super().__init__()
        self.r = r
        m = r.model
        self.embed = Embedding(r) if r.first else None
        self.blocks = nn.ModuleList(Block(r, i) for i in r.layers)
        tied: nn.Parameter | None = None
        if r.last and m.tied_embeddings:
            if self.embed is not None:
                tied = self.embed.word
            else:  # Megatron keeps a copy of the word embedding on the last stage
                v_local = local_vocab(m, r.tp)
                self.word_copy = nn.Parameter(torch.empty(v_local, m.hidden_size, dtype=r.dtype))
                nn.init.normal_(self.word_copy, std=0.02)
                tied = self.word_copy
        self.head = Head(r, tied) if r.last else None

    def forward(self, inp: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(inp) if self.embed is not None else inp
        for blk in self.blocks:
            if self.r.checkpointing == "full":
                x = checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        if self.head is not None:
            assert targets is not None
            if self.r.checkpointing == "full":  # the head and loss are recomputed too
                loss: torch.Tensor = checkpoint(self.head, x, targets, use_reentrant=False)
                return loss
            return self.head(x, targets)  # type: ignore[no-any-return]
        return x
