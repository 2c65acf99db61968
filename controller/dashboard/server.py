"""The controller's read-only web dashboard: routes, authorization and the history sampler
(docs/dashboard.md).

Authorization is the Controller API's own: the same Authenticator (a bearer token from the tokens
file; `Authorization: Bearer` or the `tessera_token` cookie that /login sets), the same role table
(controller/access.py: each page is authorized as the RPC that reads the same data: ListNodes,
ListJobs, GetJob) and the same tenant rules (a user sees its tenant's jobs; another tenant's job is
404, as a missing one). Only the login page and the static files answer without a token.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from tessera.common.errors import (
    InvalidArgument,
    InvalidInput,
    NotFound,
    PermissionDenied,
    TesseraError,
    Unauthenticated,
    Unavailable,
)
from tessera.common.jobspec import NAME_RULE
from tessera.common.tls import TlsConfig
from tessera.common.tokens import TENANT_RE, Principal
from tessera.controller import metrics
from tessera.controller.access import authorize, list_tenant, may_see
from tessera.controller.auth import Authenticator, InsecureAuthenticator
from tessera.controller.convert import job_pb
from tessera.controller.core.validate import JOB_ID_RE
from tessera.controller.dashboard import joblist, pages
from tessera.controller.dashboard.budget import LoopBudget
from tessera.controller.dashboard.data import capacity_json, dumps, message_json, progress_json
from tessera.controller.dashboard.history import History
from tessera.controller.dashboard.http import HttpServer, Request, Response
from tessera.controller.dashboard.options import is_loopback
from tessera.controller.dashboard.pages import HeldJob
from tessera.controller.errors import JobNotFound
from tessera.controller.listing import list_page
from tessera.controller.node_listing import list_nodes
from tessera.controller.redact import hider
from tessera.controller.store import ACTIVE, JobRecord
from tessera.v1 import common_pb2, controller_pb2

if TYPE_CHECKING:
    from tessera.controller.engine import Engine

log = structlog.get_logger("tessera.controller.dashboard")

STATIC = Path(__file__).resolve().parent / "static"
STATIC_TYPES = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
COOKIE = "tessera_token"
SAMPLE_IDLE_S = 5.0  # the sampler looks at least this often, notified or not
SAMPLE_MIN_S = 0.5  # and at most this often (a burst of notifications costs one sample)
JOB_PAGE_RE = re.compile(r"/(?:api/)?jobs/([^/]+)")
STATUS = {Unauthenticated: 401, PermissionDenied: 403, NotFound: 404, InvalidInput: 400, Unavailable: 503}


def ssl_context(cfg: TlsConfig) -> ssl.SSLContext:
    """HTTPS with the controller's own certificate (the one its gRPC API serves)."""
    assert cfg.cert is not None and cfg.key is not None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="tessera-dashboard-") as d:  # load_cert_chain reads files only
        cert, key = Path(d) / "cert.pem", Path(d) / "key.pem"
        cert.write_bytes(cfg.cert)
        key.touch(mode=0o600)
        key.write_bytes(cfg.key)
        ctx.load_cert_chain(cert, key)
    return ctx


def token_metadata(req: Request) -> list[tuple[str, str]]:
    """The call's credentials as gRPC metadata: the Authorization header(s), else the cookie."""
    values = req.header("authorization")
    if values:
        return [("authorization", v) for v in values]
    for header in req.header("cookie"):
        for part in header.split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE and value:
                return [("authorization", f"Bearer {value}")]
    return []


def job_states(text: str) -> list[int]:
    states = []
    for word in filter(None, (w.strip() for w in text.split(","))):
        name = "JOB_STATE_" + word.upper()
        if name not in common_pb2.JobState.DESCRIPTOR.values_by_name or name == "JOB_STATE_UNSPECIFIED":
            raise InvalidArgument("state", f"unknown state {word[:40]!r}")
        states.append(common_pb2.JobState.Value(name))
    return states


def tenant_filter(who: Principal, text: str) -> str:
    """`?tenant=` as ListJobs takes it (access.list_tenant), once it is a tenant's name at all (the
    job file's rule, which SubmitJob and the tokens file apply): a well-formed name of no tenant
    lists no job, as ListJobs does (a tenant has no record beyond its jobs and the tenants file)."""
    if text and not TENANT_RE.fullmatch(text):
        raise InvalidArgument("tenant", f"must be a tenant's name: {NAME_RULE}")
    return list_tenant(who, text)


class Standby(Unavailable):
    """No engine here; `leader`: the leader's address as the gRPC refusal names it ("" = unknown)."""

    def __init__(self, message: str, leader: str = "") -> None:
        super().__init__(message)
        self.leader = leader


class Dashboard:
    """Serves the pages and /api/ of the engine `attach` gave (none yet, or a standby that lost
    its lead: 503). `leader` names the leader's address without I/O ("" when unknown), as the gRPC
    gate's (leader_gate.LeaderSwitch): a standby's 503 says it; set it after construction when the
    election starts later."""

    def __init__(self, auth: Authenticator, tls: TlsConfig | None = None, standby_reason: str = "",
                 leader: Callable[[], str] = lambda: "") -> None:
        self.auth = auth
        self.leader = leader
        self.engine: Engine | None = None
        self.history = History()
        self.page_key = os.urandom(32)  # continue tokens of /api/jobs; this process only
        self.standby_reason = standby_reason or "the controller is starting"
        self.server = HttpServer(self.handle, ssl_context(tls) if tls is not None else None)
        self.budget = LoopBudget()
        self._sampler: asyncio.Task[None] | None = None

    async def start(self, listen: str) -> int:
        host, _, port = listen.rpartition(":")
        return await self.server.start(host.strip("[]"), int(port))

    def attach(self, engine: Engine) -> None:
        self.engine = engine
        self.history = History()
        self._sampler = asyncio.create_task(self._sample(engine))

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        await self.server.close()

    async def _sample(self, engine: Engine) -> None:
        while True:
            try:
                self._observe(engine)
            except Exception:
                log.exception("dashboard_sample_failed")
            await asyncio.sleep(SAMPLE_MIN_S)
            await engine.view.wait_changed(SAMPLE_IDLE_S)

    def _observe(self, engine: Engine) -> None:
        view, now = engine.view, engine.wall()
        self.history.observe(now, engine.rounds, lambda: metrics.gpu_states(view, now),
                             {j.id: view.progress(j.id) for j in view.jobs(states=ACTIVE)})

    # ---------------------------------------------------------------- routing

    async def handle(self, req: Request) -> Response:
        if isinstance(self.auth, InsecureAuthenticator) and not all(map(loopback_host, req.header("host"))):
            # Open (no tokens: loopback only, as main checks): a page a browser loaded from another
            # site may point its own name at 127.0.0.1 (DNS rebinding), and then reads as a local
            # caller; its requests still name that site in Host.
            return Response(421, b"this dashboard answers requests for localhost only\n")
        path = req.path.rstrip("/") or "/"
        if path.startswith("/static/"):
            return self._static(path[len("/static/"):])
        if path == "/login":
            return html(200, pages.login_page())
        api = path.startswith("/api/")
        if self.budget.exhausted():
            return Response(503, b"the dashboard is busy: try again in a second\n", headers=[("Retry-After", "1")])
        started = self.budget.clock()
        try:
            return self._route(path, req, api)
        except TesseraError as e:
            status = next((s for cls, s in STATUS.items() if isinstance(e, cls)), 500)
            if api:
                doc = {"error": str(e), "code": e.code.value}
                if isinstance(e, Standby) and e.leader:
                    doc["leader"] = e.leader
                return Response(status, dumps(doc), "application/json")
            if status == 401:
                return html(401, pages.login_page(str(e)))
            return html(status, pages.error_page(status, str(e)))
        finally:
            self.budget.spend(started)

    def _static(self, name: str) -> Response:
        if name not in STATIC_TYPES:
            return Response(404, b"not found\n")
        return Response(200, (STATIC / name).read_bytes(), STATIC_TYPES[name],
                        headers=[("Cache-Control", "max-age=300")])

    def _principal(self, req: Request, method: str) -> Principal:
        principal = self.auth.authenticate(token_metadata(req))
        authorize(method, principal)
        return principal

    def _engine(self) -> Engine:
        if self.engine is None:
            leader = self.leader()
            where = f"; leader at {leader}" if leader else ""
            raise Standby(f"no data here: {self.standby_reason}{where}", leader)
        return self.engine

    def _route(self, path: str, req: Request, api: bool) -> Response:
        if path in ("/", "/api/capacity"):
            who = self._principal(req, "ListNodes")
            nodes = list_nodes(self._engine().view, who)
            if api:
                return json_response(capacity_json(self.history.capacity))
            return html(200, pages.cluster_page(who, self.history.capacity, nodes, self._engine().wall()))
        if path in ("/nodes", "/api/nodes"):
            who = self._principal(req, "ListNodes")
            nodes = list_nodes(self._engine().view, who)  # ListNodes's own answer to `who`
            if api:
                return json_response({"nodes": [message_json(n) for n in nodes]})
            return html(200, pages.nodes_page(who, nodes, self._held(who), self._engine().wall()))
        if path == "/api/jobs":
            return json_response(message_json(self._jobs(self._principal(req, "ListJobs"), req)))
        if path == "/jobs":
            who = self._principal(req, "ListJobs")
            return html(200, self._jobs_page(who, req))
        m = JOB_PAGE_RE.fullmatch(path)
        if m:
            who = self._principal(req, "GetJob")
            job = self._job(who, m.group(1))
            points = self.history.progress.points(job.id)
            if api:
                return json_response({"job": message_json(job), "progress_history": progress_json(points)})
            return html(200, pages.job_page(who, job, points, self._engine().wall()))
        raise NotFound(f"no page {path[:200]}")

    def _held(self, who: Principal) -> dict[str, list[HeldJob]]:
        held: dict[str, list[HeldJob]] = {}
        for j in self._engine().view.jobs(states=ACTIVE):
            if may_see(who, j.spec.tenant) and j.placement is not None:
                for s in j.placement.slices:
                    held.setdefault(s.node_id, []).append((j.id, j.spec.name, tuple(s.gpu_indices)))
        return held

    def _jobs(self, who: Principal, req: Request) -> controller_pb2.ListJobsResponse:
        view = self._engine().view
        tenant = tenant_filter(who, req.query.get("tenant", ""))
        states = job_states(req.query.get("state", ""))
        try:
            limit = int(req.query.get("limit", "0"))
        except ValueError:
            raise InvalidArgument("limit", "must be an integer") from None

        def fetch(after: tuple[float, str] | None, n: int) -> list[JobRecord]:
            return view.jobs_page(states, tenant, after, n)

        return list_page(fetch, view.progress, self.page_key, states, tenant, limit, req.query.get("continue", ""),
                         self._engine().forecaster.get, hider(who, view.tenant_of))

    def _jobs_page(self, who: Principal, req: Request) -> str:
        """Not the listing's first page (the oldest jobs): joblist.select's, newest first."""
        engine = self._engine()
        view, now = engine.view, engine.wall()
        tenant = tenant_filter(who, req.query.get("tenant", ""))
        listed = joblist.select(view.jobs, view.jobs_page, job_states(req.query.get("state", "")), tenant, now)
        hide = hider(who, view.tenant_of)
        jobs = [job_pb(r, view.progress(r.id), forecast=engine.forecaster.get(r.id), hide=hide)
                for r in listed.jobs]
        return pages.jobs_page(who, jobs, req.query.get("state", ""), now, req.query.get("tenant", ""),
                               listed.matching if listed.cut else 0)

    def _job(self, who: Principal, jid: str) -> controller_pb2.Job:
        if not JOB_ID_RE.fullmatch(jid):
            raise InvalidArgument("job_id", "malformed")
        view = self._engine().view
        rec = view.get(jid)
        if not may_see(who, rec.spec.tenant):
            raise JobNotFound(jid)
        return job_pb(rec, view.progress(jid), view.events(jid), self._engine().forecaster.get(jid),
                      hider(who, view.tenant_of))


def html(status: int, body: str) -> Response:
    return Response(status, body.encode(), "text/html; charset=utf-8")


def json_response(doc: Any) -> Response:
    return Response(200, dumps(doc), "application/json")


def loopback_host(host: str) -> bool:
    """Whether a Host header (`name`, `name:port`, `[v6]:port`) names this machine's loopback."""
    host = host.strip().lower()
    if host.startswith("["):
        return is_loopback(host.partition("]")[0] + "]")
    return is_loopback(host.partition(":")[0])
