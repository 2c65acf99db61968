"""Per-stage computation time for DP-only and TP-only stages (Crius Sec. 5.1).

Crius: "A Codesign of Scheduling and Parallelization for Large Model Training in Heterogeneous
Clusters", arXiv 2024 (arXiv:2403.16125; docs/reference/papers.md).

Crius profiles each stage's computation on one device for the data-parallel-only and the
tensor-parallel-only plan. Without a device, Tessera computes the same two numbers analytically from
the operators' FLOPs and the GPU catalog with a stated efficiency prior (a two-term roofline):

    t = matmul_flops / (peak_dense * matmul_efficiency) + traffic_multiplier * traffic_bytes / mem_bw

- `matmul_flops` are the training FLOPs that run as matrix multiplies (forward, backward and the
  recomputed forward), divided by TP; each DP rank runs micro_batch / dp samples;
- `traffic_bytes` are the activation bytes of Korthikanti et al. (docs/reference/estimation.md 1.1:
  34sbh + 5as^2b per layer without TP; the 10sbh part is not divided by TP, the rest is), which are
  read and written by memory-bound kernels (softmax, norms, dropout, GeLU); `traffic_multiplier`
  says how many times each such byte crosses DRAM per training step;
- `microbatch_overhead_s`: a fixed cost per micro-batch and stage (kernel launches, the runtime's
  pipeline instructions), added by cells.py;
- a per-GPU-type `gpu_scale` (default 1.0) absorbs what the catalog figures miss.

Convolution operators (Wide-ResNet) add, per micro-batch, `conv_weight_traffic` times their weight
bytes (of this GPU's TP shard; replicated under DP) of memory traffic. The Crius authors' single-
device profiles of Wide-ResNet data-parallel stages (data/arena/iter_time_estimated.json, A100) take
a + b x per-GPU batch seconds with a growing with the weights (about 2.0, 3.7 and 8.8 s for the
0.5, 1 and 2 B models, whatever the batch), so part of a convnet's step scales with its weights and
the number of micro-batches, not with its images; what inside the kernels does it (weight-gradient
partial sums at small batches would) was not measured.

Models trained in float32 (4-byte activations, no tensor cores) take the catalog's dense FP32 rate
(`GpuType.tflops_fp32_dense`: the non-tensor peak, halved on GA10x/AD10x parts) with their own
efficiency `fp32_efficiency` instead of the FP16 peak and `matmul_efficiency` (a GPU whose FP32 rate
is not in the catalog is taken at 1/8 of its FP16 rate, stated in the source).

The coefficients are a prior: their default values and what they were fitted on are in
`DEFAULT_PRIOR.source` and docs/estimator-cells.md. With a device, `profile_stage_compute` times the
operators for real through an `OperatorProfiler` (tessera.estimator.torch.stage_profiler.StageProfiler
runs them with torch; this module never imports torch: the controller imports it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tessera.common.gpus import GpuType
from tessera.estimator.partition import CONV_KINDS, LayerShape, Operator


@dataclass(frozen=True)
class EfficiencyPrior:
    """Analytical compute prior; see the module docstring for the formula."""

    matmul_efficiency: float = 0.5
    traffic_multiplier: float = 4.0
    microbatch_overhead_s: float = 0.0
    fp32_efficiency: float = 0.5
    conv_weight_traffic: float = 0.0
    gpu_scale: tuple[tuple[str, float], ...] = ()
    source: str = "prior:default"
    # torch.compile: the memory-bound traffic term is multiplied by this (see COMPILE_TRAFFIC_SOURCE).
    compile_traffic_factor: float = 0.5
    # Fraction of the BF16 peak of flash attention's score matmuls; 0 = FLASH_UTILIZATION's table.
    flash_utilization: float = 0.0
    # Speed of Float8 linear GEMMs over BF16 ones; 0 = FP8_SPEEDUP (the peak ratio).
    fp8_speedup: float = 0.0

    def __post_init__(self) -> None:
        for name in ("matmul_efficiency", "fp32_efficiency"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise ValueError(f"{name}: must be in (0, 1], got {v}")
        if self.traffic_multiplier < 0:
            raise ValueError(f"traffic_multiplier: must be >= 0, got {self.traffic_multiplier}")
        if self.conv_weight_traffic < 0:
            raise ValueError(f"conv_weight_traffic: must be >= 0, got {self.conv_weight_traffic}")
        if not 0 <= self.flash_utilization <= 1:
            raise ValueError(f"flash_utilization: must be in [0, 1], got {self.flash_utilization}")
        if self.fp8_speedup < 0:
            raise ValueError(f"fp8_speedup: must be >= 0, got {self.fp8_speedup}")
        if not 0 < self.compile_traffic_factor <= 1:
            raise ValueError(f"compile_traffic_factor: must be in (0, 1], got {self.compile_traffic_factor}")
        if self.microbatch_overhead_s < 0:
            raise ValueError(f"microbatch_overhead_s: must be >= 0, got {self.microbatch_overhead_s}")
        for name, v in self.gpu_scale:
            if v <= 0:
                raise ValueError(f"gpu_scale[{name}]: must be > 0, got {v}")

    def scale_for(self, gpu: GpuType) -> float:
        for name, v in self.gpu_scale:
            if name == gpu.name:
                return v
        return 1.0


# Fitted by `bench/estimator_arena.py --refit` (seed 0, 16 micro-batches as the artifact's trainers) on
# the training half of the Crius artifact's measured optima (13 of 26 BERT/MoE model keys, 119 of 236
# pairs; the held-out half never seen), with Alpa's runtime in the loop: hence the per-micro-batch
# overhead. docs/estimator-cells.md has the
# procedure and the accuracy. Refit for another runtime (or let live metrics override, cells.py).
# fp32_efficiency and conv_weight_traffic: the same bench, fitted on the training half of the
# artifact's Wide-ResNet models (float32 convolutions) with the other constants held.
DEFAULT_PRIOR = EfficiencyPrior(
    matmul_efficiency=0.5929,
    traffic_multiplier=5.6652,
    microbatch_overhead_s=0.013456,
    fp32_efficiency=0.584,
    conv_weight_traffic=81.07,
    source="prior:roofline(eta_mm=0.593,eta_fp32=0.584,kappa=5.67,mb=13.5ms,kw=81;fit:arena-train-seed0)",
)


# torch.compile (TorchInductor) fuses chains of pointwise and reduction kernels (norms, activations,
# residual adds, dropout, casts) into one kernel each, so an intermediate tensor is written and read
# back once instead of once per eager kernel. The factor 0.5 on the memory-bound term is a stated
# prior, not fitted (no compiled training run was measured here): Ansel et al., "PyTorch 2" (ASPLOS
# 2024) report a 1.41x geometric-mean training speedup on A100 over their three benchmark suites
# (TorchBench, HuggingFace, TIMM), of which the matmuls (unchanged by fusion) take a large part;
# halving the pointwise traffic is the reading that matches that order on transformer layers.
COMPILE_TRAFFIC_SOURCE = "prior:compile(traffic x0.5; Ansel et al. ASPLOS'24)"

# GPUs whose tensor cores run FP8 (E4M3/E5M2) matmuls at twice their dense BF16/FP16 rate: Hopper
# (H100/H200/H20: NVIDIA H100 whitepaper, Table 3 "FP8 Tensor Core" 2x FP16), Ada (L4, L40S, RTX 4090:
# NVIDIA Ada whitepaper, FP8 = 2x FP16 tensor TFLOPS) and CDNA3 (MI300X: AMD datasheet, 2,615 against
# 1,307 TFLOPS dense). Ampere (A100, A800, A10, A30, A40), Volta, Turing and Pascal have no FP8 units.
FP8_PREFIXES = ("H100", "H200", "H20", "H800", "L4-", "L40S", "RTX-4090", "MI300X", "MI325X")
FP8_SPEEDUP = 2.0


# Flash attention kernels reach less of the tensor-core peak than GEMMs on Hopper: FlashAttention-2
# "achieves only 35% utilization on H100 GPUs" (Shah et al., FlashAttention-3, NeurIPS 2024, abstract);
# on A100 it reaches "50-73% of the theoretical maximum FLOPs/s" (Dao, FlashAttention-2, abstract),
# the range of the fitted matmul efficiency, so other GPUs keep `matmul_efficiency` for the scores.
# torch's SDPA flash backend and torchtitan (2024) run FlashAttention-2 kernels.
FLASH_UTILIZATION: tuple[tuple[str, float], ...] = (("H100", 0.35), ("H200", 0.35), ("H20", 0.35),
                                                     ("H800", 0.35))


def flash_efficiency(gpu: GpuType, matmul_efficiency: float, utilization: float = 0.0) -> float:
    """Fraction of the BF16 peak that flash attention's score matmuls reach on `gpu`: `utilization`
    when given (> 0, a fitted constant: time_constants.py), else FLASH_UTILIZATION's."""
    if utilization > 0:
        return utilization
    name = gpu.name.upper()
    for prefix, util in FLASH_UTILIZATION:
        if name.startswith(prefix):
            return min(matmul_efficiency, util)
    return matmul_efficiency


def has_fp8(gpu: GpuType) -> bool:
    """Whether the GPU's tensor cores run FP8 matmuls (at FP8_SPEEDUP x the BF16 rate)."""
    return gpu.name.upper().startswith(FP8_PREFIXES)


@dataclass(frozen=True)
class ComputeEstimate:
    seconds: float
    source: str


def _check_degrees(dp: int, tp: int, micro_batch: float) -> None:
    if dp < 1:
        raise ValueError(f"dp: must be >= 1, got {dp}")
    if tp < 1:
        raise ValueError(f"tp: must be >= 1, got {tp}")
    if micro_batch <= 0:
        raise ValueError(f"micro_batch: must be > 0, got {micro_batch}")


def stage_compute_time(
    ops: Sequence[Operator],
    gpu: GpuType,
    dp: int,
    tp: int,
    micro_batch: float,
    prior: EfficiencyPrior = DEFAULT_PRIOR,
    fp32: bool = False,
    float8: bool = False,
    compiled: bool = False,
    flash: bool = False,
) -> ComputeEstimate:
    """Seconds for one micro-batch (forward + backward) of `ops` on one GPU of a (dp, tp) stage.

    `micro_batch` is the number of samples the whole stage processes per micro-batch; each DP rank
    gets micro_batch / dp of them. Expert FFNs under DP keep the same per-rank work (top-k routing
    with balanced experts), so the formula is the same; only their communication differs (comm.py).
    `fp32`: the model computes in float32 (FP32 peak and `fp32_efficiency`, see the module doc).
    `float8`: the operators' `linear_flops` run as FP8 matmuls at `prior.fp8_speedup` (default
    FP8_SPEEDUP, the peak ratio) x the rate (a GPU with
    FP8 tensor cores, `has_fp8`; the caller refuses the others); attention scores stay in BF16.
    `compiled`: torch.compile, the traffic term times `prior.compile_traffic_factor`.
    `flash`: the non-linear matmul FLOPs (attention scores: `flops - linear_flops` of operators that
    split them) run as flash attention kernels, at `flash_efficiency` (FLASH_UTILIZATION).
    """
    _check_degrees(dp, tp, micro_batch)
    samples = micro_batch / dp
    mm = sum(o.flops for o in ops) * samples / tp
    fp8 = prior.fp8_speedup or FP8_SPEEDUP
    if float8:
        mm -= sum(o.linear_flops for o in ops) * samples / tp * (1 - 1 / fp8)
    traffic = sum(o.traffic_bytes + o.traffic_sharded_bytes / tp for o in ops) * samples
    source = f"formula:{prior.source}"
    if float8:
        source += f";float8(x{fp8:g} linear)"
    if compiled:
        traffic *= prior.compile_traffic_factor
        source += ";" + COMPILE_TRAFFIC_SOURCE
    if fp32:
        peak = gpu.tflops_fp32_dense or gpu.tflops_fp16 / 8
        if not gpu.tflops_fp32_dense:
            source += f";fp32=fp16/8({gpu.name})"
        t = mm / (peak * 1e12 * prior.fp32_efficiency)
    elif flash:
        att = sum(o.flops - o.linear_flops for o in ops if o.linear_flops > 0) * samples / tp
        eff = flash_efficiency(gpu, prior.matmul_efficiency, prior.flash_utilization)
        t = (mm - att) / (gpu.tflops_fp16 * 1e12 * prior.matmul_efficiency) + att / (gpu.tflops_fp16 * 1e12 * eff)
        if eff != prior.matmul_efficiency:
            source += f";flash-util={eff:g}"
    else:
        t = mm / (gpu.tflops_fp16 * 1e12 * prior.matmul_efficiency)
    t += prior.traffic_multiplier * traffic / (gpu.bandwidth_gbps * 1e9)
    if prior.conv_weight_traffic:
        conv_params = sum(o.params for o in ops if o.shape is not None and o.shape.kind in CONV_KINDS)
        weight_bytes = conv_params / tp * (4 if fp32 else 2)
        t += prior.conv_weight_traffic * weight_bytes / (gpu.bandwidth_gbps * 1e9)
    return ComputeEstimate(t * prior.scale_for(gpu), source)


def optimizer_step_time(params_per_gpu: float, gpu: GpuType, bytes_per_param: float = 16.0) -> float:
    """Seconds of the memory-bound optimizer update: every state byte is read and written once."""
    if params_per_gpu < 0:
        raise ValueError("params_per_gpu: must be >= 0")
    return 2.0 * bytes_per_param * params_per_gpu / (gpu.bandwidth_gbps * 1e9)


# ---------------------------------------------------------------------------------------------------
# Profiling on one device: the profiler itself is torch code (tessera.estimator.torch.stage_profiler)


class OperatorProfiler(Protocol):
    """Times one operator on a real device (tessera.estimator.torch.stage_profiler.StageProfiler):
    seconds of forward + backward for `samples` samples on one rank of a (dp, tp) stage."""

    @property
    def device(self) -> str: ...

    def op_seconds(self, shape: LayerShape, samples: int, dp: int, tp: int) -> float: ...


def profile_stage_compute(
    ops: Sequence[Operator],
    dp: int,
    tp: int,
    micro_batch: float,
    profiler: OperatorProfiler,
) -> ComputeEstimate:
    """Seconds per micro-batch of `ops` on one GPU of a (dp, tp) stage, measured on `profiler.device`.

    Every operator needs a `shape`; operators with the same shape are timed once.
    """
    _check_degrees(dp, tp, micro_batch)
    samples = max(1, round(micro_batch / dp))
    total = 0.0
    for o in ops:
        if o.shape is None:
            raise ValueError(f"ops[{o.name}].shape: profiling needs the operator's shape")
        total += profiler.op_seconds(o.shape, samples, dp, tp)
    return ComputeEstimate(total, f"profiled:torch:{profiler.device}")
