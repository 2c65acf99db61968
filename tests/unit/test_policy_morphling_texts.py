"""The morphling policy's reasons in the tenants' words (controller/core/policies/morphling_texts.py,
controller/core/guarantee_notes.py; docs/tenants.md, "Reasons"): a live audit read, under morphling,
"preempted for j-..., guaranteed within its tenant's quota", "shrunk to 1 GPUs", a guaranteed start
that did not say it was one, and a wait blamed on shrinking running jobs that could not be shrunk.
Texts only: the decisions are the policy's own (bench/sim_morphling.py prints the same rows)."""

from __future__ import annotations

from tessera.controller.core.policies.morphling_curves import Point
from tessera.controller.core.policies.morphling_texts import victim
from tessera.controller.core.snapshot import Action, Cell, CellEstimate, Slice, Snapshot, TenantQuota
from tests.unit.test_policy_morphling import ALG1, GUAR, Plans, decide, guaranteed, job, node, run
from tests.unit.test_sia_live_defects import opaque

TENANTS = (TenantQuota("A", (("X", 4),)), TenantQuota("B"))
TABLE = {**GUAR, "one": {1: {"dp": 1.0}}}


def test_a_victim_and_the_guaranteed_job_say_what_is_reclaimed() -> None:
    """g's minRes is 2 x X (zero-dp); one GPU is free, the other held by a 1-GPU best-effort job."""
    be = job("be", "one", 100_000, tenant="B")
    snap = Snapshot((node("n0", 2, busy=(0,)),), (guaranteed(),), running=(run(be, "n0", (0,)),), now=0.0,
                    tenants=TENANTS)
    d = decide(snap, Plans(TABLE), **ALG1)
    assert d["be"].action is Action.STOP and d["be"].reason == (
        "morphling: preempted: guaranteed job g of tenant A reclaims 2 x X of its quota, 1 of them from this job; "
        "back to the queue from its checkpoint")
    assert (d["g"].action, d["g"].slices) == (Action.START, (Slice("n0", (0, 1)),))
    assert d["g"].reason.endswith("; guaranteed (tenant A): as fast as its promise of 4 x X by the estimates; "
                                  "admitted within quota (0 of 4 x X in use before it)")


def test_a_job_waiting_behind_a_guaranteed_job_at_its_minimum_says_so() -> None:
    """Nothing running could be shrunk: the only job is guaranteed, at its minRes."""
    g = guaranteed()
    snap = Snapshot((node("n0", 2, busy=(0, 1)),), (job("be", "be", 100, t=5.0, tenant="B"),),
                    running=(run(g, "n0", (0, 1)),), now=10.0, tenants=TENANTS)
    d = decide(snap, Plans(TABLE), **ALG1)
    assert d["g"].action is Action.KEEP and d["be"].action is Action.PENDING
    assert d["be"].reason.startswith(
        "morphling: waiting; its best step (2 x X, plan dp) needs GPUs guaranteed jobs hold at their minimum demand "
        "(as fast as their promise), below which they are never shrunk; free now: 0/2 X")
    # A best-effort job there instead, which could give its GPUs up: the plain text stands.
    snap = Snapshot(snap.nodes, snap.pending, running=(run(job("b2", "be", 10, tenant="B"), "n0", (0, 1)),),
                    now=10.0, tenants=TENANTS)
    assert "gains less than shrinking running jobs would lose" in decide(snap, Plans(TABLE), **ALG1)["be"].reason


def test_an_opaque_victim_goes_back_to_the_queue_from_no_checkpoint_of_tesseras() -> None:
    # Tessera takes no checkpoint of an opaque job (docs/opaque-jobs.md); morphling said "from its
    # checkpoint" of one, as the guarantee layer did before.
    point = Point("X", 2, 1, CellEstimate(Cell("X", 2, 1), 1.0))
    said = victim("preempted", guaranteed(), point, False, 1, opaque("o", 1))
    assert said.endswith("1 of them from this job; back to the queue"), said
    assert victim("preempted", guaranteed(), point, False, 1, job("be", "one", 10, tenant="B")).endswith(
        "back to the queue from its checkpoint")
