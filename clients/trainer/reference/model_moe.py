"""Mixtral's sparse mixture of experts: a linear router, softmax over the experts, the top-k renormalised,
SwiGLU experts, dropless (every routed token is computed), and the Switch/Mixtral load-balancing loss.

Sources: Jiang et al. 2024, "Mixtral of Experts" (sec. 2.1: y = sum over the top-2 of
softmax(top-2 logits)_i SwiGLU_i(x)); Fedus et al. 2022, "Switch Transformers" (eq. 4-6, the balancing
loss); Hugging Face's modeling_mixtral.py (MixtralSparseMoeBlock: softmax over all experts, then top-k,
then the k weights renormalised to sum to 1, which equals the softmax of the top-k logits;
load_balancing_loss_func: E * sum over (k, e) of the fraction of tokens whose k-th choice is e times
the mean router probability of e).

The auxiliary loss does not travel with the activations: each MoE layer adds its gradient where it is
computed (_AddAuxGrad, Megatron-LM's MoEAuxLossAutoScaler), so it reaches the router on every plan,
including a pipeline stage that never sees the LM loss, and under activation checkpointing.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x), no biases (LLaMA's MLP and each Mixtral expert)."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(probabilities over all experts, the top-k weights renormalised to sum to 1, the top-k experts)
    of router logits (tokens, experts); probabilities and weights in fp32."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    return probs, weights / weights.sum(dim=-1, keepdim=True), experts


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """E * sum_{k,e} f_{k,e} * P_e: f_{k,e} the fraction of tokens whose k-th choice is expert e, P_e the
    mean router probability of e (tokens, experts). Its minimum, top_k, is perfectly balanced routing;
    gradient flows through P only (f counts choices)."""
    f = F.one_hot(experts, num_experts).float().mean(dim=0)  # (top_k, E)
    return num_experts * (f * probs.mean(dim=0).unsqueeze(0)).sum()


class _AddAuxGrad(torch.autograd.Function):
    """Identity on `out`; in the backward pass, also the gradient `scale` for `aux` (as if `scale * aux`
    had been added to the loss being differentiated)."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(aux)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        (aux,) = ctx.saved_tensors
        return grad, torch.full_like(aux, ctx.scale), None


class SparseMoE(nn.Module):
    """Top-k routing over `num_experts` SwiGLU experts, dropless. `aux_weight` (the model sets it: the
    coefficient over the number of MoE layers) x `grad_scale` (the trainer sets it: its scale of the LM
    loss per micro-batch) is the weight of this layer's balancing loss in the gradient."""

    def __init__(self, hidden: int, ffn: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleDict({str(e): SwiGLU(hidden, ffn) for e in range(num_experts)})
        self.aux_weight = 0.0
        self.grad_scale = 1.0
        self.last_aux_loss: torch.Tensor | None = None  # the last forward's balancing loss (detached)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        probs, weights, chosen = route(self.router(flat), self.top_k)
        weights = weights.to(flat.dtype)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts.values()):
            token, slot = torch.where(chosen == e)
            # Every expert runs, on no rows when no token chose it: each parameter then gets a gradient
            # (zeros) on every rank, which DDP, FSDP2's reduce-scatter and the hand all-reduce of the
            # data-parallel plans need (the same tensors on every rank), and a TP group stays in step.
            y = expert(flat.index_select(0, token)) * weights[token, slot].unsqueeze(-1)
            out = out.index_add(0, token, y)
        aux = load_balancing_loss(probs, chosen, len(self.experts))
        self.last_aux_loss = aux.detach()
        if self.aux_weight and torch.is_grad_enabled():
            out = _AddAuxGrad.apply(out, aux, self.aux_weight * self.grad_scale)
        return out.view(shape)
