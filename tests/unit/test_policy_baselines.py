"""Gavel, ElasticFlow, Gandiva and Sia on literal clusters, in the modes of
docs/reference/baselines.md."""

from __future__ import annotations

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import CellEstimate, RoundConfig, plan_round
from tessera.controller.core.snapshot import (
    Cell,
    Decision,
    GpuView,
    JobView,
    NodeView,
    RunningView,
    Slice,
    Snapshot,
)
from tessera.estimator.models import ModelDims

GB = 1000**3
M = ModelDims(64, 2, 4, 256, 64, "m")


def node(nid: str, model: str, n: int, busy: tuple[int, ...] = ()) -> NodeView:
    return NodeView(nid, tuple(GpuView(i, model, 40 * GB) for i in range(n)), frozenset(busy))


def job(jid: str, key: str, t: float, n: int, gtype: str) -> JobView:
    return JobView(jid, t, M, 100, n, (), gtype, 1000, estimate_key=key)


def run(j: JobView, gtype: str, slices: tuple[Slice, ...]) -> RunningView:
    return RunningView(j, Cell(gtype, sum(len(s.gpu_indices) for s in slices)), slices)


def by_id(decisions: tuple[Decision, ...]) -> dict[str, Decision]:
    return {d.job_id: d for d in decisions}


def test_gavel_artifact_admission_changes_a_running_jobs_type() -> None:
    est = TableEstimates({("a", "FAST", 2): 1.0, ("a", "SLOW", 2): 1.1, ("b", "FAST", 2): 1.0, ("b", "SLOW", 2): 5.0})
    a, b = job("A", "a", 0, 2, "FAST"), job("B", "b", 1, 2, "FAST")
    snap = Snapshot((node("f", "FAST", 2, (0, 1)), node("s", "SLOW", 2)), (b,),
                    running=(run(a, "FAST", (Slice("f", (0, 1)),)),), arrivals=("B",))
    d = by_id(plan_round(snap, est, make_policy("gavel", "artifact")).decisions)
    assert d["A"].action == "migrate" and d["A"].cell == Cell("SLOW", 2)
    assert d["B"].action == "start" and d["B"].cell == Cell("FAST", 2)
    # The paper mode prices the fast type high enough that A, which barely needs it, moves too.
    p = by_id(plan_round(snap, est, make_policy("gavel", "paper")).decisions)
    assert p["B"].cell == Cell("FAST", 2) and p["A"].cell == Cell("SLOW", 2)


def test_elasticflow_ls_gives_minimum_shares_then_doubles_and_repacks() -> None:
    table = {(k, "X", n): t for k in ("a", "b") for n, t in ((1, 4.0), (2, 2.2), (4, 1.3))}
    est = TableEstimates(table)
    a, b = job("A", "a", 0, 1, "X"), job("B", "b", 1, 1, "X")
    snap = Snapshot((node("x", "X", 4, (0,)),), (b,), running=(run(a, "X", (Slice("x", (0,)),)),), arrivals=("B",))
    d = by_id(plan_round(snap, est, make_policy("elasticflow-l", "artifact")).decisions)
    # Minimum share 1 each, then the larger gain doubles first: A and B end with 2 GPUs each.
    assert d["A"].cell == Cell("X", 2) and d["B"].cell == Cell("X", 2)
    assert d["A"].action == "migrate" and d["B"].action == "start"


def test_elasticflow_paper_declines_a_job_no_data_parallel_share_can_run() -> None:
    # "big" runs under Alpa's plans (the table has times) but its data-parallel replica fits on no
    # count: ElasticFlow, data-parallel only, can never serve it.
    table = {(k, "X", n): 1.0 for k in ("big", "a") for n in (1, 2, 4)}
    est = TableEstimates(table, dp_ok={("big", "X", n): False for n in (1, 2, 4)})
    big, a = job("BIG", "big", 0, 2, "X"), job("A", "a", 1, 1, "X")
    snap = Snapshot((node("x", "X", 4),), (big, a), arrivals=("BIG", "A"))
    d = by_id(plan_round(snap, est, make_policy("elasticflow-l", "paper")).decisions)
    assert d["BIG"].action == "drop" and "declined" in d["BIG"].reason and "fits its memory" in d["BIG"].reason
    assert d["A"].action == "start"
    # The artifact's ElasticFlowSched lets it wait instead.
    art = by_id(plan_round(snap, est, make_policy("elasticflow-l", "artifact")).decisions)
    assert art["BIG"].action == "pending"


def test_elasticflow_paper_keeps_shares_within_the_rounds_per_job_cap() -> None:
    """Before: paper mode capped shares at the cluster's largest type only, so a lone job doubled to
    8 GPUs where the round allows 4 per job."""
    est = TableEstimates({("a", "X", n): 8.0 / n for n in (1, 2, 4, 8)})
    snap = Snapshot((node("x", "X", 8),), (job("A", "a", 0, 1, "X"),), arrivals=("A",))
    free = by_id(plan_round(snap, est, make_policy("elasticflow-l", "paper")).decisions)
    assert free["A"].cell == Cell("X", 8)
    capped = by_id(plan_round(snap, est, make_policy("elasticflow-l", "paper"), RoundConfig(max_gpus_per_job=4)).decisions)
    assert capped["A"].action == "start" and capped["A"].cell == Cell("X", 4)


def test_gandiva_grows_onto_idle_gpus_of_its_node_after_departures() -> None:
    est = TableEstimates({("a", "X", 1): 4.0, ("a", "X", 2): 2.2, ("a", "X", 4): 1.3})
    a = job("A", "a", 0, 1, "X")
    snap = Snapshot((node("x", "X", 4, (0,)),), (), running=(run(a, "X", (Slice("x", (0,)),)),),
                    arrivals=(), departures=1)
    d = by_id(plan_round(snap, est, make_policy("gandiva", "artifact")).decisions)
    assert d["A"].action == "migrate" and d["A"].cell == Cell("X", 4) and d["A"].change == "scale-up"
    quiet = Snapshot(snap.nodes, (), running=snap.running, arrivals=(), departures=0)
    assert plan_round(quiet, est, make_policy("gandiva", "artifact")).decisions[0].action == "keep"


def test_sia_artifact_admits_with_the_best_configuration() -> None:
    est = TableEstimates({("b", "X", n): 4.0 / n ** 0.8 for n in (1, 2, 4)})
    b = job("B", "b", 0, 1, "X")
    snap = Snapshot((node("x", "X", 4),), (b,), arrivals=("B",))
    d = by_id(plan_round(snap, est, make_policy("sia", "artifact")).decisions)
    assert d["B"].action == "start" and d["B"].cell == Cell("X", 4)
    p = by_id(plan_round(snap, est, make_policy("sia", "paper")).decisions)
    assert p["B"].action == "start"


def test_sia_paper_halves_a_running_job_when_the_objective_pays_for_a_waiting_one() -> None:
    # A gains little from its last doubling (2.1 -> 1.9 s/iter): halving it costs the objective
    # less than the lambda of leaving B unallocated (Eq. 1), so B starts on the GPUs A gives back.
    table = {("a", "X", 1): 4.0, ("a", "X", 2): 2.1, ("a", "X", 4): 1.9,
             ("b", "X", 1): 4.0, ("b", "X", 2): 2.0, ("b", "X", 4): 1.0}
    a, b = job("A", "a", 0, 4, "X"), job("B", "b", 1e6, 1, "X")
    snap = Snapshot((node("x", "X", 4, (0, 1, 2, 3)),), (b,),
                    running=(run(a, "X", (Slice("x", (0, 1, 2, 3)),)),), now=1e6, arrivals=("B",))
    d = by_id(plan_round(snap, TableEstimates(table), make_policy("sia", "paper")).decisions)
    assert d["A"].action == "migrate" and d["A"].change == "scale-down" and d["A"].cell == Cell("X", 2)
    assert d["B"].action == "start" and d["B"].cell == Cell("X", 1) and "halved" in d["B"].reason
    # When A scales well (1.0 s/iter on 4), halving it costs more than B waiting: B waits.
    est = TableEstimates({**table, ("a", "X", 4): 1.0})
    d = by_id(plan_round(snap, est, make_policy("sia", "paper")).decisions)
    assert d["A"].action == "keep" and d["B"].action == "pending"


class _OneNodeOnly(TableEstimates):
    """Estimates that cover a gang only on one node (as the arena table does for small jobs)."""

    def cells(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> tuple[CellEstimate, ...]:
        return tuple(super().cells(job, gpu_type, gpus, nodes)) if nodes == 1 else ()


def test_sia_paper_places_a_job_only_on_node_counts_it_can_run_on() -> None:
    # One free GPU on each of two nodes: B's 2 GPUs fit by count, but B runs only on one node.
    est = _OneNodeOnly({("b", "X", 2): 1.0, ("c", "X", 1): 1.0})
    c, d_ = job("C", "c", 0, 1, "X"), job("D", "c", 0, 1, "X")
    b = job("B", "b", 1, 2, "X")
    snap = Snapshot((node("x1", "X", 2, (0,)), node("x2", "X", 2, (0,))), (b,),
                    running=(run(c, "X", (Slice("x1", (0,)),)), run(d_, "X", (Slice("x2", (0,)),))),
                    arrivals=("B",))
    d = by_id(plan_round(snap, est, make_policy("sia", "paper")).decisions)
    assert d["B"].action == "pending"
    # With one node's GPUs free, it starts there.
    snap = Snapshot((node("x1", "X", 2), node("x2", "X", 2, (0, 1))), (b,),
                    running=(run(d_, "X", (Slice("x2", (0, 1)),)),), arrivals=("B",))
    d = by_id(plan_round(snap, est, make_policy("sia", "paper")).decisions)
    assert d["B"].action == "start" and d["B"].slices == (Slice("x1", (0, 1)),)


def test_gandiva_paper_starts_a_job_that_only_another_type_than_the_first_runs() -> None:
    # The job has no type: it does not run on A (the first type), only on B, which is idle.
    est = TableEstimates({("k", "B", 1): 1.0})
    j = JobView("J", 0.0, M, 100, 1, estimate_key="k")
    snap = Snapshot((node("a", "A", 1), node("b", "B", 1)), (j,), arrivals=("J",))
    d = by_id(plan_round(snap, est, make_policy("gandiva", "paper")).decisions)
    assert d["J"].action == "start" and d["J"].cell == Cell("B", 1)
    # Only when no type it may use runs it is it "fits nowhere".
    only_a = Snapshot(snap.nodes, (JobView("J", 0.0, M, 100, 1, ("A",), estimate_key="k"),), arrivals=("J",))
    d = by_id(plan_round(only_a, est, make_policy("gandiva", "paper")).decisions)
    assert d["J"].action == "pending" and d["J"].pending == "fits_nowhere"


def test_gandiva_keeps_a_job_to_the_types_it_may_use() -> None:
    est = TableEstimates({("k", "A", 1): 1.0, ("k", "B", 1): 1.0})
    j = JobView("J", 0.0, M, 100, 1, ("B",), estimate_key="k")
    snap = Snapshot((node("a", "A", 1), node("b", "B", 1)), (j,), arrivals=("J",))
    for mode in ("paper", "artifact"):
        d = by_id(plan_round(snap, est, make_policy("gandiva", mode)).decisions)
        assert d["J"].action == "start" and d["J"].cell == Cell("B", 1), mode
