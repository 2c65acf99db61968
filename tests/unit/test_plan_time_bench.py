"""bench/estimator_plan_time.py's split of torchtitan's rows: what the fitted constants of
estimator/time_constants.py were (and were not) fitted on."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench" / "estimator_plan_time.py"


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("estimator_plan_time_bench", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_split_keeps_each_configuration_whole_and_halves_each_gpu_type() -> None:
    b = bench()
    halves = b.split(0)
    assert set(halves.values()) == {"train", "test"}
    by_row = {name: halves[b._group(dims, gpu, fields, seq)] for name, dims, gpu, _, fields, seq, _ in b.TORCHTITAN}
    # one recipe at 8 and at 128 GPUs, and one run published twice, are one configuration
    assert by_row["H100 T1 FSDP"] == by_row["H100 T3 FSDP 128"]
    assert by_row["H100 T1 +compile"] == by_row["H100 T3 +compile"]
    assert by_row["H100 T4 2D"] == by_row["H100 aTP 70B float8"]
    assert by_row["H200 L3-8B 32 GPUs"] == by_row["H200 L3-8B 64 GPUs"]
    assert len(halves) < len(b.TORCHTITAN)
    for gpu in ("A100-80GB", "H100-80GB"):
        groups = [h for g, h in halves.items() if gpu in g]
        assert groups.count("train") == len(groups) // 2
    assert b.split(0) == halves and b.split(1) != halves


def test_report_counts_every_row_once_per_half() -> None:
    b = bench()
    rows = b.torchtitan_rows()
    rep = b.report(rows)
    assert rep["train"]["all"]["n"] + rep["test"]["all"]["n"] == rep["all"]["all"]["n"] == len(b.TORCHTITAN)
    assert {r["half"] for r in rows} == {"train", "test"}
