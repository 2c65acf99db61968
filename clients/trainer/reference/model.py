"""A small GPT: token + position embedding, pre-LayerNorm blocks of causal self-attention and MLP.

The module tree is laid out for every plan the trainer runs:

- attention has separate `q`, `k`, `v` projections (not a fused qkv), so that a column-wise tensor-
  parallel split of each gives every TP rank whole heads; the head count is read from the local
  projection width (`head_dim` is fixed), so the same code runs on a TP shard;
- the blocks live in a `ModuleDict` keyed "0", "1", ...: a pipeline stage deletes the blocks it does not
  own and every remaining parameter keeps its fully-qualified name (`blocks.3.fc.weight`), which is what
  lets a distributed checkpoint written by one plan load into another;
- `tok_emb`/`pos_emb` (first stage) and `ln_f`/`head` (last stage) may be None on a pipeline stage;
  `forward(idx)` then takes or returns hidden states instead of token ids or logits.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from tessera.clients.trainer import ModelDims


class CausalSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, flash: bool = True) -> None:
        super().__init__()
        self.recompute_core = False  # selective activation checkpointing: recompute softmax(QK^T)V
        # flash: SDPA (flash/efficient kernels store no scores); otherwise plain attention, which keeps
        # the softmax of the scores for backward (what Megatron's selective recomputation saves).
        self.flash = flash
        self.head_dim = hidden // heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: all of them, or this tensor-parallel rank's share (its q/k/v outputs are narrower).
        q, k, v = (lin(x).view(b, t, -1, self.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v))
        y = attention_core(q, k, v, self.flash, self.recompute_core)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, flash: bool, recompute: bool) -> torch.Tensor:
    """Causal attention of (batch, heads, seq, head_dim) q, k, v: SDPA under `flash`, else plain attention
    (scores materialised); `recompute`: Megatron's selective recomputation of this core in backward."""
    core = F.scaled_dot_product_attention if flash else _plain_attention
    if recompute and torch.is_grad_enabled():
        out: torch.Tensor = checkpoint(core, q, k, v, is_causal=True, use_reentrant=False)
        return out
    return core(q, k, v, is_causal=True)


def _plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = True) -> torch.Tensor:
    """softmax(QK^T / sqrt(d)) V with the scores materialised (no flash kernel)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        t = q.shape[-2]
        mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, flash: bool = True) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = CausalSelfAttention(hidden, heads, flash)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.out = nn.Linear(4 * hidden, hidden)

    def tp_plan(self) -> dict[str, str]:
        """Tensor-parallel style of each linear (parallel.py): whole heads and MLP columns per rank."""
        return {"attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise", "attn.proj": "rowwise",
                "fc": "colwise", "out": "rowwise"}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Decoder-only transformer built from ModelDims; `tied_head` shares the embedding with the head.

    `activation_checkpointing` (torch.utils.checkpoint, non-reentrant): "full" keeps only each
    block's input and recomputes the block in the backward pass; "selective" recomputes only the
    attention core (Megatron's selective recomputation); "none" keeps everything. `flash_attention`
    False runs plain attention (scores materialised); "selective" needs it, as the estimator says
    (under flash attention there are no scores to recompute, estimator/plans.py).
    """

    def __init__(self, dims: ModelDims, tied_head: bool = True, activation_checkpointing: str = "none",
                 flash_attention: bool = True) -> None:
        super().__init__()
        check_checkpointing(activation_checkpointing, flash_attention)
        self.dims = dims
        self.activation_checkpointing = activation_checkpointing == "full"
        self.tok_emb: nn.Embedding | None = nn.Embedding(dims.vocab_size, dims.hidden_size)
        self.pos_emb: nn.Embedding | None = nn.Embedding(dims.seq_length, dims.hidden_size)
        self.blocks = nn.ModuleDict({str(i): Block(dims.hidden_size, dims.num_heads, flash_attention)
                                     for i in range(dims.num_layers)})
        self.ln_f: nn.LayerNorm | None = nn.LayerNorm(dims.hidden_size)
        self.head: nn.Linear | None = nn.Linear(dims.hidden_size, dims.vocab_size, bias=False)
        self.apply(self._init)
        # GPT-2's scaled init of the projections that write into the residual stream.
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "out.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * max(1, dims.num_layers)))
        for block in self.blocks.values():
            assert isinstance(block, Block)
            block.attn.recompute_core = activation_checkpointing == "selective"
        self.tied_head = tied_head
        if tied_head:
            self.head.weight = self.tok_emb.weight

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def keep_stage(self, layers: range, first: bool, last: bool) -> None:
        """Turn this model into one pipeline stage: keep the blocks in `layers`, the embeddings only if
        `first`, the final LayerNorm and head only if `last`. A tied head on a last stage that is not
        also the first keeps its own copy of the embedding weight (the trainer keeps the two copies
        equal by summing their gradients)."""
        keep_blocks(self, layers)
        if not first:
            self.tok_emb = None
            self.pos_emb = None
        if not last:
            self.ln_f = None
            self.head = None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, seq) -> logits (batch, seq, vocab). A pipeline stage without embeddings
        takes hidden states instead of ids; one without a head returns hidden states."""
        if self.tok_emb is not None:
            assert self.pos_emb is not None
            t = idx.shape[1]
            if t > self.dims.seq_length:
                raise ValueError(f"sequence of {t} tokens is longer than seq_length={self.dims.seq_length}")
            x = self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device))
        else:
            x = idx
        return blocks_and_head(self, x)


def check_checkpointing(activation_checkpointing: str, flash_attention: bool) -> None:
    """ValueError for an activation checkpointing the models cannot mean ("selective" recomputes the
    attention scores, which flash attention never stores)."""
    if activation_checkpointing not in ("none", "selective", "full"):
        raise ValueError(f"activation_checkpointing must be none, selective or full, got {activation_checkpointing!r}")
    if activation_checkpointing == "selective" and flash_attention:
        raise ValueError("activation_checkpointing 'selective' recomputes the attention scores, which flash "
                         "attention never stores: set flash_attention False")


def keep_blocks(model: Any, layers: range) -> None:
    """Delete the blocks of `model.blocks` outside `layers` (a pipeline stage's cut); the others keep
    their keys, hence their checkpoint names."""
    for key in list(model.blocks.keys()):
        if int(key) not in layers:
            del model.blocks[key]


def blocks_and_head(model: Any, x: torch.Tensor) -> torch.Tensor:
    """`model`'s blocks over hidden states x (each under a non-reentrant checkpoint with full
    activation checkpointing), then its final norm and head, or x itself on a stage without a head:
    the same for every model this trainer builds (GPT, Llama)."""
    for block in model.blocks.values():
        if model.activation_checkpointing and torch.is_grad_enabled():
            x = checkpoint(block, x, use_reentrant=False)
        else:
            x = block(x)
    if model.head is None:
        return x
    assert model.ln_f is not None
    out: torch.Tensor = model.head(model.ln_f(x))
    return out


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over all tokens of the batch."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, object]]:
    """AdamW groups: decay on matrices and embeddings, none on biases and LayerNorm parameters."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for p in model.parameters():  # shared (tied) parameters appear once
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
