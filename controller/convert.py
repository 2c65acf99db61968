"""Domain records to API messages."""

from __future__ import annotations

from tessera.controller.core.snapshot import Cell, PlanChoice, Slice
from tessera.controller.redact import Hide
from tessera.controller.store import EventRecord, JobRecord
from tessera.controller.view import NodeInfo
from tessera.estimator.convert import merged_plan, plan_message
from tessera.v1 import common_pb2, controller_pb2


def event_pb(e: EventRecord, hide: Hide | None = None) -> common_pb2.JobEvent:
    """`hide`: what the reader may not see taken out of the message (controller/redact.py)."""
    return common_pb2.JobEvent(seq=e.seq, job_id=e.job_id, time=e.time, kind=e.kind,
                               message=e.message if hide is None else hide(e.message))


_FORECAST_STATES = (common_pb2.JOB_STATE_PENDING, common_pb2.JOB_STATE_STARTING, common_pb2.JOB_STATE_RUNNING)


def job_pb(j: JobRecord, progress: common_pb2.Progress | None = None,
           events: list[EventRecord] | None = None,
           forecast: controller_pb2.Forecast | None = None, hide: Hide | None = None) -> controller_pb2.Job:
    msg = controller_pb2.Job(
        id=j.id, spec=j.spec, state=j.state, reason=j.reason if hide is None else hide(j.reason),
        attempt=j.attempt, submit_time=j.submit_time, start_time=j.start_time, end_time=j.end_time,
        restarts=j.restarts, launch_failures=j.launch_failures, next_launch_time=j.next_launch_time,
    )
    # A requeued job's record keeps its last attempt's plan and placement; shown as its own while it
    # waits, they named GPUs, nodes, a pipeline and a predicted cost it no longer has.
    if j.plan is not None and j.state != common_pb2.JOB_STATE_PENDING:
        msg.plan.CopyFrom(j.plan)
        msg.cell = str(Cell(j.plan.gpu_model, j.plan.dp * j.plan.tp * j.plan.pp, j.plan.pp))
        if j.plan.HasField("prediction"):  # the cost objective's (docs/cost-objective.md)
            pr = j.plan.prediction
            msg.predicted_seconds, msg.predicted_cost, msg.allocation = pr.total_seconds, pr.cost, pr.allocation
    if j.placement is not None and j.state != common_pb2.JOB_STATE_PENDING:
        msg.placement.CopyFrom(j.placement)
    prog = progress or j.progress
    if prog is not None:
        msg.progress.CopyFrom(prog)
    if events:
        msg.events.extend(event_pb(e, hide) for e in events)
    if forecast is not None and j.state in _FORECAST_STATES:  # the last round's (docs/forecasts.md)
        msg.forecast.CopyFrom(forecast)
    return msg


def plan_pb(p: PlanChoice, recipe: common_pb2.ExecutionPlan | None = None) -> common_pb2.Plan:
    """The launched plan: the scheduler's sizes, its whole execution plan when it gave one, and the job's
    recipe (JobSpec.plan: checkpointing, loss, float8, LoRA, ...) on top, so the workers run, or refuse by
    name, what the job asked for (TESSERA_PLAN)."""
    msg = common_pb2.Plan(dp=p.dp, tp=p.tp, pp=p.pp, micro_batch=p.micro_batch, grad_accum=p.grad_accum,
                          gpu_model=p.gpu_model, memory_per_gpu_bytes=p.memory_per_gpu_bytes,
                          memory_source=p.memory_source)
    if p.execution is not None:
        msg.options.CopyFrom(plan_message(p.execution))
    if recipe is not None and recipe.ListFields():
        msg.options.CopyFrom(merged_plan(msg.options, recipe))
    msg.stages.extend(common_pb2.PipelineStage(gpu_model=s.gpu_type, gpus=s.gpus, layer_start=s.layer_start,
                                               layer_end=s.layer_end) for s in p.stages)
    if p.prediction is not None:
        pr = p.prediction
        msg.prediction.CopyFrom(common_pb2.CostPrediction(iteration_seconds=pr.iteration_s, total_seconds=pr.total_s,
                                                          cost=pr.cost, allocation=pr.allocation))
    return msg


def placement_pb(slices: tuple[Slice, ...], rendezvous: str) -> common_pb2.Placement:
    return common_pb2.Placement(
        slices=[common_pb2.NodeSlice(node_id=s.node_id, gpu_indices=list(s.gpu_indices)) for s in slices],
        rendezvous=rendezvous)


def node_pb(n: NodeInfo, busy: dict[str, set[int]], cpus: dict[str, int] | None = None) -> controller_pb2.Node:
    """A node as ListNodes answers it (and the dashboard shows it); `busy`: EngineView.busy_gpus();
    `cpus`: CPUs promised to guaranteed jobs per node (snapshots.busy_cpus)."""
    return controller_pb2.Node(
        id=n.id, address=n.address, state=n.state, reason=n.reason, inventory=n.inventory,
        last_heartbeat=n.last_heartbeat_wall, busy_gpus=sorted(busy.get(n.id, ())),
        launch_failures=n.launch_failures, unhealthy_until=n.unhealthy_until, agent_version=n.agent_version,
        agent_commit=n.agent_commit, busy_cpus=(cpus or {}).get(n.id, 0), gpu_isolation=n.gpu_isolation,
        gpu_isolation_note=n.gpu_isolation_note)
