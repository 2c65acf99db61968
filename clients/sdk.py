"""The Python SDK of the Tessera controller API.

    from tessera.clients import Client, load_job_file

    with Client("controller:50051", token=os.environ["TESSERA_TOKEN"]) as c:
        job = c.submit(load_job_file("examples/jobs/tiny.yaml"))
        done = c.wait(job.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=600)

`token` is a bearer token of the controller's tokens file (docs/auth.md), sent with every call as
metadata `authorization: Bearer <token>`; without one, only a controller that runs without
authentication answers. Every call is blocking and has a deadline (`timeout`, 10 s by default); streams (`watch`, `wait`)
take their own. Every mutating call carries a request id (a fresh uuid4 unless given), so retrying
it with the same id is safe. gRPC failures surface as `RpcError(code, message)`, where `code` is
the status code name ("NOT_FOUND", "INVALID_ARGUMENT", ...); `ControllerUnreachable` (a subclass,
code "UNAVAILABLE") means no connection to the controller could be made at all. `RpcError` is a
`TesseraError` (tessera.common.errors, re-exported here), the root of every error Tessera raises on
purpose, so ``except TesseraError`` catches a failed call as it always has.
"""

from __future__ import annotations

import builtins
import itertools
import os
import time
import uuid
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import grpc

from tessera.common import tls
from tessera.common.errors import Code, TesseraError
from tessera.common.rpc import check_address, leader_hint, sync_channel
from tessera.v1 import common_pb2, controller_pb2, controller_pb2_grpc, info_pb2, info_pb2_grpc

Job = controller_pb2.Job
Node = controller_pb2.Node
JobEvent = common_pb2.JobEvent
JobSpec = common_pb2.JobSpec

TERMINAL_STATES = frozenset(
    {common_pb2.JOB_STATE_SUCCEEDED, common_pb2.JOB_STATE_FAILED, common_pb2.JOB_STATE_CANCELLED}
)

# The server's largest ListJobs page (controller/listing.py), the most `list(limit=N)` asks for at once.
MAX_PAGE = 1000

# How long wait() keeps resuming while the controller is unreachable (a restart takes seconds).
UNAVAILABLE_GRACE_S = 30.0

# Trailing metadata of a controller's refusal before any of its servicers ran: a standby's "not
# the leader" (controller/leader_gate.py UNSERVED_KEY). Nothing of such a call was done.
UNSERVED_KEY = "tessera-unserved"

# Details that gRPC core gives when no connection could be made (as opposed to a server that
# answered UNAVAILABLE itself).
_CONNECT_FAILURES = (
    "failed to connect", "connection refused", "dns resolution failed", "name resolution", "errors resolving",
    "no route to host", "network is unreachable", "connect failed", "deadline exceeded while waiting",
)


class RpcError(TesseraError):
    """A failed call as a client sees it: `code` the status code (a Code, equal to its name as a
    str: ``err.code == "NOT_FOUND"``), `message` the status details on one line; `request_id` the
    submit's idempotency key when a submit failed and may have been stored ("" otherwise);
    `unserved`: the controller refused the call before doing any of it (a standby's "not the
    leader")."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(" ".join(message.split()))  # always one line
        self.code = Code(code) if code in Code.__members__ else Code.UNKNOWN
        self.request_id = ""
        self.unserved = False

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __reduce__(self) -> tuple[type[RpcError], tuple[str, str]]:
        return RpcError, (self.code.value, self.message)


class ControllerUnreachable(RpcError):
    """No connection to the controller could be made (refused, unresolvable, timed out)."""

    def __init__(self, target: str, message: str) -> None:
        super().__init__("UNAVAILABLE", message)
        self.target = target


@dataclass(frozen=True)
class SubmitResult:
    """What SubmitJob answered: the job, and whether this call created it (False: the request id
    had been seen and the job it created first is returned)."""

    job: controller_pb2.Job
    created: bool


def state_value(state: int | str) -> int:
    """A JobState enum value from a value or a name ("RUNNING", "running", "JOB_STATE_RUNNING")."""
    if isinstance(state, int):
        return state
    name = state.strip().upper()
    if not name.startswith("JOB_STATE_"):
        name = "JOB_STATE_" + name
    try:
        return int(common_pb2.JobState.Value(name))
    except ValueError:
        known = ", ".join(n.removeprefix("JOB_STATE_") for n in common_pb2.JobState.keys()[1:])
        raise ValueError(f"unknown job state {state!r} (known: {known})") from None


def split_targets(target: str | Sequence[str]) -> builtins.list[str]:
    """`"a:1,b:2"` or `["a:1", "b:2"]` -> ["a:1", "b:2"] (blanks dropped, duplicates once)."""
    parts = target.split(",") if isinstance(target, str) else [p for t in target for p in t.split(",")]
    out: builtins.list[str] = []
    for p in (p.strip() for p in parts):
        if p and p not in out:
            out.append(check_address(p, "controller"))
    if not out:
        raise ValueError("no controller address given")
    return out


def connection(target: str | Sequence[str], token: str | None, ca: str | os.PathLike[str] | None,
               insecure: bool) -> tuple[builtins.list[str], tuple[tuple[str, str], ...], tls.TlsConfig | None]:
    """What a client (this one, or clients/aio.py's) dials with: the controller addresses, the call
    metadata carrying the token (`token`, else $TESSERA_TOKEN), and the TLS settings (None = plaintext;
    the CA from `ca`, else $TESSERA_CA, else the system's): the same variables tessctl reads."""
    token = token or os.environ.get("TESSERA_TOKEN") or None
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    ca = ca or os.environ.get("TESSERA_CA") or None
    return split_targets(target), metadata, None if insecure else (tls.load(ca) if ca else tls.TlsConfig(ca=None))


class Client:
    """A blocking client of a controller at `target` (host:port), over TLS, calling as `token`'s holder.

    `token`: the bearer token (default $TESSERA_TOKEN). `ca`: the CA certificate file that signed the
    controller's (default $TESSERA_CA, else the system's trusted CAs); the controller's certificate
    must name the host dialled. `insecure`:
    plaintext, for a controller started with --insecure.

    `target` may name several controllers (a list, or "a:1,b:2"): the controllers of a highly
    available control plane (docs/ha.md), of which one leads. A call answered UNAVAILABLE (a standby,
    or a controller that is down) is sent again to the leader the standby named (only when it is one
    of `target`'s addresses) or to the next address, up to twice round the list. Every call is safe
    to send twice: reads, and mutations that carry a request id (the same id on every try).
    """

    def __init__(self, target: str | Sequence[str], timeout: float = 10.0, *, token: str | None = None,
                 ca: str | os.PathLike[str] | None = None, insecure: bool = False) -> None:
        self.targets, self._metadata, self._tls = connection(target, token, ca, insecure)
        self.target = self.targets[0]
        self.timeout = timeout
        self._channel = self._dial(self.target)
        self._stub = controller_pb2_grpc.ControllerStub(self._channel)

    def _move(self, hint: str) -> None:
        """Use the hinted leader when it is one of ours, else the next address."""
        i = self.targets.index(self.target)
        nxt = self.targets[self.targets.index(hint)] if hint in self.targets else self.targets[(i + 1) % len(self.targets)]
        if nxt == self.target:
            return
        self._channel.close()
        self.target = nxt
        self._channel = self._dial(nxt)
        self._stub = controller_pb2_grpc.ControllerStub(self._channel)

    def _dial(self, target: str) -> grpc.Channel:
        return sync_channel(target, insecure=True) if self._tls is None else sync_channel(target, tls=self._tls)

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the channel; the client cannot be used afterwards."""
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- jobs ------------------------------------------------------------------------------------

    def submit(self, spec: common_pb2.JobSpec, request_id: str | None = None) -> controller_pb2.Job:
        """Submit a job; returns it (PENDING). The same request_id returns the job it first created."""
        return self.submit_ex(spec, request_id).job

    def submit_ex(self, spec: common_pb2.JobSpec, request_id: str | None = None) -> SubmitResult:
        """Like submit, and also says whether this call created the job. A call that timed out or
        found the controller unavailable is retried with the same request id (SUBMIT_RETRIES times):
        the controller may have stored the job all the same, and only the same id finds it again. A
        failure that remains carries the id as `request_id`, for a retry by hand, unless no try
        can have stored it (every one refused unserved, or never connected)."""
        req = controller_pb2.SubmitJobRequest(request_id=request_id or _new_id(), spec=spec)
        failures: builtins.list[RpcError] = []
        for tries in itertools.count():
            try:
                resp = self._call("SubmitJob", req, failures)
                return SubmitResult(job=resp.job, created=resp.created)
            except RpcError as err:
                if submit_gives_up(err, tries, req.request_id):
                    if not may_have_run(failures):
                        err.request_id = ""
                    raise
        raise AssertionError("not reached")

    def get(self, job_id: str, with_events: bool = False) -> controller_pb2.Job:
        """The job with this id, with its events when with_events. NOT_FOUND if there is none."""
        return self._call("GetJob", controller_pb2.GetJobRequest(job_id=job_id, with_events=with_events))

    def forecast(self, job_id: str) -> controller_pb2.Forecast | None:
        """The job's forecast start and finish with their band (unix seconds, 0 = none; `note` says
        why), None when the controller has none for it (ended, or no round since it came;
        docs/forecasts.md). The same as `get(job_id).forecast`."""
        job = self.get(job_id)
        return job.forecast if job.HasField("forecast") else None

    def list(self, states: Iterable[int | str] | None = None, tenant: str = "",
             limit: int | None = None) -> list[controller_pb2.Job]:
        """Jobs in any of `states` (all when None or empty) of `tenant` (all when empty), oldest
        first, every page joined; at most `limit` when given."""
        page = min(limit, MAX_PAGE) if limit is not None and limit > 0 else 0
        return list(itertools.islice(self.iter_jobs(states, tenant, page_size=page), limit))

    def iter_jobs(self, states: Iterable[int | str] | None = None, tenant: str = "",
                  page_size: int = 0) -> Iterator[controller_pb2.Job]:
        """The jobs `list` returns, one page (`page_size` jobs; 0 = the server's default) per
        ListJobs call, fetched as the iterator is consumed."""
        req = controller_pb2.ListJobsRequest(states=[state_value(s) for s in states or ()], tenant=tenant,
                                             limit=page_size)
        seen: set[str] = set()
        while True:
            resp = self._call("ListJobs", req)
            yield from resp.jobs
            token = resp.continue_token
            if not token:
                return
            if token in seen or not resp.jobs:  # a server that would page forever
                raise RpcError("INTERNAL", "the controller repeated a ListJobs page (continue_token)")
            seen.add(token)
            req.continue_token = token

    def cancel(self, job_id: str, request_id: str | None = None) -> controller_pb2.Job:
        """Cancel a job (its workers are stopped); returns the job. Cancelling an ended job is a no-op
        or FAILED_PRECONDITION, as the controller decides."""
        req = controller_pb2.CancelJobRequest(request_id=request_id or _new_id(), job_id=job_id)
        return self._call("CancelJob", req)

    def watch(
        self, job_id: str, after_seq: int = 0, timeout: float | None = None
    ) -> Generator[common_pb2.JobEvent, None, None]:
        """The job's events after `after_seq`, then new ones as they happen, until the job ends (or
        `timeout` seconds pass: DEADLINE_EXCEEDED). Close the iterator to stop early."""
        req = controller_pb2.WatchJobEventsRequest(job_id=job_id, after_seq=after_seq)
        stream = self._stub.WatchJobEvents(req, timeout=timeout, metadata=self._metadata)
        try:
            yield from stream
        except grpc.RpcError as exc:
            err = self._error(exc)
            if err.code == "UNAVAILABLE" and len(self.targets) > 1:
                self._move(leader_hint(exc))  # wait() resumes the stream there
            raise err from None
        finally:
            stream.cancel()

    def wait(
        self, job_id: str, states: Iterable[int | str], timeout: float | None = None
    ) -> controller_pb2.Job:
        """Block until the job's state is one of `states` and return the job.

        Driven by the job's event stream (the state is re-read after each event that is not
        PROGRESS), never by polling. Raises RpcError DEADLINE_EXCEEDED after `timeout` seconds,
        and FAILED_PRECONDITION when the job ends in a state outside `states`. A stream broken by a
        controller restart is resumed from the last event seen; after UNAVAILABLE_GRACE_S seconds
        without a controller the UNAVAILABLE error is raised.
        """
        wanted = {state_value(s) for s in states}
        deadline = None if timeout is None else time.monotonic() + timeout
        job = self.get(job_id, with_events=True)
        last_seq = max((e.seq for e in job.events), default=0)
        down_since: float | None = None
        while True:
            if job.state in wanted:
                return job
            if job.state in TERMINAL_STATES:
                name = common_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_")
                raise RpcError("FAILED_PRECONDITION", f"job {job_id} ended {name}: {job.reason}")
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise RpcError("DEADLINE_EXCEEDED", f"job {job_id} did not reach {_names(wanted)} in time")
            try:
                events = self.watch(job_id, after_seq=last_seq, timeout=remaining)
                try:
                    for event in events:
                        last_seq = max(last_seq, event.seq)
                        if event.kind != "PROGRESS":
                            job = self.get(job_id)
                            if job.state in wanted or job.state in TERMINAL_STATES:
                                break
                finally:
                    events.close()
                job = self.get(job_id)
                down_since = None
            except RpcError as exc:
                if exc.code == "DEADLINE_EXCEEDED" and deadline is not None and time.monotonic() >= deadline:
                    raise RpcError(
                        "DEADLINE_EXCEEDED", f"job {job_id} did not reach {_names(wanted)} in time"
                    ) from None
                if exc.code != "UNAVAILABLE":
                    raise
                now = time.monotonic()
                down_since = down_since or now
                if now - down_since > UNAVAILABLE_GRACE_S:
                    raise
                time.sleep(0.5)  # the controller is restarting: resume the stream

    def logs(
        self, job_id: str, rank: int = 0, attempt: int = 0, tail_bytes: int = 0
    ) -> controller_pb2.GetJobLogsResponse:
        """The last `tail_bytes` (0 = 64 KiB) of a rank's log of an attempt (0 = the current or last
        one), read through the agent that ran it: `.data` (bytes), `.node_id`, `.path`."""
        req = controller_pb2.GetJobLogsRequest(job_id=job_id, rank=rank, attempt=attempt, tail_bytes=tail_bytes)
        return self._call("GetJobLogs", req)

    def watch_job(self, job_id: str, timeout: float | None = None) -> Generator[controller_pb2.JobUpdate, None, None]:
        """The job now, then an update (`.job` with state, reason and progress; `.events`, new
        ones) on every change until it ends (or `timeout` seconds: DEADLINE_EXCEEDED)."""
        yield from self._stream("WatchJob", controller_pb2.WatchJobRequest(job_id=job_id), timeout)

    def watch_jobs(self, states: Iterable[int | str] | None = None, tenant: str = "",
                   timeout: float | None = None) -> Generator[controller_pb2.JobUpdate, None, None]:
        """Every job of the list, then the changes (`.removed`: left the list); `.batch_end` after
        each consistent set. Endless until closed or `timeout`."""
        req = controller_pb2.WatchJobsRequest(states=[state_value(s) for s in states or ()], tenant=tenant)
        yield from self._stream("WatchJobs", req, timeout)

    def stream_logs(self, job_id: str, rank: int = 0, all_ranks: bool = False, attempt: int = 0,
                    tail_lines: int = 0, follow: bool = False,
                    timeout: float | None = None) -> Generator[controller_pb2.LogLines, None, None]:
        """Whole log lines of one rank (or all ranks), the last `tail_lines` (0: all kept), then with
        `follow` new ones until the job ends: messages of `.rank`, `.attempt`, `.lines` (bytes)."""
        req = controller_pb2.StreamJobLogsRequest(job_id=job_id, rank=rank, all_ranks=all_ranks, attempt=attempt,
                                                  tail_lines=tail_lines, follow=follow)
        yield from self._stream("StreamJobLogs", req, timeout)

    def _stream(self, method: str, request: Any, timeout: float | None) -> Generator[Any, None, None]:
        """The stream's messages. Refused UNAVAILABLE before its first message (a standby, a
        controller down), it is opened again at the hinted leader or the next address, as `_call`
        does; broken after one, the client moves there too and the error is raised: only the caller
        knows how to go on without repeating what it got (tessctl's watches and logs do,
        clients/waiting.py)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        tries = 0
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            stream = getattr(self._stub, method)(request, timeout=left, metadata=self._metadata)
            got = False
            try:
                for msg in stream:
                    got = True
                    yield msg
                return
            except grpc.RpcError as exc:
                err = self._error(exc)
                if err.code != "UNAVAILABLE" or len(self.targets) == 1:
                    raise err from None
                self._move(leader_hint(exc))
                if got or tries >= 2 * len(self.targets):
                    raise err from None
                tries += 1
            finally:
                stream.cancel()

    # -- nodes -----------------------------------------------------------------------------------

    def nodes(self) -> builtins.list[controller_pb2.Node]:
        """Every node the controller knows, in any state."""
        return list(self._call("ListNodes", controller_pb2.ListNodesRequest()).nodes)

    def node(self, node_id: str) -> controller_pb2.Node:
        """One node by id (from ListNodes); RpcError NOT_FOUND if the controller has none."""
        for node in self.nodes():
            if node.id == node_id:
                return node
        raise RpcError("NOT_FOUND", f"node {node_id} not found")

    def drain(self, node_id: str, reason: str = "", request_id: str | None = None) -> controller_pb2.Node:
        """Stop placing work on a node and move its jobs away; returns the node (DRAINING/DRAINED)."""
        req = controller_pb2.DrainNodeRequest(request_id=request_id or _new_id(), node_id=node_id, reason=reason)
        return self._call("DrainNode", req)

    def undrain(self, node_id: str, request_id: str | None = None) -> controller_pb2.Node:
        """Make a drained node schedulable again; returns the node."""
        req = controller_pb2.UndrainNodeRequest(request_id=request_id or _new_id(), node_id=node_id)
        return self._call("UndrainNode", req)

    def remove_node(self, node_id: str, force: bool = False, request_id: str | None = None) -> bool:
        """Forget a node (admin). FAILED_PRECONDITION while attempts run on it, unless `force`
        (they are requeued); NOT_FOUND for an unknown node. An agent still running comes back at
        its next heartbeat: drain it first to keep work off it."""
        req = controller_pb2.RemoveNodeRequest(request_id=request_id or _new_id(), node_id=node_id, force=force)
        return bool(self._call("RemoveNode", req).removed)

    # -- tenants ---------------------------------------------------------------------------------

    def tenants(self) -> controller_pb2.ListTenantsResponse:
        """Tenants with their GPU quotas and use (docs/tenants.md): `.tenants` (each with `.quota`,
        `.guaranteed_in_use`, `.borrowed`, `.jobs_running`, `.jobs_pending`), `.file`, `.warnings`.
        A user gets its own tenant only; an admin every one."""
        return self._call("ListTenants", controller_pb2.ListTenantsRequest())

    # -- identity --------------------------------------------------------------------------------

    def whoami(self) -> controller_pb2.WhoAmIResponse:
        """Who the controller takes this client for: `.principal`, `.tenant`, `.role`."""
        return self._call("WhoAmI", controller_pb2.WhoAmIRequest())

    def version(self) -> info_pb2.VersionInfo:
        """The controller's version and build (tessera.v1.Info: answered without a token, by a
        standby too): `.component`, `.version`, `.git_commit`, `.python_version`, `.grpc_version`."""
        try:
            return info_pb2_grpc.InfoStub(self._channel).GetVersion(
                info_pb2.GetVersionRequest(), timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    # -- plumbing --------------------------------------------------------------------------------

    def _call(self, method: str, request: Any, failures: builtins.list[RpcError] | None = None) -> Any:
        """`failures`: every failed try is added to it."""
        tries = 0
        while True:
            try:
                return getattr(self._stub, method)(request, timeout=self.timeout, metadata=self._metadata)
            except grpc.RpcError as exc:
                err = self._error(exc)
                if failures is not None:
                    failures.append(err)
                if err.code != "UNAVAILABLE" or len(self.targets) == 1 or tries >= 2 * len(self.targets):
                    raise err from None
                tries += 1
                self._move(leader_hint(exc))

    def _error(self, exc: grpc.RpcError) -> RpcError:
        code_obj = exc.code() if hasattr(exc, "code") else None
        code = code_obj.name if code_obj is not None else "UNKNOWN"
        details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
        if code == "UNAVAILABLE" and any(s in details.lower() for s in _CONNECT_FAILURES):
            return ControllerUnreachable(self.target, details)
        err = RpcError(code, details)
        err.unserved = code == "UNAVAILABLE" and unserved(exc)
        return err


def unserved(exc: grpc.RpcError) -> bool:
    trailing = getattr(exc, "trailing_metadata", None)
    try:
        md = trailing() if callable(trailing) else ()
    except Exception:  # noqa: BLE001 (a call with no metadata to read: nothing says unserved)
        return False
    return any(k == UNSERVED_KEY for k, _ in md or ())


def may_have_run(failures: Iterable[RpcError]) -> bool:
    """Whether a call that failed so many times may have been carried out by one of its tries: one
    refused unserved, or that never reached a controller, did nothing."""
    return any(not (f.unserved or isinstance(f, ControllerUnreachable)) for f in failures)


# A submit that ended so may have been stored: retried with the same request id, which finds it
# (not when no connection was made at all: ControllerUnreachable).
RETRY_SUBMIT = frozenset({"DEADLINE_EXCEEDED", "UNAVAILABLE"})
SUBMIT_RETRIES = 2


def submit_gives_up(err: RpcError, tries: int, request_id: str) -> bool:
    """Whether a failed submit is final after `tries` retries; a final one carries its request id."""
    if err.code not in RETRY_SUBMIT or isinstance(err, ControllerUnreachable) or tries >= SUBMIT_RETRIES:
        err.request_id = request_id
        return True
    return False


def _new_id() -> str:
    return str(uuid.uuid4())


def _names(states: set[int]) -> str:
    return "/".join(sorted(common_pb2.JobState.Name(s).removeprefix("JOB_STATE_") for s in states))
