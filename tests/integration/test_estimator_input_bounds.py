"""Bounds of an estimator request's sizes and links, over real gRPC (the fixtures of
test_estimator_service.py): each out-of-bounds value is INVALID_ARGUMENT naming the request's field.

- EstimateTime's `gpus_per_node` is a node's size, 1..1,024 as a cluster file's; 2**31 - 1 used to be
  clamped to the plan's GPUs and answered. A node larger than the plan still holds it whole (the
  default 8 for a 4-GPU plan too): that clamp is kept, and the answer says the size used.
- A pool's `nic_gbps` and `pcie_gbps` (GetCells's cluster, PlaceStages's stages) are 0.0125..10,000
  GB/s; 1e-300 was accepted and timed (~1e297 s an iteration).
- A PerfRunConfig's node sizes are named as the message names them (`config.gpus_per_node[0]`, not
  the library's `config.placement.gpus_per_node[0]`).
"""

from __future__ import annotations

import grpc
import pytest

from tessera.v1 import common_pb2 as c
from tessera.v1 import estimator_pb2 as pb
from tests.integration.test_estimator_service import GPT, SMALL, Server, _config, srv  # noqa: F401


def _time(**kw: int) -> pb.EstimateTimeRequest:
    return pb.EstimateTimeRequest(model=SMALL, plan=c.ExecutionPlan(dp=4), gpu="H100-80GB", num_gpus=4,
                                  global_batch_size=8, **kw)


def _stages(**kw: float) -> pb.PlaceStagesRequest:
    return pb.PlaceStagesRequest(model=GPT, global_batch_size=8, stages=[
        pb.GpuPool(gpu="A100", num_gpus=4, gpus_per_node=4), pb.GpuPool(gpu="A40", num_gpus=4, gpus_per_node=4, **kw)])


@pytest.mark.parametrize(("method", "request_", "field"), [
    ("EstimateTime", _time(gpus_per_node=1025), "gpus_per_node"),
    ("EstimateTime", _time(gpus_per_node=2**31 - 1), "gpus_per_node"),
    ("EstimateTime", _time(gpus_per_node=-1), "gpus_per_node"),
    ("PlaceStages", _stages(nic_gbps=1e-300), "stages[1].nic_gbps"),
    ("PlaceStages", _stages(pcie_gbps=1e-300), "stages[1].pcie_gbps"),
    ("PlaceStages", _stages(nic_gbps=1e300), "stages[1].nic_gbps"),
    ("PlaceStages", _stages(nic_gbps=-1.0), "stages[1].nic_gbps"),
    ("GetCells", pb.GetCellsRequest(model=GPT, global_batch_size=8, cluster=pb.ClusterSpec(pools=[pb.GpuPool(
        gpu="A10", num_gpus=8, gpus_per_node=2, nic_gbps=0.01)])), "cluster.pools[0].nic_gbps"),
    ("ReportStepTimes", pb.ReportStepTimesRequest(config=_config(8, 1, 1, 1, pb.ZERO_KIND_NONE, [2000]),
                                                  steps=[pb.StepTime(seconds=1.0, iteration=1)]),
     "config.gpus_per_node[0]"),
])
async def test_out_of_bounds_is_invalid_argument_naming_the_field(srv: Server, method: str,  # noqa: F811
                                                                  request_: object, field: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await getattr(srv.stub, method)(request_)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(f"{field}: "), err.value.details()


@pytest.mark.parametrize(("per_node", "used"), [(0, 4), (2, 2), (8, 4), (1024, 4)])
async def test_a_node_larger_than_the_plan_holds_it_whole(srv: Server, per_node: int, used: int) -> None:  # noqa: F811
    got = await srv.stub.EstimateTime(_time(gpus_per_node=per_node))
    assert got.gpus_per_node == used and got.iter_time_seconds > 0


async def test_the_smallest_link_is_timed(srv: Server) -> None:  # noqa: F811
    got = await srv.stub.PlaceStages(_stages(nic_gbps=0.0125, pcie_gbps=0.0125))
    assert 0 < got.placement.iter_time_seconds.value < 1e6
