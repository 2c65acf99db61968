"""The cost tree's answers are reused across rounds where the solver would give them again
(controller/core/cost_objective.py `_reuse`): a job with a deadline asks with a smaller SLO every
round, and each round searched again (0.1-0.4 s per waiting job, on the event loop)."""

from __future__ import annotations

from dataclasses import replace

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
from tessera.estimator.models import ModelDims

GB = 1000**3
TINY = ModelDims(64, 12, 4, 256, 64, "tiny")
NODES = (NodeView("a100", tuple(GpuView(i, "A100-80GB", 80 * GB) for i in range(4)), frozenset()),
         NodeView("a10", tuple(GpuView(i, "A10-24GB", 24 * GB) for i in range(4)), frozenset()))
SNAP = Snapshot(NODES, (), (("A10-24GB", 24 * GB, 4), ("A100-80GB", 80 * GB, 4)), (),
                prices=(("A10-24GB", 1.0), ("A100-80GB", 4.0)))


def test_a_shrinking_slo_reuses_the_plan_it_still_meets_and_the_infeasibility_below_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(co, "_MEMO", {})
    calls: list[float] = []
    real = co.cheapest_plan

    def counted(model: object, offers: object, iterations: int, slo_s: float) -> object:
        calls.append(slo_s)
        return real(model, offers, iterations, slo_s)  # type: ignore[arg-type]

    monkeypatch.setattr(co, "cheapest_plan", counted)

    def decide(slo_s: float) -> tuple[str, str]:
        job = JobView("c", 0.0, TINY, 16, iterations=1000, objective=Objective.COST, slo_s=slo_s)
        (d,), _ = co.place(SNAP, (job,))
        return str(d.action), d.reason.replace(f"(SLO {slo_s:,.0f} s)", "(SLO)")

    first = decide(3600.0)
    assert first[0] == Action.START and len(calls) == 1
    plan_time = co._MEMO[next(iter(co._MEMO))][1].total_time_s  # type: ignore[union-attr]
    assert decide(3000.0) == first and decide(plan_time) == first and len(calls) == 1
    assert decide(3601.0) == first and len(calls) == 2  # a looser SLO may have a cheaper plan: searched
    # Under the fastest plan's time: infeasible, found once, then reused with the SLO it is asked for.
    low = decide(0.001)
    assert low[0] == Action.PENDING and "within 0.001 s;" in low[1] and len(calls) == 3
    lower = decide(0.0005)
    assert lower == (Action.PENDING, low[1].replace("within 0.001 s;", "within 0.0005 s;")) and len(calls) == 3


def test_a_job_left_pending_by_the_reused_answer_says_it_fits_nowhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(co, "_MEMO", {})
    job = JobView("c", 0.0, TINY, 16, iterations=1000, objective=Objective.COST, slo_s=0.001)
    (d,), _ = co.place(SNAP, (job,))
    (again,), _ = co.place(SNAP, (job,))
    assert d.pending is again.pending is PendingKind.FITS_NOWHERE and d.reason == again.reason


def test_an_slo_no_plan_meets_is_reused_as_the_tree_writes_its_slo() -> None:
    # The tree writes 3,600 and 1,200.5 (estimator.cost_tree.seconds_text); the memo looked for "3600"
    # and "1200.5", so from 1,000 s, and for any SLO with a fraction, it searched again each round.
    why = ("slo_s: no allocation of 2 GPU type(s) within their quotas, at most 8 stages runs 100000 iterations "
           "within 3,600 s; the fastest takes 12,174.3 s (x)")
    got = co._reuse((3600.0, co.NoFeasiblePlan(12174.3, why)), 1200.5)
    assert isinstance(got, co.NoFeasiblePlan) and got.best_time_s == 12174.3
    assert got.reason == why.replace("within 3,600 s;", "within 1,200.5 s;")
    assert co._reuse((3600.0, co.NoFeasiblePlan(12174.3, why)), 12175.0) is None  # a plan may meet that


def test_a_model_no_gpu_holds_is_reused_whatever_the_slo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(co, "_MEMO", {})
    calls: list[float] = []

    def none_fits(model: object, offers: object, iterations: int, slo_s: float) -> object:
        calls.append(slo_s)
        raise co.NoFeasiblePlan(float("inf"), "no allocation of 2 GPU type(s) ... holds tiny in GPU memory")

    monkeypatch.setattr(co, "cheapest_plan", none_fits)
    # A deadline's SLO shrinks every round; memory does not depend on it. The whole cluster's
    # question, asked each round such a job waits, searched again every round.
    reasons = set()
    for slo_s in (3600.0, 3599.25, 3000.0):
        job = JobView("c", 0.0, TINY, 16, iterations=1000, objective=Objective.COST, slo_s=slo_s)
        (d,), _ = co.place(SNAP, (job,))
        assert d.pending is PendingKind.FITS_NOWHERE
        reasons.add(d.reason)
    assert len(reasons) == 1 and len(calls) == 1


def test_the_reused_reason_is_the_one_the_tree_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(co, "_MEMO", {})
    real, calls = co.cheapest_plan, []

    def counted(*a: object) -> object:
        calls.append(a)
        return real(*a)  # type: ignore[arg-type]

    monkeypatch.setattr(co, "cheapest_plan", counted)
    job = JobView("c", 0.0, TINY, 16, iterations=10**8, objective=Objective.COST, slo_s=5000.0)
    co.place(SNAP, (job,))
    (again,), _ = co.place(SNAP, (replace(job, slo_s=4321.5),))
    assert len(calls) == 1  # the free GPUs are the whole cluster here: one question
    model, offers, iterations, _ = calls[0]
    with pytest.raises(co.NoFeasiblePlan) as fresh:
        real(model, offers, iterations, 4321.5)  # type: ignore[arg-type]
    assert "within 4,321.5 s;" in fresh.value.reason and fresh.value.reason in again.reason
