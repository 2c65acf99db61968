"""RealTrace, the result of tracing one rank of a plan on real model code, and the mapping from the
memory tracker's categories to the five the memory formula uses (memory_terms.MemoryBreakdown).

Imports without torch: the service and the CLI build and print RealTrace values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# torch.distributed._tools.fsdp2_mem_tracker._FSDPRefType values (and plain MemTracker's _MemRefType
# ones, for a module without FSDP) -> the formula's categories. FSDP2's all-gather outputs and
# reduce-scatter inputs are communication staging buffers, neither a parameter nor a gradient copy the
# formula keeps: they go to `other`, which is therefore a measured tensor figure here, not the
# formula's 1 GiB reserve for the CUDA context and workspaces (which no tensor tracker sees; the
# formula's allocator slack is in `reserved`).
CATEGORY_OF: dict[str, str] = {
    "Sharded Param": "parameters",
    "Unsharded Param": "parameters",
    "Parameter": "parameters",
    "Buffer": "parameters",
    "Sharded Grad": "gradients",
    "Unsharded Grad": "gradients",
    "Gradient": "gradients",
    "OptState": "optimizer",
    "Optstate": "optimizer",
    "Activation": "activations",
    "Temp": "activations",
    "Inputs": "activations",
    "All Gather": "other",
    "Reduce Scatter": "other",
    "Other": "other",
}

CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "other")


@dataclass(frozen=True)
class RealTrace:
    """Peak bytes of one rank's training step on real model code, by category; `peak` is their sum.

    The categories are those of memory_terms.MemoryBreakdown, measured at the moment of the peak
    (FSDP2's unsharded parameters count as parameters, its unsharded gradients as gradients).
    `other` holds FSDP2's communication buffers (no CUDA context reserve: see CATEGORY_OF).
    `detail` says how the step ran: the stack, the stage, the raw tracker categories, what was
    approximated.
    """

    parameters: int
    gradients: int
    optimizer: int
    activations: int
    other: int
    peak: int
    stack: str
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"parameters": self.parameters, "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations, "other": self.other, "peak": self.peak, "stack": self.stack,
                "detail": dict(self.detail)}

    @classmethod
    def from_snapshot(cls, snapshot: dict[str, int], stack: str, detail: dict[str, Any]) -> RealTrace:
        """From a tracker's peak snapshot of one device ({category name: bytes, 'Total': bytes})."""
        sums = dict.fromkeys(CATEGORIES, 0)
        for name, value in snapshot.items():
            if name == "Total":
                continue
            if name not in CATEGORY_OF:
                raise KeyError(f"memory tracker category {name!r} has no formula category")
            sums[CATEGORY_OF[name]] += int(value)
        total = int(snapshot.get("Total", sum(sums.values())))
        if total != sum(sums.values()):
            raise AssertionError(f"tracker categories sum to {sum(sums.values())}, its total is {total}")
        raw = {k: int(v) for k, v in snapshot.items() if k != "Total" and v}
        return cls(sums["parameters"], sums["gradients"], sums["optimizer"], sums["activations"], sums["other"],
                   total, stack, {**detail, "tracker_peak": raw})
