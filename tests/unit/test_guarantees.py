"""Tenants, quotas and guarantees in the pure core (controller/core/guarantees.py, quotas.py): literal
snapshots, a literal table of iteration times."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import RoundConfig, RoundContext, finalize, plan_round
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    Change,
    Decision,
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
# Faster with more GPUs; a gang over two nodes is 10% slower.
EST = TableEstimates({("k", "X", n): 8.0 / n for n in (1, 2, 4, 8)}, node_slowdown=0.1)
TENANTS = (TenantQuota("A", (("X", 4),)), TenantQuota("B"))


def node(nid: str, n: int = 4, busy: Sequence[int] = ()) -> NodeView:
    return NodeView(nid, tuple(GpuView(i, "X", 40 * GB) for i in range(n)), frozenset(busy))


def job(jid: str, t: float, n: int, tenant: str = "B", guaranteed: bool = False, done: float = 0.0) -> JobView:
    prio = Priority.GUARANTEED if guaranteed else Priority.BEST_EFFORT
    promise = Promise(n, 8 * n, "zero-dp") if guaranteed else None
    return JobView(jid, t, M, 64, n, (), "X", 1000, done, estimate_key="k", tenant=tenant, priority=prio,
                   promise=promise)


def running(j: JobView, nid: str, idx: Sequence[int], since: float = 0.0) -> RunningView:
    return RunningView(j, Cell("X", len(idx)), (Slice(nid, tuple(idx)),), since=since)


def busy_nodes(*specs: tuple[str, Sequence[int]]) -> tuple[NodeView, ...]:
    return tuple(node(nid, busy=b) for nid, b in specs)


def by_id(snap: Snapshot, policy: str = "fcfs") -> dict[str, Decision]:
    plan = plan_round(snap, EST, make_policy(policy))
    return {d.job_id: d for d in plan.decisions}


class Scripted:
    """A policy that returns the decisions it is given (to put a guaranteed job below its promise).
    It decides for the admitted jobs itself (`places_admitted`), so that these tests check the
    repair of a policy's decisions (controller/core/preplace.py otherwise places them first)."""

    name = "scripted"
    places_admitted = True

    def __init__(self, decisions: Sequence[Decision]) -> None:
        self.ds = list(decisions)

    def plan(self, ctx: RoundContext) -> list[Decision]:
        return list(self.ds)


class Handling(Scripted):
    """A scripted policy that says it handles guarantees itself (may grow guaranteed jobs)."""

    handles_guarantees = True


def test_a_guaranteed_job_preempts_best_effort_work_and_starts_at_once() -> None:
    be = job("be", 0, 4)
    g = job("g", 5, 4, "A", guaranteed=True)
    snap = Snapshot(busy_nodes(("x0", (0, 1, 2, 3))), (g,), running=(running(be, "x0", (0, 1, 2, 3)),),
                    now=100, tenants=TENANTS)
    plan = plan_round(snap, EST, make_policy("fcfs"))
    d = {x.job_id: x for x in plan.decisions}
    assert d["be"].action is Action.STOP
    assert d["be"].reason.startswith("preempted: guaranteed job g of tenant A reclaims 4 x X of its quota")
    assert d["g"].action is Action.START and d["g"].cell == Cell("X", 4)
    assert d["g"].slices == (Slice("x0", (0, 1, 2, 3)),)
    assert "admitted within quota (0 of 4 x X in use before it)" in d["g"].reason
    assert plan.admitted == ("g",)


def test_the_fewest_and_cheapest_victims() -> None:
    # x0: two 2-GPU jobs, x1: one 4-GPU job. A 2-GPU promise takes 2 GPUs from one job: halving the
    # 4-GPU one (it goes on with 2) costs less than preempting a 2-GPU one.
    a, b, c = job("a", 0, 2), job("b", 1, 2), job("c", 2, 4)
    g = job("g", 5, 2, "A", guaranteed=True)
    snap = Snapshot(busy_nodes(("x0", (0, 1, 2, 3)), ("x1", (0, 1, 2, 3))), (g,),
                    running=(running(a, "x0", (0, 1)), running(b, "x0", (2, 3)), running(c, "x1", (0, 1, 2, 3))),
                    now=100, tenants=(TenantQuota("A", (("X", 8),)), TenantQuota("B")))
    d = by_id(snap)
    assert not [k for k, x in d.items() if x.action is Action.STOP]
    assert d["c"].action is Action.MIGRATE and d["c"].change is Change.SCALE_DOWN
    assert d["c"].slices == (Slice("x1", (0, 1)),) and d["c"].reason.startswith(
        "shrunk: guaranteed job g of tenant A reclaims 2 x X of its quota")
    assert d["g"].action is Action.START and d["g"].slices == (Slice("x1", (2, 3)),)
    assert d["a"].action is Action.KEEP and d["b"].action is Action.KEEP
    # 8 GPUs over both nodes: everything goes, but a 4-GPU promise needs only the one 4-GPU job.
    g4 = job("g", 5, 4, "A", guaranteed=True)
    d = by_id(Snapshot(snap.nodes, (g4,), running=snap.running, now=100, tenants=snap.tenants))
    assert sorted(k for k, x in d.items() if x.action is Action.STOP) == ["c"]


def test_best_effort_borrows_idle_quota_and_a_guaranteed_job_reclaims_it() -> None:
    # 8 GPUs, tenant A guarantees 4: best-effort work may use all 8 while A is idle...
    snap = Snapshot(busy_nodes(("x0", ()), ("x1", ())), (job("b1", 0, 4), job("b2", 1, 4)), now=0,
                    tenants=TENANTS)
    d = by_id(snap)
    assert d["b1"].action is Action.START and d["b2"].action is Action.START
    # ...and when A's guaranteed job comes, the borrower (the newer placement) gives it back.
    b1, b2 = job("b1", 0, 4), job("b2", 1, 4)
    g = job("g", 50, 4, "A", guaranteed=True)
    snap = Snapshot(busy_nodes(("x0", (0, 1, 2, 3)), ("x1", (0, 1, 2, 3))), (g,),
                    running=(running(b1, "x0", (0, 1, 2, 3), since=0), running(b2, "x1", (0, 1, 2, 3), since=60)),
                    now=120, tenants=TENANTS)
    d = by_id(snap)
    assert d["b2"].action is Action.STOP and "reclaims 4 x X of its quota" in d["b2"].reason
    assert d["b1"].action is Action.KEEP
    assert d["g"].action is Action.START and d["g"].slices == (Slice("x1", (0, 1, 2, 3)),)


def test_an_admitted_job_is_placed_before_the_policy_plans() -> None:
    """controller/core/preplace.py: fcfs would start `be`, earlier in its queue, on the only node;
    the admitted guaranteed job is placed first, and fcfs plans what is left."""
    be = job("be", 0, 4)
    g = job("g", 5, 4, "A", guaranteed=True)
    d = by_id(Snapshot(busy_nodes(("x0", ())), (be, g), now=10, tenants=TENANTS))
    assert d["g"].action is Action.START and d["g"].reason.endswith("placed at its promise before fcfs plans the round")
    assert d["be"].action is Action.PENDING and d["be"].reason == "fcfs: waiting for 4 x X: free now: 0/4 X"


def test_a_job_the_policy_would_start_waits_when_its_gpus_are_reclaimed() -> None:
    """The repair after a policy that handles guarantees (no placement before it): a job it was
    about to start on the GPUs a guaranteed job needs waits."""
    be = job("be", 0, 4)
    g = job("g", 5, 4, "A", guaranteed=True)
    policy = Handling([Decision("be", Action.START, "scripted", None, (Slice("x0", (0, 1, 2, 3)),), Cell("X", 4))])
    plan = plan_round(Snapshot(busy_nodes(("x0", ())), (be, g), now=10, tenants=TENANTS), EST, policy)
    d = {x.job_id: x for x in plan.decisions}
    assert d["g"].action is Action.START
    assert d["be"].action is Action.PENDING and d["be"].pending is PendingKind.NO_ROOM_NOW
    assert d["be"].reason == ("waiting: scripted would have started it, but guaranteed job g of tenant A reclaims "
                              "4 x X of its quota")


def test_a_job_the_policy_would_start_reads_where_it_would_have_run_not_from_this_job() -> None:
    """It holds nothing yet: "1 of them from this job" was said of a job stopped the round before
    (a live audit, under gandiva)."""
    be = job("be", 0, 1)
    g = job("g", 5, 2, "A", guaranteed=True)
    policy = Handling([Decision("be", Action.START, "scripted", None, (Slice("x0", (0,)),), Cell("X", 1))])
    plan = plan_round(Snapshot(busy_nodes(("x0", (2, 3))), (be, g), now=10, tenants=TENANTS), EST, policy)
    d = {x.job_id: x for x in plan.decisions}
    assert d["g"].action is Action.START
    assert d["be"].reason == ("waiting: scripted would have started it, but guaranteed job g of tenant A reclaims "
                              "2 x X of its quota, 1 of them where it would have run")


def test_a_guaranteed_job_over_quota_waits_with_the_reason() -> None:
    g1 = job("g1", 0, 4, "A", guaranteed=True)
    g2 = job("g2", 5, 2, "A", guaranteed=True)
    snap = Snapshot(busy_nodes(("x0", (0, 1, 2, 3)), ("x1", ())), (g2,), running=(running(g1, "x0", (0, 1, 2, 3)),),
                    now=10, tenants=TENANTS)
    plan = plan_round(snap, EST, make_policy("fcfs"))
    d = {x.job_id: x for x in plan.decisions}
    assert d["g1"].action is Action.KEEP
    # 4 GPUs are free, but A's guaranteed jobs use its whole quota: g2 waits, not run best-effort.
    assert d["g2"].action is Action.PENDING and d["g2"].pending is PendingKind.WAITING
    assert d["g2"].reason.startswith("waiting: over quota: tenant A's guaranteed jobs use its quota "
                                     "(X: quota 4, charged 4); this guaranteed job's promise needs 2 GPUs")
    assert plan.admitted == ("g1",)
    # A tenant with no quota at all: every guaranteed job of it waits.
    gb = job("gb", 0, 1, "B", guaranteed=True)
    d = by_id(Snapshot(busy_nodes(("x0", ())), (gb,), tenants=TENANTS))
    assert d["gb"].action is Action.PENDING and "X: quota 0, charged 0" in d["gb"].reason


def test_an_unknown_tenant_is_best_effort() -> None:
    u = job("u", 0, 4, "nobody", guaranteed=True)
    be = job("be", 0, 4)
    snap = Snapshot(busy_nodes(("x0", (0, 1, 2, 3))), (u,), running=(running(be, "x0", (0, 1, 2, 3)),),
                    tenants=TENANTS)
    plan = plan_round(snap, EST, make_policy("fcfs"))
    d = {x.job_id: x for x in plan.decisions}
    assert d["be"].action is Action.KEEP and d["u"].action is Action.PENDING and plan.admitted == ()


def test_a_guaranteed_job_is_never_placed_below_its_promise() -> None:
    g = job("g", 0, 4, "A", guaranteed=True)
    nodes = busy_nodes(("x0", ()), ("x1", ()))
    # The policy starts it on 2 GPUs (4 s/iter; its promise, 4 GPUs on one node, gives 2 s/iter).
    low = Decision("g", Action.START, "scripted", slices=(Slice("x0", (0, 1)),), cell=Cell("X", 2), iteration_s=4.0)
    d = {x.job_id: x for x in plan_round(Snapshot(nodes, (g,), tenants=TENANTS), EST, Scripted([low])).decisions}
    assert d["g"].action is Action.START and d["g"].cell == Cell("X", 4) and len(d["g"].slices) == 1
    assert "slower than its promise gives 2 s/iter" in d["g"].reason
    # Spread over two nodes (2.2 s/iter) is slower too: the layer gathers it on one node.
    spread = Decision("g", Action.START, "scripted", slices=(Slice("x0", (0, 1)), Slice("x1", (0, 1))),
                      cell=Cell("X", 4), iteration_s=2.2)
    d = {x.job_id: x for x in plan_round(Snapshot(nodes, (g,), tenants=TENANTS), EST, Scripted([spread])).decisions}
    assert d["g"].slices == (Slice("x0", (0, 1, 2, 3)),)
    # 8 GPUs are faster, but hold more than the promise: the 4 GPUs over it go to best-effort work...
    fast = Decision("g", Action.START, "scripted", slices=(Slice("x0", (0, 1, 2, 3)), Slice("x1", (0, 1, 2, 3))),
                    cell=Cell("X", 8), iteration_s=1.1)
    d = {x.job_id: x for x in plan_round(Snapshot(nodes, (g,), tenants=TENANTS), EST, Scripted([fast])).decisions}
    assert d["g"].cell == Cell("X", 4) and "more than its promise's 4 GPUs" in d["g"].reason
    # ...unless the policy handles guarantees itself: its choice stands, untouched but for its reason,
    # which says the job is guaranteed (controller/core/guarantee_notes.py).
    d = {x.job_id: x for x in plan_round(Snapshot(nodes, (g,), tenants=TENANTS), EST, Handling([fast])).decisions}
    assert d["g"] == dataclasses.replace(fast, reason="scripted; guaranteed (tenant A): over its promise of 4 x X; "
                                         "admitted within quota (0 of 4 x X in use before it)")


def test_a_running_guaranteed_job_keeps_its_promise_and_moves_only_with_slack() -> None:
    nodes = busy_nodes(("x0", (0, 1, 2, 3)), ("x1", ()))
    # Admitted at 0 on its promise (2 s/iter); at 1000 s it has done 370 iterations (a 260 s restart).
    g = job("g", 0, 4, "A", guaranteed=True, done=370)
    run = running(g, "x0", (0, 1, 2, 3))
    half = Decision("g", Action.MIGRATE, "scripted", slices=(Slice("x0", (0, 1)),), cell=Cell("X", 2),
                    previous=Cell("X", 4), change=Change.SCALE_DOWN, iteration_s=4.0)
    be = job("be", 1, 2)
    take = Decision("be", Action.START, "scripted", slices=(Slice("x0", (2, 3)),), cell=Cell("X", 2), iteration_s=4.0)
    snap = Snapshot(nodes, (be,), running=(run,), now=1000, tenants=TENANTS)
    d = {x.job_id: x for x in plan_round(snap, EST, Scripted([half, take])).decisions}
    assert d["g"].action is Action.KEEP and d["g"].slices == run.slices
    assert d["be"].action is Action.PENDING  # the GPUs it was given are the guaranteed job's
    # Scaling up to 8 GPUs (1.1 s/iter) is faster, but the restart would put it behind: kept.
    up = Decision("g", Action.MIGRATE, "scripted", slices=(Slice("x0", (0, 1, 2, 3)), Slice("x1", (0, 1, 2, 3))),
                  cell=Cell("X", 8), previous=Cell("X", 4), change=Change.SCALE_UP, iteration_s=1.1)
    d = {x.job_id: x for x in plan_round(Snapshot(nodes, (), running=(run,), now=1000, tenants=TENANTS), EST,
                                         Handling([up])).decisions}
    assert d["g"].action is Action.KEEP and "no slack" in d["g"].reason
    # Ahead of its promise (500 done >= 1000 s / 2 s): the move stands.
    ahead = running(job("g", 0, 4, "A", guaranteed=True, done=500), "x0", (0, 1, 2, 3))
    d = {x.job_id: x for x in plan_round(Snapshot(nodes, (), running=(ahead,), now=1000, tenants=TENANTS), EST,
                                         Handling([up])).decisions}
    assert d["g"] == up
    # The policy stops it: kept where it is.
    stop = Decision("g", Action.STOP, "scripted: opportunistic")
    d = {x.job_id: x for x in plan_round(Snapshot(nodes, (), running=(run,), now=1000, tenants=TENANTS), EST,
                                         Scripted([stop])).decisions}
    assert d["g"].action is Action.KEEP


GOLDEN = [("r", Action.KEEP, Cell("X", 2), (Slice("x0", (0, 1)),)),
          ("a", Action.START, Cell("X", 2), (Slice("x0", (2, 3)),)),
          ("b", Action.START, Cell("X", 4), (Slice("x1", (0, 1, 2, 3)),)),
          ("c", Action.PENDING, None, ())]


def test_without_tenants_the_decisions_are_the_policys_own() -> None:
    jobs = (job("a", 1, 2, "A", guaranteed=True), job("b", 2, 4), job("c", 3, 4))
    snap = Snapshot(busy_nodes(("x0", (0, 1)), ("x1", ())), jobs, running=(running(job("r", 0, 2), "x0", (0, 1)),))
    for name in ("fcfs", "crius", "sia"):
        pol = make_policy(name)
        ctx = RoundContext(snap, EST, RoundConfig())
        own = finalize(ctx, pol.plan(ctx), pol.name)
        assert plan_round(snap, EST, make_policy(name)) == own
    got = [(d.job_id, d.action, d.cell, d.slices) for d in plan_round(snap, EST, make_policy("fcfs")).decisions]
    assert got == GOLDEN


def test_a_running_guaranteed_job_keeps_its_gpus_when_the_policy_hands_them_to_another() -> None:
    # g1 runs on x0 at its promise; the policy stops it and starts guaranteed g2 there instead.
    tenants = (TenantQuota("A", (("X", 8),)),)
    g1, g2 = job("g1", 0, 4, "A", guaranteed=True), job("g2", 5, 4, "A", guaranteed=True)
    stop = Decision("g1", Action.STOP, "scripted")
    swap = Decision("g2", Action.START, "scripted", slices=(Slice("x0", (0, 1, 2, 3)),), cell=Cell("X", 4),
                    iteration_s=2.0)
    snap = Snapshot(busy_nodes(("x0", (0, 1, 2, 3)), ("x1", ())), (g2,), running=(running(g1, "x0", (0, 1, 2, 3)),),
                    now=100, tenants=tenants)
    d = {x.job_id: x for x in plan_round(snap, EST, Scripted([stop, swap])).decisions}
    assert d["g1"].action is Action.KEEP and d["g1"].slices == (Slice("x0", (0, 1, 2, 3)),)
    assert d["g2"].action is Action.START and d["g2"].slices == (Slice("x1", (0, 1, 2, 3)),)
    assert "its GPUs stay with guaranteed job g1" in d["g2"].reason


def test_fewer_gpus_as_fast_as_the_promise_are_its_minimum_demand() -> None:
    # This model runs as fast on 2 GPUs as on 4 (Morphling's minRes): with 2 GPUs free it starts there.
    est = TableEstimates({("k2", "X", 2): 2.0, ("k2", "X", 4): 2.0})
    g = JobView("g", 0, M, 64, 4, (), "X", 1000, estimate_key="k2", tenant="A", priority=Priority.GUARANTEED,
                promise=Promise(4))
    snap = Snapshot(busy_nodes(("x0", (0, 1))), (g,), now=10, tenants=TENANTS)
    d = {x.job_id: x for x in plan_round(snap, est, Scripted([])).decisions}
    assert d["g"].action is Action.START and d["g"].cell == Cell("X", 2)
    assert "as fast as its promise of 4 x X by the estimates" in d["g"].reason


def test_a_promise_without_a_type_counts_against_the_type_the_job_runs_on() -> None:
    est = TableEstimates({("k", t, n): 8.0 / n for t in ("X", "Y") for n in (1, 2, 4)})
    nodes = (node("x0"), NodeView("y0", tuple(GpuView(i, "Y", 40 * GB) for i in range(4))))
    tenants = (TenantQuota("A", (("Y", 4),)),)  # A's quota is on Y only

    def g(jid: str) -> JobView:
        return JobView(jid, 0, M, 64, 4, (), "", 1000, estimate_key="k", tenant="A",
                       priority=Priority.GUARANTEED, promise=Promise(4))

    # The policy starts it on X, where A has no quota: the layer moves it to Y.
    on_x = Decision("g", Action.START, "scripted", slices=(Slice("x0", (0, 1, 2, 3)),), cell=Cell("X", 4),
                    iteration_s=2.0)
    d = {x.job_id: x for x in plan_round(Snapshot(nodes, (g("g"),), tenants=tenants), est,
                                         Scripted([on_x])).decisions}
    assert d["g"].cell == Cell("Y", 4) and "where its tenant has no quota left" in d["g"].reason
    # A second one is over quota on every type it may use.
    plan = plan_round(Snapshot(nodes, (g("g"), g("h")), tenants=tenants), est, make_policy("fcfs"))
    d = {x.job_id: x for x in plan.decisions}
    assert d["g"].cell == Cell("Y", 4) and d["h"].action is Action.PENDING
    assert "X: quota 0, charged 0; Y: quota 4, charged 4" in d["h"].reason


def test_random_rounds_keep_every_admitted_promise_or_say_why() -> None:
    """Seeded random snapshots under several policies: the plan is valid (finalize checks it), and
    every admitted guaranteed job is placed as fast as its promise or its reason says why not."""
    import random

    rng = random.Random(7)
    tenants = (TenantQuota("A", (("X", 8),)), TenantQuota("B"))
    for trial in range(40):
        nodes_free = {f"x{i}": list(range(4)) for i in range(3)}
        run: list[RunningView] = []
        for k in range(rng.randint(0, 5)):
            n = rng.choice((1, 2, 4))
            nid = rng.choice(sorted(nodes_free))
            if len(nodes_free[nid]) < n:
                continue
            idx, nodes_free[nid] = nodes_free[nid][:n], nodes_free[nid][n:]
            guar = rng.random() < 0.4
            j = job(f"r{k}", k, n, "A" if guar else "B", guaranteed=guar, done=rng.choice((0.0, 500.0)))
            run.append(running(j, nid, idx, since=float(k)))
        pend = [job(f"p{k}", 10 + k, rng.choice((1, 2, 4)), rng.choice(("A", "B", "C")),
                    guaranteed=rng.random() < 0.5) for k in range(rng.randint(0, 5))]
        busy = tuple(node(nid, busy=[i for i in range(4) if i not in free]) for nid, free in nodes_free.items())
        snap = Snapshot(busy, tuple(pend), running=tuple(run), now=1000.0, tenants=tenants)
        for name in ("fcfs", "crius", "gandiva"):
            plan = plan_round(snap, EST, make_policy(name))
            d = {x.job_id: x for x in plan.decisions}
            for jid in plan.admitted:
                x = d[jid]
                n = {j.id: j for j in (*pend, *(r.job for r in run))}[jid].promise.gpus  # type: ignore[union-attr]
                if x.action in (Action.START, Action.KEEP, Action.MIGRATE):
                    held = sum(len(s.gpu_indices) for s in x.slices)
                    fast = EST.cells(job("t", 0, held), "X", held, len(x.slices))[0].iteration_s <= 8.0 / n
                    assert fast or "no best-effort work" in x.reason or "no room" in x.reason, (trial, name, x)
                else:
                    assert "guaranteed" in x.reason, (trial, name, x)
