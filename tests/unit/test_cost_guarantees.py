"""The cost objective's jobs under tenants (controller/core/policy.py `plan_round`, guarantees.py):
they are best-effort work, so a guaranteed job within its tenant's quota preempts them like any
other; a mixed-type pipeline is preempted whole, never halved. Literal snapshots, a fake solver."""

from __future__ import annotations

import dataclasses

import pytest

from tessera.controller.core import cost_objective as co
from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import plan_round
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    Decision,
    JobView,
    PlanChoice,
    Priority,
    Promise,
    RunningView,
    Slice,
    Snapshot,
    StageAssignment,
    TenantQuota,
)
from tests.unit.test_cost_objective import A10, A100, MIXED, TINY, Recorder, cost_job, node, snap

# The guaranteed job's table: as fast on 2 x A100 as its promise, twice as fast on 4.
EST = TableEstimates({("g", A100, 2): 1.0, ("g", A100, 4): 0.5})
TENANTS = (TenantQuota("A", ((A100, 2),)), TenantQuota("B"))
STAGES = (StageAssignment(A100, 2, 0, 8), StageAssignment(A10, 2, 8, 12))
PIPE = PlanChoice(2, 1, 2, 8, 1, f"{A100}+{A10}", 0, "cost-tree", stages=STAGES)


def guaranteed(t: float = 10.0) -> JobView:
    return JobView("g", t, TINY, 16, 2, (A100,), A100, 100, estimate_key="g", tenant="A",
                   priority=Priority.GUARANTEED, promise=Promise(2, 0, "", A100))


def pipeline(job: JobView) -> RunningView:
    """A running cost job on 2 A100s and 2 A10s: stage 0 then stage 1."""
    return RunningView(job, Cell(f"{A100}+{A10}", 4, 2), (Slice("a100", (0, 1)), Slice("a10", (0, 1))), PIPE)


def decide(s: Snapshot, policy: str = "fcfs") -> dict[str, Decision]:
    return {d.job_id: d for d in plan_round(s, EST, make_policy(policy)).decisions}


def with_tenants(s: Snapshot) -> Snapshot:
    return dataclasses.replace(s, tenants=TENANTS)


@pytest.mark.parametrize("policy", ["fcfs", "crius", "morphling"])
def test_a_guaranteed_job_within_quota_preempts_a_running_cost_pipeline_whole(policy: str) -> None:
    c = cost_job("c", tenant="B")
    s = with_tenants(snap(node("a100", A100, 2, busy=(0, 1)), node("a10", A10, 2, busy=(0, 1)),
                          pending=(guaranteed(),), running=(pipeline(c),)))
    out = decide(s, policy)
    assert out["c"].action is Action.STOP  # the whole pipeline: no half of a mixed-type pipeline
    assert out["c"].reason == ("preempted: guaranteed job g of tenant A reclaims 2 x A100-80GB of its quota; "
                               "back to the queue from its checkpoint")
    g = out["g"]
    assert g.action is Action.START and g.slices == (Slice("a100", (0, 1)),)
    assert "preempts best-effort job c" in g.reason


def test_without_a_guaranteed_claim_the_cost_pipeline_keeps_running() -> None:
    c = cost_job("c", tenant="B")
    s = with_tenants(snap(node("a100", A100, 4, busy=(0, 1)), node("a10", A10, 2, busy=(0, 1)),
                          pending=(guaranteed(),), running=(pipeline(c),)))
    out = decide(s)
    # Two A100s are free: the guaranteed job starts there, the pipeline is not touched.
    assert out["c"].action is Action.KEEP and out["c"].plan == PIPE
    assert out["g"].action is Action.START and out["g"].slices == (Slice("a100", (2, 3)),)


def test_a_cost_job_the_cost_pass_would_start_waits_for_a_guaranteed_one(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(co, "default_solver", Recorder(MIXED))
    s = with_tenants(snap(node("a100", A100, 2), node("a10", A10, 2), pending=(cost_job("c", tenant="B"), guaranteed())))
    out = decide(s)
    assert out["g"].action is Action.START and out["g"].slices == (Slice("a100", (0, 1)),)
    c = out["c"]
    assert c.action is Action.PENDING
    assert c.reason.startswith("waiting: the cost objective would have started it, but guaranteed job g of tenant A")
    # Without tenants the same round starts the cost job (the policy never sees its GPUs).
    plain = snap(node("a100", A100, 2), node("a10", A10, 2), pending=(cost_job("c", tenant="B"), guaranteed()))
    assert decide(plain)["c"].action is Action.START


def test_best_effort_jobs_of_the_policy_still_leave_a_cost_pipeline_alone() -> None:
    be = JobView("be", 10.0, TINY, 16, 2, (A100,), A100, 100, estimate_key="g", tenant="B")
    s = with_tenants(snap(node("a100", A100, 2, busy=(0, 1)), node("a10", A10, 2, busy=(0, 1)),
                          pending=(be,), running=(pipeline(cost_job("c", tenant="B")),)))
    out = decide(s, "crius")
    assert out["c"].action is Action.KEEP and out["be"].action is Action.PENDING


def test_a_stored_guaranteed_cost_job_counts_as_best_effort() -> None:
    """Submission refuses priority: guaranteed with objective: cost (common/jobspec.py); a record
    stored before is best-effort here: no quota charged, preemptible."""
    c = cost_job("c", tenant="A", priority=Priority.GUARANTEED, promise=Promise(2, 0, "", A100))
    s = with_tenants(snap(node("a100", A100, 2, busy=(0, 1)), node("a10", A10, 2, busy=(0, 1)),
                          pending=(guaranteed(),), running=(pipeline(c),)))
    plan = plan_round(s, EST, make_policy("fcfs"))
    out = {d.job_id: d for d in plan.decisions}
    assert plan.admitted == ("g",)
    assert out["c"].action is Action.STOP and out["g"].action is Action.START
