"""The cost tree's limits: max_stages at most MAX_STAGES, a work budget per search (the search for
the fastest plan behind NoFeasiblePlan included), the stage placer's limit at the leaves, and the
controller's cost pass leaving a job whose search is too large pending instead of failing the round."""

from __future__ import annotations

import math

import pytest

from tessera.controller.core import cost_objective as co
from tessera.controller.core.snapshot import (
    Action,
    GpuView,
    JobView,
    NodeView,
    Objective,
    PendingKind,
    Snapshot,
)
from tessera.estimator import cost_tree
from tessera.estimator.cells import CellModel
from tessera.estimator.cost_tree import (
    MAX_SEARCH_WORK,
    MAX_STAGES,
    CostInputError,
    GpuOffer,
    NoFeasiblePlan,
    SearchTooLarge,
    _prepare,
    _search,
    cheapest_plan,
    fastest_plan,
)
from tessera.estimator.models import ModelDims

BIG = CellModel("gpt", hidden_size=4096, num_layers=10, num_heads=32, vocab_size=32000, seq_length=2048,
                global_batch=16, name="big")
NIC = 2.5 / 8
OFFERS = [GpuOffer(t, p, q, 4, NIC) for t, p, q in (("A6000", 6, 4), ("A30", 4, 4), ("RTX3090", 2.5, 4),
                                                    ("A4000", 2, 4))]


def test_max_stages_is_capped() -> None:
    assert MAX_STAGES == 16
    with pytest.raises(CostInputError, match="^max_stages: must be an integer from 1 to 16, got 17"):
        cheapest_plan(BIG, OFFERS, 10, 40.0, max_stages=17)
    with pytest.raises(CostInputError, match="^max_work: must be an integer >= 1, got 0"):
        cheapest_plan(BIG, OFFERS, 10, 40.0, max_stages=2, max_work=0)


def test_a_search_over_its_budget_is_refused_and_the_default_leaves_room() -> None:
    plan = cheapest_plan(BIG, OFFERS, 10, 40.0, max_stages=3)
    p = _prepare(BIG, OFFERS, 10, 40.0, None, 3, None, False)
    _, st = _search(p, "cost", 40.0, None)
    assert 0 < st.work < MAX_SEARCH_WORK / 100
    assert cheapest_plan(BIG, OFFERS, 10, 40.0, max_stages=3, max_work=st.work).cost == plan.cost
    with pytest.raises(SearchTooLarge, match=r"^max_stages: search too large: \d+ nodes expanded and \d+ allocations "
                                             r"placed took \d+ units of work, over the budget of 100 .*; lower "
                                             r"--max-stages or offer fewer types$") as exc:
        cheapest_plan(BIG, OFFERS, 10, 40.0, max_stages=3, max_work=100)
    assert isinstance(exc.value, CostInputError) and exc.value.code == "INVALID_ARGUMENT"
    with pytest.raises(SearchTooLarge):
        fastest_plan(BIG, OFFERS, 10, max_stages=3, max_work=100)


def test_laying_out_the_trees_has_a_budget_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound terms of every (dp, k) were computed before the search and outside its budget: a MoE
    model over the 24 catalog types took 54 s, inside a controller round on its event loop."""
    from tessera.estimator import cost_tree

    p = _prepare(BIG, OFFERS, 10, 40.0, None, 3, None, False)
    used = sum(s.work for s in p.shapes)
    assert 0 < used < cost_tree.MAX_PREPARE_WORK / 100
    monkeypatch.setattr(cost_tree, "MAX_PREPARE_WORK", used)  # exactly enough
    assert len(_prepare(BIG, OFFERS, 10, 40.0, None, 3, None, False).shapes) == len(p.shapes)
    monkeypatch.setattr(cost_tree, "MAX_PREPARE_WORK", used // 2)
    with pytest.raises(SearchTooLarge, match=r"^max_stages: search too large: laying out the trees took over \d+ "
                                             r"units of work \(\d+ of them built; up to 3 stages, 4 GPU types\)"):
        cheapest_plan(BIG, OFFERS, 10, 40.0, max_stages=3)


def test_the_search_for_the_fastest_plan_behind_no_feasible_plan_has_the_budget_too() -> None:
    slo = 0.5 * fastest_plan(BIG, OFFERS, 10, max_stages=3).total_time_s
    with pytest.raises(NoFeasiblePlan):
        cheapest_plan(BIG, OFFERS, 10, slo, max_stages=3)
    p = _prepare(BIG, OFFERS, 10, slo, None, 3, None, False)
    _, first = _search(p, "cost", slo, None)  # every root is pruned against the SLO at once
    assert first.placed == 0
    with pytest.raises(SearchTooLarge):  # the first search fits its budget; the fastest plan's does not
        cheapest_plan(BIG, OFFERS, 10, slo, max_stages=3, max_work=first.work + 1)


def test_a_leaf_the_stage_placer_would_refuse_stops_the_search(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cost_tree, "MAX_PLACE_WORK", 10)
    with pytest.raises(SearchTooLarge, match=r"^max_stages: search too large: placing \d+ stages of \d+ GPU type\(s\) "
                                             r"over 10 layers exceeds the stage placer's limit \(\d+ > 10\)"):
        cheapest_plan(BIG, OFFERS, 10, 40.0, max_stages=3)


TINY = ModelDims(64, 12, 4, 256, 64, "tiny")
GB = 1000**3


def test_the_controller_leaves_a_job_whose_search_is_too_large_pending(monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = (NodeView("a100", tuple(GpuView(i, "A100-80GB", 24 * GB) for i in range(4)), frozenset()),
             NodeView("a10", tuple(GpuView(i, "A10-24GB", 24 * GB) for i in range(4)), frozenset()))
    snap = Snapshot(nodes, (), (("A10-24GB", 24 * GB, 4), ("A100-80GB", 24 * GB, 4)), (),
                    prices=(("A10-24GB", 1.0), ("A100-80GB", 4.0)))
    job = JobView("c", 0.0, TINY, 16, iterations=100, objective=Objective.COST, slo_s=3600.0)
    monkeypatch.setattr(co, "_MEMO", {})
    monkeypatch.setattr(cost_tree, "BOUND_WORK", math.inf)  # the real solver: over budget at the first node
    (d,), _ = co.place(snap, (job,))
    assert d.action is Action.PENDING and d.pending is PendingKind.FITS_NOWHERE
    assert "the cost tree cannot plan the job: max_stages: search too large" in d.reason
    # Remembered as NoFeasiblePlan is: the next round does not search again (seconds each).
    calls: list[int] = []
    real = co.cheapest_plan

    def counted(*a: object, **kw: object) -> object:
        calls.append(1)
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(co, "cheapest_plan", counted)
    (again,), _ = co.place(snap, (job,))
    assert again.reason == d.reason and calls == []
