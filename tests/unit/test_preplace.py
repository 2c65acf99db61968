"""Admitted guaranteed jobs placed at their promise before the policy plans
(controller/core/preplace.py): literal snapshots, the literal table of tests/unit/test_guarantees.py."""

from __future__ import annotations

from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import RoundContext, plan_round
from tessera.controller.core.snapshot import Action, Decision, Slice, Snapshot, TenantQuota
from tests.unit.test_guarantees import EST, busy_nodes, job, running

TENANTS = (TenantQuota("A", (("X", 8),)), TenantQuota("B"))


def fragmenting() -> Snapshot:
    """x0: a running guaranteed job on 2 GPUs, best-effort b0 on the other 2; x1: best-effort b1 on
    all 4. Pending and admitted: g1 (2 GPUs, shortest promise, admitted first) and g2 (4 GPUs)."""
    g_run = job("gR", 0, 2, "A", guaranteed=True, done=10)
    b0, b1 = job("b0", 0, 2), job("b1", 0, 4)
    g1 = job("g1", 5, 2, "A", guaranteed=True, done=990)
    g2 = job("g2", 6, 4, "A", guaranteed=True)
    return Snapshot(busy_nodes(("x0", (0, 1, 2, 3)), ("x1", (0, 1, 2, 3))), (g1, g2),
                    running=(running(g_run, "x0", (0, 1)), running(b0, "x0", (2, 3)), running(b1, "x1", (0, 1, 2, 3))),
                    now=10, tenants=TENANTS)


def test_the_largest_admitted_job_is_placed_first_so_both_fit() -> None:
    # In admission order g1 would halve b1 on x1 (the fewest GPUs taken), and then no node could
    # hold g2's 4 GPUs. Largest first: g2 takes x1 whole, g1 takes b0's half of x0.
    plan = plan_round(fragmenting(), EST, make_policy("fcfs"))
    d = {x.job_id: x for x in plan.decisions}
    assert d["g2"].action is Action.START and d["g2"].slices == (Slice("x1", (0, 1, 2, 3)),)
    assert d["g1"].action is Action.START and d["g1"].slices == (Slice("x0", (2, 3)),)
    assert d["b1"].action is Action.STOP and d["b0"].action is Action.STOP
    assert d["gR"].action is Action.KEEP
    assert d["g2"].reason.endswith("placed at its promise before fcfs plans the round")


def test_the_policy_sees_neither_the_placed_jobs_nor_their_victims() -> None:
    seen: list[tuple[tuple[str, ...], tuple[str, ...], dict[str, frozenset[int]]]] = []

    class Recording:
        name = "recording"

        def plan(self, ctx: RoundContext) -> list[Decision]:
            seen.append((tuple(j.id for j in ctx.pending), tuple(sorted(ctx.running)),
                         {n.id: n.busy for n in ctx.snap.nodes}))
            return []

    plan_round(fragmenting(), EST, Recording())
    ((pending, run, busy),) = seen
    assert pending == () and run == ("gR",)
    assert busy == {"x0": frozenset({0, 1, 2, 3}), "x1": frozenset({0, 1, 2, 3})}


def test_morphling_places_admitted_jobs_itself() -> None:
    """Algorithm 1 places the admitted jobs first (lines 2-3): no placement before it."""
    assert getattr(make_policy("morphling"), "places_admitted", False) is True
    d = {x.job_id: x for x in plan_round(fragmenting(), EST, make_policy("morphling")).decisions}
    assert "placed at its promise before" not in d["g2"].reason
