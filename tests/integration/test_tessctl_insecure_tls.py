"""`tessctl --insecure` against a TLS controller: a real TLS server on loopback closes the plaintext
connection, gRPC says only "Socket closed", and tessctl says what to change."""

from __future__ import annotations

import asyncio

import pytest

from tessera.clients.tessctl import main
from tessera.common import identity, rpc
from tests.fake_agent import tls_config


async def test_insecure_against_a_tls_controller_says_to_drop_insecure(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `cannot reach controller at ... (Socket closed)` and nothing more, where a missing CA
    got a hint."""
    server, port = rpc.aio_server("127.0.0.1:0", [], tls=tls_config(identity.CONTROLLER))
    await server.start()
    try:
        rc = await asyncio.to_thread(main, ["--controller", f"127.0.0.1:{port}", "--insecure", "--timeout", "5",
                                            "get", "jobs"])
    finally:
        await server.stop(None)
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith(f"tessctl: error: cannot reach controller at 127.0.0.1:{port} (") and \
        err.rstrip("\n").endswith("; with --insecure tessctl speaks plaintext: a TLS controller closes the connection "
                                  "(drop --insecure)"), err
