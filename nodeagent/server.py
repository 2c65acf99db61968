"""The NodeAgent gRPC servicer: a thin shell over the supervisor, the epoch fence and the drain flag.

Handlers raise the core's errors (InvalidArgument, FailedPrecondition, NotFound); the server's
ErrorInterceptor (tessera.common.rpc) maps them to status codes and turns anything unexpected into
INTERNAL after logging it, so no request can take the server down.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from tessera.nodeagent.errors import FailedPrecondition
from tessera.nodeagent.supervisor import Supervisor
from tessera.v1 import agent_pb2, agent_pb2_grpc

log = structlog.get_logger("tessera.nodeagent.server")


class EpochFence:
    """The highest controller epoch this agent has seen.

    Calls from an older epoch come from a controller that has been replaced (a restart, a failover)
    and are refused, so a stale controller can neither launch nor stop anything. A newer epoch is
    accepted and becomes the floor. `on_raise` persists it, so the floor survives an agent restart.
    """

    def __init__(self, epoch: int = 0, on_raise: Callable[[int], None] | None = None) -> None:
        self.epoch = epoch
        self._on_raise = on_raise

    def observe(self, epoch: int) -> None:
        """Raise the floor to `epoch` if it is higher (from a RegisterResponse, for instance)."""
        if epoch > self.epoch:
            self.epoch = epoch
            if self._on_raise is not None:
                self._on_raise(epoch)

    def check(self, epoch: int) -> None:
        """FailedPrecondition for an epoch below the floor; otherwise observe it."""
        if epoch < self.epoch:
            raise FailedPrecondition(f"stale controller epoch {epoch} < {self.epoch}")
        self.observe(epoch)


class DrainFlag:
    """Whether this node refuses new launches; `on_change` triggers a prompt heartbeat."""

    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        self.draining = False
        self._on_change = on_change

    def set(self, draining: bool) -> None:
        if draining != self.draining:
            self.draining = draining
            log.info("drain changed", draining=draining)
            if self._on_change is not None:
                self._on_change()


class NodeAgentServicer(agent_pb2_grpc.NodeAgentServicer):  # type: ignore[misc]  # generated, untyped
    def __init__(self, supervisor: Supervisor, fence: EpochFence, drain: DrainFlag) -> None:
        self.supervisor = supervisor
        self.fence = fence
        self.drain = drain

    async def Launch(
        self, request: agent_pb2.LaunchRequest, context: Any
    ) -> agent_pb2.LaunchResponse:
        self.fence.check(request.controller_epoch)
        existing = self.supervisor.statuses_of(request.job_id, request.attempt)
        # A retried Launch of an attempt already running answers as before, even when draining.
        if self.drain.draining and existing is None:
            raise FailedPrecondition("node is draining: no new launches")
        started, workers = await self.supervisor.launch(request)
        log.info(
            "launch",
            request_id=request.request_id,
            job_id=request.job_id,
            attempt=request.attempt,
            started=started,
        )
        return agent_pb2.LaunchResponse(started=started, workers=workers)

    async def Stop(
        self, request: agent_pb2.StopRequest, context: Any
    ) -> agent_pb2.StopResponse:
        self.fence.check(request.controller_epoch)
        workers = await self.supervisor.stop(
            request.job_id, request.attempt, request.grace_seconds, request.reason
        )
        log.info("stop", request_id=request.request_id, job_id=request.job_id, attempt=request.attempt)
        return agent_pb2.StopResponse(workers=workers)

    async def Drain(
        self, request: agent_pb2.DrainRequest, context: Any
    ) -> agent_pb2.DrainResponse:
        self.fence.check(request.controller_epoch)
        self.drain.set(request.drain)
        return agent_pb2.DrainResponse(draining=self.drain.draining)

    async def ReadLog(
        self, request: agent_pb2.ReadLogRequest, context: Any
    ) -> agent_pb2.ReadLogResponse:
        self.fence.check(request.controller_epoch)
        path, data = self.supervisor.read_log(
            request.job_id, request.attempt, request.rank, request.tail_bytes
        )
        return agent_pb2.ReadLogResponse(path=path, data=data)

    async def ReportProgress(
        self, request: agent_pb2.ReportProgressRequest, context: Any
    ) -> agent_pb2.ReportProgressResponse:
        # Not fenced: it comes from a local worker, which knows no controller epoch.
        progress = request.progress if request.HasField("progress") else None
        checkpoint, stop = self.supervisor.report_progress(
            request.job_id, request.attempt, request.rank, progress
        )
        return agent_pb2.ReportProgressResponse(checkpoint_requested=checkpoint, stop_requested=stop)
