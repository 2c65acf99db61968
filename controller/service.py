"""gRPC servicers of the controller: thin shells that validate and call the engine.

Errors are raised, never aborted by hand: rpc.ErrorInterceptor maps them (see `translate`).
Every Controller call arrives admitted by the AuthInterceptor (controller/auth.py: who, and may
that role call this method); the handlers scope what they read and change to the caller's tenant
(controller/access.py). A job of another tenant is NOT_FOUND, word for word as a missing one."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import structlog

from tessera.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    InvalidInput,
    NotFound,
    PermissionDenied,
    TesseraError,
    Unauthenticated,
)
from tessera.common.jobspec import fill_guarantee
from tessera.common.nodespec import node_id_error, status_errors
from tessera.common.objective import cost_precondition, deadline_passed
from tessera.common.tls import peer_identity
from tessera.common.tokens import Principal
from tessera.controller import unended
from tessera.controller.access import list_tenant, may_see, submit_tenant
from tessera.controller.agents import peer_details
from tessera.controller.auth import principal_of
from tessera.controller.convert import job_pb
from tessera.controller.core.validate import JOB_ID_RE, REQUEST_ID_RE, summary, validate_spec
from tessera.controller.engine import Engine
from tessera.controller.errors import JobNotFound
from tessera.controller.listing import list_page
from tessera.controller.logstream import LogStream
from tessera.controller.node_listing import list_nodes
from tessera.controller.redact import Hide, hider
from tessera.controller.registry import fence_seconds
from tessera.controller.store import ACTIVE, JobRecord, RequestConflict
from tessera.controller.streams import StreamSlots
from tessera.controller.tenants import TenantsSource, submit_refusal, tenant_rows, unguarded_warnings
from tessera.controller.transitions import request_key
from tessera.controller.view import EngineView
from tessera.controller.watching import watch_events, watch_job, watch_jobs
from tessera.v1 import agent_pb2, agent_pb2_grpc, common_pb2, controller_pb2, controller_pb2_grpc

P = common_pb2
log = structlog.get_logger("tessera.controller.service")
# Problems named in one refused registration or heartbeat, at most.
MAX_REPORTED = 10


def translate() -> dict[type[BaseException], Callable[[Any], TesseraError]]:
    """The store's own errors as the statuses the Controller API answers.

    RequestConflict is defined outside the error model (store.py), so the server's ErrorInterceptor
    maps it by class; pass this as aio_server's `translate`. (The engine's JobNotFound and
    NodeNotFound are NotFound errors themselves.)
    """
    return {
        RequestConflict: lambda e: AlreadyExists(
            # A job's key is "tenant/request_id" (Engine.submit): the caller knows only its id.
            f"request_id: {str(e.args[0]).partition('/')[2] or e.args[0]} was already used for a "
            f"different {e.args[1] if len(e.args) > 1 else 'job spec'}"),
    }


def _request_id(rid: str) -> str:
    if not rid:
        raise InvalidArgument("request_id", "required on every mutating call")
    if not REQUEST_ID_RE.fullmatch(rid):
        raise InvalidArgument("request_id", "must match [A-Za-z0-9._:-]{1,128}")
    return rid


def _job_id(jid: str) -> str:
    if not jid:
        raise InvalidArgument("job_id", "required")
    if not JOB_ID_RE.fullmatch(jid):
        raise InvalidArgument("job_id", "malformed")
    return jid


def _states(states: Any) -> list[int]:
    for s in states:
        if s not in common_pb2.JobState.values() or s == 0:
            raise InvalidArgument("states", f"unknown state {s}")
    return list(states)


def _node_id(nid: str) -> str:
    why = node_id_error(nid)
    if why is not None:
        raise InvalidArgument("node_id", why)
    return nid


class ControllerService(controller_pb2_grpc.ControllerServicer):
    """`page_key` signs ListJobs continue tokens (controller/core/pagetoken.py): every controller
    that may answer a client's next page needs the same key (tessera-controller keeps it in
    STATE_DIR/page-token.key); None = a random key, good for this process only."""

    def __init__(self, engine: Engine, page_key: bytes | None = None) -> None:
        self.engine = engine
        self.view: EngineView = engine.view
        self.page_key = page_key or os.urandom(32)
        self.streams = StreamSlots()

    def _visible(self, jid: str, who: Principal) -> JobRecord:
        """The job, if `who` may see it; the same JobNotFound as for no job at all otherwise."""
        rec = self.view.get(jid)
        if not may_see(who, rec.spec.tenant):
            raise JobNotFound(jid)
        return rec

    def _tenants(self) -> TenantsSource:
        """The tenants config, reloaded first if the file changed (a stat): submissions and
        `get tenants` follow the file at once, rounds from the next one (kicked here)."""
        src = self.engine.tenants
        if src.refresh():
            self.engine.kick()
        return src

    def _job(self, jid: str, who: Principal, with_events: bool = False) -> controller_pb2.Job:
        rec = self.view.get(jid)
        return job_pb(rec, self.view.progress(jid), self.view.events(jid) if with_events else None,
                      self.engine.forecaster.get(jid), self._hide(who))

    def _hide(self, who: Principal) -> Hide | None:
        """Other tenants' job ids out of `who`'s texts (controller/redact.py)."""
        return hider(who, self.view.tenant_of)

    async def SubmitJob(self, request: controller_pb2.SubmitJobRequest, context: Any) -> controller_pb2.SubmitJobResponse:
        who = principal_of(context)
        rid = _request_id(request.request_id)
        if not request.HasField("spec"):
            raise InvalidArgument("spec", "required")
        fill_guarantee(request.spec)  # a guaranteed job without a guarantee is promised its hint
        errors = validate_spec(request.spec, self.engine.cfg.allowed_env)
        if errors:
            raise InvalidInput(summary(errors))  # every bad field at once, within a status's size
        cost_precondition(request.spec, self.engine.cfg.prices)
        request.spec.tenant = submit_tenant(who, request.spec.tenant)
        tenants = self._tenants()
        refused = submit_refusal(tenants.config, tenants.path, request.spec, tenants.last_error, who.sees_all)
        if refused is not None:  # nothing is stored: a job that could never be admitted here
            raise refused
        passed = deadline_passed(request.spec, self.engine.wall())
        if passed is not None and not self.view.has_request(request_key(request.spec.tenant or "default", rid)):
            raise passed  # a retry of a stored job gets the job, as below
        # The caps on unended jobs (the tenant's, all tenants'); no await from here to the store's create_job.
        capped = unended.check(self.view, request.spec.tenant or "default", rid, self.engine.cfg.max_unended_jobs,
                               tenants.config, self.engine.cfg.max_unended_jobs_total)
        if capped is not None:
            raise capped
        rec, created = await self.engine.submit(request.spec, rid, who)
        return controller_pb2.SubmitJobResponse(job=self._job(rec.id, who), created=created)

    async def GetJob(self, request: controller_pb2.GetJobRequest, context: Any) -> controller_pb2.Job:
        who = principal_of(context)
        rec = self._visible(_job_id(request.job_id), who)
        return self._job(rec.id, who, request.with_events)

    async def ListJobs(self, request: controller_pb2.ListJobsRequest, context: Any) -> controller_pb2.ListJobsResponse:
        who = principal_of(context)
        tenant = list_tenant(who, request.tenant)
        states = _states(request.states)

        def fetch(after: tuple[float, str] | None, limit: int) -> list[JobRecord]:
            return self.view.jobs_page(states, tenant, after, limit)

        return list_page(fetch, self.view.progress, self.page_key, states, tenant, request.limit,
                         request.continue_token, self.engine.forecaster.get, self._hide(who))

    async def CancelJob(self, request: controller_pb2.CancelJobRequest, context: Any) -> controller_pb2.Job:
        _request_id(request.request_id)
        who = principal_of(context)
        jid = self._visible(_job_id(request.job_id), who).id
        rec = await self.engine.cancel(jid, f"{who.name} ({who.role})")
        return job_pb(rec, self.view.progress(rec.id), hide=self._hide(who))

    async def WatchJobEvents(self, request: controller_pb2.WatchJobEventsRequest,
                             context: Any) -> AsyncIterator[common_pb2.JobEvent]:
        who = principal_of(context)
        jid = self._visible(_job_id(request.job_id), who).id
        with self.streams.hold(who, "WatchJobEvents"):
            async for event in watch_events(self.view, jid, request.after_seq, hide=self._hide(who)):
                yield event

    # WatchJob, WatchJobs, StreamJobLogs: controller/watching.py and controller/logstream.py.

    async def WatchJob(self, request: controller_pb2.WatchJobRequest,
                       context: Any) -> AsyncIterator[controller_pb2.JobUpdate]:
        who = principal_of(context)
        jid = self._visible(_job_id(request.job_id), who).id
        with self.streams.hold(who, "WatchJob"):
            async for update in watch_job(self.view, jid, hide=self._hide(who)):
                yield update

    async def WatchJobs(self, request: controller_pb2.WatchJobsRequest,
                        context: Any) -> AsyncIterator[controller_pb2.JobUpdate]:
        who = principal_of(context)
        tenant = list_tenant(who, request.tenant)
        with self.streams.hold(who, "WatchJobs"):
            async for update in watch_jobs(self.view, _states(request.states), tenant, hide=self._hide(who)):
                yield update

    async def StreamJobLogs(self, request: controller_pb2.StreamJobLogsRequest,
                            context: Any) -> AsyncIterator[controller_pb2.LogLines]:
        who = principal_of(context)
        jid = self._visible(_job_id(request.job_id), who).id
        logs = LogStream(self.view, self.engine.agents.read_log, self.engine.epoch)
        with self.streams.hold(who, "StreamJobLogs"):
            async for lines in logs.stream(jid, request):
                yield lines

    def _node(self, node_id: str, who: Principal) -> controller_pb2.Node:
        """One node as ListNodes answers it to `who` (its busy CPUs included)."""
        return next(n for n in list_nodes(self.view, who) if n.id == node_id)

    async def ListNodes(self, request: controller_pb2.ListNodesRequest, context: Any) -> controller_pb2.ListNodesResponse:
        who = principal_of(context)  # admitted by the AuthInterceptor, which checked the role table
        return controller_pb2.ListNodesResponse(nodes=list_nodes(self.view, who))

    async def ListTenants(self, request: controller_pb2.ListTenantsRequest,
                          context: Any) -> controller_pb2.ListTenantsResponse:
        """Every tenant for an admin; a user's own tenant only (its usage is its own business).

        No pending job is read, only counted by the store, as SubmitJob's cap counts: there may be
        thousands (reading 2,000 took 2.2 s, the event loop stalled). A user's call reads its own
        active jobs (their plans: the GPUs they hold) and counts its pending ones; an admin's reads
        every tenant's active jobs (bounded by the cluster's GPUs) and counts every tenant's pending
        ones (a tenant outside the file may hold pending jobs only, and still has its row)."""
        who = principal_of(context)
        only = "" if who.sees_all else (who.tenant or "default")
        src = self._tenants()
        cap = self.engine.cfg.max_unended_jobs
        waiting = (P.JOB_STATE_PENDING,)
        pending = {only: self.view.count_jobs(waiting, only)} if only else self.view.count_jobs_by_tenant(waiting)
        active = self.view.jobs(ACTIVE, only)
        rows = tenant_rows(src.config, active, only, cap, pending)
        for row in rows:  # the churn guard's cool-offs (in the engine's memory)
            row.no_preempt_until, row.no_preempt_reason = self.engine.churn.cooling(row.name, self.engine.wall())
        registered: dict[str, int] = {}
        for nid in self.view.node_ids():
            for g in self.view.node(nid).inventory.gpus:
                registered[g.model] = registered.get(g.model, 0) + 1
        # A user learns that quotas come from a file, not where the controller keeps it.
        shown = (src.path if who.sees_all else Path(src.path).name) if src.configured else ""
        return controller_pb2.ListTenantsResponse(
            tenants=rows, file=shown, loaded_at=src.loaded_at,
            # A user reads the warnings of its own jobs only: those its quota no longer covers.
            warnings=(src.warnings(registered) if who.sees_all else [])
            + unguarded_warnings(src.config, active, self.engine.admissions.unguarded))

    async def DrainNode(self, request: controller_pb2.DrainNodeRequest, context: Any) -> controller_pb2.Node:
        who = principal_of(context)
        _request_id(request.request_id)
        rec, unconfirmed = await self.engine.drain(_node_id(request.node_id), request.reason[:500])
        node = self._node(rec.id, who)
        node.agent_unconfirmed = unconfirmed
        return node

    async def UndrainNode(self, request: controller_pb2.UndrainNodeRequest, context: Any) -> controller_pb2.Node:
        who = principal_of(context)
        _request_id(request.request_id)
        rec, unconfirmed = await self.engine.undrain(_node_id(request.node_id))
        node = self._node(rec.id, who)
        node.agent_unconfirmed = unconfirmed
        return node

    async def RemoveNode(self, request: controller_pb2.RemoveNodeRequest,
                         context: Any) -> controller_pb2.RemoveNodeResponse:
        principal_of(context)
        rid = _request_id(request.request_id)
        removed = await self.engine.remove_node(_node_id(request.node_id), request.force, rid)
        return controller_pb2.RemoveNodeResponse(removed=removed)

    async def WhoAmI(self, request: controller_pb2.WhoAmIRequest, context: Any) -> controller_pb2.WhoAmIResponse:
        who = principal_of(context)
        return controller_pb2.WhoAmIResponse(principal=who.name, tenant=who.tenant, role=who.role)

    async def GetJobLogs(self, request: controller_pb2.GetJobLogsRequest, context: Any) -> controller_pb2.GetJobLogsResponse:
        rec = self._visible(_job_id(request.job_id), principal_of(context))
        if request.rank < 0 or request.attempt < 0 or request.tail_bytes < 0:
            raise InvalidArgument("rank, attempt, tail_bytes", "must be >= 0")
        if rec.placement is None or not rec.placement.slices:
            raise FailedPrecondition(f"job {rec.id} has not been placed yet")
        attempt = request.attempt or rec.attempt
        if attempt > rec.attempt:
            raise NotFound(f"job {rec.id} has no attempt {attempt} (its latest is {rec.attempt})")
        # The rank's node as StreamJobLogs finds it: a launcher of one process per node, an earlier
        # attempt on other nodes (before: ranks counted by GPU on the current placement only).
        logs = LogStream(self.view, self.engine.agents.read_log, self.engine.epoch)
        node_id = await logs.node_of(rec, attempt, request.rank)
        address = self.view.agent_address(node_id)
        if address is None:  # not UNAVAILABLE: the SDK would take it for this controller's and go elsewhere
            raise FailedPrecondition(f"node {node_id} holding the log is not reachable")
        try:
            resp = await self.engine.agents.read_log(node_id, address, agent_pb2.ReadLogRequest(
                controller_epoch=self.engine.epoch, job_id=rec.id, attempt=attempt, rank=request.rank,
                tail_bytes=request.tail_bytes or 65536))
        except grpc.aio.AioRpcError as e:  # the agent's answer, said as the caller's (never INTERNAL)
            why = f"rank {request.rank} attempt {attempt} of job {rec.id} on node {node_id}: {peer_details(e)}"
            if e.code() == grpc.StatusCode.NOT_FOUND:
                raise NotFound(f"no log of {why}") from None
            if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise FailedPrecondition(f"node {node_id} holding the log did not answer ({e.code().name}) "
                                         f"for {why}") from None
            raise FailedPrecondition(f"cannot read the log of {why} ({e.code().name})") from None
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
        """A forged or broken status is refused before anything of it is kept (common/nodespec.py)."""
        errors = status_errors(status)
        if len(errors) == 1:
            raise InvalidArgument(*errors[0])
        if errors:
            raise InvalidInput("; ".join(f"{f}: {r}" for f, r in errors[:MAX_REPORTED]))

    async def Register(self, request: agent_pb2.RegisterRequest, context: Any) -> agent_pb2.RegisterResponse:
        self._speaks_for(context, request.status.node_id)
        self._check(request.status)
        await self.engine.register(request.status)
        lv = self.engine.cfg.liveness
        return agent_pb2.RegisterResponse(controller_epoch=self.engine.epoch, lease_seconds=lv.lease_s,
                                          heartbeat_interval_seconds=lv.heartbeat_interval_s,
                                          fence_seconds=fence_seconds(lv), fence_grace_seconds=lv.fence_grace_s)

    async def Heartbeat(self, request: agent_pb2.HeartbeatRequest, context: Any) -> agent_pb2.HeartbeatResponse:
        self._speaks_for(context, request.status.node_id)
        self._check(request.status)
        ok = await self.engine.heartbeat(request.status, request.controller_epoch)
        return agent_pb2.HeartbeatResponse(reregister=not ok, controller_epoch=self.engine.epoch)
