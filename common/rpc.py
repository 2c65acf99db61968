"""The one place that builds gRPC servers and channels.

Every server and channel in Tessera comes from here, so message limits, keepalive, retries and
deadlines are set once, and so is transport security (docs/security.md): every port and channel is
TLS from a `TlsConfig` (tessera.common.tls), and plaintext only when the caller says
`insecure=True` (a daemon's --insecure); asking for neither is a ValueError. A channel that means to
reach one identity (the controller calling node gpu-a1) names it as `peer`: the server must then
present that identity's certificate, whatever address it was dialled at.

Errors: every server built here answers through `ErrorInterceptor`, so a servicer raises and never
aborts by hand. A `TesseraError` (tessera.common.errors) becomes its code and its message; any
other exception becomes INTERNAL "METHOD failed; see the NAME log", logged with its traceback, so
no internal text reaches the peer and no request can take a server down.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import grpc
import grpc.aio
import structlog

from tessera.common.errors import InvalidArgument, TesseraError
from tessera.common.handlerwrap import read_after, refuse_undecodable, rewrap
from tessera.common.hooks import Hooks
from tessera.common.identity import Identity
from tessera.common.opencalls import OpenCallBounds, OpenCallLimit
from tessera.common.tls import TlsConfig, channel_credentials, server_credentials

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
                         {"service": "tessera.v1.NodeAgent"}, {"service": "tessera.v1.Estimator"},
                         {"service": "tessera.v1.Info"}],
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


# A foreign exception (one a module outside tessera.common defines, JobNotFound say) -> the
# TesseraError it means, for a server whose code cannot raise a TesseraError itself.
Translate = Mapping[type[BaseException], Callable[[Any], TesseraError]]


def status_of(exc: BaseException, method: str, name: str,
              translate: Translate | None = None) -> tuple[grpc.StatusCode, str]:
    """The status a server answers for `exc` raised by `method`; INTERNAL hides the text.

    The message is made one line: status details end up in logs and in tessctl's one-line errors.
    """
    for cls, to_error in (translate or {}).items():
        if isinstance(exc, cls):
            exc = to_error(exc)
            break
    if isinstance(exc, TesseraError):
        return grpc.StatusCode[exc.code.value], " ".join(exc.message.split())
    if isinstance(exc, NotImplementedError):  # a generated servicer's method this server does not serve
        return grpc.StatusCode.UNIMPLEMENTED, f"{method} is not served by this {name}"
    return grpc.StatusCode.INTERNAL, f"{method} failed; see the {name} log"


class ErrorInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc.aio is untyped
    """Map what a handler raises to a status, for unary and streaming RPCs alike (see status_of).

    `name` says whose log holds the traceback of an INTERNAL error ("controller", "agent").
    """

    def __init__(self, name: str = "server", translate: Translate | None = None) -> None:
        self.name = name
        self.translate = dict(translate or {})

    async def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None  # unknown method: gRPC answers UNIMPLEMENTED itself
        method = details.method.rpartition("/")[2]
        return rewrap(handler, lambda b: self._unary(method, b), lambda b: self._stream(method, b),
                      tolerant=True)

    async def _abort(self, context: grpc.aio.ServicerContext, method: str, exc: Exception) -> None:
        code, message = status_of(exc, method, self.name, self.translate)
        if code == grpc.StatusCode.INTERNAL:  # a bug, ours or a library's: the traceback is for us
            log.error("rpc_failed", method=method, exc_info=exc)
        else:
            log.info("rpc_refused", method=method, code=code.name, message=message)
        await context.abort(code, message)

    def _unary(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                refuse_undecodable(request)
                result = behavior(request, context)
                return await result if inspect.isawaitable(result) else result
            except grpc.aio.AbortError:
                raise  # the handler aborted with a status of its own
            except Exception as exc:
                await self._abort(context, method, exc)
                raise AssertionError("unreachable: abort raises") from exc

        return call

    def _stream(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        if not inspect.isasyncgenfunction(behavior):
            return self._unary(method, behavior)  # a coroutine that writes with context.write

        async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                refuse_undecodable(request)
                async for response in behavior(request, context):
                    yield response
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await self._abort(context, method, exc)
                raise AssertionError("unreachable: abort raises") from exc

        return call


class Authorize(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc.aio is untyped
    """Call `check(method, context)` before every handler runs, and before its request is read
    (handlerwrap.read_after): what it raises (Unauthenticated, PermissionDenied) becomes the call's
    status through the ErrorInterceptor outside it, and a refused caller's request is never received
    nor parsed. Before, the check ran in the handler, after gRPC had taken the whole request: 32
    refused 15 MiB calls held 670 MB of the estimator's memory, 48 the agent's 720 MB (a live audit).

    An interceptor sees no call context, only the handler it returns does: the check wraps the
    handler, as ErrorInterceptor does.
    """

    def __init__(self, check: Callable[[str, Any], None]) -> None:
        self.check = check

    async def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method.rpartition("/")[2]
        check = self.check
        return read_after(handler, lambda context: check(method, context))


def _security(tls: TlsConfig | None, insecure: bool, what: str) -> None:
    if tls is None and not insecure:
        raise ValueError(f"{what}: TLS configuration required (plaintext only with insecure=True)")
    if tls is not None and insecure:
        raise ValueError(f"{what}: both TLS and insecure given")


def add_port(server: grpc.aio.Server, listen: str, *, tls: TlsConfig | None = None, insecure: bool = False,
             client_cert: bool = True) -> int:
    """Bind one more address (host:port, or unix:PATH) to `server`; returns the bound port.

    With `tls`, `client_cert` requires a client certificate of the CA on this port. Raises OSError
    when the address cannot be bound.
    """
    _security(tls, insecure, listen)
    try:
        if tls is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, server_credentials(tls, client_cert=client_cert))
    except RuntimeError as exc:  # grpc reports a failed bind as RuntimeError
        raise OSError(f"cannot bind gRPC server to {listen!r}: {exc}") from None
    if port == 0 and not listen.startswith("unix:"):
        raise OSError(f"cannot bind gRPC server to {listen!r}")
    return int(port)


class _Recorder:
    """The server as the generated add_*Servicer_to_server functions see it: records the names of
    the services they register (for health and reflection), passes everything on."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self.server = server
        self.names: list[str] = []

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        self.names.append(service)
        self.server.add_registered_method_handlers(service, handlers)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.server, attr)


def aio_server(
    listen: str, registrations: Sequence[tuple[Any, Any]], interceptors: Sequence[Any] = (),
    name: str = "server", translate: Translate | None = None, *, tls: TlsConfig | None = None,
    insecure: bool = False, client_cert: bool = True, hooks: Hooks | None = None,
    max_receive_bytes: int = MAX_MESSAGE_BYTES, max_concurrent_rpcs: int | None = None,
    grow_windows: bool = True, open_calls: OpenCallBounds | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Build an asyncio server on `listen` (host:port, port 0 = pick one).

    `registrations` is a list of (add_XServicer_to_server, servicer). Errors are mapped by an
    ErrorInterceptor(name, translate), outermost. TLS from `tls` (with a required client
    certificate unless `client_cert` is False), plaintext only with `insecure`. Every server also
    serves the standard hooks (tessera.common.hooks: health, reflection, Info): `hooks`, made by a
    daemon that reports its readiness through them, else ones that say SERVING. The services the
    registrations add are named to them. `max_receive_bytes` and `max_concurrent_rpcs` bound what
    callers can make it hold (more concurrent calls are RESOURCE_EXHAUSTED). `grow_windows=False`
    keeps HTTP/2's receive windows from growing past their initial size (no BDP probing): a server that refuses
    calls without reading their requests (handlerwrap.refusal) then buffers little of what the callers send
    meanwhile (BDP-grown windows had it hold 190 MB of 128 refused 15 MiB requests), at the price
    of slower uploads of large requests over long round trips. The hooks, which need no
    credentials, are admitted within `open_calls` (tessera.common.opencalls; its defaults when
    None). Returns the server, not yet started, and the bound port.
    Raises OSError when the address cannot be bound.
    """
    _security(tls, insecure, f"{name} server")
    chain = [ErrorInterceptor(name, translate), OpenCallLimit(open_calls), *interceptors]
    options = [o for o in _SERVER_OPTIONS if o[0] != "grpc.max_receive_message_length"]
    options.append(("grpc.max_receive_message_length", max_receive_bytes))
    if not grow_windows:
        options.append(("grpc.http2.bdp_probe", 0))
    server = grpc.aio.server(options=options, interceptors=chain, maximum_concurrent_rpcs=max_concurrent_rpcs)
    recorder = _Recorder(server)
    for add, servicer in registrations:
        add(servicer, recorder)
    hooks = hooks or Hooks(name)
    hooks.add_services(recorder.names)
    hooks.register(server)
    port = add_port(server, listen, tls=tls, insecure=insecure, client_cert=client_cert)
    return server, port


class ServerGroup:
    """Servers started and stopped as one: a daemon's ports that need different limits (the
    controller's users' and agents' ports) are servers of their own, since gRPC's limits are per
    server."""

    def __init__(self, *servers: grpc.aio.Server) -> None:
        self.servers = servers

    async def start(self) -> None:
        for s in self.servers:
            await s.start()

    async def stop(self, grace: float | None) -> None:
        await asyncio.gather(*(s.stop(grace) for s in self.servers))


# How long past its grace a server may take to finish shutting down before we stop waiting.
STOP_OVERRUN_S = 5.0


async def stop_server(server: grpc.aio.Server | ServerGroup, grace: float) -> bool:
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


def _channel_options(peer: Identity | None) -> list[tuple[str, Any]]:
    # gRPC checks a server certificate against a host name only: the identity's reserved name
    # (identity.py) is what the certificate of `peer`, and no other, carries.
    return _CHANNEL_OPTIONS + ([("grpc.ssl_target_name_override", peer.dns)] if peer is not None else [])


def aio_channel(target: str, *, tls: TlsConfig | None = None, insecure: bool = False,
                peer: Identity | None = None) -> grpc.aio.Channel:
    """An asyncio channel to host:port with Tessera's limits and retry policy: TLS from `tls`
    (presenting its certificate, if any), plaintext only with `insecure`. `peer`: the identity
    the server must prove; None checks the host name dialled, as any TLS client does."""
    _security(tls, insecure, f"channel to {target}")
    if tls is None:
        return grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
    return grpc.aio.secure_channel(target, channel_credentials(tls), options=_channel_options(peer))


def sync_channel(target: str, *, tls: TlsConfig | None = None, insecure: bool = False,
                 peer: Identity | None = None) -> grpc.Channel:
    """A blocking channel (SDK and CLI) with the same limits, retry policy and security rules."""
    _security(tls, insecure, f"channel to {target}")
    if tls is None:
        return grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
    return grpc.secure_channel(target, channel_credentials(tls), options=_channel_options(peer))


# ASCII digits only: `\d` would take "５００５１" (fullwidth), which no server binds.
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})$")


def check_address(address: str, what: str, example_port: int = 50051) -> str:
    """`address` stripped, when it is host:port, [v6]:port, or a gRPC target of another scheme
    (unix:PATH, dns:///host:port); else InvalidArgument naming `what` and saying what is expected:
    gRPC would only answer "connection refused" for a host without a port."""
    a = address.strip()
    if a.startswith(("unix:", "unix-abstract:")) or "://" in a:
        return a
    m = _HOST_PORT.fullmatch(a)
    if m and 0 < int(m.group(2)) < 65536:
        return a
    if not a:
        raise InvalidArgument(what, "empty address: expected host:port")
    if m is None and ":" not in a.strip("[]") or a.startswith("[") and a.endswith("]"):
        raise InvalidArgument(what, f"{a!r} has no port: expected host:port, e.g. {a}:{example_port}")
    raise InvalidArgument(what, f"{a!r} is not host:port (port 1-65535; IPv6 as [addr]:port)")


def check_listen(value: str, flag: str, example_port: int) -> str:
    """`value` stripped, when it is an address a daemon listens on: what `check_address` takes (same
    wording), plus port 0 (any free port; "00000" too, returned as 0); a dialling target with "://"
    (dns:///host:port) is refused, and so is an empty host (":50051"), which gRPC does not bind ("host
    must not be empty"): the reason names 0.0.0.0:PORT and [::]:PORT instead. Else InvalidArgument
    naming `flag`. Every daemon checks its --listen flags here before anything reads the host or opens
    its state: "localhost" would otherwise pass as host "" (every address)."""
    a = value.strip()
    if "://" in a:  # a dialling target (dns:///...), nothing a server binds
        raise InvalidArgument(flag, f"{a!r} is not host:port (port 0-65535; IPv6 as [addr]:port)")
    if a.startswith(("unix:", "unix-abstract:")):
        return a  # a socket path, no port
    host, sep, port = a.rpartition(":")
    zero = bool(sep) and re.fullmatch("0{1,5}", port) is not None
    if sep and not host and re.fullmatch("[0-9]{1,5}", port) and int(port) < 65536:
        shown = 0 if zero else port
        raise InvalidArgument(flag, f"{a!r} has an empty host: give 0.0.0.0:{shown} (every IPv4 address), "
                                    f"[::]:{shown} (every address) or 127.0.0.1:{shown} (this machine only)")
    # A filler port for what check_address refuses and a server binds; a refusal then names the value as given.
    probe = f"{host}:1" if zero else a
    try:
        check_address(probe, flag, example_port)
    except InvalidArgument as e:
        if probe == a and "is not host:port" not in e.reason:
            raise  # no port, or empty: its message says so with an example
        raise InvalidArgument(flag, f"{a!r} is not host:port (port 0-65535; IPv6 as [addr]:port)") from None
    return f"{host}:0" if zero else a


def host_of(address: str) -> str:
    """The host part of host:port ([v6]:port included)."""
    host, _, _ = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1"


def external_aio_channel(target: str, credentials: grpc.ChannelCredentials | None = None) -> grpc.aio.Channel:
    """An asyncio channel to a service that is not Tessera's (etcd): its own TLS credentials, the
    message limits and keepalive, no Tessera retry policy (the caller decides what is safe to retry)."""
    options = _COMMON_OPTIONS + [("grpc.keepalive_time_ms", 5_000), ("grpc.keepalive_timeout_ms", 3_000),
                                 ("grpc.initial_reconnect_backoff_ms", 100),
                                 ("grpc.max_reconnect_backoff_ms", 1_000)]
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, credentials, options=options)


# Trailing metadata of an UNAVAILABLE answered by a standby controller: the leader's address
# (docs/ha.md). Clients follow it only to an address they were configured with.
LEADER_HINT_KEY = "tessera-leader"


def leader_hint(exc: grpc.RpcError) -> str:
    """The leader address a standby named in its UNAVAILABLE answer; "" when none."""
    try:
        md = exc.trailing_metadata() or ()
    except Exception:  # noqa: BLE001 (a connection failure has no metadata)
        return ""
    for key, value in md:
        if key == LEADER_HINT_KEY and isinstance(value, str):
            return value
    return ""
