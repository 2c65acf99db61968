"""A cooling tenant's pending guaranteed jobs preempt, shrink or move nobody (controller/core/churn.py
`hold_back`; docs/tenants.md, "Churn guard"): shown to the policy as best-effort, a policy made room
for one as for any best-effort job (a live audit: crius shrank another tenant's running job for it
at once, morphling for its slope, and its PLACED said "started as best-effort on free GPUs")."""

from __future__ import annotations

import dataclasses

import pytest

from tessera.controller.core.churn import ChurnConfig, Ledger, after_round, demote
from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import plan_round
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    Decision,
    GpuView,
    JobView,
    NodeView,
    Priority,
    Promise,
    RoundPlan,
    RunningView,
    Slice,
    Snapshot,
    TenantQuota,
)
from tessera.estimator.models import ModelDims

GB = 1000**3
M = ModelDims(1024, 24, 16, 32000, 1024, "m")
# Little gained past 2 GPUs: a policy finds halving a running job worth it for a waiting one.
EST = TableEstimates({("k", "X", 1): 8.0, ("k", "X", 2): 7.0, ("k", "X", 4): 6.8}, node_slowdown=0.1)
TENANTS = (TenantQuota("A", (("X", 2),)), TenantQuota("B"))


def job(jid: str, tenant: str, guaranteed: bool, gpus: int = 2) -> JobView:
    return JobView(jid, 10.0, M, 64, gpus, (), "X", 1000, 0.0, estimate_key="k", tenant=tenant,
                   priority=Priority.GUARANTEED if guaranteed else Priority.BEST_EFFORT,
                   promise=Promise(gpus, 0, "", "X") if guaranteed else None)


def on(nid: str, *gpus: int) -> tuple[Slice, ...]:
    return (Slice(nid, gpus),)


def cooling() -> Ledger:
    ledger = Ledger(ChurnConfig(limit=1))
    ledger.started("old", "A", 0.0, preempting=True)
    assert ledger.ended("old", 5.0)  # tenant A cools off until 3,605
    return ledger


@pytest.mark.parametrize("policy", ["crius", "morphling"])
def test_the_policy_shrinks_nobody_for_a_cooling_tenants_job(policy: str) -> None:
    """The audit's case: bob's best-effort job runs on the 2 GPUs, alice's guaranteed job waits while
    team-a cools off. The policy halves bob's job for it; the guard keeps bob's job whole."""
    bob = RunningView(job("b", "B", False), Cell("X", 2), on("n1", 0, 1))
    nodes = (NodeView("n1", tuple(GpuView(i, "X", 40 * GB) for i in range(2)), frozenset({0, 1})),)
    snap = Snapshot(nodes, (job("g", "A", True),), now=100.0, running=(bob,), tenants=TENANTS)
    ledger = cooling()
    shown, notes = demote(snap, ledger)
    plan = plan_round(shown, EST, make_policy(policy))
    first = {d.job_id: d for d in plan.decisions}
    assert (first["b"].action, first["g"].action) == (Action.MIGRATE, Action.START)  # what the policy does
    out = {d.job_id: d for d in after_round(ledger, plan, shown, notes).decisions}
    assert out["b"].action is Action.KEEP and out["b"].slices == bob.slices and out["b"].cell == bob.cell
    assert out["g"].action is Action.PENDING
    assert out["g"].reason == (f"{notes['g']}; meanwhile best-effort: waiting: {policy} would have started it on 1 x X "
                               "by shrinking b, but while its tenant cools off it starts on free GPUs only")
    assert ledger.demoted == set() and "g" not in ledger.starts


def test_a_victim_keeps_its_gpus_unless_another_job_lands_on_them() -> None:
    runs = {"p": RunningView(job("p", "B", False), Cell("X", 2), on("n1", 0, 1)),
            "s": RunningView(job("s", "B", False), Cell("X", 4), on("n2", 0, 1, 2, 3)),
            "m": RunningView(job("m", "B", False), Cell("X", 2), on("n3", 0, 1)),
            "o": RunningView(job("o", "B", False), Cell("X", 2), on("n4", 0, 1))}
    snap = Snapshot((), (job("g1", "A", False), job("g2", "A", False), job("g3", "A", False), job("g4", "A", False),
                         job("x", "B", False)), now=100.0, running=tuple(runs.values()), tenants=TENANTS)
    plan = RoundPlan((
        Decision("p", Action.STOP, "preempted"),
        Decision("g1", Action.START, "fcfs: 2 x X on n1", slices=on("n1", 0, 1), cell=Cell("X", 2)),
        Decision("s", Action.MIGRATE, "halved", slices=on("n2", 0, 1), cell=Cell("X", 2)),
        Decision("g2", Action.START, "fcfs: 1 x X on n2", slices=on("n2", 2), cell=Cell("X", 1)),
        Decision("x", Action.START, "fcfs: 1 x X on n2", slices=on("n2", 3), cell=Cell("X", 1)),  # not demoted
        Decision("m", Action.MIGRATE, "moved", slices=on("n5", 0, 1), cell=Cell("X", 2)),
        Decision("g3", Action.START, "fcfs: 2 x X on n3", slices=on("n3", 0, 1), cell=Cell("X", 2)),
        Decision("o", Action.KEEP, "running", slices=on("n4", 0, 1)),
        Decision("g4", Action.START, "fcfs: 2 x X on n6", slices=on("n6", 0, 1), cell=Cell("X", 2))),
        policy="fcfs")
    notes = {j: "cooling" for j in ("g1", "g2", "g3", "g4")}
    out = {d.job_id: d for d in after_round(cooling(), plan, snap, notes).decisions}
    assert {j: out[j].action for j in ("g1", "g2", "g3", "g4", "x")} == {
        "g1": Action.PENDING, "g2": Action.PENDING, "g3": Action.PENDING, "g4": Action.START, "x": Action.START}
    assert out["g1"].reason == ("cooling; meanwhile best-effort: waiting: fcfs would have started it on 2 x X by "
                                "preempting p, but while its tenant cools off it starts on free GPUs only")
    assert "by moving m" in out["g3"].reason
    # p and m keep their GPUs; s stays halved, as x (whose tenant may preempt) starts on what it gave up.
    assert (out["p"].action, out["p"].slices, out["m"].action, out["m"].slices) == (
        Action.KEEP, runs["p"].slices, Action.KEEP, runs["m"].slices)
    assert out["s"] == plan.decisions[2] and out["o"] == plan.decisions[7]
    assert out["g4"].reason == "cooling; started as best-effort on free GPUs: fcfs: 2 x X on n6"  # nothing taken


def test_a_start_on_free_gpus_goes_ahead_and_says_so() -> None:
    ledger = cooling()
    snap = Snapshot((), (job("g", "A", True),), now=100.0, tenants=TENANTS)
    shown, notes = demote(snap, ledger)
    plan = RoundPlan((Decision("g", Action.START, "crius: Cell 2 x X on node n1", slices=on("n1", 0, 1),
                               cell=Cell("X", 2)),), policy="crius")
    out = after_round(ledger, plan, shown, notes)
    assert out.decisions[0].action is Action.START
    assert out.decisions[0].reason.endswith("(churn guard); started as best-effort on free GPUs: crius: Cell 2 x X on node n1")
    assert ledger.demoted == {"g"}
    assert dataclasses.replace(out, decisions=plan.decisions) == plan


def test_a_running_job_started_while_cooling_grows_onto_free_gpus_only() -> None:
    """A cooling tenant's job that started as best-effort on free GPUs could then grow by shrinking
    another tenant's job the next round: the guard held back only starts."""
    ledger = cooling()
    ledger.demoted.add("g")
    runs = {"g": RunningView(job("g", "A", False, gpus=1), Cell("X", 1), on("n1", 0)),
            "b": RunningView(job("b", "B", False), Cell("X", 2), on("n1", 1, 2)),
            "h": RunningView(job("h", "A", False, gpus=1), Cell("X", 1), on("n2", 0))}
    snap = Snapshot((), (), now=100.0, running=tuple(runs.values()), tenants=TENANTS)
    plan = RoundPlan((
        Decision("b", Action.MIGRATE, "halved", slices=on("n1", 1), cell=Cell("X", 1)),
        Decision("g", Action.MIGRATE, "grown", slices=on("n1", 0, 2), cell=Cell("X", 2)),
        Decision("h", Action.MIGRATE, "grown", slices=on("n2", 0, 1), cell=Cell("X", 2))), policy="morphling")
    out = {d.job_id: d for d in after_round(ledger, plan, snap, {}).decisions}
    assert (out["g"].action, out["g"].slices, out["g"].cell) == (Action.KEEP, runs["g"].slices, Cell("X", 1))
    assert out["g"].reason == ("morphling: running in 1 x X; it would have grown to 2 x X by shrinking b, but while "
                               "its tenant cools off it grows and moves onto free GPUs only")
    assert (out["b"].action, out["b"].slices) == (Action.KEEP, runs["b"].slices)
    assert out["h"] == plan.decisions[2]  # not started while cooling; onto a free GPU anyway
    # Once the tenant has cooled off, it is best-effort work as any other.
    later = dataclasses.replace(snap, now=4_000.0)
    assert after_round(ledger, plan, later, {}) == plan


def test_a_held_grower_whose_gpus_another_job_takes_is_not_held() -> None:
    """Keeping it would place two jobs on one GPU: the plan goes ahead as decided."""
    ledger = cooling()
    ledger.demoted.add("g")
    runs = (RunningView(job("g", "A", False, gpus=1), Cell("X", 1), on("n1", 0)),
            RunningView(job("b", "B", False), Cell("X", 2), on("n1", 1, 2)))
    snap = Snapshot((), (job("x", "B", False, gpus=1),), now=100.0, running=runs, tenants=TENANTS)
    plan = RoundPlan((
        Decision("b", Action.MIGRATE, "halved", slices=on("n1", 1), cell=Cell("X", 1)),
        Decision("g", Action.MIGRATE, "moved", slices=on("n1", 2), cell=Cell("X", 1)),
        Decision("x", Action.START, "fcfs", slices=on("n1", 0), cell=Cell("X", 1))), policy="fcfs")
    assert after_round(ledger, plan, snap, {}) == plan
