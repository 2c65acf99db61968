"""The NodeAgent gRPC servicer: a thin shell over the supervisor, the epoch fence and the drain flag.

Handlers raise the core's errors (InvalidArgument, FailedPrecondition, NotFound); the server's
ErrorInterceptor (tessera.common.rpc) maps them to status codes and turns anything unexpected into
INTERNAL after logging it, so no request can take the server down.

Who may call what (docs/security.md): Launch, Stop, Drain and ReadLog come over TCP from the
controller's certificate only (with `authenticate`; --insecure trusts anyone on TCP), so an epoch
reaches the fence only from the authenticated controller. ReportProgress comes from this node's
workers only: over the agent's unix socket, with the attempt's secret (`WorkerTokens`) in the
metadata `tessera-worker-token`. Neither kind of call is served on the other's transport.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from tessera.common.errors import PermissionDenied, Unauthenticated
from tessera.common.identity import CONTROLLER
from tessera.common.nodespec import report_text
from tessera.common.privatefile import key_file
from tessera.common.tls import peer_identity, peer_is_local
from tessera.nodeagent import ports
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


WORKER_TOKEN_ENV = "TESSERA_WORKER_TOKEN"
WORKER_TOKEN_METADATA = "tessera-worker-token"
SECRET_FILE = "worker-secret"
# A Stop's reason goes into every stopped worker's reason: a controller repeats peers' text there.
STOP_REASON_MAX = 1024


class WorkerTokens:
    """The secret of each attempt, given to its workers in TESSERA_WORKER_TOKEN.

    Derived, not stored: HMAC-SHA256 of "job_id\nattempt" under a random key kept in
    <work-dir>/worker-secret (0600), so workers re-adopted by a restarted agent still hold a valid
    token, and no table of tokens has to be persisted. One attempt's workers cannot speak for
    another attempt's, nor guess the key from their own token.
    """

    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def load_or_create(cls, work_dir: Path) -> WorkerTokens:
        return cls(key_file(work_dir / SECRET_FILE))

    def token(self, job_id: str, attempt: int) -> str:
        return hmac.new(self._key, f"{job_id}\n{attempt}".encode(), hashlib.sha256).hexdigest()

    def check(self, job_id: str, attempt: int, presented: str | None) -> None:
        if not presented:
            raise Unauthenticated(f"ReportProgress needs the attempt's secret in metadata {WORKER_TOKEN_METADATA} "
                                  f"(the worker's {WORKER_TOKEN_ENV})")
        if not hmac.compare_digest(presented.encode(errors="replace"), self.token(job_id, attempt).encode()):
            raise PermissionDenied(f"the worker token is not the one of job {job_id[:80]!r} attempt {attempt}")


def _metadata(context: Any, key: str) -> str | None:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else v.decode(errors="replace")
    return None


# NodeAgent's methods that only the controller may call.
CONTROLLER_METHODS = frozenset({"Launch", "Stop", "Drain", "ReadLog"})


class NodeAgentServicer(agent_pb2_grpc.NodeAgentServicer):  # type: ignore[misc]  # generated, untyped
    def __init__(self, supervisor: Supervisor, fence: EpochFence, drain: DrainFlag, *,
                 tokens: WorkerTokens | None = None, authenticate: bool = True) -> None:
        self.supervisor = supervisor
        self.fence = fence
        self.drain = drain
        self.tokens = tokens or WorkerTokens(secrets.token_bytes(32))
        self.authenticate = authenticate

    def _from_controller(self, method: str, context: Any) -> None:
        """Only the controller, over TCP: never a local worker, never another certificate."""
        if peer_is_local(context):
            raise PermissionDenied(f"{method} is not served on the workers' socket")
        if not self.authenticate:
            return
        who = peer_identity(context)
        if who is None:
            raise Unauthenticated(f"{method} needs the controller's client certificate")
        if who != CONTROLLER:
            log.warning("call refused", method=method, certificate=str(who))
            raise PermissionDenied(f"{method} is the controller's; the certificate of {who} may not call it")

    def check_call(self, method: str, context: Any) -> None:
        """The TCP server's check of a call before its request is read (rpc.Authorize): the
        controller's methods from the controller's certificate only, ReportProgress never (it is the
        workers' socket's). A refused caller's request is then never taken in: before, 48 refused
        15 MiB Launches held 720 MB of the agent's memory (a live audit). The handlers check again."""
        if method == "ReportProgress":
            raise PermissionDenied("ReportProgress is served only on the agent's unix socket, to its workers")
        if method in CONTROLLER_METHODS:
            self._from_controller(method, context)

    async def Launch(
        self, request: agent_pb2.LaunchRequest, context: Any
    ) -> agent_pb2.LaunchResponse:
        self._from_controller("Launch", context)
        self.fence.check(request.controller_epoch)
        existing = self.supervisor.statuses_of(request.job_id, request.attempt)
        # A retried Launch of an attempt already running answers as before, even when draining.
        if self.drain.draining and existing is None:
            raise FailedPrecondition("node is draining: no new launches")
        port = request.rendezvous.rpartition(":")[2]
        if existing is None and any(r.rank == 0 for r in request.ranks) and port.isdigit() \
                and 0 < int(port) < 65536 and ports.held(int(port)):
            raise FailedPrecondition(f"rendezvous port {port} is already held by another process on this node; "
                                     "the job's next attempt gets another port")
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
        self._from_controller("Stop", context)
        self.fence.check(request.controller_epoch)
        workers = await self.supervisor.stop(
            request.job_id, request.attempt, request.grace_seconds, report_text(request.reason, STOP_REASON_MAX)
        )
        log.info("stop", request_id=request.request_id, job_id=request.job_id, attempt=request.attempt)
        return agent_pb2.StopResponse(workers=workers)

    async def Drain(
        self, request: agent_pb2.DrainRequest, context: Any
    ) -> agent_pb2.DrainResponse:
        self._from_controller("Drain", context)
        self.fence.check(request.controller_epoch)
        self.drain.set(request.drain)
        return agent_pb2.DrainResponse(draining=self.drain.draining)

    async def ReadLog(
        self, request: agent_pb2.ReadLogRequest, context: Any
    ) -> agent_pb2.ReadLogResponse:
        self._from_controller("ReadLog", context)
        self.fence.check(request.controller_epoch)
        path, data, offset, size = self.supervisor.read_log_chunk(
            request.job_id, request.attempt, request.rank, request.tail_bytes,
            request.offset if request.from_offset else None,
        )
        return agent_pb2.ReadLogResponse(path=path, data=data, offset=offset, size=size)

    async def ReportProgress(
        self, request: agent_pb2.ReportProgressRequest, context: Any
    ) -> agent_pb2.ReportProgressResponse:
        # Not fenced: it comes from a local worker, which knows no controller epoch.
        if not peer_is_local(context):
            raise PermissionDenied("ReportProgress is served only on the agent's unix socket, to its workers")
        self.tokens.check(request.job_id, request.attempt, _metadata(context, WORKER_TOKEN_METADATA))
        progress = request.progress if request.HasField("progress") else None
        checkpoint, stop = self.supervisor.report_progress(
            request.job_id, request.attempt, request.rank, progress
        )
        return agent_pb2.ReportProgressResponse(checkpoint_requested=checkpoint, stop_requested=stop)
