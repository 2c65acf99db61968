"""`tessctl logs` of earlier attempts and of unreachable nodes: StreamJobLogs over real gRPC on
loopback (the controller's servicer, auth interceptor and tokens) on an engine over in-memory
agents whose logs live on the node that ran each rank (controller/logstream.py; where an earlier
attempt ran is recorded in the job's placement, controller/transitions.py).

Before: `--attempt 1` after a drain read the current node and answered NOT_FOUND; a job shrunk from
4 ranks to 2 refused `--attempt 1 --rank 3`; `--all-ranks` whose logs could not be read printed
nothing and exited 0."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import queue
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tessera.clients import tessctl
from tessera.clients.sdk import Client, RpcError
from tessera.controller.core.policy import RoundContext
from tessera.controller.core.snapshot import Decision, Slice
from tessera.v1 import agent_pb2
from tessera.v1 import common_pb2 as P
from tests.engine_api import serve_engine
from tests.fake_agent_calls import Call, FakeAgents, inventory
from tests.unit.test_engine import Harness, ScriptedMoves, run_to_running, tiny


class LogAgents(FakeAgents):
    """FakeAgents whose ReadLog reads the logs of the node asked: each launched rank writes two
    lines there; a node in `down` answers UNAVAILABLE (its agent was killed)."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.logs: dict[tuple[str, str, int, int], bytes] = {}
        self.down: set[str] = set()

    async def launch(self, node_id: str, address: str, req: agent_pb2.LaunchRequest) -> agent_pb2.LaunchResponse:
        resp = await super().launch(node_id, address, req)
        for r in req.ranks:
            self.logs[(node_id, req.job_id, req.attempt, r.rank)] = \
                b"".join(b"%s attempt %d rank %d line %d\n" % (node_id.encode(), req.attempt, r.rank, i)
                         for i in (1, 2))
        return resp

    async def stop(self, node_id: str, address: str, epoch: int, job_id: str, attempt: int, grace_s: float,
                   reason: str) -> None:
        if node_id not in self.down:
            await super().stop(node_id, address, epoch, job_id, attempt, grace_s, reason)

    async def read_log(self, node_id: str, address: str, req: agent_pb2.ReadLogRequest) -> agent_pb2.ReadLogResponse:
        self.calls.append(Call("read_log", node_id, req.job_id, req.attempt, str(req.rank)))
        data = self.logs.get((node_id, req.job_id, req.attempt, req.rank))
        code = grpc.StatusCode.UNAVAILABLE if node_id in self.down else None if data is not None \
            else grpc.StatusCode.NOT_FOUND
        if code is not None:
            raise grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="fake agent")
        assert data is not None
        n = req.tail_bytes
        start = min(req.offset, len(data)) if req.from_offset else max(0, len(data) - n)
        return agent_pb2.ReadLogResponse(path="p", data=data[start:start + n], offset=start, size=len(data))


class Shrinks(ScriptedMoves):
    """ScriptedMoves whose move can also shrink the plan: job id -> data parallel degree."""

    def __init__(self) -> None:
        super().__init__()
        self.dp: dict[str, int] = {}

    def plan(self, ctx: RoundContext) -> list[Decision]:
        return [self._shrunk(d, self.dp.pop(d.job_id)) if d.job_id in self.dp else d for d in super().plan(ctx)]

    @staticmethod
    def _shrunk(d: Decision, dp: int) -> Decision:
        assert d.plan is not None and d.cell is not None
        return dataclasses.replace(d, plan=dataclasses.replace(d.plan, dp=dp, tp=1, pp=1),
                                   cell=dataclasses.replace(d.cell, gpus=dp))


def cluster(nodes: dict[str, int], shrinks: bool = False) -> Harness:
    h = Harness(nodes=())
    if shrinks:
        h.policy = Shrinks()
    h.agents = LogAgents(h.store)
    h.engine = h._engine()
    for name, gpus in nodes.items():
        h.agents.add_node(name, inventory("A10-24GB", gpus, 24))
    return h


@contextlib.asynccontextmanager
async def api(h: Harness, tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    """The engine's Controller API over real gRPC on loopback (TLS, tokens): (address, admin's token)."""
    async with serve_engine(h.engine, tmp_path) as (address, tokens):
        yield address, tokens["admin"]


async def logs(where: tuple[str, str], job_id: str, **kw: Any) -> list[tuple[int, int, str, str]]:
    """StreamJobLogs as a client reads it: (rank, attempt, node, line) of every line."""
    def call() -> list[tuple[int, int, str, str]]:
        with Client(where[0], token=where[1], timeout=30) as c:
            return [(m.rank, m.attempt, m.node_id, ln.decode()) for m in c.stream_logs(job_id, timeout=30, **kw)
                    for ln in m.lines]

    return await asyncio.to_thread(call)


async def refused(where: tuple[str, str], job_id: str, **kw: Any) -> RpcError:
    with pytest.raises(RpcError) as e:
        await logs(where, job_id, **kw)
    return e.value


async def cli(where: tuple[str, str], *args: str) -> tuple[int, str]:
    """`tessctl logs ...`: its exit status and stdout (its stderr is pytest's to capture)."""
    out = io.StringIO()
    rc = await asyncio.to_thread(tessctl.main, ["logs", *args, "--controller", where[0], "--token", where[1]], out)
    return rc, out.getvalue()


def lines(node: str, attempt: int, *ranks: int) -> list[tuple[int, int, str, str]]:
    return [(r, attempt, node, f"{node} attempt {attempt} rank {r} line {i}") for r in ranks for i in (1, 2)]


async def drained_once(h: Harness) -> tuple[str, str, str]:
    """A 1-GPU job runs attempt 1 on one node; that node is drained; attempt 2 runs on the other:
    (job, the first node, the second)."""
    await h.register(*h.agents.nodes)
    jid = await h.submit(tiny(gpus=1))
    await h.round()
    await run_to_running(h, jid)
    (first,) = h.nodes_of(jid)
    await h.engine.drain(first, "maintenance")
    await h.heartbeat(first)  # the workers stopped after their checkpoint: requeued
    await h.round()
    (second,) = h.nodes_of(jid)
    assert second != first and h.job(jid).attempt == 2
    await run_to_running(h, jid)
    return jid, first, second


async def test_an_earlier_attempt_is_read_on_the_node_that_ran_it(tmp_path: Path) -> None:
    """Attempt 1 ran on the node then drained, attempt 2 runs on the other: each is read where it ran."""
    h = cluster({"node-a10": 4, "node-a40": 4})
    jid, first, second = await drained_once(h)
    async with api(h, tmp_path) as where:
        assert await logs(where, jid, attempt=1) == lines(first, 1, 0)
        assert await logs(where, jid, attempt=1, all_ranks=True) == lines(first, 1, 0)
        assert await logs(where, jid) == lines(second, 2, 0)
        assert await logs(where, jid, attempt=2, all_ranks=True) == lines(second, 2, 0)
        rc, out = await cli(where, jid, "--attempt", "1", "--all-ranks")
        assert (rc, out) == (0, f"[rank 0] {first} attempt 1 rank 0 line 1\n[rank 0] {first} attempt 1 rank 0 line 2\n")
        e = await refused(where, jid, attempt=3)
        assert e.code == "NOT_FOUND" and f"job {jid} has no attempt 3 (its latest is 2)" in e.message
        # A follow of the earlier attempt reads its log to the end, then ends.
        assert await logs(where, jid, attempt=1, follow=True) == lines(first, 1, 0)
        # A rank the earlier attempt never had: refused up front, as for the current attempt.
        e = await refused(where, jid, attempt=1, rank=1)
        assert e.code == "INVALID_ARGUMENT" and f"attempt 1 of job {jid} has no rank 1 (ranks 0..0)" in e.message


async def test_an_earlier_attempt_with_more_ranks_than_now(tmp_path: Path) -> None:
    """Shrunk from 4 GPUs on one node to 2 on another: attempt 1's ranks 2 and 3 are still read."""
    h = cluster({"node-big": 4, "node-small": 2}, shrinks=True)
    await h.register("node-big", "node-small")
    jid = await h.submit(tiny(gpus=4))
    await h.round()
    assert h.nodes_of(jid) == ["node-big"]
    await run_to_running(h, jid)
    assert isinstance(h.policy, Shrinks)
    h.policy.move[jid] = (Slice("node-small", (0, 1)),)
    h.policy.dp[jid] = 2
    await h.round()
    await h.heartbeat("node-big")  # the old workers exited after their checkpoint: relaunched
    assert h.nodes_of(jid) == ["node-small"] and h.job(jid).attempt == 2
    await run_to_running(h, jid)
    async with api(h, tmp_path) as where:
        assert await logs(where, jid, attempt=1, rank=3) == lines("node-big", 1, 3)
        assert await logs(where, jid, attempt=1, all_ranks=True) == lines("node-big", 1, 0, 1, 2, 3)
        assert await logs(where, jid, all_ranks=True) == lines("node-small", 2, 0, 1)
        e = await refused(where, jid, rank=3)  # the current attempt's ranks are known: refused up front
        assert e.code == "INVALID_ARGUMENT" and "has no rank 3 (ranks 0..1)" in e.message


async def test_an_earlier_attempt_over_two_nodes(tmp_path: Path) -> None:
    """Attempt 1 ran over two nodes, attempt 2 on a third: its ranks are read where it recorded they
    ran, one call each; no node is asked whether it has them (a first version looked for them on
    every node: a call per node and rank, and a rank on a removed node went missing silently)."""
    h = cluster({"node-x": 2, "node-y": 2, "node-z": 4}, shrinks=True)
    await h.register("node-x", "node-y")
    jid = await h.submit(tiny(gpus=4))
    await h.round()
    await run_to_running(h, jid)
    first = h.nodes_of(jid)
    assert sorted(first) == ["node-x", "node-y"]
    await h.register("node-z")
    assert isinstance(h.policy, Shrinks)
    h.policy.move[jid] = (Slice("node-z", (0, 1, 2, 3)),)
    await h.round()
    await h.heartbeat(*first)
    assert h.nodes_of(jid) == ["node-z"] and h.job(jid).attempt == 2
    async with api(h, tmp_path) as where:
        h.agents.calls.clear()
        assert await logs(where, jid, attempt=1, all_ranks=True) == \
            lines(first[0], 1, 0, 1) + lines(first[1], 1, 2, 3)
        asked = [(c.node_id, int(c.detail)) for c in h.agents.calls if c.kind == "read_log"]
        assert asked == [(first[0], 0), (first[0], 1), (first[1], 2), (first[1], 3)]
        # The second node is removed: its ranks are named, not dropped from an OK answer.
        assert await h.engine.remove_node(first[1], False, "rm-1")
        e = await refused(where, jid, attempt=1, all_ranks=True)
        assert e.code == "FAILED_PRECONDITION" and f"job {jid} attempt 1: 2 rank log(s) read, not rank 2, 3: " \
            f"rank 2 of attempt 1 ran on node {first[1]}, which is no longer known to the controller (removed)" \
            in e.message


async def test_a_node_that_does_not_answer_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The agent of the job's node was killed: `logs` and `logs --all-ranks` both fail, naming it."""
    h = cluster({"node-a10": 4, "node-a40": 4})
    jid, first, second = await drained_once(h)
    h.agents.down.add(second)
    async with api(h, tmp_path) as where:
        for kw in ({}, {"all_ranks": True}):
            e = await refused(where, jid, **kw)
            assert e.code == "FAILED_PRECONDITION", kw
            assert f"rank 0 of attempt 2 ran on node {second}, whose agent did not answer (UNAVAILABLE); the " \
                   "node is READY" in e.message
        rc, out = await cli(where, jid, "--all-ranks")
        assert (rc, out) == (1, "")
        assert f"ran on node {second}" in capsys.readouterr().err
        # Past its lease the node is UNREACHABLE; attempt 1's node is too now: the error names it.
        h.agents.down.add(first)
        h.clock.advance(20)
        await h.engine.liveness_tick()
        assert h.engine.view.node(first).state == P.NODE_STATE_UNREACHABLE
        e = await refused(where, jid, attempt=1)
        assert e.code == "FAILED_PRECONDITION" and e.message.startswith(f"rank 0 of attempt 1 ran on node {first}")
        assert "UNREACHABLE (no heartbeat for 20s)" in e.message
        e = await refused(where, jid)
        assert f"rank 0 of attempt 2 ran on node {second}, whose agent did not answer (UNAVAILABLE); the " \
               "node is UNREACHABLE (no heartbeat for 20s)" in e.message


async def test_all_ranks_with_some_logs_unread_prints_them_then_fails(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    h = cluster({"node-x": 2, "node-y": 2})
    await h.register("node-x", "node-y")
    jid = await h.submit(tiny(gpus=4))
    await h.round()
    assert sorted(h.nodes_of(jid)) == ["node-x", "node-y"]
    await run_to_running(h, jid)
    head, tail = h.nodes_of(jid)
    h.agents.down.add(tail)
    async with api(h, tmp_path) as where:
        rc, out = await cli(where, jid, "--all-ranks")
        err = capsys.readouterr().err
        assert rc == 1 and out.splitlines() == [f"[rank {r}] {head} attempt 1 rank {r} line {i}"
                                                for r in (0, 1) for i in (1, 2)]
        assert f"FAILED_PRECONDITION: job {jid} attempt 1: 2 rank log(s) read, not rank 2, 3: rank 2 of attempt 1 " \
               f"ran on node {tail}, whose agent did not answer (UNAVAILABLE)" in err
        # The node's log of rank 2 is gone (its attempt folder removed), and the node answers again.
        h.agents.down.discard(tail)
        del h.agents.logs[(tail, jid, 1, 2)]
        e = await refused(where, jid, all_ranks=True)
        assert e.code == "NOT_FOUND" and e.message == (
            f"job {jid} attempt 1: 3 rank log(s) read, not rank 2: no log of rank 2 attempt 1 on node {tail} "
            "(not started yet, or the agent removed it after its --attempt-ttl)")


class Follower:
    """A StreamJobLogs follow read in a thread, its lines (or its error) queued as they come."""

    def __init__(self, where: tuple[str, str], job_id: str, **kw: Any) -> None:
        self.q: queue.Queue[tuple[int, int, str, str] | Exception | None] = queue.Queue()

        def run() -> None:
            try:
                with Client(where[0], token=where[1], timeout=60) as c:
                    for m in c.stream_logs(job_id, follow=True, timeout=60, **kw):
                        for ln in m.lines:
                            self.q.put((m.rank, m.attempt, m.node_id, ln.decode()))
                self.q.put(None)
            except Exception as e:  # noqa: BLE001 - handed to the test
                self.q.put(e)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    async def take(self, n: int) -> list[Any]:
        return [await asyncio.to_thread(self.q.get, True, 30) for _ in range(n)]


async def test_a_follow_moves_to_the_next_attempt_and_says_at_its_end_what_it_could_not_read(tmp_path: Path) -> None:
    h = cluster({"node-a10": 4, "node-a40": 4})
    await h.register(*h.agents.nodes)
    jid = await h.submit(tiny(gpus=1))
    await h.round()
    await run_to_running(h, jid)
    (first,) = h.nodes_of(jid)
    async with api(h, tmp_path) as where:
        follow = Follower(where, jid, all_ranks=True)
        assert await follow.take(2) == lines(first, 1, 0)
        await h.engine.drain(first, "maintenance")
        await h.heartbeat(first)
        await h.round()
        (second,) = h.nodes_of(jid)
        assert await follow.take(2) == lines(second, 2, 0)  # attempt 2, from its start
        h.agents.logs[(second, jid, 2, 0)] += b"more\n"
        assert await follow.take(1) == [(0, 2, second, "more")]
        await h.engine.cancel(jid, "admin")
        assert await follow.take(1) == [None]  # the job ended, its logs read: the follow ends OK

        # A follow whose log was never read ends with the error, once the job has ended.
        jid2 = await h.submit(tiny("two", gpus=1))
        await h.round()
        (node,) = h.nodes_of(jid2)
        h.agents.down.add(node)
        follow = Follower(where, jid2)
        await h.engine.cancel(jid2, "admin")
        (e,) = await follow.take(1)
        assert isinstance(e, RpcError) and e.code == "FAILED_PRECONDITION"
        assert f"rank 0 of attempt 1 ran on node {node}, whose agent did not answer" in e.message


async def test_get_job_logs_reads_an_earlier_attempt_where_it_ran(tmp_path: Path) -> None:
    """The SDK's `logs()` (GetJobLogs) finds the node as StreamJobLogs does. Before: it read attempt 1
    on attempt 2's node (NOT_FOUND), and answered UNAVAILABLE for a node whose agent did not answer,
    which the SDK takes for its controller's failure and tries another."""
    h = cluster({"node-a10": 4, "node-a40": 4})
    jid, first, second = await drained_once(h)
    async with api(h, tmp_path) as where:
        def get(**kw: Any) -> tuple[str, bytes]:
            with Client(where[0], token=where[1], timeout=30) as c:
                r = c.logs(jid, **kw)
                return r.node_id, r.data

        assert await asyncio.to_thread(get, attempt=1) == (first, b"".join(
            f"{first} attempt 1 rank 0 line {i}\n".encode() for i in (1, 2)))
        assert (await asyncio.to_thread(get))[0] == second
        h.agents.down.add(second)
        with pytest.raises(RpcError) as e:
            await asyncio.to_thread(get)
        assert e.value.code == "FAILED_PRECONDITION" and f"node {second} holding the log did not answer " \
            "(UNAVAILABLE)" in e.value.message


async def test_an_attempt_whose_nodes_were_not_recorded_is_refused_by_name(tmp_path: Path) -> None:
    """A job placed before the record was kept (or past the last 32 attempts): no search, a clear
    refusal."""
    h = cluster({"node-a10": 4, "node-a40": 4})
    jid, _, _ = await drained_once(h)
    rec = h.store.get_job(jid)
    assert rec is not None and rec.placement is not None and [e.attempt for e in rec.placement.earlier] == [1]
    bare = P.Placement()
    bare.CopyFrom(rec.placement)
    del bare.earlier[:]
    h.store.save_job(rec.with_(placement=bare), h.clock())
    async with api(h, tmp_path) as where:
        h.agents.calls.clear()
        e = await refused(where, jid, attempt=1)
        assert e.code == "FAILED_PRECONDITION" and e.message.startswith(
            f"where attempt 1 of job {jid} ran is not recorded: the controller keeps the nodes of a job's last 32")
        assert not [c for c in h.agents.calls if c.kind == "read_log"]
