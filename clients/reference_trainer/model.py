"""A small GPT: token + position embedding, pre-LayerNorm blocks of causal self-attention and MLP."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from clients.trainer_sdk import ModelDims


class CausalSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=2)
        q, k, v = (z.view(b, t, self.heads, h // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, h))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = CausalSelfAttention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.out = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Decoder-only transformer built from ModelDims; `tied_head` shares the embedding with the head."""

    def __init__(self, dims: ModelDims, tied_head: bool = True) -> None:
        super().__init__()
        self.dims = dims
        self.tok_emb = nn.Embedding(dims.vocab_size, dims.hidden_size)
        self.pos_emb = nn.Embedding(dims.seq_length, dims.hidden_size)
        self.blocks = nn.ModuleList(Block(dims.hidden_size, dims.num_heads) for _ in range(dims.num_layers))
        self.ln_f = nn.LayerNorm(dims.hidden_size)
        self.head = nn.Linear(dims.hidden_size, dims.vocab_size, bias=False)
        self.apply(self._init)
        # GPT-2's scaled init of the projections that write into the residual stream.
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "out.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * max(1, dims.num_layers)))
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

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (batch, seq, vocab) and, with targets, the mean cross-entropy over all tokens."""
        _, t = idx.shape
        if t > self.dims.seq_length:
            raise ValueError(f"sequence of {t} tokens is longer than seq_length={self.dims.seq_length}")
        pos = torch.arange(t, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, object]]:
    """AdamW groups: decay on matrices and embeddings, none on biases and LayerNorm parameters."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for p in model.parameters():  # shared (tied) parameters appear once
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
