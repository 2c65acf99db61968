"""Parameters of one rank under the PyTorch-native recipes (memory_recipes.py): the linears of a
layer, T5's encoder and decoder layers, LoRA's adapters. Counts reproduce Hugging Face's parameter
counts of Qwen2.5, Gemma 2, Mixtral and T5 (tests/unit/test_memory_recipes.py)."""

from __future__ import annotations

from tessera.estimator.memory_terms import layer_params, local_vocab, rank_params, stage_layers
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan

LORA_LINEARS = {"qv": ("q", "v"), "attention": ("q", "k", "v", "o"),
                "all-linear": ("q", "k", "v", "o", "w1", "w2", "w3")}


def _layer_linears(m: ModelDims, tp: int, index: int, cross: bool) -> list[tuple[str, int, int, bool]]:
    """(name, local in, local out, column-parallel) of each linear of a layer (one expert for MoE)."""
    h, d = m.hidden_size, m.head_dim
    a, kv, f = m.num_heads, m.kv_heads, m.ffn
    att = [("q", h, a * d // tp, True), ("k", h, kv * d // tp, True), ("v", h, kv * d // tp, True),
           ("o", a * d // tp, h, False)]
    out = list(att)
    if cross:
        out += [("x" + n, i, o, c) for n, i, o, c in att]
    if m.gated:
        out += [("w1", h, f // tp, True), ("w3", h, f // tp, True), ("w2", f // tp, h, False)]
    else:
        out += [("w1", h, f // tp, True), ("w2", f // tp, h, False)]
    return out


def _encdec_layer_params(m: ModelDims, tp: int, decoder: bool, first: bool) -> int:
    """A T5 layer on one rank: its norms (weight only), attention(s), MLP, and the first layer's
    relative position bias (32 buckets x heads/tp)."""
    n = sum(i * o for _, i, o, _ in _layer_linears(m, tp, 0, decoder))
    n += (3 if decoder else 2) * m.hidden_size
    if first:
        n += 32 * (m.num_heads // tp)
    return n


def model_params(m: ModelDims, plan: ExecutionPlan, stage: int) -> tuple[int, int, int, int]:
    """(dense, expert, largest layer, linear weights) parameters on one rank of `stage`; `largest layer`
    is the most parameters one layer has on the rank (what FSDP2 all-gathers at once)."""
    tp = plan.tp
    h = m.hidden_size
    if m.family == "encoder-decoder":
        layers = [_encdec_layer_params(m, tp, False, i == 0) for i in range(m.num_layers)]
        layers += [_encdec_layer_params(m, tp, True, i == 0) for i in range(m.decoder_layers)]
        v_l = local_vocab(m, tp)
        dense = sum(layers) + v_l * h + 2 * h + (0 if m.tied_embeddings else v_l * h)
        linear = sum(sum(i * o for _, i, o, _ in _layer_linears(m, tp, 0, False)) for _ in range(m.num_layers)) + \
            sum(sum(i * o for _, i, o, _ in _layer_linears(m, tp, 0, True)) for _ in range(m.decoder_layers))
        return dense, 0, max(layers), linear
    dense, expert, _ = rank_params(m, plan, stage)
    idx = stage_layers(m, plan)[stage]
    per = [sum(layer_params_native(m, i, tp, plan.ep)) for i in idx]
    linear = 0
    for i in idx:
        lin = sum(a * b for _, a, b, _ in _layer_linears(m, tp, i, False))
        if m.is_moe_layer(i):
            lin = sum(a * b for n, a, b, _ in _layer_linears(m, tp, i, False) if n in ("q", "k", "v", "o"))
            lin += (m.num_experts // plan.ep) * (3 if m.gated else 2) * h * (m.ffn // tp)
        linear += lin
    return dense, expert, max(per) if per else 0, linear


def layer_params_native(m: ModelDims, index: int, tp: int, ep: int) -> tuple[int, int]:
    return layer_params(m, index, tp, ep)


def adapter_params(m: ModelDims, plan: ExecutionPlan, stage: int) -> int:
    """LoRA adapters on one rank: r*(in + out) per targeted linear (A: r x in, B: out x r; the
    TP-split side divided by tp, as the base linear's), for every layer (and expert) of the stage."""
    if not plan.lora_rank:
        return 0
    r, targets = plan.lora_rank, LORA_LINEARS[plan.lora_targets]
    if m.family == "encoder-decoder":
        kinds = [False] * m.num_layers + [True] * m.decoder_layers
        idx = list(range(len(kinds)))
    else:
        idx = list(stage_layers(m, plan)[stage])
        kinds = [False] * len(idx)
    total = 0
    for i, cross in zip(idx, kinds):
        for name, fan_in, fan_out, _ in _layer_linears(m, plan.tp, i, cross):
            if name.lstrip("x") in targets:
                copies = m.num_experts // plan.ep if (m.is_moe_layer(i) and name.startswith("w")) else 1
                total += copies * r * (fan_in + fan_out)
    return total
