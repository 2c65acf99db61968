"""A LLaMA-style decoder: RMSNorm (pre-norm and final), rotary positions, grouped-query attention and a
SwiGLU MLP, or, in the layers an Arch says, a Mixtral-style sparse MoE (model_moe.py).

Sources: Touvron et al. 2023, "LLaMA" (sec. 2.2: pre-normalisation with RMSNorm, SwiGLU, rotary
embeddings); Ainslie et al. 2023, "GQA"; Jiang et al. 2024, "Mixtral of Experts"; Hugging Face's
modeling_llama.py / modeling_mixtral.py for the conventions a checkpoint of those models follows:
rotate_half rotary (the two halves of a head, not interleaved pairs), kv heads repeated with
repeat_interleave (query head j reads kv head j // (heads / kv_heads)), `w2(silu(w1 x) * w3 x)`.

The module tree follows model.py's discipline, so every plan and checkpoint path works as for the GPT:
separate `q`, `k`, `v` projections (a column-wise tensor-parallel split of each gives a rank whole
query and kv heads, and the head counts are read from the local widths), blocks in a ModuleDict keyed
by layer number, `tok_emb` / `ln_f` / `head` under the GPT's names (a pipeline stage drops them; the tied
head's handling in parallel.py and checkpoint.py is the same). Rotary tables are computed from the
sequence length in each attention call: no buffers, nothing carried across pipeline stages.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tessera.clients.trainer import ModelDims
from tessera.clients.trainer.reference.architecture import RMS_NORM_EPS, ROUTER_AUX_LOSS_COEF, Arch
from tessera.clients.trainer.reference.model import (
    attention_core,
    blocks_and_head,
    check_checkpointing,
    keep_blocks,
)
from tessera.clients.trainer.reference.model_moe import SparseMoE, SwiGLU


def rotary_tables(t: int, head_dim: int, theta: float, device: torch.device,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (t, head_dim): position p, channel i (and i + head_dim/2) turned by p * theta^(-2i/d)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    freqs = torch.outer(torch.arange(t, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (batch, heads, t, head_dim) rotated: x cos + rotate_half(x) sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class GQAttention(nn.Module):
    """Causal self-attention with `kv_heads` key/value heads shared by groups of the `heads` query heads,
    rotary positions on q and k, and biases on q, k, v only when `qkv_bias` (none on the output)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, qkv_bias: bool = False,
                 rope_theta: float = 10000.0, flash: bool = True) -> None:
        super().__init__()
        self.recompute_core = False  # selective activation checkpointing (see model.GPT)
        self.flash = flash
        self.head_dim = head_dim
        self.rope_theta = rope_theta
        self.q = nn.Linear(hidden, heads * head_dim, bias=qkv_bias)
        self.k = nn.Linear(hidden, kv_heads * head_dim, bias=qkv_bias)
        self.v = nn.Linear(hidden, kv_heads * head_dim, bias=qkv_bias)
        self.proj = nn.Linear(heads * head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: all of them, or this tensor-parallel rank's share (its projections are narrower).
        q, k, v = (lin(x).view(b, t, -1, self.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v))
        cos, sin = rotary_tables(t, self.head_dim, self.rope_theta, x.device, q.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        groups = q.shape[1] // k.shape[1]
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        y = attention_core(q, k, v, self.flash, self.recompute_core)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class LlamaBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(x)); the MLP is SwiGLU (`mlp`) or a sparse MoE
    (`moe`)."""

    def __init__(self, dims: ModelDims, arch: Arch, moe: bool, flash: bool = True) -> None:
        super().__init__()
        h = dims.hidden_size
        self.ln1 = nn.RMSNorm(h, eps=RMS_NORM_EPS)
        self.attn = GQAttention(h, dims.num_heads, arch.kv_heads, arch.head_dim, arch.qkv_bias, arch.rope_theta,
                                flash)
        self.ln2 = nn.RMSNorm(h, eps=RMS_NORM_EPS)
        self.mlp: SwiGLU | None = None if moe else SwiGLU(h, arch.ffn)
        self.moe: SparseMoE | None = SparseMoE(h, arch.ffn, arch.num_experts, arch.top_k) if moe else None

    def tp_plan(self) -> dict[str, str]:
        """Tensor-parallel style of each linear (parallel.py): whole heads and whole MLP columns per rank;
        the router stays replicated (every rank routes the same tokens the same way)."""
        plan = {"attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise", "attn.proj": "rowwise"}
        if self.moe is not None:
            prefixes = [f"moe.experts.{e}." for e in self.moe.experts]
        else:
            prefixes = ["mlp."]
        for p in prefixes:
            plan.update({p + "w1": "colwise", p + "w3": "colwise", p + "w2": "rowwise"})
        return plan

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        ffn = self.mlp if self.mlp is not None else self.moe
        assert ffn is not None
        return x + ffn(self.ln2(x))


class Llama(nn.Module):
    """LLaMA-style decoder built from ModelDims and an Arch (gated); the same interface as model.GPT
    (`keep_stage`, `forward`, `tok_emb`, `ln_f`, `head`, `blocks`), with `pos_emb` always None."""

    def __init__(self, dims: ModelDims, arch: Arch, tied_head: bool = True, activation_checkpointing: str = "none",
                 flash_attention: bool = True) -> None:
        super().__init__()
        check_checkpointing(activation_checkpointing, flash_attention)
        if not arch.gated:
            raise ValueError("Llama builds gated (LLaMA-style) models; model.GPT builds GPT-2-style ones")
        self.dims = dims
        self.arch = arch
        self.activation_checkpointing = activation_checkpointing == "full"
        h = dims.hidden_size
        self.tok_emb: nn.Embedding | None = nn.Embedding(dims.vocab_size, h)
        self.pos_emb: nn.Embedding | None = None  # rotary: no position parameters
        self.blocks = nn.ModuleDict({str(i): LlamaBlock(dims, arch, arch.is_moe_layer(i), flash_attention)
                                     for i in range(dims.num_layers)})
        self.ln_f: nn.RMSNorm | None = nn.RMSNorm(h, eps=RMS_NORM_EPS)
        self.head: nn.Linear | None = nn.Linear(h, dims.vocab_size, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        # GPT-2's scaled init of the projections that write into the residual stream.
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "w2.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * max(1, dims.num_layers)))
        moe_layers = max(1, arch.num_moe_layers(dims.num_layers))
        for block in self.blocks.values():
            assert isinstance(block, LlamaBlock)
            block.attn.recompute_core = activation_checkpointing == "selective"
            if block.moe is not None:
                # The objective is the LM loss + coef x the mean over MoE layers of their balancing losses.
                block.moe.aux_weight = ROUTER_AUX_LOSS_COEF / moe_layers
        self.tied_head = tied_head
        if tied_head:
            self.head.weight = self.tok_emb.weight

    def set_aux_grad_scale(self, scale: float) -> None:
        """How the trainer scales the LM loss's gradient per micro-batch (1 / micro-batches when it
        divides the loss itself, 1 when the pipeline schedule divides the gradients afterwards): the
        MoE layers give their auxiliary losses the same scale."""
        for block in self.blocks.values():
            assert isinstance(block, LlamaBlock)
            if block.moe is not None:
                block.moe.grad_scale = scale

    def keep_stage(self, layers: range, first: bool, last: bool) -> None:
        """As model.GPT.keep_stage: keep the blocks in `layers`, the embedding if `first`, the final norm
        and head if `last`."""
        keep_blocks(self, layers)
        if not first:
            self.tok_emb = None
        if not last:
            self.ln_f = None
            self.head = None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, seq) -> logits; hidden states in or out on a pipeline stage without the
        embedding or the head."""
        if self.tok_emb is not None:
            if idx.shape[1] > self.dims.seq_length:
                raise ValueError(f"sequence of {idx.shape[1]} tokens is longer than seq_length={self.dims.seq_length}")
            x = self.tok_emb(idx)
        else:
            x = idx
        return blocks_and_head(self, x)
