"""The estimator's lane for heavy calls of callers other than the controller counts a call until its
work ends (estimator/service/server.py `_Lane`): real gRPC on loopback with mTLS."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tessera.common import rpc
from tessera.common.identity import ESTIMATOR, node
from tessera.common.localcluster import tls_config
from tessera.estimator.service.server import HEAVY_QUEUE, HEAVY_THREADS
from tessera.v1 import estimator_pb2 as pb
from tessera.v1 import estimator_pb2_grpc
from tests.integration.test_estimator_service import SMALL, _BlockingCells, _serve


async def test_calls_their_clients_gave_up_on_still_hold_the_lane_while_they_run() -> None:
    """A node's client sends heavy calls with a short deadline and gives up on them; their threads
    run on. Counted out at the cancel, they let the same client queue HEAVY_THREADS + HEAVY_QUEUE
    more calls behind work nobody waits for."""
    est = _BlockingCells()
    req = pb.GetCellsRequest(model=SMALL, global_batch_size=16, cluster=pb.ClusterSpec(
        pools=[pb.GpuPool(gpu="A40", num_gpus=2, gpus_per_node=2)]))
    async for s in _serve(est):
        lane = s.service._lanes[False]
        other = rpc.aio_channel(f"127.0.0.1:{s.port}", tls=tls_config(node("n1")), peer=ESTIMATOR)
        try:
            stub = estimator_pb2_grpc.EstimatorStub(other)
            abandoned = [asyncio.ensure_future(stub.GetCells(req, timeout=2.0)) for _ in range(HEAVY_THREADS)]
            while est.inside < HEAVY_THREADS:  # every one in its thread, where it waits past its deadline
                await asyncio.sleep(0.01)
            for call in abandoned:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            queued = [asyncio.ensure_future(stub.GetCells(req)) for _ in range(HEAVY_QUEUE)]
            for _ in range(1000):  # until the queued calls are in (at most 10 s: a bound on a failure only)
                if lane.inside >= HEAVY_THREADS + HEAVY_QUEUE:
                    break
                await asyncio.sleep(0.01)
            # Counted out at the cancel, the abandoned calls left room: the queued ones got in, and so does this.
            assert lane.inside == HEAVY_THREADS + HEAVY_QUEUE, lane.inside
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await asyncio.wait_for(stub.GetCells(req), 10)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            est.release.set()
            assert all(got.cells for got in await asyncio.gather(*queued))
            while lane.inside:
                await asyncio.sleep(0.01)
        finally:
            est.release.set()
            await other.close()
