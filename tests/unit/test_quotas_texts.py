"""What the tenants' admission and the guarantee layer say (controller/core/quotas.py,
guarantees.py, guarantee_notes.py), on literal snapshots: whose guaranteed jobs keep a job within
quota from its layout, a running guaranteed job its tenant's quota no longer covers, what a victim
gives up, a start below a promise the estimates cannot time. Each case was a live audit's finding."""

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
EST = TableEstimates({("k", "X", n): 8.0 / n for n in (1, 2, 4)}, node_slowdown=0.1)


def node(nid: str, n: int, busy: tuple[int, ...] = ()) -> NodeView:
    return NodeView(nid, tuple(GpuView(g, "X", 40 * GB) for g in range(n)), frozenset(busy))


def gjob(jid: str, tenant: str, n: int, t: float = 0.0) -> JobView:
    return JobView(jid, t, M, 64, n, (), "X", 1000, estimate_key="k", tenant=tenant, priority=Priority.GUARANTEED,
                   promise=Promise(n, 0, "", "X"))


def bjob(jid: str, tenant: str, n: int) -> JobView:
    return JobView(jid, 0.0, M, 64, n, (), "X", 1000, estimate_key="k", tenant=tenant)


def run(j: JobView, nid: str, gpus: tuple[int, ...], since: float = 0.0) -> RunningView:
    return RunningView(j, Cell("X", len(gpus)), (Slice(nid, gpus),), since=since)


def layout_reason(snap: Snapshot, jid: str) -> str:
    return admit(snap, RoundSizer(RoundContext(snap, EST, RoundConfig())), 3600.0).over_quota[jid]


def test_the_layout_wait_says_whose_guaranteed_jobs_hold_the_gpus() -> None:
    """team-c's guaranteed job holds the 2 GPUs of a 2-GPU cluster, on which quotas sum to 4: alice's
    job within team-a's quota read "beside the GPUs its tenant's admitted guaranteed jobs hold"."""
    tenants = (TenantQuota("team-a", (("X", 2),)), TenantQuota("team-c", (("X", 2),)))
    carol = run(gjob("c1", "team-c", 2), "n1", (0, 1))
    snap = Snapshot((node("n1", 2, (0, 1)),), (gjob("a1", "team-a", 2, 5.0),), running=(carol,), now=10,
                    tenants=tenants, cluster_gpus=(("X", 40 * GB, 2),))
    assert layout_reason(snap, "a1") == (
        "waiting: within tenant team-a's quota, but its minimum demand (2 x X on the fewest nodes as fast as its "
        "promise) cannot be laid out beside the GPUs other tenants' admitted guaranteed jobs hold; the tenants' "
        "quotas of X sum to 4, more than the 2 the cluster has (oversubscribed): a job within its tenant's quota "
        "may wait for other tenants' guaranteed jobs; it is admitted when they leave room")
    # Jobs of both hold them (the quotas over the cluster again).
    tenants = (TenantQuota("team-a", (("X", 4),)), TenantQuota("team-c", (("X", 1),)))
    held = (run(gjob("a0", "team-a", 1), "n1", (0,)), run(gjob("c1", "team-c", 1), "n2", (0,)))
    snap = Snapshot((node("n1", 1, (0,)), node("n2", 1, (0,))), (gjob("a1", "team-a", 1, 5.0),), running=held,
                    now=10, tenants=tenants)
    assert layout_reason(snap, "a1").endswith(
        "cannot be laid out beside the GPUs its tenant's and other tenants' admitted guaranteed jobs hold; the tenants' "
        "quotas of X sum to 5, more than the 2 the cluster has (oversubscribed): a job within its tenant's quota may "
        "wait for other tenants' guaranteed jobs; it is admitted when they leave room")
    # Its own tenant's alone: as before, and nothing of oversubscription.
    snap = Snapshot(snap.nodes, snap.pending, running=held[:1] + (run(gjob("a2", "team-a", 1), "n2", (0,)),), now=10,
                    tenants=(TenantQuota("team-a", (("X", 3),)), TenantQuota("team-c")))
    assert layout_reason(snap, "a1").endswith("cannot be laid out beside the GPUs its tenant's admitted guaranteed "
                                              "jobs hold; it is admitted when they leave room")


def test_a_running_guaranteed_job_over_its_cut_quota_says_it_runs_as_best_effort() -> None:
    """team-a's quota cut from 2 to 1 under its guaranteed job of 2: it counts as best-effort, and its
    reason and its preemption's say why (a live audit read "guaranteed", "training", and then a
    preemption that looked like another tenant breaking its guarantee)."""
    tenants = (TenantQuota("team-a", (("X", 1),)), TenantQuota("team-c", (("X", 2),)))
    alice = run(gjob("a1", "team-a", 2), "n1", (0, 1))
    snap = Snapshot((node("n1", 2, (0, 1)),), (), running=(alice,), now=10, tenants=tenants,
                    cluster_gpus=(("X", 40 * GB, 2),))
    adm = admit(snap, RoundSizer(RoundContext(snap, EST, RoundConfig())), 3600.0)
    why = "running as best-effort: tenant team-a's quota (1 x X) no longer covers its promise (2 x X)"
    assert adm.charges == {} and adm.unguarded == {"a1": why}
    kept = {d.job_id: d for d in plan_round(snap, EST, make_policy("fcfs")).decisions}["a1"]
    assert kept.action is Action.KEEP and kept.reason == f"fcfs: running in 2 x X; {why}"
    # team-c's guaranteed job within its quota takes the GPUs back: the victim's text says it ran so.
    snap = Snapshot(snap.nodes, (gjob("c1", "team-c", 2, 5.0),), running=(alice,), now=10, tenants=tenants,
                    cluster_gpus=snap.cluster_gpus)
    d = {x.job_id: x for x in plan_round(snap, EST, make_policy("crius")).decisions}
    assert d["c1"].action is Action.START
    assert d["a1"].action is Action.STOP and d["a1"].reason == (
        "preempted: guaranteed job c1 of tenant team-c reclaims 2 x X of its quota (it ran as best-effort: tenant "
        "team-a's quota (1 x X) no longer covers its promise (2 x X)); back to the queue from its checkpoint")


def test_a_victim_reads_what_it_gives_up_of_the_reclaimed_gpus() -> None:
    """Under sia a victim holding 1 GPU read "reclaims 2 x A100-80GB", the other GPU being free."""
    tenants = (TenantQuota("A", (("X", 2),)), TenantQuota("B"))
    snap = Snapshot((node("n1", 2, (0,)),), (gjob("g", "A", 2, 5.0),), running=(run(bjob("b", "B", 1), "n1", (0,)),),
                    now=10, tenants=tenants)
    d = {x.job_id: x for x in plan_round(snap, EST, make_policy("sia")).decisions}
    assert d["g"].action is Action.START and d["b"].action is Action.STOP
    assert d["b"].reason == ("preempted: guaranteed job g of tenant A reclaims 2 x X of its quota, 1 of them from this "
                             "job; back to the queue from its checkpoint")
    assert "; preempts best-effort job b;" in d["g"].reason


def test_a_guaranteed_start_below_an_untimed_promise_says_it_is_not_held_to_it() -> None:
    """Promised 4 x X with 2 registered and no estimate of 4 GPUs: admitted, not held to a speed, and
    crius starts it on 2. A live audit read a plain "crius: Cell 2 x A40-48GB ..."."""
    est = TableEstimates({("k", "X", n): 8.0 / n for n in (1, 2)})
    snap = Snapshot((node("n1", 2),), (gjob("g", "A", 4),), now=10, tenants=(TenantQuota("A", (("X", 4),)),),
                    cluster_gpus=(("X", 40 * GB, 2),))
    d = {x.job_id: x for x in plan_round(snap, est, make_policy("crius")).decisions}["g"]
    assert d.action is Action.START and d.reason.startswith("crius: Cell 2 x X")
    assert d.reason.endswith("; guaranteed (tenant A): below its promise of 4 x X (the cluster has 2 registered), "
                             "not held to a speed: no estimate of its promise; admitted within quota (0 of 4 x X in "
                             "use before it)")
