"""GPU catalog: memory, dense BF16/FP16 rate, FP32 rate, memory bandwidth and interconnect per GPU model.

The spec table every part of Tessera names GPUs by: the agent maps NVML's names to it (`from_nvml`)
and checks declared inventories against it (`lookup`), the controller and the clients canonicalise
names with it, the estimator reads the rates. It sits in tessera.common so that the agent needs no
estimator code for GPU names; the estimator's own extras (the Espresso prices) are in
tessera.estimator.catalog.

Figures are from docs/reference/gpus.md, which names a public source for each row; rows marked
there as unconfirmed (†) carry `confirmed=False`. An A100-40GB is not an A100-80GB: entries are keyed
by model *and* memory size. The FP32 (non-tensor) rates are not in gpus.md: `FP32_TFLOPS` names the
public page each comes from; 0 means not known (the estimator's compute.py then uses a stated fraction
of the FP16 rate).
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass, replace

from tessera.common.errors import InvalidInput

GIB = 1024**3
GB = 1000**3


@dataclass(frozen=True)
class GpuType:
    name: str
    memory_gb: float
    tflops_fp16: float
    bandwidth_gbps: float
    nvlink_gbps: float  # 0 = PCIe only
    source: str
    confirmed: bool = True
    tflops_fp32: float = 0.0  # non-tensor FP32 peak (CUDA cores), as the datasheet gives it; 0 = not known
    fp32_shares_int32: bool = False  # GA10x/AD10x: half of the FP32 lanes are the INT32 lanes
    tflops_fp8: float = 0.0  # dense FP8 tensor peak; 0 = no FP8 tensor cores (or not known): FP8_TFLOPS

    @property
    def tflops_fp32_dense(self) -> float:
        """The FP32 rate a dense kernel (convolution, GEMM) can draw on: the datasheet peak counts
        every FP32 lane, but on GA10x/AD10x parts half of them also execute the kernels' INT32
        (address) work, so only the dedicated half is counted (NVIDIA Ampere GA102 whitepaper: one
        datapath FP32 only, the other FP32 or INT32). 0 when the catalog has no FP32 figure."""
        return self.tflops_fp32 / 2 if self.fp32_shares_int32 else self.tflops_fp32


    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * GB)


_SRC = "docs/reference/gpus.md"
CATALOG: dict[str, GpuType] = {
    g.name: g
    for g in [
        GpuType("A100-40GB", 40, 312, 1555, 600, _SRC),
        GpuType("A100-80GB", 80, 312, 2039, 600, _SRC),
        GpuType("A800-80GB", 80, 312, 2039, 400, _SRC),
        GpuType("H100-80GB", 80, 989, 3350, 900, _SRC),
        GpuType("H100-PCIE-80GB", 80, 756, 2000, 600, _SRC),
        GpuType("H100-NVL-94GB", 94, 835, 3900, 600, _SRC, confirmed=False),
        GpuType("H200-141GB", 141, 989, 4800, 900, _SRC),
        GpuType("V100-16GB", 16, 125, 900, 300, _SRC),
        GpuType("V100-32GB", 32, 125, 900, 300, _SRC),
        GpuType("A10-24GB", 24, 125, 600, 0, _SRC, confirmed=False),
        GpuType("A30-24GB", 24, 165, 933, 200, _SRC, confirmed=False),
        GpuType("A40-48GB", 48, 149.7, 696, 112.5, _SRC),
        GpuType("RTX-A6000-48GB", 48, 154.8, 768, 112.5, _SRC),
        GpuType("RTX-A4000-16GB", 16, 76.7, 448, 0, _SRC),
        GpuType("L4-24GB", 24, 121, 300, 0, _SRC),
        GpuType("L40S-48GB", 48, 362, 864, 0, _SRC),
        GpuType("T4-16GB", 16, 65, 320, 0, _SRC),
        GpuType("RTX-3090-24GB", 24, 71, 936, 112.5, _SRC, confirmed=False),
        GpuType("RTX-4090-24GB", 24, 165.2, 1008, 0, _SRC),
        GpuType("RTX-2080TI-11GB", 11, 53.8, 616, 100, _SRC, confirmed=False),
        GpuType("P100-16GB", 16, 21.2, 732, 160, _SRC),
        # The H100 with six HBM stacks enabled (96 GB), as in the GH200 Grace Hopper superchip: NVIDIA GH200
        # datasheet (96 GB HBM3, 4 TB/s; the same GH100 compute as the H100 SXM5, 900 GB/s NVLink). We found
        # no public source for an "H100 96GB HBM2e" part (the name): gpus.md, unconfirmed.
        GpuType("H100-96GB", 96, 989, 4000, 900, _SRC, confirmed=False),
        # NVIDIA H20 (Hopper for the China market): 96 GB HBM3, 4.0 TB/s, 148 TFLOPS BF16 dense, 900 GB/s
        # NVLink (NVIDIA's H20 product brief as reproduced by willitrunai.com and unanswered.io; gpus.md).
        GpuType("H20-96GB", 96, 148, 4000, 900, _SRC),
        # AMD Instinct MI300X: 192 GB HBM3, 5.3 TB/s, 1,307.4 TFLOPS BF16/FP16 dense, 896 GB/s peak aggregate
        # Infinity Fabric between the 8 OAMs of a node (AMD Instinct MI300X data sheet; gpus.md).
        GpuType("MI300X-192GB", 192, 1307.4, 5300, 896, _SRC),
    ]
}

# Non-tensor FP32 peak, TFLOPS, with the public page it was read from. FP32 training without TF32
# (the Crius artifact's Wide-ResNet: float32 under XLA, docs/estimator-cells.md) runs at this rate.
FP32_TFLOPS: dict[str, tuple[float, str]] = {
    "A100-40GB": (19.5, "techpowerup.com gpu-specs A100 SXM4 40 GB (19.49)"),
    "A100-80GB": (19.5, "same GA100 part as the 40 GB (techpowerup.com, 19.49)"),
    "V100-16GB": (15.7, "cvw.cac.cornell.edu Tesla V100: 5120 FP32 cores x 2 x 1.53 GHz"),
    "V100-32GB": (15.7, "cvw.cac.cornell.edu Tesla V100: 5120 FP32 cores x 2 x 1.53 GHz"),
    "A10-24GB": (31.2, "sysrqmts.com A10 PCIe (31.24)"),
    "A40-48GB": (37.4, "ecer.com reproduction of the A40 datasheet (peak FP32 non-tensor 37.4)"),
    "RTX-A4000-16GB": (19.2, "ecer.com RTX A4000 datasheet (single precision 19.2)"),
    "H100-80GB": (66.9, "glennklockwood.com/garden/processors/h100 (FP32 66.9); hpctech.co.jp H100 table (67)"),
    "H100-PCIE-80GB": (51.0, "archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100 (FP32 51)"),
    "H200-141GB": (66.9, "glennklockwood.com: the H200 is the H100 SXM5 with more HBM3e memory"),
    "H100-96GB": (66.9, "the H100 SXM5's GH100 compute (glennklockwood.com, 66.9)"),
    "H20-96GB": (44.0, "H20 figures as reported from NVIDIA's brief (zangshuxian.com: FP32 44 TFLOPS)"),
    "MI300X-192GB": (163.4, "AMD Instinct MI300X data sheet (peak FP32 vector 163.4)"),
}

# Dense FP8 tensor peak, TFLOPS (the datasheets print sparse figures with an asterisk: halved here).
# Hopper: twice its BF16 rate; Ada (L4, L40S, RTX 4090): FP8 tensor cores, twice the BF16 rate at the
# same accumulate; Ampere and older have none (0). Torchao's Float8 training needs these (plan.float8).
FP8_TFLOPS: dict[str, tuple[float, str]] = {
    "H100-80GB": (1978.9, "glennklockwood.com/garden/processors/h100 (FP8 matrix 1978.9 dense)"),
    "H100-PCIE-80GB": (1513, "archive-lib.hpctech.co.jp H100 table (3,026 with sparsity)"),
    "H100-NVL-94GB": (1671, "twice the unconfirmed 835 BF16 of gpus.md (H100 NVL brief: 3,341 per GPU sparse)"),
    "H100-96GB": (1978.9, "the H100 SXM5's GH100 compute"),
    "H200-141GB": (1978.9, "same compute as the H100 SXM5 (lzwjava.github.io H200 table: 3,958 sparse)"),
    "H20-96GB": (296, "H20 brief as reported (willitrunai.com: 296 INT8 TOPS; FP8 is the same rate on Hopper)"),
    "L4-24GB": (242.5, "NVIDIA L4 datasheet (FP8 485 TFLOPS with sparsity)"),
    "L40S-48GB": (733, "NVIDIA L40S datasheet (FP8 1,466 TFLOPS with sparsity; 733 dense)"),
    "RTX-4090-24GB": (330.3, "NVIDIA Ada whitepaper appendix (FP8 with FP32 accumulate 330.3 dense; recalled)"),
    "MI300X-192GB": (2614.9, "AMD Instinct MI300X data sheet (peak FP8 2,614.9 dense)"),
}
# Ampere GA10x and Ada AD10x parts (the A10, A40, RTX A6000/A4000, RTX 3090/4090, L4, L40S).
FP32_SHARES_INT32 = frozenset({"A10-24GB", "A40-48GB", "RTX-A6000-48GB", "RTX-A4000-16GB", "RTX-3090-24GB",
                               "RTX-4090-24GB", "L4-24GB", "L40S-48GB"})
CATALOG = {name: replace(g, tflops_fp32=FP32_TFLOPS[name][0] if name in FP32_TFLOPS else 0.0,
                         fp32_shares_int32=name in FP32_SHARES_INT32,
                         tflops_fp8=FP8_TFLOPS[name][0] if name in FP8_TFLOPS else 0.0)
           for name, g in CATALOG.items()}


# Short names users and traces write; each maps to one entry (the memory size of the Crius tables).
ALIASES: dict[str, str] = {
    "A100": "A100-80GB", "A800": "A800-80GB", "H100": "H100-80GB", "H200": "H200-141GB",
    "V100": "V100-32GB", "A10": "A10-24GB", "A30": "A30-24GB", "A40": "A40-48GB",
    "A6000": "RTX-A6000-48GB", "A4000": "RTX-A4000-16GB", "L4": "L4-24GB", "L40S": "L40S-48GB",
    "T4": "T4-16GB", "RTX3090": "RTX-3090-24GB", "RTX4090": "RTX-4090-24GB",
    "RTX2080TI": "RTX-2080TI-11GB", "P100": "P100-16GB",
    "H100NVL": "H100-NVL-94GB", "H100PCIE": "H100-PCIE-80GB", "H20": "H20-96GB", "MI300X": "MI300X-192GB",
    "H10096": "H100-96GB", "H100SXM": "H100-80GB",
}


class UnknownGpuError(InvalidInput, ValueError):
    pass


def _norm(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().upper())


MAX_NAME = 64  # longer than any catalog name or NVML product string


def lookup(name: str) -> GpuType:
    """The catalog entry for a name or alias (case and separators ignored); UnknownGpuError if none.
    A name over MAX_NAME characters is unknown without a search, and its message quotes its start
    only: names come from requests, and each distinct one used to stay cached, up to 16 MiB each."""
    if len(name) > MAX_NAME:
        raise UnknownGpuError(f"unknown GPU model {name[:MAX_NAME]!r}... ({len(name):,} characters); "
                              f"known: {', '.join(sorted(CATALOG))}")
    return _lookup(name)


@functools.lru_cache(maxsize=4096)
def _lookup(name: str) -> GpuType:
    """Memoised (the catalog is fixed at import; errors are not cached): the estimator asks for a pool's
    type in every stage cost, hundreds of thousands of times in one cost-tree search."""
    key = _norm(name)
    if key in CATALOG:
        return CATALOG[key]
    compact = key.replace("-", "")
    for alias, target in ALIASES.items():
        if compact == alias:
            return CATALOG[target]
    for entry in CATALOG.values():
        if entry.name.replace("-", "") == compact:
            return entry
    raise UnknownGpuError(f"unknown GPU model {name!r}; {_did_you_mean(compact)}known: {', '.join(sorted(CATALOG))}")


def _did_you_mean(compact: str) -> str:
    """The nearest catalog name or alias to a name given without separators ("H100 96G" -> H100-96GB)."""
    candidates = {e.name.replace("-", ""): e.name for e in CATALOG.values()}
    candidates.update({alias: target for alias, target in ALIASES.items()})
    close = difflib.get_close_matches(compact, list(candidates), n=1, cutoff=0.6)
    return f"did you mean {candidates[close[0]]!r}? " if close else ""


def from_nvml(product_name: str, memory_bytes: int) -> tuple[GpuType | None, str]:
    """Map an NVML product name ("NVIDIA A100-SXM4-80GB") and its memory to a catalog entry.

    Returns (entry, note). The entry is the one whose family appears in the name and whose memory is
    nearest; `note` says when the match was not exact. (None, reason) when no family matches: an
    unknown GPU is reported as unknown, never silently guessed.
    """
    name = _norm(product_name).replace("NVIDIA-", "").replace("TESLA-", "").replace("GEFORCE-", "")
    compact = name.replace("-", "")
    families = sorted({e.name.rsplit("-", 1)[0] for e in CATALOG.values()}, key=len, reverse=True)
    for fam in families:
        fam_c = fam.replace("-", "").replace("RTX", "")
        if fam_c and fam_c in compact.replace("RTX", ""):
            if fam == "H100" and "PCIE" in compact:
                fam = "H100-PCIE"
            candidates = [e for e in CATALOG.values() if e.name.rsplit("-", 1)[0] == fam]
            best = min(candidates, key=lambda e: abs(e.memory_bytes - memory_bytes))
            exact = abs(best.memory_bytes - memory_bytes) <= 0.1 * best.memory_bytes
            note = "" if exact else f"nearest catalog entry {best.name} for {product_name} ({memory_bytes} bytes)"
            return best, note
    return None, f"GPU {product_name!r} is not in the catalog"
