"""The standard hooks every Tessera daemon serves beside its own API (docs/observability.md):

- `grpc.health.v1.Health` (grpcio-health-checking): Check and Watch, for grpc_health_probe,
  kubelet's gRPC probes and load balancers;
- server reflection (grpcio-reflection: `grpc.reflection.v1alpha`, which grpcurl falls back to
  when `v1` is not served): grpcurl and other tools list the services and read their schemas;
- `tessera.v1.Info/GetVersion`: the daemon's version and build (tessera.common.buildinfo).

rpc.aio_server registers them on every server it builds, so they share the server's ports and
transport security: TLS as the port says, a client certificate where the port requires one.
Whether a token is needed is the daemon's interceptors' decision; the controller's checks the
Controller service only, so these answer without a token (docs/security.md).

Health, as served here (`""` is what a probe asks by default):
- `""` and each service the daemon serves (`tessera.v1.Controller`, ...): SERVING while the daemon
  does its job: the controller leads with its store open, the agent is registered with a controller
  whose lease it holds, the estimator is started. NOT_SERVING otherwise (a standby controller, an
  agent before it registers or while it is fenced) and from the start of a shutdown on.
- `tessera.live` (LIVE): SERVING while the process answers at all: a liveness probe, which must not
  restart a standby controller or an agent waiting for its controller.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import Gauge

from tessera.common.buildinfo import build_info, version_info
from tessera.common.errors import NotFound
from tessera.v1 import info_pb2, info_pb2_grpc

LIVE = "tessera.live"
HEALTH_SERVICE: str = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
INFO_SERVICE: str = info_pb2.DESCRIPTOR.services_by_name["Info"].full_name
REFLECTION_SERVICE: str = reflection.SERVICE_NAME

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

BUILD_INFO = Gauge("tessera_build_info", "Always 1: the labels say which build this process runs",
                   ["component", "version", "git_commit", "python_version", "grpc_version"])


class InfoService(info_pb2_grpc.InfoServicer):  # type: ignore[misc]  # generated code is untyped
    def __init__(self, component: str, start_time: float) -> None:
        self.answer = version_info(component, start_time)

    async def GetVersion(self, request: info_pb2.GetVersionRequest, context: Any) -> info_pb2.VersionInfo:
        return self.answer


class HealthService(health_pb2_grpc.HealthServicer):  # type: ignore[misc]  # generated code is untyped
    """grpc.health.v1.Health on asyncio, with statuses set synchronously from the daemon's loop.

    Not grpcio-health-checking's own aio servicer: its Watch forgets a service's watchers when the
    first of several ends, so the others never hear of a later change; and its `set` is a coroutine,
    awkward from the callbacks (a heartbeat's result) that know the state. The messages and the
    service's registration are the package's.
    """

    def __init__(self) -> None:
        self._status: dict[str, int] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._frozen = False

    @property
    def frozen(self) -> bool:
        return self._frozen

    def status(self, service: str) -> int | None:
        return self._status.get(service)

    def set(self, service: str, status: int) -> None:
        """Set a status (on the server's loop thread); ignored once `freeze` was called."""
        if not self._frozen:
            self._put(service, status)

    def freeze(self, status: int) -> None:
        """Every status to `status`, for good: the daemon is shutting down."""
        for service in list(self._status):
            self._put(service, status)
        self._frozen = True

    def _put(self, service: str, status: int) -> None:
        if self._status.get(service) == status:
            return
        self._status[service] = status
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def Check(self, request: health_pb2.HealthCheckRequest, context: Any) -> health_pb2.HealthCheckResponse:
        status = self._status.get(request.service)
        if status is None:  # the protocol's answer for a service the server does not know
            raise NotFound(f"no health status for service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: health_pb2.HealthCheckRequest,
                    context: Any) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        # The protocol: the current status at once, then each change; SERVICE_UNKNOWN (not an
        # error) for a service not known yet, which may become known later.
        # The status is read again after each message: a change made while the message was on its
        # way is sent next, not lost (nothing awaits between that read and the waiter's registration).
        last: int | None = None
        loop = asyncio.get_running_loop()
        while True:
            status = self._status.get(request.service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            if status != last:
                last = status
                yield health_pb2.HealthCheckResponse(status=status)
                continue
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)


class Hooks:
    """Health, reflection and Info of one daemon's server: made by the daemon, which flips
    `set_serving` as its state changes, and registered by rpc.aio_server.

    `serving`: the readiness until the daemon says otherwise (a standby controller starts False).
    """

    def __init__(self, component: str, services: Iterable[str] = (), *, serving: bool = True) -> None:
        self.component = component
        self.services: list[str] = list(dict.fromkeys(services))
        self.health = HealthService()
        self.start_time = time.time()
        self._serving = serving
        b = build_info()
        BUILD_INFO.labels(component, b.version, b.git_commit or "unknown", b.python_version, b.grpc_version).set(1)

    @property
    def serving(self) -> bool:
        return self._serving

    def add_services(self, names: Iterable[str]) -> None:
        """Services the server serves (before `register`): they get a health status and are listed
        by reflection."""
        self.services = list(dict.fromkeys([*self.services, *names]))

    def register(self, server: grpc.aio.Server) -> None:
        """Add Health, Info and reflection to `server` (not started), with the initial statuses.
        The same hooks may be registered again on a new server (an agent whose first bind failed)."""
        status = SERVING if self._serving else NOT_SERVING
        for name in ("", *self.services):
            self.health.set(name, status)
        self.health.set(LIVE, SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        info_pb2_grpc.add_InfoServicer_to_server(InfoService(self.component, self.start_time), server)
        reflection.enable_server_reflection(self.listed(), server)

    def listed(self) -> Sequence[str]:
        """What reflection lists: the daemon's services and the hooks themselves."""
        return [*self.services, INFO_SERVICE, HEALTH_SERVICE, REFLECTION_SERVICE]

    def set_serving(self, serving: bool) -> None:
        """The daemon's readiness: `""` and every service of the daemon (not LIVE). Called on the
        server's loop thread; a no-op when unchanged, and once `shutdown` has begun."""
        if serving == self._serving or self.health.frozen:
            return
        self._serving = serving
        status = SERVING if serving else NOT_SERVING
        for name in ("", *self.services):
            self.health.set(name, status)

    def shutdown(self) -> None:
        """Before the server stops: every status NOT_SERVING, LIVE included, for good (watchers
        are told at once, so a load balancer drains the daemon while in-flight calls finish)."""
        self._serving = False
        self.health.freeze(NOT_SERVING)
