"""bench/morphling_artifact.py's pure parts on literal inputs: the artifact's workload CSV with
Tessera's jittered arrivals, and the figures read back from the artifact's output."""

from __future__ import annotations

import csv
import importlib.util
import io
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tessera.controller.sim.traces import TraceJob
from tessera.estimator.models import ModelDims

BENCH = Path(__file__).resolve().parents[2] / "bench"
M = ModelDims(1024, 24, 16, 32000, 1024, "m")
CSV = ("name,submission_time,model,num_gpus,is_sla\n"
       "a,0.0,gpt2,8,0\n"
       "b,100.0,bert,4,1\n"
       "c,120.0,vit,1,0\n")


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("morphling_artifact_bench", BENCH / "morphling_artifact.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    sys.path.insert(0, str(BENCH))  # the bench imports benchio, morphling_bounds and morphling_jitter bare
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH))
    return mod


def jobs() -> list[TraceJob]:
    return [TraceJob(n, t, 10, "gpt2", M, 8, 1, "") for n, t in (("a", 0.0), ("b", 100.0), ("c", 120.0))]


def test_the_jittered_csv_carries_tesseras_draws_and_every_other_field() -> None:
    b = bench()
    out = b.jittered_csv(CSV, jobs(), seed=3, width=300.0)
    rows = list(csv.DictReader(io.StringIO(out)))
    want = b.jitter(jobs(), 3, 300.0)
    assert [(r["name"], float(r["submission_time"])) for r in rows] == [(j.id, j.submit_time) for j in want]
    original = {r["name"]: r for r in csv.DictReader(io.StringIO(CSV))}
    for r in rows:
        assert {k: v for k, v in r.items() if k != "submission_time"} == {
            k: v for k, v in original[r["name"]].items() if k != "submission_time"}
    assert out.splitlines()[0] == CSV.splitlines()[0]
    with pytest.raises(SystemExit, match="not the trace Tessera loads"):
        b.jittered_csv(CSV, list(reversed(jobs())), seed=3, width=300.0)


def test_figures_are_read_from_the_artifacts_last_summary() -> None:
    b = bench()
    text = ("round 1\nAverage JCT (s): 5.0\nMakespan (s): 60\n"
            "{'a': 500.0, 'b': 1000.0, 'c': 80.0}\nAverage JCT (s): 526.7\nMakespan (s): 1140\n")
    got = b.parse_output(text, CSV)
    assert got == {"jobs": 3, "finished": 3, "jct_avg_s": 526.7, "makespan_artifact_s": 1140.0,
                   "makespan_s": 1100.0}  # b ends at 1,100 s, counted from the first arrival at 0
    with pytest.raises(RuntimeError, match="no 'Average JCT"):
        b.parse_output("nothing\n", CSV)
