"""What the GPU benches share: the device's description and catalog entry, and the CUDA caching
allocator's peaks around a piece of work. Used by bench/estimator_gpu.py and
bench/estimator_gpu_recipes.py (both put bench/ on sys.path by being run from it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Self


def device_info() -> dict[str, Any]:
    """The device as the JSON of a GPU bench records it; {"device": "cpu"} without CUDA."""
    import torch

    info: dict[str, Any] = {"torch": torch.__version__}
    if not torch.cuda.is_available():
        return {**info, "device": "cpu"}
    props = torch.cuda.get_device_properties(0)
    from tessera.common.gpus import from_nvml

    gpu, note = from_nvml(props.name, props.total_memory)
    return {**info, "device": props.name, "capability": list(torch.cuda.get_device_capability(0)),
            "total_memory": props.total_memory, "catalog": gpu.name if gpu else None,
            "catalog_note": note, "cuda": torch.version.cuda}


def supports_float8() -> bool:
    """Float8 matmuls (torch._scaled_mm) need compute capability 8.9 (Ada) or 9.0 (Hopper) and up
    (PyTorch's _scaled_mm requirement, as torchao's Float8 training README states)."""
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability(0) >= (8, 9)


@dataclass
class CudaPeak:
    """Peaks of the caching allocator over a `with` block, counted from the block's start:
    `allocated` is torch.cuda.max_memory_allocated minus what was allocated when the block began
    (0 base in a fresh process), `reserved` likewise for max_memory_reserved, `base_*` what was there
    before. `base=False` keeps the absolute figures (a fresh process per measurement)."""

    base: bool = True
    allocated: int = 0
    reserved: int = 0
    base_allocated: int = 0
    base_reserved: int = 0
    extra: dict[str, int] = field(default_factory=dict)

    def __enter__(self) -> Self:
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        if self.base:
            self.base_allocated = torch.cuda.memory_allocated()
            self.base_reserved = torch.cuda.memory_reserved()
        return self

    def __exit__(self, *exc: object) -> None:
        import torch

        torch.cuda.synchronize()
        self.allocated = torch.cuda.max_memory_allocated() - self.base_allocated
        self.reserved = torch.cuda.max_memory_reserved() - self.base_reserved
        free, total = torch.cuda.mem_get_info()
        # What the driver sees in use on the device at the end: the CUDA context, cuBLAS/cuDNN
        # workspaces and the allocator's reserved segments (one process on the GPU).
        self.extra["device_used_end"] = total - free
        self.extra["allocated_end"] = torch.cuda.memory_allocated()
        self.extra["reserved_end"] = torch.cuda.memory_reserved()
        stats = torch.cuda.memory_stats()
        self.extra["num_alloc_retries"] = int(stats.get("num_alloc_retries", 0))
