"""gRPC servicers of the controller: thin shells that validate and call the engine.

Errors are raised, never aborted by hand: rpc.ErrorInterceptor maps them (see `translate`)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import structlog

from tessera.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    InvalidInput,
    PermissionDenied,
    TesseraError,
    Unauthenticated,
    Unavailable,
)
from tessera.common.tls import peer_identity
from tessera.controller.convert import event_pb, job_pb
from tessera.controller.core.validate import JOB_ID_RE, REQUEST_ID_RE, validate_spec
from tessera.controller.engine import Engine
from tessera.controller.store import TERMINAL, RequestConflict
from tessera.controller.view import EngineView
from tessera.v1 import agent_pb2, agent_pb2_grpc, common_pb2, controller_pb2, controller_pb2_grpc

log = structlog.get_logger("tessera.controller.service")
NODE_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
ADDRESS_RE = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):\d{1,5}$")


def translate() -> dict[type[BaseException], Callable[[Any], TesseraError]]:
    """The store's own errors as the statuses the Controller API answers.

    RequestConflict is defined outside the error model (store.py), so the server's ErrorInterceptor
    maps it by class; pass this as aio_server's `translate`. (The engine's JobNotFound and
    NodeNotFound are NotFound errors themselves.)
    """
    return {
        RequestConflict: lambda e: AlreadyExists(
            f"request_id: {e.args[0]} was already used for a different job spec"),
    }


def _request_id(rid: str) -> str:
    if not rid:
        raise InvalidArgument("request_id", "required on every mutating call")
    if not REQUEST_ID_RE.match(rid):
        raise InvalidArgument("request_id", "must match [A-Za-z0-9._:-]{1,128}")
    return rid


def _job_id(jid: str) -> str:
    if not jid:
        raise InvalidArgument("job_id", "required")
    if not JOB_ID_RE.match(jid):
        raise InvalidArgument("job_id", "malformed")
    return jid


def _node_id(nid: str) -> str:
    if not nid:
        raise InvalidArgument("node_id", "required")
    if not NODE_ID_RE.match(nid):
        raise InvalidArgument("node_id", "must match [a-z0-9][a-z0-9._-]{0,62}")
    return nid


class ControllerService(controller_pb2_grpc.ControllerServicer):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.view: EngineView = engine.view

    def _job(self, jid: str, with_events: bool = False) -> controller_pb2.Job:
        rec = self.view.get(jid)
        return job_pb(rec, self.view.progress(jid), self.view.events(jid) if with_events else None)

    async def SubmitJob(self, request: controller_pb2.SubmitJobRequest, context: Any) -> controller_pb2.SubmitJobResponse:
        rid = _request_id(request.request_id)
        if not request.HasField("spec"):
            raise InvalidArgument("spec", "required")
        errors = validate_spec(request.spec)
        if errors:
            raise InvalidInput("; ".join(map(str, errors)))  # every bad field at once
        rec, created = await self.engine.submit(request.spec, rid)
        return controller_pb2.SubmitJobResponse(job=self._job(rec.id), created=created)

    async def GetJob(self, request: controller_pb2.GetJobRequest, context: Any) -> controller_pb2.Job:
        return self._job(_job_id(request.job_id), request.with_events)

    async def ListJobs(self, request: controller_pb2.ListJobsRequest, context: Any) -> controller_pb2.ListJobsResponse:
        for s in request.states:
            if s not in common_pb2.JobState.values() or s == 0:
                raise InvalidArgument("states", f"unknown state {s}")
        recs = self.view.jobs(request.states, request.tenant)
        return controller_pb2.ListJobsResponse(jobs=[job_pb(r, self.view.progress(r.id)) for r in recs])

    async def CancelJob(self, request: controller_pb2.CancelJobRequest, context: Any) -> controller_pb2.Job:
        _request_id(request.request_id)
        rec = await self.engine.cancel(_job_id(request.job_id))
        return job_pb(rec, self.view.progress(rec.id))

    async def WatchJobEvents(self, request: controller_pb2.WatchJobEventsRequest,
                             context: Any) -> AsyncIterator[common_pb2.JobEvent]:
        jid = _job_id(request.job_id)
        self.view.get(jid)
        seq = request.after_seq
        while True:
            events = self.view.events(jid, seq)
            for e in events:
                seq = e.seq
                yield event_pb(e)
            if not events and self.view.get(jid).state in TERMINAL:
                return
            await self.view.wait_changed(5.0)

    def _node(self, node_id: str, busy: dict[str, set[int]]) -> controller_pb2.Node:
        n = self.view.node(node_id)
        return controller_pb2.Node(
            id=n.id, address=n.address, state=n.state, reason=n.reason, inventory=n.inventory,
            last_heartbeat=n.last_heartbeat_wall, busy_gpus=sorted(busy.get(node_id, ())))

    async def ListNodes(self, request: controller_pb2.ListNodesRequest, context: Any) -> controller_pb2.ListNodesResponse:
        busy = self.view.busy_gpus()
        return controller_pb2.ListNodesResponse(nodes=[self._node(n, busy) for n in self.view.node_ids()])

    async def DrainNode(self, request: controller_pb2.DrainNodeRequest, context: Any) -> controller_pb2.Node:
        _request_id(request.request_id)
        rec = await self.engine.drain(_node_id(request.node_id), request.reason[:500])
        return self._node(rec.id, self.view.busy_gpus())

    async def UndrainNode(self, request: controller_pb2.UndrainNodeRequest, context: Any) -> controller_pb2.Node:
        _request_id(request.request_id)
        rec = await self.engine.undrain(_node_id(request.node_id))
        return self._node(rec.id, self.view.busy_gpus())

    async def GetJobLogs(self, request: controller_pb2.GetJobLogsRequest, context: Any) -> controller_pb2.GetJobLogsResponse:
        rec = self.view.get(_job_id(request.job_id))
        if request.rank < 0 or request.attempt < 0 or request.tail_bytes < 0:
            raise InvalidArgument("rank, attempt, tail_bytes", "must be >= 0")
        if rec.placement is None or not rec.placement.slices:
            raise FailedPrecondition(f"job {rec.id} has not been placed yet")
        rank, node_id = request.rank, ""
        for s in rec.placement.slices:
            if rank < len(s.gpu_indices):
                node_id = s.node_id
                break
            rank -= len(s.gpu_indices)
        if not node_id:
            raise InvalidArgument("rank", f"job {rec.id} has no rank {request.rank}")
        address = self.view.agent_address(node_id)
        if address is None:
            raise Unavailable(f"node {node_id} holding the log is not reachable")
        resp = await self.engine.agents.read_log(node_id, address, agent_pb2.ReadLogRequest(
            controller_epoch=self.engine.epoch, job_id=rec.id, attempt=request.attempt or rec.attempt,
            rank=request.rank, tail_bytes=request.tail_bytes or 65536))
        return controller_pb2.GetJobLogsResponse(node_id=node_id, path=resp.path, data=resp.data)


class RegistryService(agent_pb2_grpc.AgentRegistryServicer):
    """Register and Heartbeat speak for one node: with `authenticate` (the controller serves TLS),
    only over the mTLS certificate of that node (docs/security.md), so nobody else can move a node's
    address or report its workers' exits. Without it (--insecure) anyone can, as the flag says."""

    def __init__(self, engine: Engine, authenticate: bool = True) -> None:
        self.engine = engine
        self.authenticate = authenticate

    def _speaks_for(self, context: Any, node_id: str) -> None:
        if not self.authenticate:
            return
        who = peer_identity(context)
        if who is None:
            raise Unauthenticated("AgentRegistry needs the node's client certificate: connect to the "
                                  "controller's agent port (--agent-listen) with the agent's --tls-dir")
        if who.kind != "node" or who.name != node_id:
            log.warning("registry_identity_refused", certificate=str(who), node_id=node_id[:80])
            raise PermissionDenied(f"status.node_id: the certificate of {who} may not speak for node "
                                   f"{node_id[:80]!r}")

    @staticmethod
    def _check(status: agent_pb2.NodeStatus) -> None:
        _node_id(status.node_id)
        if not ADDRESS_RE.match(status.address):
            raise InvalidArgument("status.address", "must be host:port")
        if not status.inventory.gpus:
            raise InvalidArgument("status.inventory.gpus", "a node must report at least one GPU")
        for g in status.inventory.gpus:
            if g.memory_bytes <= 0:
                raise InvalidArgument(f"status.inventory.gpus[{g.index}].memory_bytes", "must be > 0")

    async def Register(self, request: agent_pb2.RegisterRequest, context: Any) -> agent_pb2.RegisterResponse:
        self._speaks_for(context, request.status.node_id)
        self._check(request.status)
        await self.engine.register(request.status)
        lv = self.engine.cfg.liveness
        return agent_pb2.RegisterResponse(controller_epoch=self.engine.epoch, lease_seconds=lv.lease_s,
                                          heartbeat_interval_seconds=lv.heartbeat_interval_s)

    async def Heartbeat(self, request: agent_pb2.HeartbeatRequest, context: Any) -> agent_pb2.HeartbeatResponse:
        self._speaks_for(context, request.status.node_id)
        ok = await self.engine.heartbeat(request.status, request.controller_epoch)
        return agent_pb2.HeartbeatResponse(reregister=not ok, controller_epoch=self.engine.epoch)
