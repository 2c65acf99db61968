"""The controller's streams (controller/watching.py, controller/logstream.py) over an in-memory view and
agent logs, and the client side of wait (clients/waiting.py)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from tessera.clients import waiting
from tessera.common.errors import FailedPrecondition, NotFound
from tessera.controller import logstream
from tessera.controller.logstream import CUT_NOTE as LOG_CUT_NOTE
from tessera.controller.logstream import LogStream, split_lines
from tessera.controller.store import EventRecord, JobRecord
from tessera.controller.watching import watch_events, watch_job, watch_jobs
from tessera.v1 import agent_pb2, controller_pb2
from tessera.v1 import common_pb2 as P


def running(jid: str = "j-1", ranks: int = 2, attempt: int = 1) -> JobRecord:
    spec = P.JobSpec(name="x", entrypoint=["a"], iterations=40, hint=P.ResourceHint(gpus=ranks))
    slice_ = P.NodeSlice(node_id="n1", gpu_indices=list(range(ranks)))
    return JobRecord(jid, "r", spec, P.JOB_STATE_RUNNING, "", 1.0, attempt=attempt,
                     plan=P.Plan(dp=ranks, tp=1, pp=1, micro_batch=1, grad_accum=1, gpu_model="A40-48GB"),
                     placement=P.Placement(slices=[slice_], rendezvous="h:1",  # earlier attempts: the same node
                                           earlier=[P.EarlierPlacement(attempt=a, slices=[slice_], world_size=ranks)
                                                    for a in range(1, attempt)]))


class View:
    """The EngineView methods the streams use. The tests change its dicts between reads without
    counting the changes: every generation is new, so a watch looks again at every wake-up (the
    counts themselves: tests/unit/test_watch_changes.py)."""

    def __init__(self, *jobs: JobRecord) -> None:
        self.jobs_by_id = {j.id: j for j in jobs}
        self.events_of: dict[str, list[EventRecord]] = {j.id: [] for j in jobs}
        self.prog: dict[str, P.Progress] = {}
        self.waits = 0
        self.count = 0

    def generation(self, tenant: str = "") -> int:
        self.count += 1
        return self.count

    def job_generation(self, jid: str) -> int:
        return self.generation()

    def get(self, jid: str) -> JobRecord:
        return self.jobs_by_id[jid]

    def events(self, jid: str, after: int = 0) -> list[EventRecord]:
        return [e for e in self.events_of[jid] if e.seq > after]

    def progress(self, jid: str) -> P.Progress | None:
        return self.prog.get(jid)

    def jobs(self, states: Any = (), tenant: str = "") -> list[JobRecord]:
        return [j for j in self.jobs_by_id.values() if not states or j.state in states]

    def agent_address(self, node_id: str) -> str | None:
        return "n1:1"

    async def wait_changed(self, timeout: float, since: int | None = None) -> None:
        # The tests change the view between reads: a wake-up that looks again is all a watch needs.
        self.waits += 1
        await asyncio.sleep(0)


class Logs:
    """Agent logs by (attempt, rank), read as ReadLog reads them (tail or from an offset)."""

    def __init__(self) -> None:
        self.data: dict[tuple[int, int], bytes] = {}
        self.reads: list[agent_pb2.ReadLogRequest] = []

    async def read(self, node_id: str, address: str, req: agent_pb2.ReadLogRequest) -> agent_pb2.ReadLogResponse:
        self.reads.append(req)
        data = self.data.get((req.attempt, req.rank))
        if data is None:
            raise grpc.aio.AioRpcError(grpc.StatusCode.NOT_FOUND, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       details="no log")
        n = req.tail_bytes
        start = min(req.offset, len(data)) if req.from_offset else max(0, len(data) - n)
        return agent_pb2.ReadLogResponse(path="p", data=data[start:start + n], offset=start, size=len(data))


async def collect(it: AsyncIterator[Any], n: int | None = None) -> list[Any]:
    out = []
    async for x in it:
        out.append(x)
        if n is not None and len(out) == n:
            break
    return out


def test_split_lines() -> None:
    assert split_lines(b"a\nb\nc") == ([b"a", b"b"], b"c")
    assert split_lines(b"a\n") == ([b"a"], b"")
    assert split_lines(b"abc") == ([], b"abc")


async def test_tail_gives_whole_lines_growing_the_read() -> None:
    view, logs = View(running()), Logs()
    long = b"".join(b"line %d %s\n" % (i, b"x" * 1000) for i in range(200))  # ~200 KiB: over the first read
    logs.data[(1, 0)] = long
    req = controller_pb2.StreamJobLogsRequest(job_id="j-1", rank=0, tail_lines=150)
    msgs = await collect(LogStream(view, logs.read, 1).stream("j-1", req))
    lines = [ln for m in msgs for ln in m.lines]
    assert len(lines) == 150 and lines[0].startswith(b"line 50 ") and lines[-1].startswith(b"line 199 ")
    assert [r.tail_bytes for r in logs.reads] == [64 * 1024, 512 * 1024]
    # A read that starts mid-line never shows the cut line: the next, larger read has it whole.
    logs.data[(1, 0)] = b"x" * 70000 + b"\nlast one\n"
    logs.reads.clear()
    msgs = await collect(LogStream(view, logs.read, 1).stream("j-1", req.__class__(job_id="j-1", tail_lines=2)))
    assert [ln for m in msgs for ln in m.lines] == [b"x" * 70000, b"last one"]
    assert [r.tail_bytes for r in logs.reads] == [64 * 1024, 512 * 1024]


async def test_a_missing_log_and_an_unplaced_job() -> None:
    view, logs = View(running()), Logs()
    with pytest.raises(NotFound):
        await collect(LogStream(view, logs.read, 1).stream("j-1", controller_pb2.StreamJobLogsRequest(job_id="j-1")))
    view.jobs_by_id["j-1"] = view.jobs_by_id["j-1"].with_(placement=None, state=P.JOB_STATE_PENDING)
    with pytest.raises(FailedPrecondition, match="has not been placed yet"):
        await collect(LogStream(view, logs.read, 1).stream("j-1", controller_pb2.StreamJobLogsRequest(job_id="j-1")))


async def test_follow_all_ranks_reads_each_byte_once_and_ends_with_the_job() -> None:
    view, logs = View(running()), Logs()
    logs.data[(1, 0)] = b"r0 a\nr0 b\n"
    logs.data[(1, 1)] = b"r1 a\nr1 part"
    req = controller_pb2.StreamJobLogsRequest(job_id="j-1", all_ranks=True, tail_lines=1, follow=True)
    stream = LogStream(view, logs.read, 1, poll_s=0.01).stream("j-1", req)
    first = await collect(stream, 2)
    assert [(m.rank, list(m.lines)) for m in first] == [(0, [b"r0 b"]), (1, [b"r1 a"])]
    logs.data[(1, 1)] += b"ial\nr1 c\n"
    logs.data[(1, 0)] += b"r0 c\nunfinished"
    more = await collect(stream, 2)
    assert sorted((m.rank, list(m.lines)) for m in more) == [(0, [b"r0 c"]), (1, [b"r1 partial", b"r1 c"])]
    view.jobs_by_id["j-1"] = view.jobs_by_id["j-1"].with_(state=P.JOB_STATE_SUCCEEDED)
    rest = await collect(stream)
    assert [(m.rank, list(m.lines)) for m in rest] == [(0, [b"unfinished"])]
    offsets = [r.offset for r in logs.reads if r.from_offset and r.rank == 0]
    assert offsets[0] == len(b"r0 a\nr0 b\n")  # each read starts where the last ended


async def test_follow_goes_on_after_the_agent_cut_the_log() -> None:
    """The agent's log cap rewrote the log as a note and its newest part (nodeagent/logcap.py): the
    follower's offset is past the end. It says so, tails the cut log and follows on from its end."""
    view, logs = View(running(ranks=1)), Logs()
    logs.data[(1, 0)] = b"".join(b"old %d\n" % i for i in range(100))
    req = controller_pb2.StreamJobLogsRequest(job_id="j-1", rank=0, tail_lines=1, follow=True)
    stream = LogStream(view, logs.read, 1, poll_s=0.01).stream("j-1", req)
    assert [list(m.lines) for m in await collect(stream, 1)] == [[b"old 99"]]
    logs.data[(1, 0)] = b"note: cut\n" + b"".join(b"new %d\n" % i for i in range(20))
    (cut,) = await collect(stream, 1)
    assert list(cut.lines) == [LOG_CUT_NOTE] + [b"new %d" % i for i in range(10, 20)]
    logs.data[(1, 0)] += b"new 20\n"
    (more,) = await collect(stream, 1)
    assert list(more.lines) == [b"new 20"]


async def test_a_node_answering_more_than_asked_or_no_newline_holds_no_more_than_a_message() -> None:
    """A node whose every ReadLog answer is 15 MiB without a newline grew the controller by 15 MiB a
    poll while a user followed its log: an answer is cut to what was asked, and a line longer than a
    message goes out in pieces."""
    view = View(running(ranks=1))
    sent = {"n": 0}

    async def flood(node_id: str, address: str, req: agent_pb2.ReadLogRequest) -> agent_pb2.ReadLogResponse:
        sent["n"] += 1
        return agent_pb2.ReadLogResponse(path="p", data=b"x" * (15 << 20), offset=req.offset if req.from_offset else 0,
                                         size=sent["n"] * (15 << 20))

    req = controller_pb2.StreamJobLogsRequest(job_id="j-1", rank=0, follow=True)
    stream = LogStream(view, flood, 1, poll_s=0.01).stream("j-1", req)
    ls = LogStream(view, flood, 1)
    resp = await ls._read(view.get("j-1"), 1, logstream._Cursor(0, "n1"), 4096, None)
    assert resp is not None and (len(resp.data), resp.offset) == (4096, (15 << 20) - 4096)  # a tail keeps the end
    msgs = await collect(stream, 4)
    assert all(sum(len(ln) for ln in m.lines) <= logstream.MESSAGE_BYTES for m in msgs)


async def test_rank_out_of_range() -> None:
    view, logs = View(running(ranks=2)), Logs()
    with pytest.raises(Exception, match="has no rank 5"):
        await collect(LogStream(view, logs.read, 1).stream("j-1", controller_pb2.StreamJobLogsRequest(job_id="j-1",
                                                                                                     rank=5)))


async def test_rank_out_of_range_under_a_per_node_launcher_is_a_node_rank() -> None:
    """One node, torchrun starting its 2 ranks: one log, node rank 0. A live audit read `has no rank
    1 (ranks 0..0)` while the job's events counted 2 ranks."""
    job = running(ranks=2)
    job.spec.launcher.name = "torchrun"
    view, logs = View(job), Logs()
    with pytest.raises(Exception, match=r"job j-1 has no node rank 1: under its per-node torchrun launcher a rank "
                                        r"is a node rank \(0\.\.0\)"):
        await collect(LogStream(view, logs.read, 1).stream("j-1", controller_pb2.StreamJobLogsRequest(job_id="j-1",
                                                                                                     rank=1)))


async def test_watch_job_pushes_progress_and_events_and_ends() -> None:
    view = View(running())
    stream = watch_job(view, "j-1")
    (first,) = await collect(stream, 1)
    assert first.job.state == P.JOB_STATE_RUNNING and not first.events
    view.prog["j-1"] = P.Progress(iteration=7, loss=2.5)
    (second,) = await collect(stream, 1)
    assert second.job.progress.iteration == 7
    view.jobs_by_id["j-1"] = view.jobs_by_id["j-1"].with_(state=P.JOB_STATE_FAILED, reason="boom")
    view.events_of["j-1"].append(EventRecord(1, "j-1", 2.0, "FAILED", "boom"))
    rest = await collect(stream)
    assert [u.job.state for u in rest] == [P.JOB_STATE_FAILED] and rest[0].events[0].kind == "FAILED"


async def test_watch_events_carries_progress_reports() -> None:
    view = View(running())
    view.events_of["j-1"].append(EventRecord(4, "j-1", 1.0, "STARTED", "all ranks running"))
    view.prog["j-1"] = P.Progress(iteration=12, loss=3.25, step_time_seconds=0.25)
    stream = watch_events(view, "j-1", 0)
    first = await collect(stream, 2)
    assert [(e.seq, e.kind) for e in first] == [(4, "STARTED"), (4, "PROGRESS")]
    assert first[1].message == "iteration 12/40 loss 3.25 step 0.25s"
    view.prog["j-1"] = P.Progress(iteration=13)
    (second,) = await collect(stream, 1)
    assert second.message == "iteration 13/40"
    view.jobs_by_id["j-1"] = view.jobs_by_id["j-1"].with_(state=P.JOB_STATE_SUCCEEDED)
    view.events_of["j-1"].append(EventRecord(5, "j-1", 2.0, "SUCCEEDED", "done"))
    assert [e.kind for e in await collect(stream)] == ["SUCCEEDED"]


async def test_watch_jobs_sends_the_list_then_changes() -> None:
    view = View(running("j-1"), running("j-2"))
    stream = watch_jobs(view, [P.JOB_STATE_RUNNING], "")
    first = await collect(stream, 3)
    assert [u.job.id for u in first[:2]] == ["j-1", "j-2"] and first[2].batch_end
    view.jobs_by_id["j-2"] = view.jobs_by_id["j-2"].with_(state=P.JOB_STATE_SUCCEEDED)
    view.prog["j-1"] = P.Progress(iteration=3)
    second = await collect(stream, 3)
    assert (second[0].job.progress.iteration, second[1].job.id, second[1].removed, second[2].batch_end) == (
        3, "j-2", True, True)
    await stream.aclose()  # type: ignore[attr-defined]


def job(state: int, iteration: int | None = None, total: int = 40, step: float = 0.5) -> controller_pb2.Job:
    j = controller_pb2.Job(id="j-1", state=state, spec=P.JobSpec(iterations=total))
    if iteration is not None:
        j.progress.CopyFrom(P.Progress(iteration=iteration, loss=3.25, step_time_seconds=step))
    return j


def test_progress_text_bar_and_exit_codes() -> None:
    assert waiting.progress_text(job(3)) == ""
    assert waiting.progress_text(job(3, 10)) == "10/40 (25%)  loss 3.25  2 it/s  ETA 15s"
    assert waiting.progress_text(job(3, 10, total=0)) == "iteration 10  loss 3.25  2 it/s"
    assert waiting.bar(job(3, 20)) == "[" + "#" * 12 + "." * 12 + "] "
    codes = [waiting.end_code(s) for s in (P.JOB_STATE_SUCCEEDED, P.JOB_STATE_FAILED, P.JOB_STATE_CANCELLED)]
    assert codes == [0, 1, 4]
    assert waiting.end_code(P.JOB_STATE_FAILED, "done") == 0


def test_printer_draws_a_bar_on_a_terminal_and_lines_in_a_pipe() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Tty(), io.StringIO()
    for out in (tty, pipe):
        p = waiting.Printer(out)
        p.progress(job(3, 10))
        p.progress(job(3, 10))  # the same report: nothing new
        p.line("j-1 SUCCEEDED")
        p.close()
    assert pipe.getvalue() == "j-1 progress: 10/40 (25%)  loss 3.25  2 it/s  ETA 15s\nj-1 SUCCEEDED\n"
    assert tty.getvalue().startswith("\r\x1b[K[") and tty.getvalue().endswith("\r\x1b[Kj-1 SUCCEEDED\n")


def test_piped_progress_is_throttled_and_the_last_report_always_shows() -> None:
    now = [0.0]
    out = io.StringIO()
    p = waiting.Printer(out, clock=lambda: now[0])
    for it in range(1, 21):  # a report a second for 20 s
        p.progress(job(3, it))
        now[0] += 1.0
    p.line("j-1 SUCCEEDED")
    lines = out.getvalue().splitlines()
    iterations = [int(ln.split("progress: ")[1].split("/")[0]) for ln in lines if "progress: " in ln]
    assert iterations == [1, 11, 20]  # the first, one every 10 s, and the latest before the end
    assert lines[-1] == "j-1 SUCCEEDED"


async def test_a_follow_of_an_earlier_attempt_ends_when_its_log_is_read() -> None:
    """The job runs attempt 2; a follow of attempt 1 read its log and then polled forever (it ended
    only with the job)."""
    view, logs = View(running(ranks=1, attempt=2)), Logs()
    logs.data[(1, 0)] = b"first 1\nfirst 2\n"
    req = controller_pb2.StreamJobLogsRequest(job_id="j-1", rank=0, attempt=1, follow=True)
    got = await asyncio.wait_for(collect(LogStream(view, logs.read, 1, poll_s=0.01).stream("j-1", req)), 30)
    assert [list(m.lines) for m in got] == [[b"first 1", b"first 2"]]


async def test_a_follow_ends_clearly_when_the_next_attempt_lacks_its_rank() -> None:
    """Shrunk from 2 ranks to 1: a follow of rank 1 ends FAILED_PRECONDITION saying why. Before: an
    INVALID_ARGUMENT mid-stream, as if the request had been malformed."""
    view, logs = View(running(ranks=2)), Logs()
    logs.data[(1, 1)] = b"one\n"
    req = controller_pb2.StreamJobLogsRequest(job_id="j-1", rank=1, follow=True)
    stream = LogStream(view, logs.read, 1, poll_s=0.01).stream("j-1", req)
    assert [list(m.lines) for m in await collect(stream, 1)] == [[b"one"]]
    view.jobs_by_id["j-1"] = running(ranks=1, attempt=2)
    with pytest.raises(FailedPrecondition, match=r"^the follow ends: attempt 2 of job j-1 started without what it "
                                                 r"followed \(job j-1 has no rank 1 \(ranks 0\.\.0\)\)$"):
        await collect(stream)
