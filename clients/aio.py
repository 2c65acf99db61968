"""The asyncio SDK of the controller API: `AsyncClient`, beside the blocking `Client` (sdk.py).

    import asyncio
    from tessera.clients.aio import AsyncClient
    from tessera.clients.results import JobState

    async def main() -> None:
        async with AsyncClient("controller:50051", token=os.environ["TESSERA_TOKEN"]) as c:
            job = await c.submit(load_job_file("examples/jobs/tiny.yaml"))
            async for event in c.watch(job.id):
                print(event.kind, event.message)
            done = await c.wait(job.id, {JobState.SUCCEEDED}, timeout=600)

The same rules as `Client`: TLS with `ca` (default $TESSERA_CA), plaintext only with `insecure`;
`token` (default $TESSERA_TOKEN) sent as `authorization: Bearer`; every call has the `timeout` deadline except the streams;
every mutating call carries a request id (a fresh uuid4 unless given); several controllers (a list
or "a:1,b:2") are followed to the leader on UNAVAILABLE; failures raise `RpcError` /
`ControllerUnreachable`. Results are the typed dataclasses of tessera.clients.results, with job
states as `JobState` names.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import os
import time
import uuid
from collections.abc import AsyncGenerator, Iterable, Sequence
from types import TracebackType
from typing import Any, Self

import grpc
import grpc.aio

from tessera.clients.results import Identity, JobEvent, JobInfo, JobState, LogChunk, NodeInfo, VersionInfo
from tessera.clients.sdk import (
    _CONNECT_FAILURES,
    MAX_PAGE,
    ControllerUnreachable,
    RpcError,
    connection,
    may_have_run,
    submit_gives_up,
    unserved,
)
from tessera.common.rpc import aio_channel, leader_hint
from tessera.v1 import common_pb2, controller_pb2, controller_pb2_grpc, info_pb2, info_pb2_grpc

States = Iterable[JobState | str | int]


def _state_number(s: JobState | str | int) -> int:
    if isinstance(s, int):
        return s
    try:
        return JobState(s.strip().upper().removeprefix("JOB_STATE_")).number
    except ValueError:
        known = ", ".join(m.value for m in JobState if m is not JobState.UNKNOWN)
        raise ValueError(f"unknown job state {s!r} (known: {known})") from None


class AsyncClient:
    """An asyncio client of a controller at `target` (see the module doc)."""

    def __init__(self, target: str | Sequence[str], timeout: float = 10.0, *, token: str | None = None,
                 ca: str | os.PathLike[str] | None = None, insecure: bool = False) -> None:
        self.targets, self._metadata, self._tls = connection(target, token, ca, insecure)
        self.target = self.targets[0]
        self.timeout = timeout
        self._channel = self._dial(self.target)
        self._stub = controller_pb2_grpc.ControllerStub(self._channel)

    def _dial(self, target: str) -> grpc.aio.Channel:
        return aio_channel(target, insecure=True) if self._tls is None else aio_channel(target, tls=self._tls)

    async def _move(self, hint: str) -> None:
        i = self.targets.index(self.target)
        nxt = hint if hint in self.targets else self.targets[(i + 1) % len(self.targets)]
        if nxt == self.target:
            return
        await self._channel.close()
        self.target = nxt
        self._channel = self._dial(nxt)
        self._stub = controller_pb2_grpc.ControllerStub(self._channel)

    # -- lifecycle -------------------------------------------------------------------------------

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # -- jobs ------------------------------------------------------------------------------------

    async def submit(self, spec: common_pb2.JobSpec, request_id: str | None = None) -> JobInfo:
        """Submit a job; the same request_id returns the job it first created. Retried with the
        same request id after a timeout or UNAVAILABLE, as Client.submit_ex is."""
        req = controller_pb2.SubmitJobRequest(request_id=request_id or str(uuid.uuid4()), spec=spec)
        failures: builtins.list[RpcError] = []
        for tries in itertools.count():
            try:
                return JobInfo.from_proto((await self._call("SubmitJob", req, failures)).job)
            except RpcError as err:
                if submit_gives_up(err, tries, req.request_id):
                    if not may_have_run(failures):  # every try refused unserved or unconnected
                        err.request_id = ""
                    raise
        raise AssertionError("not reached")

    async def get(self, job_id: str, with_events: bool = False) -> JobInfo:
        req = controller_pb2.GetJobRequest(job_id=job_id, with_events=with_events)
        return JobInfo.from_proto(await self._call("GetJob", req))

    async def list(self, states: States | None = None, tenant: str = "",
                   limit: int | None = None) -> builtins.list[JobInfo]:
        """Jobs in any of `states` (all when empty) of `tenant` (all when empty), oldest first,
        every page joined; at most `limit` when given."""
        page = min(limit, MAX_PAGE) if limit is not None and limit > 0 else 0
        req = controller_pb2.ListJobsRequest(states=[_state_number(s) for s in states or ()], tenant=tenant,
                                             limit=page)
        out: builtins.list[JobInfo] = []
        seen: set[str] = set()
        while limit is None or len(out) < limit:
            resp = await self._call("ListJobs", req)
            out.extend(JobInfo.from_proto(j) for j in resp.jobs)
            token = resp.continue_token
            if not token:
                break
            if token in seen or not resp.jobs:
                raise RpcError("INTERNAL", "the controller repeated a ListJobs page (continue_token)")
            seen.add(token)
            req.continue_token = token
        return out[:limit] if limit is not None else out

    async def cancel(self, job_id: str, request_id: str | None = None) -> JobInfo:
        req = controller_pb2.CancelJobRequest(request_id=request_id or str(uuid.uuid4()), job_id=job_id)
        return JobInfo.from_proto(await self._call("CancelJob", req))

    async def watch(self, job_id: str, after_seq: int = 0, timeout: float | None = None) -> AsyncGenerator[JobEvent, None]:
        """The job's events after `after_seq`, then new ones until the job ends (or `timeout`:
        DEADLINE_EXCEEDED). Break out of the loop to stop early."""
        req = controller_pb2.WatchJobEventsRequest(job_id=job_id, after_seq=after_seq)
        call = self._stub.WatchJobEvents(req, timeout=timeout, metadata=self._metadata)
        try:
            async for event in call:
                yield JobEvent.from_proto(event)
        except grpc.RpcError as exc:
            err = self._error(exc)
            if err.code == "UNAVAILABLE" and len(self.targets) > 1:
                await self._move(leader_hint(exc))
            raise err from None
        finally:
            call.cancel()

    async def wait(self, job_id: str, states: States, timeout: float | None = None) -> JobInfo:
        """The job once its state is one of `states`, driven by its event stream. RpcError
        DEADLINE_EXCEEDED after `timeout` seconds, FAILED_PRECONDITION when it ends in another
        state; a stream broken by a controller restart resumes from the last event seen."""
        wanted = {JobState.of(_state_number(s)) for s in states}
        deadline = None if timeout is None else time.monotonic() + timeout
        job = await self.get(job_id, with_events=True)
        last_seq = max((e.seq for e in job.events), default=0)
        down_since: float | None = None
        while True:
            if job.state in wanted:
                return job
            if job.done:
                raise RpcError("FAILED_PRECONDITION", f"job {job_id} ended {job.state}: {job.reason}")
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise RpcError("DEADLINE_EXCEEDED", f"job {job_id} did not reach {_names(wanted)} in time")
            try:
                # Closed when left: a break out of `async for` leaves the stream (and its call) open
                # until the generator is collected.
                async with contextlib.aclosing(self.watch(job_id, after_seq=last_seq, timeout=remaining)) as events:
                    async for event in events:
                        last_seq = max(last_seq, event.seq)
                        if event.kind != "PROGRESS":
                            job = await self.get(job_id)
                            if job.state in wanted or job.done:
                                break
                job = await self.get(job_id)
                down_since = None
            except RpcError as exc:
                if exc.code == "DEADLINE_EXCEEDED" and deadline is not None and time.monotonic() >= deadline:
                    raise RpcError("DEADLINE_EXCEEDED",
                                   f"job {job_id} did not reach {_names(wanted)} in time") from None
                if exc.code != "UNAVAILABLE":
                    raise
                now = time.monotonic()
                down_since = down_since or now
                if now - down_since > 30.0:
                    raise
                await asyncio.sleep(0.5)

    async def logs(self, job_id: str, rank: int = 0, attempt: int = 0, tail_bytes: int = 0) -> LogChunk:
        req = controller_pb2.GetJobLogsRequest(job_id=job_id, rank=rank, attempt=attempt, tail_bytes=tail_bytes)
        resp = await self._call("GetJobLogs", req)
        return LogChunk(resp.node_id, resp.path, bytes(resp.data))

    # -- nodes, identity, version ----------------------------------------------------------------

    async def nodes(self) -> builtins.list[NodeInfo]:
        return [NodeInfo.from_proto(n) for n in (await self._call("ListNodes", controller_pb2.ListNodesRequest())).nodes]

    async def drain(self, node_id: str, reason: str = "", request_id: str | None = None) -> NodeInfo:
        req = controller_pb2.DrainNodeRequest(request_id=request_id or str(uuid.uuid4()), node_id=node_id,
                                              reason=reason)
        return NodeInfo.from_proto(await self._call("DrainNode", req))

    async def undrain(self, node_id: str, request_id: str | None = None) -> NodeInfo:
        req = controller_pb2.UndrainNodeRequest(request_id=request_id or str(uuid.uuid4()), node_id=node_id)
        return NodeInfo.from_proto(await self._call("UndrainNode", req))

    async def whoami(self) -> Identity:
        return Identity.from_proto(await self._call("WhoAmI", controller_pb2.WhoAmIRequest()))

    async def version(self) -> VersionInfo:
        """The controller's version and build (tessera.v1.Info; no token needed)."""
        try:
            v = await info_pb2_grpc.InfoStub(self._channel).GetVersion(
                info_pb2.GetVersionRequest(), timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        return VersionInfo.from_proto(v)

    # -- plumbing --------------------------------------------------------------------------------

    async def _call(self, method: str, request: Any, failures: builtins.list[RpcError] | None = None) -> Any:
        """`failures`: every failed try is added to it (Client._call's)."""
        tries = 0
        while True:
            try:
                return await getattr(self._stub, method)(request, timeout=self.timeout, metadata=self._metadata)
            except grpc.RpcError as exc:
                err = self._error(exc)
                if failures is not None:
                    failures.append(err)
                if err.code != "UNAVAILABLE" or len(self.targets) == 1 or tries >= 2 * len(self.targets):
                    raise err from None
                tries += 1
                await self._move(leader_hint(exc))

    def _error(self, exc: grpc.RpcError) -> RpcError:
        code_obj = exc.code() if hasattr(exc, "code") else None
        code = code_obj.name if code_obj is not None else "UNKNOWN"
        details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
        if code == "UNAVAILABLE" and any(s in details.lower() for s in _CONNECT_FAILURES):
            return ControllerUnreachable(self.target, details)
        err = RpcError(code, details)
        err.unserved = code == "UNAVAILABLE" and unserved(exc)
        return err


def _names(states: set[JobState]) -> str:
    return "/".join(sorted(states))
