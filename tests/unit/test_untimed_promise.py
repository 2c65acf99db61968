"""Guaranteed jobs whose promise the estimates cannot time hold no more GPUs than promised
(controller/core/untimed.py): literal snapshots, the literal table of tests/unit/test_guarantees.py
plus a model ("u") that runs on 4 GPUs only (it does not fit fewer)."""

from __future__ import annotations

import dataclasses

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.policy import plan_round
from tessera.controller.core.snapshot import Action, Cell, Decision, Slice, Snapshot, TenantQuota
from tests.unit.test_guarantees import Scripted, job, node, running

EST = TableEstimates({("u", "X", 4): 2.0, **{("k", "X", n): 8.0 / n for n in (1, 2, 4)}})
TENANTS = (TenantQuota("A", (("X", 1),)), TenantQuota("B", (("X", 1),)))


def untimed(jid: str, t: float) -> object:
    return dataclasses.replace(job(jid, t, 1, "A", guaranteed=True), estimate_key="u")


def test_a_start_past_an_untimed_promise_waits_and_says_why() -> None:
    """Tenant A's job is promised 1 GPU, which no Cell of its model runs on; the policy starts it on
    4. Before, it ran there as a guaranteed job (never a victim) while A's quota is 1, and B's
    guaranteed job within B's quota waited without end."""
    g = untimed("gA", 1)
    snap = Snapshot((node("x0"),), (g,), now=10, tenants=TENANTS)  # type: ignore[arg-type]
    start = Decision("gA", Action.START, "scripted", slices=(Slice("x0", (0, 1, 2, 3)),), cell=Cell("X", 4))
    d = {x.job_id: x for x in plan_round(snap, EST, Scripted([start])).decisions}
    assert d["gA"].action is Action.PENDING
    assert d["gA"].reason == (
        "waiting: guaranteed (tenant A): scripted's start to 4 x X would hold more than its promise's 1 x X, "
        "and the estimates cannot time the promise (no Cell of the job on 1 x X): it runs on at most the GPUs "
        "its tenant is charged for, its promise's (GPUs over a promise go to best-effort work)")


def test_a_move_past_an_untimed_promise_keeps_the_job_where_it_runs() -> None:
    g = untimed("gA", 1)
    snap = Snapshot((node("x0", busy=(0,)),), (), running=(running(g, "x0", (0,)),), now=10,  # type: ignore[arg-type]
                    tenants=TENANTS)
    grow = Decision("gA", Action.MIGRATE, "scripted", slices=(Slice("x0", (0, 1, 2, 3)),), cell=Cell("X", 4))
    d = {x.job_id: x for x in plan_round(snap, EST, Scripted([grow])).decisions}
    assert d["gA"].action is Action.KEEP and d["gA"].slices == (Slice("x0", (0,)),)
    assert "would hold more than its promise's 1 x X" in d["gA"].reason


def test_a_timed_promise_and_a_start_within_the_promise_are_left_to_the_guarantee_layer() -> None:
    g, t = untimed("gA", 1), job("gB", 2, 1, "B", guaranteed=True)
    snap = Snapshot((node("x0"),), (g, t), now=10, tenants=TENANTS)  # type: ignore[arg-type]
    ds = [Decision("gA", Action.START, "scripted", slices=(Slice("x0", (0,)),), cell=Cell("X", 1)),
          Decision("gB", Action.START, "scripted", slices=(Slice("x0", (1,)),), cell=Cell("X", 1))]
    d = {x.job_id: x for x in plan_round(snap, EST, Scripted(ds)).decisions}
    assert d["gA"].action is Action.START and d["gB"].action is Action.START


def test_a_shrink_towards_an_untimed_promise_stands() -> None:
    """gA holds 4 GPUs against a promise of 1 (placed before its tenant's quota said so); the policy
    halves it to start best-effort work on the other half. Refusing the halving (2 GPUs is still over
    the promise) stopped gA, a guaranteed job, while the best-effort job started on its GPUs."""
    g, b = untimed("gA", 1), job("b", 2, 2, "B")
    snap = Snapshot((node("x0", busy=(0, 1, 2, 3)),), (b,), running=(running(g, "x0", (0, 1, 2, 3)),),  # type: ignore[arg-type]
                    now=10, tenants=TENANTS)
    ds = [Decision("gA", Action.MIGRATE, "scripted", slices=(Slice("x0", (0, 1)),), cell=Cell("X", 2)),
          Decision("b", Action.START, "scripted", slices=(Slice("x0", (2, 3)),), cell=Cell("X", 2))]
    d = {x.job_id: x for x in plan_round(snap, EST, Scripted(ds)).decisions}
    assert d["gA"].action is Action.MIGRATE and d["gA"].slices == (Slice("x0", (0, 1)),)
    assert d["b"].action is Action.START
