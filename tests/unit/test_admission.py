"""The tenants' admission rules with a sizer (controller/core/quotas.py, admission.py): minRes
charging, shortest promise first with the starvation bound, the layout check, borrowing while not
admitted. Literal snapshots and a literal table of iteration times."""

from __future__ import annotations

from tessera.controller.core.admission import RoundSizer
from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import RoundConfig, RoundContext, plan_round
from tessera.controller.core.quotas import admit
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    GpuView,
    JobView,
    NodeView,
    PendingKind,
    Priority,
    Promise,
    RunningView,
    Slice,
    Snapshot,
    TenantQuota,
)
from tessera.estimator.models import ModelDims

GB = 1000**3
M = ModelDims(1024, 24, 16, 32000, 1024, "m")
# "flat" runs as fast on 2 GPUs as on 4 (its minRes is 2); "k" is twice as fast on twice the GPUs.
EST = TableEstimates({**{("flat", "X", n): 2.0 for n in (2, 4)}, **{("k", "X", n): 8.0 / n for n in (1, 2, 4)}},
                     node_slowdown=0.1)  # a gang over two nodes is 10% slower
TENANTS = (TenantQuota("A", (("X", 4),)), TenantQuota("B"))
BORROW = RoundConfig(admit_borrow=True)


def nodes(*busy: tuple[int, ...]) -> tuple[NodeView, ...]:
    return tuple(NodeView(f"x{i}", tuple(GpuView(g, "X", 40 * GB) for g in range(4)), frozenset(b))
                 for i, b in enumerate(busy))


def gjob(jid: str, t: float, n: int, key: str = "k", iters: int = 1000, admitted_at: float | None = None) -> JobView:
    return JobView(jid, t, M, 64, n, (), "X", iters, estimate_key=key, tenant="A", priority=Priority.GUARANTEED,
                   promise=Promise(n, 8 * n, "zero-dp"), admitted_at=admitted_at)


def sized(snap: Snapshot, starve_s: float = 3600.0) -> tuple[set[str], dict[str, int]]:
    adm = admit(snap, RoundSizer(RoundContext(snap, EST, RoundConfig())), starve_s)
    return set(adm.charges), {j: c.gpus for j, c in adm.charges.items()}


def test_minres_charging_admits_two_where_promise_charging_admits_one() -> None:
    g1, g2 = gjob("g1", 0, 4, "flat"), gjob("g2", 1, 4, "flat")
    snap = Snapshot(nodes((), ()), (g1, g2), now=10, tenants=TENANTS)
    assert set(admit(snap).charges) == {"g1"}  # charged its promise: 4 of A's 4 GPUs
    assert sized(snap) == ({"g1", "g2"}, {"g1": 2, "g2": 2})  # charged minRes: 2 + 2
    d = {x.job_id: x for x in plan_round(snap, EST, make_policy("fcfs")).decisions}
    assert d["g1"].action is Action.START and d["g2"].action is Action.START  # one node each


def test_shortest_promise_first_until_a_job_waits_past_the_bound() -> None:
    long_, short = gjob("long", 0, 4, iters=1000), gjob("short", 5, 4, iters=10)
    snap = Snapshot(nodes((), ()), (long_, short), now=100, tenants=TENANTS)
    # Both need A's whole quota: the shorter promise (10 x 2 s against 1000 x 2 s) goes first.
    assert sized(snap)[0] == {"short"}
    # Past the bound the long one goes first and blocks its tenant's later jobs while it waits.
    assert sized(snap, starve_s=50.0)[0] == {"long"}
    g0 = gjob("g0", 0, 4, iters=1000)
    snap = Snapshot(nodes((0, 1, 2, 3), ()), (long_, short), running=(
        RunningView(g0, Cell("X", 4), (Slice("x0", (0, 1, 2, 3)),), since=0.0, ),), now=100, tenants=TENANTS)
    adm = admit(snap, RoundSizer(RoundContext(snap, EST, RoundConfig())), 50.0)
    assert set(adm.charges) == {"g0"}
    assert adm.over_quota["short"].startswith("waiting: its tenant A's guaranteed jobs waiting longer than 50 s")
    # Without the bound the short one would not be held behind the long one (nor admitted: no quota).
    assert "over quota" in admit(snap, RoundSizer(RoundContext(snap, EST, RoundConfig())), 1e9).over_quota["short"]


def test_a_promise_that_cannot_be_laid_out_is_not_admitted() -> None:
    quota8 = (TenantQuota("A", (("X", 8),)),)
    g1 = gjob("g1", 0, 2, iters=1000, admitted_at=0.0)
    g2 = gjob("g2", 0, 2, iters=1000, admitted_at=0.0)
    big = gjob("big", 5, 4, iters=10)
    # g1 and g2 hold 2 GPUs on each node: 4 GPUs of quota are left, but no node has 4 free.
    snap = Snapshot(nodes((0, 1), (0, 1)), (big,), running=(
        RunningView(g1, Cell("X", 2), (Slice("x0", (0, 1)),)), RunningView(g2, Cell("X", 2), (Slice("x1", (0, 1)),))),
        now=10, tenants=quota8)
    adm = admit(snap, RoundSizer(RoundContext(snap, EST, RoundConfig())), 3600.0)
    assert set(adm.charges) == {"g1", "g2"}
    assert adm.over_quota["big"].startswith("waiting: within tenant A's quota, but its minimum demand (4 x X")
    assert set(admit(snap).charges) == {"g1", "g2", "big"}  # by GPU count alone: admitted, and stuck


def test_a_waiting_guaranteed_job_borrows_as_best_effort_then_is_admitted() -> None:
    g1 = gjob("g1", 0, 4, iters=1000, admitted_at=0.0)
    g2 = gjob("g2", 5, 4, iters=1000)
    # Round 1: A's quota is held by g1; g2 runs on the idle node as best-effort (opportunistic).
    snap = Snapshot(nodes((0, 1, 2, 3), ()), (g2,), running=(
        RunningView(g1, Cell("X", 4), (Slice("x0", (0, 1, 2, 3)),)),), now=10, tenants=TENANTS)
    off = {x.job_id: x for x in plan_round(snap, EST, make_policy("fcfs")).decisions}
    assert off["g2"].action is Action.PENDING and off["g2"].pending is PendingKind.WAITING  # borrowing is off
    plan = plan_round(snap, EST, make_policy("fcfs"), BORROW)
    d = {x.job_id: x for x in plan.decisions}
    assert plan.admitted == ("g1",)
    assert d["g2"].action is Action.START and d["g2"].opportunistic
    assert d["g2"].reason.startswith("borrowing idle GPUs as best-effort until admitted (waiting: over quota")
    # Round 2: g1 has finished; g2, still a borrower (never admitted, opportunistic), is admitted
    # where it runs: its SLA clock starts now.
    g2r = RunningView(g2, d["g2"].cell or Cell("X", 4), d["g2"].slices, opportunistic=True, since=10.0)
    snap = Snapshot(nodes((), tuple(i for s in d["g2"].slices for i in s.gpu_indices)), (), running=(g2r,), now=70,
                    tenants=TENANTS)
    plan = plan_round(snap, EST, make_policy("fcfs"), BORROW)
    d2 = {x.job_id: x for x in plan.decisions}
    assert plan.admitted == ("g2",) and d2["g2"].action is Action.KEEP
    # A best-effort job under the same tenant would take g2's GPUs only as a victim: g2 is now guaranteed.
    b = JobView("b", 0, M, 64, 4, (), "X", 1000, estimate_key="k", tenant="B")
    snap = Snapshot(nodes((), tuple(i for s in d["g2"].slices for i in s.gpu_indices)), (b,), running=(g2r,), now=70,
                    tenants=TENANTS)
    d3 = {x.job_id: x for x in plan_round(snap, EST, make_policy("fcfs"), BORROW).decisions}
    assert d3["g2"].action is Action.KEEP and d3["b"].action in (Action.START, Action.PENDING)
    assert d3["b"].pending in (None, PendingKind.NO_ROOM_NOW, PendingKind.WAITING)


def test_a_promise_over_the_whole_quota_says_it_waits_for_good() -> None:
    """Refused at submission; a reloaded tenants file may still cut a quota under a waiting job's
    promise, which was told it would be admitted "when its tenant's use leaves room"."""
    big = gjob("big", 0, 4)  # "k" needs all 4 GPUs to meet a 4-GPU promise
    snap = Snapshot(nodes((), ()), (big,), now=10, tenants=(TenantQuota("A", (("X", 2),)),))
    why = admit(snap, RoundSizer(RoundContext(snap, EST, RoundConfig())), 1e9).over_quota["big"]
    assert why == ("waiting: over quota for good: this guaranteed job's promise needs 4 GPUs, more than tenant A's "
                   "whole quota (X: quota 2, charged 0); it is admitted only if the tenants file raises the quota "
                   "again: cancel it, or resubmit it with a smaller promise or as best-effort")
