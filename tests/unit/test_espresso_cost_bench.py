"""bench/espresso_cost.py's one-line answers: GPU counts apart from the type names."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("espresso_cost_bench", BENCH / "espresso_cost.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    sys.path.insert(0, str(BENCH))  # the bench imports benchio by its bare name
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH))
    return mod


def test_a_gpu_mix_reads_as_counts_times_types() -> None:
    """Before: `21.40 (16A30+43090+12A4000, 163s)`, 4 x RTX 3090 read as 43,090."""
    b = bench()
    row = {"feasible": True, "cost": 21.4, "total_time_s": 163.2,
           "allocation": {"A30-24GB": 16, "RTX-3090-24GB": 4, "RTX-A4000-16GB": 12}}
    assert b.short(row) == "21.40 (16 x A30 + 4 x 3090 + 12 x A4000, 163 s)"
    assert b.short({"feasible": False}) == "N/A"
    assert [b.gpu_label(t) for t in ("RTX-A6000-48GB", "H100-80GB")] == ["A6000", "H100"]
