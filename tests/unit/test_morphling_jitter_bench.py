"""bench/morphling_jitter.py's perturbation of a trace and its option parsing, on literal inputs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tessera.controller.sim.traces import TraceJob
from tessera.estimator.models import ModelDims

BENCH = Path(__file__).resolve().parents[2] / "bench"
M = ModelDims(1024, 24, 16, 32000, 1024, "m")


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("morphling_jitter_bench", BENCH / "morphling_jitter.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    sys.path.insert(0, str(BENCH))  # the bench imports benchio and morphling_bounds by their bare names
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH))
    return mod


def job(i: int, t: float) -> TraceJob:
    return TraceJob(f"j{i}", t, 10, "gpt2", M, 8, 1, "")


def test_jitter_moves_each_arrival_within_the_width_and_keeps_submission_order() -> None:
    b = bench()
    jobs = [job(i, t) for i, t in enumerate((0.0, 100.0, 120.0, 5000.0))]
    out = b.jitter(jobs, seed=3, width=300.0)
    assert sorted(j.id for j in out) == ["j0", "j1", "j2", "j3"]
    assert [j.submit_time for j in out] == sorted(j.submit_time for j in out)
    before = {j.id: j.submit_time for j in jobs}
    for j in out:
        assert j.submit_time >= 0.0
        assert abs(j.submit_time - before[j.id]) <= 300.0
        assert j.iterations == 10 and j.model_key == "gpt2"  # only the arrival moves
    assert {j.id: j.submit_time for j in out} != before  # a draw of four uniforms is never all zero
    assert b.jitter(jobs, seed=3, width=300.0) == out  # seeded: the same runs again
    assert b.jitter(jobs, seed=4, width=300.0) != out
    assert b.jitter(jobs, seed=3, width=0.0) == jobs


def test_options_take_morphling_option_fields_and_refuse_others() -> None:
    b = bench()
    assert b.options(["grow_factor=2", "critical_factor=0.7"]) == {"grow_factor": 2.0, "critical_factor": 0.7}
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        b.options(["no_such_option=1"])
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        b.options(["grow_factor"])
    with pytest.raises(SystemExit, match="grow_factor must be a finite number >= 1"):
        b.options(["grow_factor=0.5"])
    with pytest.raises(SystemExit, match="not a number"):
        b.options(["grow_factor=fast"])
