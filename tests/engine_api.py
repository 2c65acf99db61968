"""An engine's Controller API served over real gRPC on loopback, for integration tests that drive
the engine by hand (tests/unit/test_engine.py's Harness) and call it as clients do: TLS, the auth
interceptor and the tokens of local_tokens (admin, alice, bob, ...)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tessera.common import rpc
from tessera.common.identity import CONTROLLER
from tessera.common.localcluster import local_tokens, tls_config
from tessera.controller.auth import AuthInterceptor, TokenAuthenticator
from tessera.controller.service import ControllerService, translate
from tessera.v1 import controller_pb2_grpc


@contextlib.asynccontextmanager
async def serve_engine(engine: Any, tmp_path: Path) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """Serve the engine's Controller API until the block ends: (address, token by user name). The
    server runs on the caller's loop, so calls go from threads (asyncio.to_thread)."""
    tokens_file, tokens = local_tokens(tmp_path / "state")
    server, port = rpc.aio_server(
        "127.0.0.1:0", [(controller_pb2_grpc.add_ControllerServicer_to_server, ControllerService(engine))],
        interceptors=[AuthInterceptor(TokenAuthenticator(tokens_file))], name="controller", translate=translate(),
        tls=tls_config(CONTROLLER), client_cert=False)
    await server.start()
    try:
        yield f"127.0.0.1:{port}", tokens
    finally:
        await rpc.stop_server(server, grace=0)
