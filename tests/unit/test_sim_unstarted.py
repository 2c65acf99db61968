"""The count and the warning of jobs a run ended without starting: those the cluster could run
(`never_started`) apart from those it never could (`infeasible`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import RoundConfig
from tessera.controller.core.snapshot import GpuView, JobView, NodeView
from tessera.controller.sim.cli import main
from tessera.controller.sim.clusters import Cluster, NodeGroup
from tessera.controller.sim.engine import FAIR, Simulator, Truth
from tessera.controller.sim.metrics import summarize
from tessera.controller.sim.traces import TraceJob
from tessera.controller.sim.unstarted import can_run, pools, warning
from tessera.estimator.models import ModelDims

M = ModelDims(64, 2, 4, 256, 64, "m")
CLUSTER = Cluster("tiny", (NodeGroup("x-", 1, 4, "X", 40.0),))


def tj(jid: str, t: float, gpus: int, iters: int, key: str) -> TraceJob:
    return TraceJob(jid, t, iters, key, M, 10, gpus, "X")


def run(trace: list[TraceJob], rounds: int, until_done: bool = False):  # type: ignore[no-untyped-def]
    est = TableEstimates({("k", "X", 4): 10.0})
    s = Simulator(CLUSTER, trace, est, Truth(est), FAIR, "t", RoundConfig(interval_s=300.0))
    return s.run(make_policy("fcfs"), rounds=rounds, until_done=until_done)


def test_a_round_limit_that_leaves_a_runnable_job_waiting_is_counted_and_warned() -> None:
    # "a" holds all 4 GPUs for 1,000 iterations of 10 s; "b" can run (4 GPUs of X) but waits
    # behind it; "c"'s model has no Cell on X at all. Three rounds stop the run first.
    trace = [tj("a", 0.0, 4, 5000, "k"), tj("b", 0.0, 4, 50, "k"), tj("c", 0.0, 1, 50, "none")]
    res = run(trace, rounds=3)
    assert res.end == "rounds"
    a, b, c = res.jobs
    assert (a.unstarted, b.unstarted, c.unstarted) == ("", "runnable", "infeasible")
    assert c.reason.startswith("infeasible: no Cell for it on any GPU type of the cluster")
    s = summarize(res)
    assert (s["never_started"], s["infeasible"], s["end"]) == (1, 1, "rounds")
    line = warning("fcfs", s)
    assert line.startswith("warning: fcfs: 1 jobs that can run on the cluster were never started, of 3 submitted")
    assert "round limit (3 rounds)" in line


def test_a_run_that_gets_stuck_says_so_and_a_complete_run_is_silent() -> None:
    # "big" asks for 8 of 4 GPUs: FCFS never starts it, though X runs its model on 4.
    trace = [tj("a", 0.0, 4, 10, "k"), tj("big", 0.0, 8, 10, "k")]
    res = run(trace, rounds=400, until_done=True)
    s = summarize(res)
    assert (s["never_started"], s["infeasible"], s["end"]) == (1, 0, "stuck")
    assert "the policy left them waiting" in warning("fcfs", s)
    held = warning("frenzy", {"jobs_placed_unrunnable": 2, "never_started": 0})
    assert held.startswith("warning: frenzy: 2 jobs were placed on GPUs the oracle cannot run them on")
    ok = summarize(run([tj("a", 0.0, 4, 10, "k")], rounds=0))
    assert (ok["never_started"], ok["infeasible"], ok["end"]) == (0, 0, "done") and warning("fcfs", ok) == ""


def test_can_run_needs_a_cell_on_an_allowed_type_within_its_gpus() -> None:
    nodes = [NodeView(f"n{i}", tuple(GpuView(g, "X", 1) for g in range(8)), frozenset()) for i in range(2)]
    p = pools(nodes)
    assert p == {"X": (16, 2, 8)}
    est = TableEstimates({("k", "X", 16): 1.0, ("k", "Y", 2): 1.0, ("big", "X", 32): 1.0})
    j = JobView("j", 0.0, M, 1, estimate_key="k")
    assert can_run(est, j, p)  # 16 GPUs on 2 nodes
    assert not can_run(est, JobView("j", 0.0, M, 1, gpu_types=("Y",), estimate_key="k"), p)  # no Y here
    assert not can_run(est, JobView("j", 0.0, M, 1, estimate_key="big"), p)  # 32 > 16 GPUs


MORPH_MODELS = ("vit", "roberta", "bert", "t5", "gpt2", "llama7", "llama30")


def test_cli_writes_the_counts_and_warns_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    for m in MORPH_MODELS:
        d = data / "morphling" / "placements" / m
        d.mkdir(parents=True)
        rows = "" if m == "vit" else "8888888,88888888,2.0,0,0,0\n1,1,1.0,0,0,0\n"
        (d / "placements.csv").write_text("exec_plan,placement,iter_time,forward,overlap_sync,optimize\n" + rows)
    w = data / "morphling" / "workloads"
    w.mkdir(parents=True)
    # "big" takes all 64 GPUs for a long time; "small" can run on 1 GPU but waits; "vit" has no
    # measured placement: it can never run.
    (w / "workload-base.csv").write_text(
        "name,submission_time,duration,application,num_gpus,num_cpus,bandwidth,exec_plan,steps,is_sla\n"
        "big,1,1,bert,64,0,0,ga,100000,0\nsmall,2,1,bert,1,0,0,ga,10,0\nvit,3,1,vit,1,0,0,ga,10,0\n")
    out = tmp_path / "out"
    assert main(["--trace", "morphling-base", "--cluster", "morphling-64", "--policies", "fcfs", "--rounds", "5",
                 "--data-dir", str(data), "--out", str(out), "--no-plots", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "warning: fcfs: 1 jobs that can run on the cluster were never started, of 3 submitted" in err
    header, row = (out / "summary.csv").read_text().splitlines()
    got = dict(zip(header.split(","), row.split(","), strict=True))
    assert (got["never_started"], got["infeasible"]) == ("1", "1")
    doc = json.loads((out / "metrics.json").read_text())
    assert doc["policies"]["fcfs"]["never_started"] == 1 and doc["policies"]["fcfs"]["end"] == "rounds"
