"""A decision of the cost objective as the live controller stores and launches it: the plan carries
each stage's type and layer range and the prediction; ranks follow the stages (pp-major) over the
agents of their types; TESSERA_PLAN gives the trainer the ranges; describe shows the prediction."""

from __future__ import annotations

import json

from tessera.clients.output import describe_job
from tessera.controller.convert import job_pb, plan_pb
from tessera.controller.core.snapshot import CostPrediction, PlanChoice, StageAssignment
from tessera.controller.launches import launch_requests
from tessera.controller.store import JobRecord
from tessera.nodeagent.contract import plan_json
from tessera.v1 import common_pb2 as P


def test_a_mixed_pipeline_is_stored_launched_and_described() -> None:
    stages = (StageAssignment("A10-24GB", 2, 0, 5), StageAssignment("A40-48GB", 2, 5, 6))
    pred = CostPrediction(0.12, 12.2, 0.0102, "2 x A10-24GB (layers 0-4) | 2 x A40-48GB (layers 5-5)")
    plan = plan_pb(PlanChoice(2, 1, 2, 1, 8, "A10-24GB+A40-48GB", 10**9, "cost-tree", stages=stages, prediction=pred))
    assert [(s.gpu_model, s.gpus, s.layer_start, s.layer_end) for s in plan.stages] == [
        ("A10-24GB", 2, 0, 5), ("A40-48GB", 2, 5, 6)]
    spec = P.JobSpec(name="c", model=P.ModelSpec(hidden_size=128, num_layers=6, num_heads=4, vocab_size=4096,
                                                 seq_length=128), global_batch_size=16, iterations=30,
                     objective=P.OBJECTIVE_COST, slo=P.Slo(iterations_within_seconds=3600))
    placement = P.Placement(slices=[P.NodeSlice(node_id="a10", gpu_indices=[0, 1]),
                                    P.NodeSlice(node_id="a40", gpu_indices=[2, 3])], rendezvous="10.0.0.1:29500")
    job = JobRecord("j-1", "r", spec, P.JOB_STATE_STARTING, "", 0.0, attempt=1, plan=plan, placement=placement)
    reqs = launch_requests(job, 1, "/ckpt")
    # Stage 0's two ranks on the A10 agent, stage 1's on the A40 agent (rank = stage x dp + replica).
    assert [(n, [r.rank for r in q.ranks]) for n, q in reqs] == [("a10", [0, 1]), ("a40", [2, 3])]
    env_plan = json.loads(plan_json(reqs[1][1].plan))
    assert env_plan["pp"] == 2 and env_plan["dp"] == 2
    assert [(s["layer_start"], s["layer_end"]) for s in env_plan["stages"]] == [(0, 5), (5, 6)]
    msg = job_pb(job)
    assert (msg.predicted_seconds, msg.predicted_cost, msg.allocation) == (12.2, 0.0102, pred.allocation)
    assert msg.cell == "4 x A10-24GB+A40-48GB, 2 stages"
    text = " ".join(describe_job(msg, 100.0).split())
    for row in ("Objective: cost", "SLO: iterations within 1h", f"Allocation: {pred.allocation}",
                "Predicted time: 12.2s Predicted cost: 0.0102"):
        assert row in text, text


def test_a_cost_jobs_pending_reason_is_the_cost_trees_alone() -> None:
    from tessera.controller.core import frenzy
    from tessera.controller.core.snapshot import (
        Action,
        Decision,
        GpuView,
        JobView,
        NodeView,
        Objective,
        PendingKind,
        Snapshot,
    )
    from tessera.controller.rounds import pending_reason
    from tessera.estimator.models import registered

    big = registered("llama2-13b")
    assert big is not None
    small = NodeView("n", (GpuView(0, "A10-24GB", 24 * 10**9),))
    snap = Snapshot((small,), (), (("A10-24GB", 24 * 10**9, 1),))
    d = Decision("j", Action.PENDING, "no plan meets the SLO", pending=PendingKind.FITS_NOWHERE)
    plain = JobView("j", 0.0, big, 64)
    cost = JobView("j", 0.0, big, 64, objective=Objective.COST, slo_s=60.0)
    cfg = frenzy.FrenzyConfig()
    assert "fits nowhere" in pending_reason(d, {"j": plain}, snap, "crius", cfg)  # a policy's memory rule
    assert pending_reason(d, {"j": cost}, snap, "crius", cfg) == "no plan meets the SLO"
