"""Forwarding running jobs' step times to a tessera-estimator (EstimatorService.ReportStepTimes).

The estimator refits its performance model (perf_model.refit, Morphling's continuous fitting) and
answers the measured time for that Cell from then on. Best effort and bounded: the controller never
waits for it, a call that fails is logged and counted, and when the estimator is slower than the
reports at most `max_in_flight` calls run while later ones are dropped (the next report of the same
attempt carries a fresh median anyway).
"""

from __future__ import annotations

import asyncio

import grpc
import structlog

from tessera.common.gpus import CATALOG
from tessera.common.identity import ESTIMATOR
from tessera.common.rpc import aio_channel
from tessera.common.tls import TlsConfig
from tessera.controller import metrics
from tessera.controller.core.step_times import Learned
from tessera.controller.store import JobRecord
from tessera.estimator.compute import DEFAULT_PRIOR
from tessera.estimator.memory import num_params
from tessera.estimator.models import ModelDims
from tessera.v1 import common_pb2, estimator_pb2, estimator_pb2_grpc

log = structlog.get_logger("tessera.controller.estimator_feed")
CALL_TIMEOUT_S = 10.0

_ZERO = {common_pb2.SHARDING_ZERO1: estimator_pb2.ZERO_KIND_ZERO_DP,
         common_pb2.SHARDING_ZERO2: estimator_pb2.ZERO_KIND_ZERO_DP,
         common_pb2.SHARDING_ZERO3: estimator_pb2.ZERO_KIND_ZERO_DP,
         common_pb2.SHARDING_FSDP: estimator_pb2.ZERO_KIND_ZERO_DP}


def step_times_request(job: JobRecord, dims: ModelDims, gpu_type: str, gpus_per_node: list[int], learned: Learned,
                       model_key: str) -> estimator_pb2.ReportStepTimesRequest:
    """The ReportStepTimes call for one attempt's new steps. The workload's forward reference is the
    roofline of one sample on one GPU (2 x parameters x tokens at the prior's matmul efficiency):
    the refit moves the model's parameters around it, and the Cell's measured time is exact anyway."""
    assert job.plan is not None
    p = job.plan
    params = float(num_params(dims))
    gpu = CATALOG[gpu_type]
    fwd = 2.0 * params * dims.seq_length / (gpu.tflops_fp16 * 1e12 * DEFAULT_PRIOR.matmul_efficiency)
    opts = p.options
    offload = opts.offload in (common_pb2.OFFLOAD_OPTIMIZER, common_pb2.OFFLOAD_OPTIMIZER_AND_PARAMS)
    zero = estimator_pb2.ZERO_KIND_OFFLOAD if offload else _ZERO.get(opts.sharding, estimator_pb2.ZERO_KIND_NONE)
    plan = estimator_pb2.PerfPlan(
        dp=p.dp, tp=p.tp, pp=p.pp, zero=zero, ga_steps=1 if p.pp > 1 else max(1, p.grad_accum),
        checkpointing=opts.checkpointing in (common_pb2.CHECKPOINTING_SELECTIVE, common_pb2.CHECKPOINTING_FULL),
        micro_batches=max(1, p.grad_accum) if p.pp > 1 else 1)
    workload = estimator_pb2.PerfWorkload(
        name=model_key, params=params, layers=dims.num_layers, hidden=dims.hidden_size, seq=dims.seq_length,
        global_batch=job.spec.global_batch_size, fwd_ref_time=fwd, fwd_ref_batch=1.0)
    # Not the job's `model` (with its batch and recipe): with it the service would answer this
    # tenant's measured time for the model's Cell to every caller, every other tenant included
    # (its Cells are keyed by model, not tenant). The refit stays per model key, which carries the
    # tenant; the controller keeps its own measured Cells per tenant (controller/cell_estimates.py).
    return estimator_pb2.ReportStepTimesRequest(
        job_id=job.id, model_key=model_key, gpu_type=gpu_type,
        config=estimator_pb2.PerfRunConfig(workload=workload, plan=plan, gpus_per_node=gpus_per_node),
        steps=[estimator_pb2.StepTime(seconds=s.seconds, time=s.time, iteration=s.iteration)
               for s in learned.new_steps])


class EstimatorFeed:
    """`tls`: the controller's certificate; the estimator must hold the estimator identity. None =
    the controller's --insecure, and the estimator is dialled in plaintext."""

    def __init__(self, target: str, max_in_flight: int = 8, *, tls: TlsConfig | None = None) -> None:
        self.target = target
        self.max_in_flight = max_in_flight
        if tls is None:
            self._channel = aio_channel(target, insecure=True)
        else:
            self._channel = aio_channel(target, tls=tls, peer=ESTIMATOR)
        self._stub = estimator_pb2_grpc.EstimatorStub(self._channel)
        self._tasks: set[asyncio.Task[None]] = set()

    def send(self, req: estimator_pb2.ReportStepTimesRequest) -> bool:
        """Start the call in the background; False (and counted) when too many are in flight."""
        if len(self._tasks) >= self.max_in_flight:
            metrics.STEP_REPORTS.labels("dropped").inc()
            return False
        task = asyncio.get_running_loop().create_task(self._call(req))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _call(self, req: estimator_pb2.ReportStepTimesRequest) -> None:
        try:
            resp = await self._stub.ReportStepTimes(req, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            metrics.STEP_REPORTS.labels("failed").inc()
            log.warning("step_times_not_delivered", estimator=self.target, job_id=req.job_id, code=e.code().name,
                        details=e.details())
            return
        metrics.STEP_REPORTS.labels("delivered").inc()
        log.info("step_times_delivered", estimator=self.target, job_id=req.job_id, steps=len(req.steps),
                 measured=round(resp.measured_seconds, 4), predicted_before=round(resp.predicted_before_seconds, 4),
                 predicted=round(resp.predicted_seconds, 4))

    async def drain(self) -> None:
        """Wait for the calls in flight (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        await self.drain()
        await self._channel.close()
