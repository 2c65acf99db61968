"""The one place that builds gRPC servers and channels.

Every server and channel in Tessera comes from here, so message limits, keepalive, retries and
deadlines are set once. Transport security: plaintext only for now (see docs/operations.md); bind
the controller and agents to a management network.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio
import structlog

log = structlog.get_logger(__name__)

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
DEFAULT_DEADLINE_S = 10.0

# Retries only for UNAVAILABLE: every mutating RPC carries a request id, so a retried call that
# did reach the server returns the stored answer instead of acting twice (the Estimator's calls
# read, FitPerformance has a request id, ReportStepTimes counts a (job, iteration) once).
_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "tessera.v1.Controller"}, {"service": "tessera.v1.AgentRegistry"},
                         {"service": "tessera.v1.NodeAgent"}, {"service": "tessera.v1.Estimator"}],
                "retryPolicy": {
                    "maxAttempts": 4,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)

_COMMON_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]

_CHANNEL_OPTIONS: list[tuple[str, Any]] = _COMMON_OPTIONS + [
    ("grpc.enable_retries", 1),
    ("grpc.service_config", _SERVICE_CONFIG),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    # Reconnect fast after a peer restarts: agents must re-register within a lease.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]

_SERVER_OPTIONS: list[tuple[str, Any]] = _COMMON_OPTIONS + [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.so_reuseport", 0),
]


def aio_server(
    listen: str, registrations: Sequence[tuple[Any, Any]], interceptors: Sequence[Any] = ()
) -> tuple[grpc.aio.Server, int]:
    """Build an asyncio server on `listen` (host:port, port 0 = pick one).

    `registrations` is a list of (add_XServicer_to_server, servicer). Returns the server, not yet
    started, and the bound port. Raises OSError when the address cannot be bound.
    """
    server = grpc.aio.server(options=_SERVER_OPTIONS, interceptors=list(interceptors))
    for add, servicer in registrations:
        add(servicer, server)
    port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"cannot bind gRPC server to {listen!r}")
    return server, port


# How long past its grace a server may take to finish shutting down before we stop waiting.
STOP_OVERRUN_S = 5.0


async def stop_server(server: grpc.aio.Server, grace: float) -> bool:
    """Stop `server`, giving in-flight calls `grace` seconds; False if gRPC never said it finished.

    grpc.aio's shutdown waits for a completion from gRPC core; if that never comes (the most likely
    reading of a CI run where a test's agent hung in close() until the 300 s timeout, with the
    event loop idle), a process shutting down must not hang on it, so the wait is bounded and the
    rest of the shutdown goes on.
    """
    try:
        await asyncio.wait_for(server.stop(grace), timeout=grace + STOP_OVERRUN_S)
    except TimeoutError:
        log.warning("grpc server did not finish stopping; going on", waited_s=grace + STOP_OVERRUN_S)
        return False
    return True


def aio_channel(target: str) -> grpc.aio.Channel:
    """An asyncio channel to host:port with Tessera's limits and retry policy."""
    return grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)


def sync_channel(target: str) -> grpc.Channel:
    """A blocking channel to host:port (SDK and CLI) with the same limits and retry policy."""
    return grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)


def host_of(address: str) -> str:
    """The host part of host:port ([v6]:port included)."""
    host, _, _ = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1"
