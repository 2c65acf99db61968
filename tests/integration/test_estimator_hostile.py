"""What a caller of the estimator service can send, from an audit's requests (2026-11-27): each is
INVALID_ARGUMENT naming the field, at once, and nothing a caller adds grows the caches. Real gRPC
on loopback with mTLS (the fixtures of test_estimator_service.py)."""

from __future__ import annotations

import math

import grpc
import pytest

from tessera.v1 import common_pb2 as c
from tessera.v1 import estimator_pb2 as pb
from tests.integration.test_estimator_service import CLUSTER, GPT, Server, _config, srv  # noqa: F401

JOB = _config(8, 1, 1, 1, pb.ZERO_KIND_NONE, [4, 4])


def _steps() -> list[pb.StepTime]:
    return [pb.StepTime(seconds=1.0, iteration=1)]


def _workload(**kw: float) -> pb.PerfRunConfig:
    cfg = pb.PerfRunConfig()
    cfg.CopyFrom(JOB)
    for k, v in kw.items():
        setattr(cfg.workload, k, v)
    return cfg


@pytest.mark.parametrize(("method", "request_", "field"), [
    # GPipe runs every micro-batch in flight, and the trace each one: 2^20 would have traced for days.
    ("EstimateMemory", pb.EstimateMemoryRequest(
        model=c.ModelSpec(hidden_size=64, num_layers=2, num_heads=2, vocab_size=128, seq_length=16),
        plan=c.ExecutionPlan(pp=2, micro_batch=1, schedule=c.PIPELINE_SCHEDULE_GPIPE), global_batch_size=2**20,
        mode=pb.MEMORY_MODE_TRACED), "plan.grad_accum"),
    # Refused before 1,000,000 pools were built and checked (10 s, 225 MB).
    ("PlaceStages", pb.PlaceStagesRequest(model=GPT, global_batch_size=64, stages=[
        pb.GpuPool(gpu="A100", num_gpus=1, gpus_per_node=1)] * 100_000), "stages"),
    ("GetCells", pb.GetCellsRequest(model=GPT, global_batch_size=8, cluster=CLUSTER,
                                    options=pb.CellOptions(microbatches_per_stage=10**9)),
     "options.microbatches_per_stage"),
    # The plan's GPUs, not the model's ("model.num_gpus").
    ("EstimateTime", pb.EstimateTimeRequest(model=GPT, plan=c.ExecutionPlan(dp=2**20), gpu="H100-80GB",
                                            global_batch_size=2**20), "plan"),
    # Named once ("env.env.intra_node_bw").
    ("ReportStepTimes", pb.ReportStepTimesRequest(config=JOB, steps=_steps(), env=pb.PerfEnvironment(
        intra_node_bw=math.nan)), "env.intra_node_bw"),
    # The input, not the NaN the fit made of it ("params.k_bwd").
    ("ReportStepTimes", pb.ReportStepTimesRequest(config=_workload(params=1e308), steps=_steps()),
     "config.workload.params"),
    ("ReportStepTimes", pb.ReportStepTimesRequest(config=_workload(fwd_ref_batch=1e-308), steps=_steps()),
     "config.workload.fwd_ref_batch"),
])
async def test_hostile_input_is_invalid_argument_naming_the_field(srv: Server, method: str,  # noqa: F811
                                                                  request_: object, field: str) -> None:
    if method == "EstimateMemory":
        pytest.importorskip("torch")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await getattr(srv.stub, method)(request_)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(f"{field}: "), err.value.details()


async def test_fields_the_service_does_not_know_are_not_part_of_the_cells_cache_key(srv: Server) -> None:  # noqa: F811
    """15 MB of an unknown field a call made each cached key 15 MB: 2 GB after 120 calls."""
    req = pb.GetCellsRequest(model=GPT, global_batch_size=8, cluster=CLUSTER, best_only=True)
    first = await srv.stub.GetCells(req)
    padded = pb.GetCellsRequest()
    padded.ParseFromString(req.SerializeToString() + b"\xc2\x3e\x10" + b"x" * 16)  # field 1000, 16 bytes
    assert padded.ByteSize() > req.ByteSize()  # the unknown field travels
    assert await srv.stub.GetCells(padded) == first
    cache = srv.service.estimator._cells
    assert (len(cache), cache.hits) == (1, 1)
