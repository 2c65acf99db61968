"""LoRA's costs on an operator chain, shared by the time of one plan (plan_time.py) and the Cells
(cells.py, through `lora_cell_operators`): which linears PEFT adapts, the adapters' parameters and
FLOPs, and what the frozen base no longer computes.

Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022; PEFT's Linear. Apart from
both so that neither imports the other (cells.py <- plan_time.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from tessera.estimator.layer_costs import Attention
from tessera.estimator.models import ModelDims
from tessera.estimator.partition import Operator
from tessera.estimator.plans import ExecutionPlan


class AttentionOf(Protocol):
    """A model that gives each layer's attention (cells.CellModel)."""

    def attention(self, idx: int) -> Attention: ...


class LoraCellModel(AttentionOf, Protocol):
    """What `lora_cell_operators` reads of a cells.CellModel."""

    @property
    def hidden_size(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def seq_length(self) -> int: ...
    @property
    def ffn_hidden(self) -> int: ...
    @property
    def gated(self) -> bool: ...
    @property
    def lora_rank(self) -> int: ...
    @property
    def lora_targets(self) -> str: ...
    @property
    def op_checkpoint(self) -> bool: ...

    def checkpointed(self, idx: int) -> bool: ...

    def recompute_passes(self, idx: int) -> float: ...


def layer_index(op: Operator) -> int | None:
    """The layer number of a layer operator ("layer3", "moe5"), None for the embedding and head."""
    for prefix in ("layer", "moe"):
        if op.name.startswith(prefix) and op.name[len(prefix):].isdigit():
            return int(op.name[len(prefix):])
    return None


def _lora_linears(model: ModelDims, att: Attention, targets: str) -> list[tuple[int, int]]:
    """(in, out) of the linears PEFT adapts per layer."""
    h, a, kv, f = model.hidden_size, att.width, att.kv_width, model.ffn
    q, k, v, o = (h, a), (h, kv), (h, kv), (a, h)
    if targets == "qv":
        return [q, v]
    mlp = [(h, f), (h, f), (f, h)] if model.gated else [(h, f), (f, h)]
    return [q, k, v, o] + (mlp if targets == "all-linear" else [])


@dataclass(frozen=True)
class LoraOperators:
    ops: tuple[Operator, ...]
    adapter_params: tuple[float, ...]  # per operator
    adapter_fwd: tuple[float, ...]  # forward FLOPs per sample, per operator
    base_linear_params: tuple[float, ...]  # frozen linear weights per operator (QLoRA dequantizes them)


def lora_operators(model: ModelDims, cm: AttentionOf, ops: Sequence[Operator], plan: ExecutionPlan) -> LoraOperators:
    """A frozen base computes no weight gradients: its linears cost forward + input gradient, 2/3 of
    the 3 passes; the adapters (x A^T B^T, rank r) cost 2r(in + out) per token forward, 3x that to
    train (Hu et al., LoRA, ICLR 2022; PEFT's Linear). The lm_head is frozen too (not adapted)."""
    r, s = plan.lora_rank, model.seq_length
    new, params, fwd, base = [], [], [], []
    for op in ops:
        i = layer_index(op)
        if i is None:
            new.append(replace(op, flops=op.flops - op.linear_flops / 3, linear_flops=op.linear_flops * 2 / 3))
            params.append(0.0)
            fwd.append(0.0)
            base.append(0.0)
            continue
        att = cm.attention(i)
        lin = _lora_linears(model, att, plan.lora_targets)
        ad = sum(2.0 * r * (a + b) for a, b in lin) * s
        new.append(replace(op, flops=op.flops - op.linear_flops / 3 + 3 * ad,
                           linear_flops=op.linear_flops * 2 / 3 + 3 * ad))
        params.append(float(sum(r * (a + b) for a, b in lin)))
        fwd.append(ad)
        mlp = (3 if model.gated else 2) * model.hidden_size * model.ffn
        base.append(float(att.params + mlp))
    return LoraOperators(tuple(new), tuple(params), tuple(fwd), tuple(base))


def lora_cell_operators(m: LoraCellModel, ops: Sequence[Operator]) -> tuple[Operator, ...]:
    """LoRA on the Cells' operator chain (estimator/cell_recipe.py): every parameter of the base is
    frozen (Operator.frozen_params: no gradient, no optimizer state); the base's weight GEMMs skip
    their weight-gradient pass (one of the 3 + recomputed passes in `linear_flops`); the adapters add
    their parameters and `lora_operators`'s FLOPs: 2r(in + out) per token forward, 3x that to train,
    once more when the layer is fully recomputed."""
    dims = ModelDims(hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                     vocab_size=m.vocab_size, seq_length=m.seq_length, ffn_hidden=m.ffn_hidden, gated=m.gated)
    plan = ExecutionPlan(lora_rank=m.lora_rank, lora_targets=m.lora_targets)  # type: ignore[arg-type]
    lo = lora_operators(dims, m, ops, plan)
    out = []
    for op, adapters, fwd in zip(ops, lo.adapter_params, lo.adapter_fwd):
        idx = layer_index(op)
        layer = idx is not None
        passes = 3.0 + (m.recompute_passes(idx) if idx is not None else 0.0)
        weight_grad = op.linear_flops / passes  # the base's weight-gradient pass
        full = 1.0 if idx is not None and m.checkpointed(idx) and not m.op_checkpoint else 0.0
        extra = (3.0 + full) * fwd if layer else 0.0
        out.append(replace(op, flops=op.flops - weight_grad + extra, linear_flops=op.linear_flops - weight_grad + extra,
                           params=op.params + adapters, frozen_params=op.params))
    return tuple(out)
