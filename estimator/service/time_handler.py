"""EstimateTime: the iteration time of one given plan, over tessera.v1 messages.

The request is EstimateMemory's (model, plan, GPU, GPU count, global batch) plus the node size the
ranks are placed on. The plan is read and checked exactly as EstimateMemory reads it (the same
errors, naming `plan.X` / `model.X`), then timed by tessera.estimator.plan_time.estimate_plan_time;
the answer also carries the memory estimate of the same plan (formula mode), so one call says both
how fast and whether it fits.
"""

from __future__ import annotations

from collections.abc import Callable

from tessera.estimator.cells import CellInputError
from tessera.estimator.clusterfile import MAX_GPUS_PER_NODE
from tessera.estimator.convert import execution_plan, model_dims
from tessera.estimator.errors import PlanInputError
from tessera.estimator.plan_time import DEFAULT_GPUS_PER_NODE, PlanTime, estimate_plan_time
from tessera.v1 import estimator_pb2 as pb

MemoryFn = Callable[[pb.EstimateMemoryRequest], pb.EstimateMemoryResponse]
PlanTimer = Callable[..., PlanTime]


def estimate_time(req: pb.EstimateTimeRequest, memory: MemoryFn, timer: PlanTimer = estimate_plan_time) -> pb.EstimateTimeResponse:
    """Seconds per iteration of req.plan (with its breakdown and source) and its memory estimate."""
    if not req.gpu:
        raise PlanInputError("gpu", "required: the GPU type to time the plan on (a catalog name such as H100-80GB)")
    # The node's size, as a cluster file's pools give it (1..1,024), not the plan's: a plan smaller
    # than a node runs inside one, so the answer's gpus_per_node is at most the plan's GPUs.
    if not 0 <= req.gpus_per_node <= MAX_GPUS_PER_NODE:
        raise PlanInputError("gpus_per_node", f"must be 1..{MAX_GPUS_PER_NODE:,} (0 = {DEFAULT_GPUS_PER_NODE}), "
                                              f"got {req.gpus_per_node:,}")
    mem = memory(pb.EstimateMemoryRequest(model=req.model, plan=req.plan, gpu=req.gpu, num_gpus=req.num_gpus,
                                          global_batch_size=req.global_batch_size))
    dims = model_dims(req.model)
    plan = execution_plan(mem.plan)  # the plan as checked and completed (grad_accum) by EstimateMemory
    try:
        t = timer(dims, plan, mem.gpu, gpus_per_node=req.gpus_per_node or None)
    except CellInputError as exc:  # the time model's own checks: of the model, or of the plan's GPUs
        if exc.field == "num_gpus":  # the pool of the plan's GPUs, not the model ("model.num_gpus" before)
            raise PlanInputError("plan", f"its dp x tp x pp GPUs: {exc.reason}") from None
        raise PlanInputError(f"model.{exc.field}", exc.reason) from None
    per_node = min(plan.num_gpus, req.gpus_per_node or DEFAULT_GPUS_PER_NODE)
    return pb.EstimateTimeResponse(
        iter_time_seconds=t.iter_time, source=t.source, tokens_per_second=t.tokens_per_second,
        breakdown=[pb.TimeComponent(name=k, seconds=v, source=t.source) for k, v in t.breakdown.items()],
        memory=mem.memory, plan=mem.plan, gpu=mem.gpu, model_signature=mem.model_signature, num_gpus=mem.num_gpus,
        gpus_per_node=per_node)
