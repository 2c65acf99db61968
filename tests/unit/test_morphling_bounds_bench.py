"""bench/morphling_bounds.py's lower bounds on a makespan, on literal inputs worked out by hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("morphling_bounds_bench", BENCH / "morphling_bounds.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    sys.path.insert(0, str(BENCH))  # the bench imports benchio by its bare name, as a script does
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH))
    return mod


def test_fluid_bound_is_the_latest_arrival_plus_the_work_from_it_on() -> None:
    b = bench()
    # 640 GPU-s at 0 and 64 GPU-s at 100 s on 64 GPUs: 11 s from 0, but 100 + 1 s from the second.
    assert b.fluid([(100.0, 64.0), (0.0, 640.0)], 64) == pytest.approx(101.0)
    assert b.fluid([(0.0, 640.0), (5.0, 64.0)], 64) == pytest.approx(11.0)


def test_mix_cost_under_a_promise() -> None:
    b = bench()
    # s/iteration by GPUs; GPU-s per iteration: 1 -> 1.0, 2 -> 1.6, 4 -> 1.2.
    curve = {1: 1.0, 2: 0.8, 4: 0.3}
    # t_P = 0.8: one point as fast costs at least 1.2 (4 GPUs); 5/7 of the iterations on 1 GPU
    # and 2/7 on 4 average 0.8 s and cost (2 x 1.2 + 5 x 1.0) / 7.
    assert b.mix_cost(curve, 0.8) == pytest.approx(7.4 / 7)
    # Only the fastest point meets t_P = 0.3; nothing meets 0.2.
    assert b.mix_cost(curve, 0.3) == pytest.approx(1.2)
    assert b.mix_cost(curve, 0.2) == float("inf")


def test_cumulative_gpu_seconds_pay_a_second_start_for_a_mix() -> None:
    b = bench()
    curve = {1: 1.0, 2: 0.8, 4: 0.3}
    # Long job (700 iterations, 10 s starts): one point costs 880 (4 GPUs: 4 x (210 + 10)); the mix
    # costs 700 x 7.4 / 7 + 10 x (2 + 1), its second start paid on the smallest count.
    assert b.cumulative_gpu_s(curve, 700, 0.8, 10.0) == pytest.approx(770.0)
    # Short job (7 iterations): the two starts cost more than the mix saves; 2 GPUs alone: 2 x 15.6.
    assert b.cumulative_gpu_s(curve, 7, 0.8, 10.0) == pytest.approx(31.2)
    # Free starts: the mix alone, 7 x 7.4 / 7.
    assert b.cumulative_gpu_s(curve, 7, 0.8, 0.0) == pytest.approx(7.4)
    assert b.cumulative_gpu_s(curve, 7, 0.2, 10.0) == float("inf")
