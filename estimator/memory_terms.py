"""The memory terms the two memory modes share: the formula (memory.py) and the traced step
(torch/traced.py) both count what one rank holds from here.

Precision recipes (bytes per parameter and per activation element), the result type
`MemoryBreakdown` and its `other` reserve, the layers of each pipeline stage, the parameters of one
rank under TP/EP, its resident state (parameters, gradients, optimizer; ZeRO sharding and CPU offload)
and the capacity of the GPU it runs on. docs/estimator-memory.md states every term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from tessera.common.gpus import UnknownGpuError, lookup
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError

GIB = 1024**3

# ------------------------------------------------------------------------------------------------
# Precision recipes


@dataclass(frozen=True)
class Recipe:
    """Bytes per parameter of one precision recipe with Adam(W), and the activation element size.

    `param` and `grad` are the model's parameter and gradient copies; `optimizer` is everything the
    optimizer keeps (fp32 master copy, fp32 main gradients where the recipe keeps them apart, Adam
    m and v). ZeRO-1 shards `optimizer`, ZeRO-2 also `grad`, ZeRO-3/FSDP also `param`.
    """

    name: str
    param: int
    grad: int
    optimizer: int
    activation: int  # bytes per activation element
    cast_grad: bool  # the optimizer step makes an fp32 copy of each (shard of a) gradient
    description: str

    @property
    def bytes_per_param(self) -> int:
        return self.param + self.grad + self.optimizer


RECIPES: dict[str, Recipe] = {r.name: r for r in [
    Recipe("fp32", 4, 4, 8, 4, False, "fp32 params, fp32 grads, fp32 Adam m and v (16 B/param); fp32 activations"),
    Recipe("amp", 4, 4, 8, 2, False,
           "PyTorch AMP: fp32 params, grads and Adam (16 B/param), bf16/fp16 autocast activations"),
    Recipe("mixed", 2, 2, 12, 2, True,
           "ZeRO paper / DeepSpeed fp16: fp16 params and grads, fp32 master + m + v (2+2+12 = 16 B/param)"),
    Recipe("megatron-bf16", 2, 4, 12, 2, False,
           "Megatron default: bf16 params, fp32 main grads, fp32 master + m + v (2+4+12 = 18 B/param)"),
    Recipe("megatron-fp16", 2, 2, 16, 2, False,
           "Megatron fp16 (Frenzy's 20): fp16 params and grads, fp32 main param + main grad + m + v "
           "(2+2+16 = 20 B/param)"),
    Recipe("bf16", 2, 2, 4, 2, False, "pure bf16: bf16 params, grads, Adam m and v (2+2+4 = 8 B/param)"),
    Recipe("mixed-adafactor", 2, 4, 4, 2, False,
           "fp16 params, fp32 grads, fp32 master, Adafactor without momentum: factored second moment "
           "(rows + columns of each matrix, not counted per parameter) (2+4+4 = 10 B/param); how the "
           "Crius artifact trains its GShard MoE (Alpa, optax.adafactor)"),
]}


# ------------------------------------------------------------------------------------------------
# Result


Source = Literal["formula", "formula:marp", "traced"]


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak bytes on the most loaded GPU of a plan, by category; `total` is their sum.

    `activations` is everything transient at the peak (stored activations of the in-flight
    micro-batches, loss and backward temporaries, the optimizer step's temporaries when that is the
    peak). `other` is the stated reserve for the CUDA context and cuBLAS/NCCL workspaces, which no
    tensor-level count sees; the caching allocator's slack is not in it but in `reserved`
    (allocator_reserved). `cpu_bytes` is host memory for offloaded state.
    """

    parameters: int
    gradients: int
    optimizer: int
    activations: int
    other: int
    source: str
    stage: int = 0
    cpu_bytes: int = 0
    capacity_bytes: int | None = None
    notes: tuple[str, ...] = field(default=())
    # Plan or model fields that change nothing (or nothing counted) under the other settings.
    warnings: tuple[str, ...] = field(default=())
    # Bytes free but cached at the peak in the pools of FSDP2's side streams, which the compute stream
    # cannot reuse (fsdp_stream_pools); in `reserved`, not in the tensors.
    stream_pools: int = 0

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.other

    @property
    def tensor_bytes(self) -> int:
        """The total without the `other` reserve: what a tensor-level tracker counts (the peak of
        torch.cuda.max_memory_allocated)."""
        return self.total - self.other

    @property
    def reserved(self) -> int:
        """Predicted peak bytes the caching allocator reserves from CUDA (torch.cuda.max_memory_reserved):
        allocator_reserved(tensor bytes, activations, stream pools)."""
        return allocator_reserved(self.tensor_bytes, self.activations, self.stream_pools)

    @property
    def fits(self) -> bool | None:
        """The reserved bytes plus the `other` reserve (CUDA context, workspaces) within the GPU."""
        return None if self.capacity_bytes is None else self.reserved + self.other <= self.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "parameters": self.parameters, "gradients": self.gradients, "optimizer": self.optimizer,
            "activations": self.activations, "other": self.other, "total": self.total,
            "reserved": self.reserved, "stream_pools": self.stream_pools,
            "source": self.source, "stage": self.stage, "cpu_bytes": self.cpu_bytes,
            "capacity_bytes": self.capacity_bytes, "fits": self.fits, "notes": list(self.notes),
            "warnings": list(self.warnings),
        }


# The PyTorch CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp) reserves whole segments and
# keeps freed blocks cached: reserved >= allocated. Its rounding: every block to 512 B, blocks of up to
# 1 MiB from 2 MiB segments, up to 10 MiB from 20 MiB segments, larger ones rounded up to 2 MiB; a
# freed block can be split for a smaller request but blocks of different segments never merge, so the
# transients of a step (activations, gradients in flight, loss buffers), allocated and freed in a
# changing order, leave cached but unusable gaps. Resident state (parameters, gradients, optimizer
# state) is allocated once, in large blocks, and fragments nothing measurable. So the slack is stated
# as a fraction of the transient bytes plus a segment's rounding. ALLOCATOR_SLACK was assumed, then
# checked on the first GPU run that recorded max_memory_reserved (bench/recorded/
# estimator_gpu_recipes_h200_2026-11-27.json): on its six one-stream cases (no FSDP2) reserved minus
# allocated was 0.04-0.18 of the predicted activations. With
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, segments grow in place and the gaps mostly vanish.
# The allocator also keeps one pool per stream: a block freed by one stream's allocation serves only
# that stream again. FSDP2's side streams make such pools (fsdp_stream_pools), added here whole.
ALLOCATOR_SLACK = 0.10
SEGMENT_BYTES = 20 * 1024**2


def allocator_reserved(tensor_bytes: int, transient_bytes: int, stream_pools: int = 0,
                       slack: float = ALLOCATOR_SLACK) -> int:
    """Peak reserved bytes of the caching allocator for a step whose peak allocated bytes are
    `tensor_bytes`, of which `transient_bytes` are allocated and freed within the step, with
    `stream_pools` bytes cached free in other streams' pools at that peak."""
    raw = tensor_bytes + slack * max(0, transient_bytes) + max(0, stream_pools) + SEGMENT_BYTES
    return int(math.ceil(raw / (2 * 1024**2)) * (2 * 1024**2))


# CUDA context (300 MiB - 2 GiB, estimation.md 1.7), cuBLAS workspace, NCCL buffers: one stated
# constant, 1 GiB, the same figure the controller reserves per GPU (docs/choices.md). The allocator's
# slack is MemoryBreakdown.reserved's (allocator_reserved).
DEFAULT_OTHER_BYTES = 1 * GIB


# ------------------------------------------------------------------------------------------------
# Layout: which layers each pipeline stage holds, what one rank holds


def stage_layers(m: ModelDims, plan: ExecutionPlan) -> list[tuple[int, ...]]:
    """Layer indices per pipeline stage: L // pp each, the first L % pp stages one more."""
    p, n = plan.pp, m.num_layers
    out: list[tuple[int, ...]] = []
    start = 0
    for i in range(p):
        k = n // p + (1 if i < n % p else 0)
        out.append(tuple(range(start, start + k)))
        start += k
    return out


def local_vocab(m: ModelDims, tp: int) -> int:
    """Rows of the vocabulary-parallel embedding on one rank: ceil(V / tp) (no padding to 128)."""
    return -(-m.vocab_size // tp)


def _norm_params(m: ModelDims) -> int:
    """RMSNorm (LLaMA style, T5) has a scale only; LayerNorm a scale and a bias."""
    return m.hidden_size if m.gated or m.family == "encoder-decoder" else 2 * m.hidden_size


def layer_params(m: ModelDims, index: int, tp: int = 1, ep: int = 1) -> tuple[int, int]:
    """(dense, expert) parameters of layer `index` on one rank (Megatron's TP split, E/ep experts)."""
    h, d = m.hidden_size, m.head_dim
    a_l, kv_l, f_l = m.num_heads // tp, m.kv_heads // tp, m.ffn // tp
    bias = m.has_bias
    qkv_out = (a_l + 2 * kv_l) * d
    norms = 4 if m.sandwich_norm else 2  # Gemma 2 normalises each block's output too
    dense = norms * _norm_params(m) + h * qkv_out + a_l * d * h + (qkv_out + h if bias else 0)
    if m.qkv_bias and not bias:  # Qwen2.5: biases on q, k and v only
        dense += qkv_out
    if m.is_moe_layer(index):
        e_l = m.num_experts // ep
        dense += h * m.num_experts  # router, replicated
        # Mixtral's experts are SwiGLU without biases; GShard's are GELU MLPs with biases
        expert = e_l * (3 * h * f_l if m.gated else 2 * h * f_l + f_l + h)
        return dense, expert
    if m.gated:
        dense += 3 * h * f_l
    else:
        dense += 2 * h * f_l + (f_l + h if bias else 0)
    return dense, 0


def embedding_params(m: ModelDims, tp: int = 1) -> int:
    h = m.hidden_size
    n = local_vocab(m, tp) * h
    if m.learned_positions:
        n += m.seq_length * h
    if m.family == "encoder":
        n += 2 * h + 2 * h  # token types, embedding LayerNorm
    return n


def head_params(m: ModelDims, tp: int = 1, has_embedding: bool = True) -> int:
    """Final norm, MLM transform (encoder), and the output projection if it is not the embedding itself."""
    h = m.hidden_size
    n = _norm_params(m)
    if m.family == "encoder":
        n += h * h + h + local_vocab(m, tp)  # dense + its bias, output bias
    if not m.tied_embeddings or not has_embedding:
        n += local_vocab(m, tp) * h  # untied head, or Megatron's copy of the embedding on the last stage
    return n


def rank_params(m: ModelDims, plan: ExecutionPlan, stage: int) -> tuple[int, int, int]:
    """(dense, expert, largest single tensor) parameters on one rank of pipeline stage `stage`."""
    layers = stage_layers(m, plan)[stage]
    first, last = stage == 0, stage == plan.pp - 1
    tp, h = plan.tp, m.hidden_size
    dense = expert = 0
    largest = 0
    for i in layers:
        d, e = layer_params(m, i, tp, plan.ep)
        dense += d
        expert += e
        f_l = m.ffn // tp
        if m.is_moe_layer(i):
            largest = max(largest, (m.num_experts // plan.ep) * h * f_l)
        else:
            largest = max(largest, h * f_l, h * (m.num_heads // tp + 2 * m.kv_heads // tp) * m.head_dim)
    if first:
        dense += embedding_params(m, tp)
        largest = max(largest, local_vocab(m, tp) * h)
    if last:
        dense += head_params(m, tp, has_embedding=first)
        if not m.tied_embeddings or not first:
            largest = max(largest, local_vocab(m, tp) * h)
    return dense, expert, largest


def gpu_capacity(gpu: str | None) -> int | None:
    """The memory of a catalog GPU in bytes (None without a GPU); PlanInputError on field "gpu" if unknown."""
    if gpu is None:
        return None
    try:
        return lookup(gpu).memory_bytes
    except UnknownGpuError as e:
        raise PlanInputError("gpu", str(e)) from e


def state_bytes(model: ModelDims, plan: ExecutionPlan, stage: int) -> tuple[int, int, int, int, int]:
    """(parameters, gradients, optimizer, cpu, largest optimizer shard) bytes on one rank of `stage`."""
    r = RECIPES[plan.precision]
    dense, expert, largest = rank_params(model, plan, stage)
    z = plan.zero_stage
    cpu = 0
    params = grads = opt = 0.0
    for n, dp in ((dense, plan.dp), (expert, plan.dp // plan.ep)):
        if n == 0:
            continue
        params += r.param * n / (dp if z >= 3 else 1)
        g = r.grad * n / (dp if z >= 2 else 1)
        o = r.optimizer * n / (dp if z >= 1 else 1)
        if plan.offload != "none":
            cpu += int(o)
            o = 0
            if z >= 2:  # ZeRO-Offload keeps the gradient partitions on the host too
                cpu += int(g)
                g = 0
        if plan.offload == "optimizer+params":
            cpu += int(params)
            params = 0
        grads += g
        opt += o
    shard = math.ceil(largest / plan.dp) if z >= 1 else largest
    return int(params), int(grads), int(opt), cpu, shard
