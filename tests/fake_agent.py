"""A NodeAgent servicer served from a background event loop, for tests of code that reports to an
agent (the trainer SDK, the reference trainer: on a unix socket, as a real agent serves its
workers) or that an agent answers (the controller: over mTLS with a node's certificate)."""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tessera.common import identity, rpc
from tessera.common.localcluster import tls_config
from tessera.v1 import agent_pb2_grpc


@contextmanager
def serve(servicer: agent_pb2_grpc.NodeAgentServicer, *, node: str | None = None) -> Iterator[str]:
    """Serve `servicer` as NodeAgent. Without `node`: on a unix socket, plaintext, as an agent serves
    its workers; yields unix:PATH. With `node`: on 127.0.0.1:<free port> over mTLS with that node's
    certificate, as an agent serves the controller; yields host:port."""
    ready = threading.Event()
    box: dict[str, object] = {}
    sock_dir = tempfile.TemporaryDirectory(prefix="tessera-fake-agent-")

    async def main() -> None:
        registrations = [(agent_pb2_grpc.add_NodeAgentServicer_to_server, servicer)]
        if node is None:
            server, port = rpc.aio_server(f"unix:{sock_dir.name}/agent.sock", registrations, insecure=True)
            box["address"] = f"unix:{sock_dir.name}/agent.sock"
        else:
            server, port = rpc.aio_server("127.0.0.1:0", registrations, tls=tls_config(identity.node(node)))
            box["address"] = f"127.0.0.1:{port}"
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
        yield str(box["address"])
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)  # type: ignore[attr-defined]
        thread.join(10)
        sock_dir.cleanup()
