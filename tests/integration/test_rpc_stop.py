"""rpc.stop_server: a real server stops and says so; a shutdown gRPC never finishes does not hang us."""

from __future__ import annotations

import asyncio

import grpc.aio
import pytest

from tessera.common import rpc
from tessera.nodeagent.testing import FakeRegistry
from tessera.v1 import agent_pb2_grpc


async def test_a_real_server_stops_within_its_grace() -> None:
    server, port = rpc.aio_server("127.0.0.1:0", [(agent_pb2_grpc.add_AgentRegistryServicer_to_server, FakeRegistry())],
                                  insecure=True)
    await server.start()
    assert await rpc.stop_server(server, grace=0)
    # Stopped for real: nothing listens on the port any more.
    channel = rpc.aio_channel(f"127.0.0.1:{port}", insecure=True)
    try:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(channel.channel_ready(), timeout=0.5)
    finally:
        await channel.close()


class _NeverStops:
    """Stands in for a grpc.aio.Server whose shutdown completion from gRPC core never arrives."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def stop(self, grace: float | None) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


async def test_a_shutdown_that_never_completes_is_abandoned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc, "STOP_OVERRUN_S", 0.05)
    stuck = _NeverStops()
    server: grpc.aio.Server = stuck  # type: ignore[assignment]
    assert not await asyncio.wait_for(rpc.stop_server(server, grace=0.05), timeout=10)
    assert stuck.cancelled.is_set()
