"""LoRA's resident state under the PyTorch-native recipes (memory_recipes.native_state): the frozen base
and the adapters on one rank, under every sharding. Only the adapters train, so only they have gradients
and optimizer states, whatever the sharding; the sharding decides over how many ranks each is split
(docs/estimator-memory.md, the LoRA and ZeRO-1/2 rows)."""

from __future__ import annotations

from dataclasses import dataclass

from tessera.estimator.memory_layers import Stack
from tessera.estimator.memory_params import _layer_linears, adapter_params, model_params
from tessera.estimator.memory_terms import local_vocab
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan

# QLoRA (Dettmers et al. 2023, arXiv 2305.14314 Sec. 3): NF4 weights (4 bits) with blockwise absmax,
# 64 weights per block, the absmax themselves quantized to 8 bits in blocks of 256 with an fp32
# second-level constant: 8/64 + 32/(64*256) = 0.127 bits per weight.
NF4_BYTES = 0.5 + (8 / 64 + 32 / (64 * 256)) / 8
# LLM.int8 (bitsandbytes Linear8bitLt): 1 byte per weight plus one fp32 scale per output row.
INT8_BYTES = 1.0


def largest_matrix(m: ModelDims, plan: ExecutionPlan) -> int:
    return max(i * o for _, i, o, _ in _layer_linears(m, plan.tp, 0, False))


def largest_tensor(m: ModelDims, plan: ExecutionPlan) -> int:
    return max(largest_matrix(m, plan), local_vocab(m, plan.tp) * m.hidden_size)


def state_shards(plan: ExecutionPlan) -> tuple[int, int, int]:
    """Ranks the (parameters, gradients, optimizer states) are split over: ZeRO-1 splits the optimizer
    states, ZeRO-2 also the gradients, ZeRO-3/FSDP also the parameters, each over dp*cp (torchtitan's
    dp_shard_cp mesh; DeepSpeed's sequence-parallel ranks join its data-parallel group likewise)."""
    n, z = plan.dp * plan.cp, plan.zero_stage
    return (n if z >= 3 else 1, n if z >= 2 else 1, n if z >= 1 else 1)


@dataclass(frozen=True)
class LoraState:
    parameters: float  # the frozen base (unless offloaded) and the adapters, as sharded
    gradients: float  # the adapters' only
    optimizer: float  # the adapters' only
    cpu: float
    layer_ws: float  # base layers in flight (gathered, or copied over from the host) and a dequantized matrix
    head_ws: float  # FSDP2's root unit, gathered from its forward to its backward
    opt_tmp: float  # AdamW's temporary for the largest tensor shard
    notes: tuple[str, ...]


def lora_state(m: ModelDims, plan: ExecutionPlan, stage: int, stack: Stack, storage: int, grad: int, optimizer: int,
               compute: int) -> LoraState:
    """`storage`, `grad`, `optimizer`, `compute`: the recipe's bytes per element (memory_recipes.native_dtypes)."""
    p_shards, g_shards, o_shards = state_shards(plan)
    deepspeed = plan.sharding in ("zero1", "zero2")  # no FSDP2 units: every parameter stays whole on the rank
    c = compute
    dense, expert, largest_layer, linear = model_params(m, plan, stage)
    trainable = adapter_params(m, plan, stage)
    # the frozen base in the compute dtype (no master copy for weights that never update), QLoRA's linears
    # quantized; adapters train as the recipe's weights: fp32 under fp32/mixed (PEFT's autocast_adapter_dtype),
    # 4 + 4 + 8 B; bf16 under pure bf16 (autocast off, as realtrace/adapters.py builds them), 2 + 2 + 4 B
    qb = {"none": float(c), "nf4": NF4_BYTES, "int8": INT8_BYTES}[plan.base_quant]
    base = linear * qb + (dense + expert - linear) * c
    params = (base + trainable * storage) / p_shards
    cpu = 0.0
    if plan.offload == "frozen":  # the base weights live in host memory; a layer at a time comes over
        cpu = base / p_shards
        params = trainable * storage / p_shards
    grads = trainable * grad / g_shards
    opt = trainable * optimizer / o_shards
    opt_tmp = 4 * largest_tensor(m, plan) / o_shards
    notes = [(f"LoRA r={plan.lora_rank} on {plan.lora_targets}: {trainable} adapter parameters train; "
              f"base {plan.base_quant} ({qb:.4g} B/param for linear weights)")]
    if deepspeed:
        notes.append(f"ZeRO-{plan.zero_stage}: base and adapters whole on every rank; the adapters' optimizer "
                     f"states{' and gradients' if plan.zero_stage == 2 else ''} split over dp*cp = {o_shards}")
        if plan.offload == "optimizer":  # ZeRO-Offload: the step runs on the host, beside the states
            cpu += opt + (grads if plan.zero_stage == 2 else 0.0)
            opt = opt_tmp = 0.0
            grads = 0.0 if plan.zero_stage == 2 else grads
    elif plan.offload in ("optimizer", "optimizer+params"):
        # FSDP2's CPUOffloadPolicy, as for a full fine-tune (memory_recipes.native_state): every sharded
        # parameter, frozen base included, its gradient and state on the host; the step runs there
        cpu += params + grads + opt
        params = grads = opt = opt_tmp = 0.0
        notes.append(f"offload {plan.offload}: FSDP2's CPUOffloadPolicy keeps the base, the adapters, their "
                     f"gradients and optimizer states in host memory; two layers at a time come over")
    # the layers in flight: two gathered (FSDP2 prefetch) or, offloaded, one copied over; a quantized
    # base is dequantized to bf16 one matrix at a time
    layer_base = largest_layer * (qb if plan.base_quant != "none" else c)
    in_flight = 1 if plan.offload == "frozen" else 2
    # from the host, a layer at a time: an offloaded base, or (not under DeepSpeed) CPUOffloadPolicy's state
    copied_over = plan.offload == "frozen" or (plan.offload != "none" and not deepspeed)
    layer_ws = in_flight * layer_base if (p_shards > 1 or copied_over) else 0.0
    if plan.base_quant != "none":
        layer_ws += c * largest_matrix(m, plan)
    head = local_vocab(m, plan.tp) * m.hidden_size
    root = head if (stack == "torchtitan" or m.tied_embeddings) else 2 * head
    head_ws = 0.0 if deepspeed else c * root
    return LoraState(params, grads, opt, cpu, layer_ws, head_ws, opt_tmp, tuple(notes))
