"""FCFS in both modes: strict FIFO per GPU type, no backfill, drops in the artifact's mode."""

from __future__ import annotations

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import plan_round
from tessera.controller.core.snapshot import Cell, GpuView, JobView, NodeView, Slice, Snapshot
from tessera.estimator.models import ModelDims

GB = 1000**3
M = ModelDims(1024, 24, 16, 32000, 1024, "m")
EST = TableEstimates({("k", t, n): 1.0 for t in ("X", "Y") for n in (1, 2, 4, 8)})


def node(nid: str, model: str, n: int, busy: tuple[int, ...] = ()) -> NodeView:
    return NodeView(nid, tuple(GpuView(i, model, 40 * GB) for i in range(n)), frozenset(busy))


def job(jid: str, t: float, n: int, gtype: str, key: str = "k") -> JobView:
    return JobView(jid, t, M, 64, n, (), gtype, 100, estimate_key=key)


def test_fifo_per_type_without_backfill() -> None:
    nodes = (node("x0", "X", 4, busy=(0, 1)), node("y0", "Y", 2))
    jobs = (job("big", 0, 4, "X"), job("small", 1, 1, "X"), job("other", 2, 1, "Y"))
    for mode in ("paper", "artifact"):
        d = {x.job_id: x for x in plan_round(Snapshot(nodes, jobs), EST, make_policy("fcfs", mode)).decisions}
        assert d["big"].action == "pending"
        assert d["small"].action == "pending" and "FIFO" in d["small"].reason
        assert d["other"].action == "start" and d["other"].cell == Cell("Y", 1)


def test_artifact_mode_drops_infeasible_jobs_and_scatters() -> None:
    nodes = (node("x0", "X", 4, busy=(0, 1, 2)), node("x1", "X", 4, busy=(0,)))
    jobs = (job("nope", 0, 2, "X", key="unknown"), job("one", 1, 1, "X"))
    d = {x.job_id: x for x in plan_round(Snapshot(nodes, jobs), EST, make_policy("fcfs", "artifact")).decisions}
    assert d["nope"].action == "drop"
    assert d["one"].slices == (Slice("x1", (1,)),)  # the node with the most idle GPUs
    p = {x.job_id: x for x in plan_round(Snapshot(nodes, jobs), EST, make_policy("fcfs")).decisions}
    assert p["nope"].action == "pending" and p["one"].slices == (Slice("x0", (3,)),)  # best fit


def test_artifact_mode_retries_waiting_jobs_only_after_departures() -> None:
    nodes = (node("x0", "X", 4),)
    waiting = job("w", 0, 2, "X")
    quiet = Snapshot(nodes, (waiting,), arrivals=(), departures=0)
    assert plan_round(quiet, EST, make_policy("fcfs", "artifact")).decisions[0].action == "pending"
    assert plan_round(quiet, EST, make_policy("fcfs", "paper")).decisions[0].action == "start"
    after = Snapshot(nodes, (waiting,), arrivals=(), departures=1)
    assert plan_round(after, EST, make_policy("fcfs", "artifact")).decisions[0].action == "start"
