"""A NodeAgent servicer served on loopback from a background event loop, for tests of code that
reports to an agent (the trainer SDK, the reference trainer)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tessera.common import rpc
from tessera.v1 import agent_pb2_grpc


@contextmanager
def serve(servicer: agent_pb2_grpc.NodeAgentServicer) -> Iterator[str]:
    """Serve `servicer` as NodeAgent on 127.0.0.1:<free port>; yields host:port."""
    ready = threading.Event()
    box: dict[str, object] = {}

    async def main() -> None:
        server, port = rpc.aio_server("127.0.0.1:0", [(agent_pb2_grpc.add_NodeAgentServicer_to_server, servicer)])
        await server.start()
        stop = asyncio.Event()
        box.update(port=port, loop=asyncio.get_running_loop(), stop=stop)
        ready.set()
        await stop.wait()
        await rpc.stop_server(server, grace=0)

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(10), "fake agent did not start"
    try:
        yield f"127.0.0.1:{box['port']}"
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)  # type: ignore[attr-defined]
        thread.join(10)
