"""tessctl's streams follow the leader among several controllers (docs/ha.md, "Agents and clients
follow the leader"), over real gRPC on loopback: a standby's refusal before the first message
sends the stream to the leader it names, as a unary call is sent; a stream broken by a failover
goes on at the new leader (`logs -f` without printing a line twice, `get jobs --watch` from the
whole list); and a submit a standby refused says no "may have been stored"."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tessera.clients import sdk, tessctl, waiting
from tessera.clients.aio import AsyncClient
from tessera.clients.sdk import Client
from tessera.common import rpc
from tessera.controller import leader_gate
from tessera.v1 import common_pb2, controller_pb2, controller_pb2_grpc
from tests.fake_controller import FakeController, FakeServer, seeded
from tests.integration.test_leader_gate import Standby

LOG = b"".join(f"step {i}\n".encode() for i in range(1, 6))


class Dying(FakeController):
    """A leader whose streams break after their first messages, naming `hint` as the new leader
    (as a standby would once it leads; a killed leader names none)."""

    hint = ""

    async def _die(self, context: Any) -> None:
        await context.abort(grpc.StatusCode.UNAVAILABLE, "Stream removed",
                            trailing_metadata=((rpc.LEADER_HINT_KEY, self.hint),) if self.hint else ())

    async def StreamJobLogs(self, request: Any, context: Any) -> Any:
        self.log_requests.append(request)
        yield controller_pb2.LogLines(rank=0, attempt=1, node_id="node-a",
                                      lines=self.logs[(request.job_id, 0)].split(b"\n")[:-1])
        await self._die(context)

    async def WatchJobs(self, request: Any, context: Any) -> Any:
        for job in self.jobs.values():
            yield controller_pb2.JobUpdate(job=job)
        yield controller_pb2.JobUpdate(batch_end=True)
        await self._die(context)


class DyingServer(FakeServer):
    async def _make(self) -> FakeController:
        return Dying()


@pytest.fixture
def leader() -> Iterator[FakeServer]:
    srv = seeded()
    yield srv
    srv.stop()


def test_streams_refused_by_a_standby_go_to_the_leader_it_names(leader: FakeServer,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    sb = Standby(leader.address)
    try:
        out = io.StringIO()
        assert tessctl.main(["--controller", f"{sb.address},{leader.address}", "logs", "j-run"], out=out) == 0, \
            capsys.readouterr().err
        assert out.getvalue() == "step 1 loss 5.0\nstep 2 loss 4.0\n"
        with Client([sb.address, leader.address], timeout=5) as c:
            first = next(iter(c.watch_jobs()))
            assert first.job.id == "j-run" and c.target == leader.address
    finally:
        sb.stop()


def test_logs_follow_goes_on_at_the_new_leader_without_repeating_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    new = seeded()
    old = DyingServer()
    try:
        old.fake.hint = new.address  # type: ignore[attr-defined]
        old.call(lambda f: f.add_job(new.call(lambda g: g.jobs["j-run"])))
        old.call(lambda f: f.logs.__setitem__(("j-run", 0), LOG))
        # The new leader's log has two lines more, and the job has ended: its follow ends.
        new.call(lambda f: f.logs.__setitem__(("j-run", 0), LOG + b"step 6\nstep 7\n"))
        new.call(lambda f: f.event("j-run", "SUCCEEDED", "done", state=common_pb2.JOB_STATE_SUCCEEDED))
        out = io.StringIO()
        rc = tessctl.main(["--controller", f"{old.address},{new.address}", "logs", "j-run", "-f", "--tail", "3"],
                          out=out)
        err = capsys.readouterr().err
        assert rc == 0, err
        assert out.getvalue().splitlines() == [f"step {i}" for i in range(1, 8)]
        assert "the log stream broke" in err and "following on" in err
        resumed = new.call(lambda f: list(f.log_requests))
        assert len(resumed) == 1 and resumed[0].follow and resumed[0].tail_lines == waiting.RESUME_TAIL_LINES
    finally:
        old.stop()
        new.stop()


class _Seen(Exception):
    pass


def test_get_jobs_watch_subscribes_again_at_the_new_leader() -> None:
    new = seeded()
    old = DyingServer()
    try:
        old.fake.hint = new.address  # type: ignore[attr-defined]
        old.call(lambda f: f.add_job(controller_pb2.Job(id="j-old", state=common_pb2.JOB_STATE_PENDING)))
        tables: list[list[str]] = []

        def render(jobs: list[controller_pb2.Job], first: bool, watching: bool) -> None:
            tables.append([j.id for j in jobs])
            if len(tables) == 2:
                raise _Seen

        with Client([old.address, new.address], timeout=5) as c, pytest.raises(_Seen):
            waiting.watch_list(c, [], "", render)
        assert tables == [["j-old"], ["j-run"]]  # the new leader's whole list, not merged with the old
    finally:
        old.stop()
        new.stop()


def test_a_submit_a_standby_refused_was_not_stored(leader: FakeServer, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: nightly\nmodel: gpt2-small\nglobal_batch_size: 8\niterations: 10\n")
    sb = Standby("")  # no leader elected yet
    try:
        rc = tessctl.main(["--controller", sb.address, "submit", "-f", str(job)], out=io.StringIO())
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert rc == 1 and line == "tessctl: error: UNAVAILABLE: not the leader; no leader elected yet", line
    finally:
        sb.stop()
    assert sdk.UNSERVED_KEY == leader_gate.UNSERVED_KEY  # the client reads the word the controller writes


def test_a_submit_whose_answer_was_withheld_may_have_been_stored(leader: FakeServer) -> None:
    lease = {"valid": True}

    class Lapsing(FakeController):
        async def SubmitJob(self, request: Any, context: Any) -> Any:
            lease["valid"] = False  # the deadline passes while the submit is stored
            return await super().SubmitJob(request, context)

    sb = Standby(leader.address, leading=lambda: lease["valid"])
    try:
        sb.switch.lead([(controller_pb2_grpc.add_ControllerServicer_to_server, Lapsing())])
        spec = seeded_spec(leader)
        with Client(sb.address, timeout=5) as c, pytest.raises(sdk.RpcError) as err:
            c.submit_ex(spec, request_id="rid-7")
        # Its retries were refused unserved, but the first try may have stored the job.
        assert err.value.code == "UNAVAILABLE" and err.value.request_id == "rid-7"
    finally:
        sb.stop()


def seeded_spec(srv: FakeServer) -> common_pb2.JobSpec:
    with Client(srv.address, timeout=5) as c:
        return c.get("j-run").spec


def test_the_async_client_reads_the_unserved_mark_too() -> None:
    sb = Standby("")  # no leader elected yet: every try refused before it ran
    spec = common_pb2.JobSpec(name="nightly")

    async def submit() -> sdk.RpcError:
        async with AsyncClient(sb.address, timeout=5) as c:
            with pytest.raises(sdk.RpcError) as err:
                await c.submit(spec, request_id="rid-9")
        return err.value

    try:
        err = asyncio.run(submit())
        assert err.code == "UNAVAILABLE" and err.unserved and err.request_id == ""
    finally:
        sb.stop()
