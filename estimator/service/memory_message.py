"""A memory estimate as its MemoryBreakdown message, and counts as int64 fields hold them.

An int64 field cannot hold every figure the bounds admit (the largest models reach 1.2e19 bytes,
a 64-stage Cell 5.5e19 plans assembled): such a figure is saturated, never INTERNAL. A saturated
byte figure is said in the message's warnings (JSON and the table both show them), with the figure
the library computed, so no one reads int64's largest as a real size or wonders why the categories
no longer add up.
"""

from __future__ import annotations

from tessera.estimator.memory_terms import MemoryBreakdown
from tessera.v1 import estimator_pb2 as pb

INT64_MAX = 2**63 - 1
# The message's byte figures, in its order (capacity is the GPU's: never past int64).
BYTE_FIELDS = ("parameters", "gradients", "optimizer", "activations", "other", "total", "cpu_bytes", "reserved")


def i64(v: float) -> int:
    """A count or byte total as an int64 field holds it: saturated at INT64_MAX."""
    return min(int(v), INT64_MAX)


def saturation_warning(figures: dict[str, int]) -> str | None:
    """The warning for the byte figures past int64, None when every one fits."""
    over = {name: v for name, v in figures.items() if v > INT64_MAX}
    if not over:
        return None
    said = ", ".join(f"{name} {v:.3g} B" for name, v in over.items())
    return (f"memory.{', memory.'.join(over)}: saturated at int64's largest ({INT64_MAX:,} B); the estimate is "
            f"larger ({said}), so the categories do not add up (fits is judged on the estimate)")


def memory_message(est: MemoryBreakdown) -> pb.MemoryBreakdown:
    """The message of `est`, every byte figure saturated at int64 and any so saturated warned of."""
    figures = {name: getattr(est, name) for name in BYTE_FIELDS}
    warnings = list(est.warnings)
    if (why := saturation_warning(figures)) is not None:
        warnings.append(why)
    msg = pb.MemoryBreakdown(capacity=i64(est.capacity_bytes or 0), source=est.source, stage=est.stage,
                             notes=list(est.notes), warnings=warnings, **{k: i64(v) for k, v in figures.items()})
    if est.fits is not None:
        msg.fits = est.fits
    return msg
