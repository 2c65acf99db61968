"""The controller's etcd connection: the etcd v3 API on a dedicated asyncio event-loop thread.

The client is aetcd (PyPI, asyncio). Its high-level `aetcd.Client` dials one host:port over
plaintext, so Tessera uses aetcd's generated etcd v3 API (`aetcd.rpc`: the KV, Lease and Watch stubs
and their messages) over a channel of its own (`common/rpc.py`'s `external_aio_channel`): TLS to etcd
(`--etcd-ca/--etcd-cert/--etcd-key`) and several endpoints, the next one tried after a failure.

Why a thread: the `Store` protocol is synchronous (the engine calls it between awaits, as it calls
SQLite), and the lease that holds leadership must be kept alive even while the controller's own loop
is busy (a round may search for `--round-budget` seconds). So the etcd client has an event loop of
its own: `call()` runs a coroutine there and blocks the caller until it answers or `timeout_s`
passes; the election's keep-alive runs there as a task and never waits for the controller's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio
import structlog
from aetcd import rpc as etcdrpc

from tessera.common import rpc
from tessera.common.errors import InvalidInput, Unavailable

log = structlog.get_logger("tessera.controller.etcd")
T = TypeVar("T")


class EtcdUnavailable(Unavailable):
    """etcd did not answer (every endpoint tried, or the call timed out)."""


@dataclass(frozen=True)
class EtcdConfig:
    endpoints: tuple[str, ...]
    prefix: str = "/tessera/"
    timeout_s: float = 5.0
    ca: str = ""  # PEM files: TLS to etcd when `ca` is set; cert+key for etcd's client-cert auth
    cert: str = ""
    key: str = ""


def parse_endpoints(value: str) -> tuple[str, ...]:
    """`host:port[,host:port...]` (an `http://` or `https://` scheme is dropped) -> endpoints;
    InvalidInput naming the bad one."""
    out = []
    for raw in value.split(","):
        ep = raw.strip().removeprefix("http://").removeprefix("https://")
        host, sep, port = ep.rpartition(":")
        if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidInput(f"--etcd-endpoints: {raw.strip()!r} is not host:port")
        out.append(ep)
    return tuple(out)


def one_line(text: str) -> str:
    return " ".join(text.split())


# Words of gRPC's details when the TLS handshake with etcd failed (a CA that did not sign etcd's
# certificate, a client certificate etcd refused, TLS against a plaintext etcd).
_TLS_WORDS = ("handshake", "tsi_", "ssl", "certificate", "x509", "wrong_version_number")
TLS_HINT = ("the TLS handshake with etcd failed: check --etcd-ca (the CA that signed etcd's server certificate), "
            "--etcd-cert and --etcd-key (a client certificate signed by a CA etcd's --trusted-ca-file names), "
            "or drop them for an etcd that serves plaintext")
PLAINTEXT_HINT = ("etcd closed the connection: an etcd that serves TLS needs --etcd-ca (and, with "
                  "--client-cert-auth, --etcd-cert and --etcd-key)")


def error_fields(exc: BaseException, tls: bool) -> dict[str, str]:
    """A failed etcd call as one log line's fields: `code`, `error` (one line: str() of an
    AioRpcError is gRPC's multi-line debug text), and `hint` naming the flags to check when the
    failure looks like TLS (`tls`: --etcd-ca given)."""
    if isinstance(exc, grpc.aio.AioRpcError):
        code, text = exc.code().name, one_line(exc.details() or "")
    else:
        code, text = ("UNAVAILABLE" if isinstance(exc, Unavailable) else type(exc).__name__), one_line(str(exc))
    out = {"code": code, "error": text[:300]}
    low = text.lower()
    if any(w in low for w in _TLS_WORDS):
        out["hint"] = TLS_HINT if tls else PLAINTEXT_HINT
    elif not tls and ("socket closed" in low or "connection reset" in low):
        out["hint"] = PLAINTEXT_HINT
    return out


def _credentials(cfg: EtcdConfig) -> grpc.ChannelCredentials | None:
    if not cfg.ca:
        return None

    def read(p: str) -> bytes | None:
        return Path(p).read_bytes() if p else None

    return grpc.ssl_channel_credentials(read(cfg.ca), read(cfg.key), read(cfg.cert))


class EtcdClient:
    """The KV, Lease and Watch stubs of one etcd cluster, on the client's own loop thread."""

    def __init__(self, cfg: EtcdConfig) -> None:
        if not cfg.endpoints:
            raise InvalidInput("--etcd-endpoints: at least one endpoint is required")
        self.cfg = replace(cfg, endpoints=parse_endpoints(",".join(cfg.endpoints)))
        self._creds = _credentials(cfg)
        self._index = 0
        self._channel: grpc.aio.Channel | None = None
        self.kv: Any = None
        self.lease: Any = None
        self.watch: Any = None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="etcd", daemon=True)
        self._thread.start()
        self.call(self._connect())

    @property
    def endpoint(self) -> str:
        return self.cfg.endpoints[self._index]

    async def _connect(self) -> None:
        self._channel = rpc.external_aio_channel(self.endpoint, self._creds)
        self.kv = etcdrpc.KVStub(self._channel)
        self.lease = etcdrpc.LeaseStub(self._channel)
        self.watch = etcdrpc.WatchStub(self._channel)

    async def _next_endpoint(self) -> None:
        old = self._channel
        self._index = (self._index + 1) % len(self.cfg.endpoints)
        await self._connect()
        if old is not None:
            await old.close()
        log.info("etcd_endpoint", endpoint=self.endpoint)

    async def rpc(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Await `fn()` (a stub call made inside it, so it uses the current channel); after a failure
        to reach etcd, move to the next endpoint and raise EtcdUnavailable. Not retried here: a write
        may have been applied before the connection broke, and only its caller knows if a retry is
        safe."""
        try:
            return await fn()
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                if len(self.cfg.endpoints) > 1:
                    await self._next_endpoint()
                raise EtcdUnavailable(f"etcd at {self.endpoint} unavailable: {one_line(exc.details() or '')}") from None
            raise

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run `coro` on the etcd loop and wait for it (from any other thread)."""
        fut = self.submit(coro)
        try:
            return fut.result(timeout_s or self.cfg.timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise EtcdUnavailable(f"etcd at {self.endpoint} did not answer within "
                                  f"{timeout_s or self.cfg.timeout_s:g}s") from None

    def close(self) -> None:
        async def shut() -> None:
            if self._channel is not None:
                await self._channel.close()

        try:
            self.call(shut(), 5.0)
        except Exception as exc:  # noqa: BLE001 (closing: nothing left to save)
            log.info("etcd_close_failed", error=str(exc)[:200])
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5.0)

