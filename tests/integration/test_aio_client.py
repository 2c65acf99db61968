"""The asyncio SDK (tessera.clients.aio) against a real controller over TLS with tokens: typed
results, states by name, the event stream, wait, errors; and the typed results of the blocking one."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator

import pytest

from tessera.clients import AsyncClient, Client, JobInfo, JobState
from tessera.clients.results import NodeState
from tessera.clients.sdk import RpcError
from tessera.common.buildinfo import build_info
from tessera.v1 import common_pb2 as P
from tests.procs import Daemon, start_controller


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_controller(tmp_path_factory.mktemp("aio") / "state")
    yield d
    d.stop()


def spec(name: str) -> P.JobSpec:
    return P.JobSpec(name=name, model=P.ModelSpec(name="gpt2-small"), global_batch_size=8, iterations=5)


async def test_submit_get_list_cancel_and_wait_typed(ctl: Daemon) -> None:
    async with AsyncClient(ctl.address, token=ctl.token) as c:
        job = await c.submit(spec("aio-1"), request_id="aio-req-1")
        assert isinstance(job, JobInfo) and job.state is JobState.PENDING and job.state == "PENDING"
        assert job.id.startswith("j-") and job.name == "aio-1" and job.iterations == 5
        assert isinstance(job.submitted, dt.datetime) and job.submitted.tzinfo is dt.UTC and job.started is None
        again = await c.submit(spec("aio-1"), request_id="aio-req-1")
        assert again.id == job.id  # the request id made it idempotent
        got = await c.get(job.id, with_events=True)
        assert [e.kind for e in got.events][:1] == ["SUBMITTED"] and got.proto.id == job.id
        assert job.id in [j.id for j in await c.list(states=[JobState.PENDING, "running"])]
        assert all(j.state is JobState.SUCCEEDED for j in await c.list(states=["SUCCEEDED"]))
        waiter = asyncio.ensure_future(c.wait(job.id, {JobState.CANCELLED}, timeout=30))
        events: list[str] = []

        async def follow() -> None:
            async for e in c.watch(job.id):
                events.append(e.kind)

        follower = asyncio.ensure_future(follow())
        cancelled = await c.cancel(job.id)
        assert cancelled.state is JobState.CANCELLED and cancelled.done
        done = await waiter
        assert done.state is JobState.CANCELLED and done.ended is not None
        await asyncio.wait_for(follower, 30)  # the stream ends with the job
        assert events[0] == "SUBMITTED" and "CANCELLED" in events
        with pytest.raises(RpcError) as ended:
            await c.wait(job.id, {"RUNNING"}, timeout=10)
        assert ended.value.code == "FAILED_PRECONDITION" and "ended CANCELLED" in ended.value.message


async def test_identity_version_nodes_and_errors(ctl: Daemon) -> None:
    async with AsyncClient(ctl.address, token=ctl.token) as c:
        me = await c.whoami()
        assert (me.principal, me.role) == ("admin", "admin")
        v = await c.version()
        assert v.component == "tessera-controller" and v.version == build_info().version and v.started is not None
        assert await c.nodes() == []
        with pytest.raises(RpcError) as missing:
            await c.get("j-doesnotexist")
        assert missing.value.code == "NOT_FOUND"
        with pytest.raises(ValueError, match="unknown job state 'sleeping' \\(known: PENDING"):
            await c.list(states=["sleeping"])
    async with AsyncClient(ctl.address) as anonymous:  # no token
        with pytest.raises(RpcError) as denied:
            await anonymous.list()
        assert denied.value.code == "UNAUTHENTICATED"
        assert (await anonymous.version()).component == "tessera-controller"  # Info needs no token


def test_blocking_client_results_convert_to_the_same_types(ctl: Daemon) -> None:
    with Client(ctl.address, token=ctl.token) as c:
        job = JobInfo.from_proto(c.submit(spec("sync-typed")))
        assert job.state is JobState.PENDING and JobState.of(c.get(job.id).state) is JobState.PENDING
        assert c.version().component == "tessera-controller"
    assert JobState.of(0) is JobState.UNKNOWN and JobState.RUNNING.number == P.JOB_STATE_RUNNING
    assert NodeState.of(P.NODE_STATE_DRAINED) is NodeState.DRAINED
    assert [s for s in JobState if s.terminal] == [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED]
