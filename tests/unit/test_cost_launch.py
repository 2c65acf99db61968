"""A decision of the cost objective as the live controller stores and launches it: the plan carries
each stage's type and layer range and the prediction; ranks follow the stages (pp-major) over the
agents of their types; TESSERA_PLAN gives the trainer the ranges; describe shows the prediction."""

from __future__ import annotations

import dataclasses
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
    # Requeued (preempted, its node lost): the record keeps the last attempt's plan and placement,
    # but a waiting job has neither GPUs nor a pipeline, so none is shown as its own.
    waiting = job_pb(dataclasses.replace(job, state=P.JOB_STATE_PENDING, attempt=2))
    assert not waiting.HasField("plan") and not waiting.HasField("placement") and waiting.cell == ""
    assert (waiting.predicted_seconds, waiting.predicted_cost, waiting.allocation) == (0.0, 0.0, "")
    assert "Allocation:" not in describe_job(waiting, 100.0) and "Objective:" in describe_job(waiting, 100.0)


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


def test_the_live_snapshot_carries_prices_slo_and_a_running_pipelines_stages() -> None:
    from tessera.controller.core.snapshot import Objective
    from tessera.controller.registry import LiveNode
    from tessera.controller.snapshots import build_snapshot
    from tessera.controller.store import NodeRecord
    from tessera.v1 import agent_pb2
    from tests.fake_agent_calls import inventory

    records, nodes = {}, {}
    for nid, model in (("a10", "A10-24GB"), ("a40", "A40-48GB")):
        inv = inventory(model, 4, 24)
        records[nid] = NodeRecord(nid, f"{nid}:1", inv)
        nodes[nid] = LiveNode(nid, f"{nid}:1", inv, agent_pb2.NodeStatus(), 0.0, 0.0, liveness=P.NODE_STATE_READY)
    states = dict.fromkeys(records, P.NODE_STATE_READY)
    stages = (StageAssignment("A10-24GB", 2, 0, 5), StageAssignment("A40-48GB", 2, 5, 6))
    pred = CostPrediction(0.12, 12.2, 0.0102, "x")
    plan = plan_pb(PlanChoice(2, 1, 2, 1, 8, "A10-24GB+A40-48GB", 1, "cost-tree", stages=stages, prediction=pred))
    spec = P.JobSpec(name="c", model=P.ModelSpec(hidden_size=128, num_layers=6, num_heads=4, vocab_size=4096,
                                                 seq_length=128), global_batch_size=16, iterations=100,
                     objective=P.OBJECTIVE_COST, slo=P.Slo(deadline=1000.0))
    placement = P.Placement(slices=[P.NodeSlice(node_id="a10", gpu_indices=[0, 1]),
                                    P.NodeSlice(node_id="a40", gpu_indices=[0, 1])], rendezvous="h:1")
    running = JobRecord("j-r", "r", spec, P.JOB_STATE_RUNNING, "", 0.0, attempt=1, plan=plan, placement=placement)
    waiting = JobRecord("j-w", "w", spec, P.JOB_STATE_PENDING, "", 0.0)
    busy = {"a10": {0, 1}, "a40": {0, 1}}
    snap = build_snapshot(records, nodes, states, busy, [waiting], [running], {}, 400.0, {"A10-24GB": 1.0})
    assert snap.prices == (("A10-24GB", 1.0),)
    (w,) = snap.pending
    assert w.objective is Objective.COST and w.slo_s == 600.0  # the deadline's seconds left at `now`
    (r,) = snap.running
    assert r.plan is not None and r.plan.stages == stages and r.plan.prediction == pred
    assert str(r.cell) == "4 x A10-24GB+A40-48GB, 2 stages" and [s.node_id for s in r.slices] == ["a10", "a40"]
