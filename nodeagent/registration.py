"""The loop that keeps the controller informed: Register, then Heartbeat with the whole node status.

- Register sends the whole NodeStatus with a fresh request id; its answer gives the controller
  epoch (raised into the fence) and the heartbeat interval.
- Heartbeat runs every interval, and at once when `wake` is set (a worker exited, drain changed), so
  the controller learns outcomes without waiting for the next tick.
- The agent registers again when the controller says reregister, answers with another epoch, or
  refuses a heartbeat with NOT_FOUND / FAILED_PRECONDITION (it forgot us, or restarted).
- An unreachable controller is retried forever with a backoff capped at `max_backoff` seconds;
  workers keep running meanwhile, until their keepers fence them. Every call carries a deadline.
- Every acknowledged Register or Heartbeat renews the self-fence (`on_renewed(sent, fence_seconds)`,
  sent = the call's time.monotonic() before it went out; tessera.nodeagent.selffence).
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable, Iterable
from enum import Enum

import grpc
import grpc.aio
import structlog

from tessera.nodeagent.controllers import ControllerSet
from tessera.nodeagent.selffence import fence_seconds
from tessera.nodeagent.server import EpochFence
from tessera.v1 import agent_pb2, agent_pb2_grpc

log = structlog.get_logger("tessera.nodeagent.registration")

DEFAULT_INTERVAL = 5.0
MIN_INTERVAL = 0.05
MAX_INTERVAL = 300.0
_REREGISTER_CODES = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)


class Outcome(Enum):
    OK = "ok"
    REREGISTER = "reregister"
    FAILED = "failed"


class Backoff:
    """Exponential delays from `initial`, doubling up to `cap`; reset after a success."""

    def __init__(self, initial: float = 0.1, cap: float = 2.0) -> None:
        self.initial = initial
        self.cap = cap
        self._next = initial

    def next(self) -> float:
        delay = self._next
        self._next = min(self.cap, self._next * 2)
        return min(delay, self.cap)

    def reset(self) -> None:
        self._next = self.initial


def _interval(value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        return DEFAULT_INTERVAL
    return min(MAX_INTERVAL, max(MIN_INTERVAL, value))


class Registrar:
    def __init__(
        self,
        stub: agent_pb2_grpc.AgentRegistryStub | ControllerSet,
        status: Callable[[], agent_pb2.NodeStatus],
        fence: EpochFence,
        wake: asyncio.Event,
        *,
        deadline: float = 5.0,
        max_backoff: float = 2.0,
        on_result: Callable[[bool], None] | None = None,
        on_renewed: Callable[[float, float], None] | None = None,
        on_fence_grace: Callable[[float], None] | None = None,
        marks: Callable[[], Iterable[agent_pb2.AttemptMark]] | None = None,
    ) -> None:
        # One controller's stub, or the set of a highly available controller (moves on failures).
        self._controllers = stub if isinstance(stub, ControllerSet) else None
        self._fixed_stub = None if isinstance(stub, ControllerSet) else stub
        self._status = status
        self._marks = marks or (lambda: ())  # sent in Register only (NodeStatus.attempt_marks)
        self._fence = fence
        self._wake = wake
        self.deadline = deadline
        self._backoff = Backoff(cap=max_backoff)
        self._on_result = on_result or (lambda ok: None)
        self._on_renewed = on_renewed or (lambda sent, seconds: None)
        self._on_fence_grace = on_fence_grace or (lambda seconds: None)
        self.fence_seconds = 0.0  # from the last RegisterResponse; 0 = no self-fencing
        # The epoch this agent is registered under; None = must register.
        self.epoch: int | None = None
        self.interval = DEFAULT_INTERVAL
        self.lease = 0.0
        self.registered = asyncio.Event()  # set after the first successful registration
        self.registrations = 0
        self.heartbeats = 0
        self.failures = 0  # failed Register/Heartbeat calls, in total
        self.last_success: float | None = None  # time.monotonic()

    async def run(self) -> None:
        """Register and heartbeat until cancelled; never raises otherwise."""
        while True:
            try:
                outcome = await (self._register() if self.epoch is None else self._heartbeat())
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not stop heartbeats for good
                log.exception("registration loop error")
                outcome = Outcome.FAILED
            if outcome is Outcome.OK:
                self._backoff.reset()
                await self._wait_next()
            elif outcome is Outcome.FAILED:
                await asyncio.sleep(self._backoff.next())
            # REREGISTER: go round at once.

    async def _wait_next(self) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=self.interval)
        except TimeoutError:
            pass
        # Cleared before the status is built: a change after this point sets it again and is sent
        # in the following heartbeat, so none is lost.
        self._wake.clear()

    @property
    def _stub(self) -> agent_pb2_grpc.AgentRegistryStub:
        return self._controllers.stub if self._controllers is not None else self._fixed_stub

    def _succeeded(self, sent: float) -> None:
        self.last_success = time.monotonic()
        self._on_result(True)
        self._on_renewed(sent, self.fence_seconds)

    def _failed(self, call: str, exc: grpc.RpcError) -> None:
        self.failures += 1
        self._on_result(False)
        if self._controllers is not None:
            self._controllers.failed(exc)
        code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
        log.warning(
            f"{call} failed",
            code=code.name if code else None,
            error=exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc),
        )

    async def _register(self) -> Outcome:
        status = self._status()
        status.attempt_marks.extend(self._marks())
        request = agent_pb2.RegisterRequest(request_id=str(uuid.uuid4()), status=status)
        sent = time.monotonic()
        try:
            resp = await self._stub.Register(request, timeout=self.deadline)
        except grpc.RpcError as exc:
            self._failed("register", exc)
            return Outcome.FAILED
        if resp.controller_epoch < self._fence.epoch:
            # Calls from this controller will be refused by the fence; say why loudly.
            log.error(
                "controller epoch went backwards; its calls will be refused",
                controller_epoch=resp.controller_epoch,
                highest_seen=self._fence.epoch,
            )
        self._fence.observe(resp.controller_epoch)
        self.epoch = resp.controller_epoch
        self.interval = _interval(resp.heartbeat_interval_seconds)
        self.lease = resp.lease_seconds
        self.fence_seconds = fence_seconds(resp.fence_seconds, resp.lease_seconds)
        if math.isfinite(resp.fence_grace_seconds) and resp.fence_grace_seconds > 0:
            self._on_fence_grace(resp.fence_grace_seconds)
        self.registrations += 1
        self.registered.set()
        self._succeeded(sent)
        log.info(
            "registered",
            controller_epoch=self.epoch,
            heartbeat_interval=self.interval,
            lease_seconds=self.lease,
            fence_seconds=self.fence_seconds,
            workers=len(request.status.workers),
        )
        if not self.fence_seconds:
            log.warning("the controller gave no lease or fence: workers are not self-fenced")
        return Outcome.OK

    async def _heartbeat(self) -> Outcome:
        assert self.epoch is not None
        request = agent_pb2.HeartbeatRequest(status=self._status(), controller_epoch=self.epoch)
        sent = time.monotonic()
        try:
            resp = await self._stub.Heartbeat(request, timeout=self.deadline)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _REREGISTER_CODES:
                log.info("controller refused the heartbeat; registering again", code=exc.code().name)
                self.epoch = None
                return Outcome.REREGISTER
            self._failed("heartbeat", exc)
            return Outcome.FAILED
        except grpc.RpcError as exc:
            self._failed("heartbeat", exc)
            return Outcome.FAILED
        # 0 means the controller left the field unset: only a different, set epoch counts.
        if resp.reregister or (resp.controller_epoch and resp.controller_epoch != self.epoch):
            log.info(
                "controller asks to register again", reregister=resp.reregister, epoch=resp.controller_epoch
            )
            self._fence.observe(resp.controller_epoch)
            self.epoch = None
            return Outcome.REREGISTER
        self.heartbeats += 1
        self._succeeded(sent)
        return Outcome.OK
