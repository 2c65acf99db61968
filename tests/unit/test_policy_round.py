"""plan_round: defaults for undecided jobs, plan checks, placement rules, the Frenzy adapter."""

from __future__ import annotations

import pytest

from tessera.controller.core import frenzy
from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.placement import SCATTER, ClusterState, Trial, quotas
from tessera.controller.core.policies import UnknownPolicy, make_policy
from tessera.controller.core.policy import RoundContext, RoundPlanError, plan_round
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    Decision,
    GpuView,
    JobView,
    NodeView,
    PendingKind,
    RunningView,
    Slice,
    Snapshot,
)
from tessera.estimator.models import REGISTERED, ModelDims

GB = 1000**3
M = ModelDims(1024, 24, 16, 32000, 1024, "m")


def node(nid: str, model: str, n: int, busy: tuple[int, ...] = (), islands: int = 0) -> NodeView:
    per = n // islands if islands else 0
    gpus = tuple(GpuView(i, model, 40 * GB, island=(i // per if per else -1)) for i in range(n))
    return NodeView(nid, gpus, frozenset(busy))


def test_quotas_fewest_nodes_first() -> None:
    assert quotas(8, 4) == [4, 2, 1]
    assert quotas(6, 4) == [3, 2, 1]
    assert quotas(8, 8, tp=2) == [8, 4, 2]


def test_best_fit_scatter_and_trial_agree() -> None:
    nodes = (node("a", "X", 4, busy=(0,)), node("b", "X", 4), node("c", "X", 4, busy=(0, 1)))
    st = ClusterState.from_nodes(nodes)
    assert st.place("X", 2) == (Slice("c", (2, 3)),)  # fewest free that suffice
    assert st.place("X", 2, prefer=SCATTER) == (Slice("b", (0, 1)),)  # most free first
    # 8 GPUs: 4 + 4 needs two nodes with 4 free (only b), 2 x 4 needs four nodes: 9 free GPUs are not
    # enough for the gang split evenly.
    assert st.place("X", 8) is None
    assert st.fits("X", 6) == 2  # 3 + 3 on a and b
    assert st.place("X", 6) == (Slice("a", (1, 2, 3)), Slice("b", (0, 1, 2)))
    tr = Trial(st)
    parts = tr.take("X", 6)
    assert parts is not None
    real = st.place("X", 6)
    assert real is not None
    assert [g.node_id for g, _ in parts] == [s.node_id for s in real]


def test_tp_groups_stay_inside_nvlink_islands() -> None:
    # Two islands of 4 on one node; island 0 has 3 free, island 1 has 4 free: a TP-4 gang of 4
    # must take island 1 whole.
    n = node("v", "V", 8, busy=(0,), islands=2)
    st = ClusterState.from_nodes((n,))
    assert st.place("V", 4, tp=4) == (Slice("v", (4, 5, 6, 7)),)
    assert st.place("V", 8, tp=4) is None


def test_running_jobs_kept_and_pending_get_a_reason_by_default() -> None:
    class Idle:
        name = "idle"

        def plan(self, ctx: RoundContext) -> list[Decision]:
            return []

    r = RunningView(JobView("r", 0.0, M, 8), Cell("X", 2), (Slice("a", (0, 1)),))
    snap = Snapshot((node("a", "X", 4, busy=(0, 1)),), (JobView("p", 1.0, M, 8),), running=(r,))
    plan = plan_round(snap, TableEstimates({}), Idle())
    assert [(d.job_id, d.action) for d in plan.decisions] == [("r", "keep"), ("p", "pending")]
    assert plan.decisions[0].slices == r.slices


def test_plan_errors_catch_double_booking_and_busy_gpus() -> None:
    class Bad:
        name = "bad"

        def __init__(self, decisions: list[Decision]) -> None:
            self.d = decisions

        def plan(self, ctx: RoundContext) -> list[Decision]:
            return self.d

    snap = Snapshot((node("a", "X", 2, busy=(1,)),), (JobView("p", 0.0, M, 8), JobView("q", 1.0, M, 8)))
    e = TableEstimates({})
    two = [Decision("p", Action.START, "", slices=(Slice("a", (0,)),)),
           Decision("q", Action.START, "", slices=(Slice("a", (0,)),))]
    with pytest.raises(RoundPlanError, match="given to p and q"):
        plan_round(snap, e, Bad(two))
    with pytest.raises(RoundPlanError, match="not free"):
        plan_round(snap, e, Bad([Decision("p", Action.START, "", slices=(Slice("a", (1,)),))]))
    with pytest.raises(RoundPlanError, match="not of type"):
        plan_round(snap, e, Bad([Decision("p", Action.START, "", slices=(Slice("a", (0,)),),
                                          cell=Cell("Y", 1))]))
    with pytest.raises(RoundPlanError, match="twice"):
        wait = Decision("p", Action.PENDING, "", pending=PendingKind.WAITING)
        plan_round(snap, e, Bad([wait, wait]))


def test_frenzy_adapter_matches_the_frenzy_round() -> None:
    nodes = (NodeView("a100", tuple(GpuView(i, "A100-80GB", 80 * GB) for i in range(4))),
             NodeView("a10", tuple(GpuView(i, "A10-24GB", 24 * GB) for i in range(4))))
    jobs = (JobView("j1", 1.0, REGISTERED["gpt2-small"], 16), JobView("j2", 2.0, REGISTERED["gpt2-small"], 16))
    snap = Snapshot(nodes, jobs, (("A100-80GB", 80 * GB, 4), ("A10-24GB", 24 * GB, 4)))
    ours = plan_round(snap, TableEstimates({}), make_policy("frenzy"))
    theirs = frenzy.plan_round(snap)
    assert [d.job_id for d in theirs.starts()] == ["j1", "j2"]  # else the comparison below says nothing
    assert [(d.job_id, d.action, d.slices) for d in ours.starts()] == \
        [(d.job_id, d.action, d.slices) for d in theirs.starts()]
    assert all(d.cell is not None and d.reason.startswith("frenzy: ") for d in ours.starts())


def test_unknown_policy_and_mode() -> None:
    with pytest.raises(UnknownPolicy, match="unknown policy"):
        make_policy("nope")
    with pytest.raises(UnknownPolicy, match="unknown mode"):
        make_policy("crius", "best")
