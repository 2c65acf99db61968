"""`tessctl logs` says on stderr when what it printed is not the whole log, or not the --tail asked:
the controller sends at most the last 4 MiB of a log, and a live audit's `logs J`, `logs J --tail
100000` and `logs J -f` of a 400,001-line log printed its last lines and nothing else. The
messages come from the controller's own LogStream over an in-memory agent log, which marks the
last message of a cut tail (LogLines.cut) with the agent's path."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest

from tessera.clients import tessctl
from tessera.controller.logstream import LogStream
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2 as C
from tests.unit.test_job_streams import Logs, View, collect, running

PATH = "/var/lib/tessera/agent/jobs/j-1/attempt-1/rank-0.log"
BIG = b"".join(b"L%08d %s\n" % (i, b"y" * 60) for i in range(400_001))


class AtPath(Logs):
    async def read(self, node_id: str, address: str, req: Any) -> Any:
        resp = await super().read(node_id, address, req)
        resp.path = PATH
        return resp


class Growing(AtPath):
    """A log that grows by `more` once its tail has been read (a follow reads the rest)."""

    def __init__(self, more: bytes) -> None:
        super().__init__()
        self.more = more

    async def read(self, node_id: str, address: str, req: Any) -> Any:
        resp = await super().read(node_id, address, req)
        if self.more:
            self.data[(1, 0)] += self.more
            self.more = b""
        return resp


class Client:
    """tessctl's client over the controller's LogStream."""

    def __init__(self, logs: Logs) -> None:
        self.logs_ = logs
        self.view = View(running(ranks=1).with_(state=P.JOB_STATE_SUCCEEDED))  # a follow ends once read

    def stream_logs(self, job_id: str, **kw: Any) -> Any:
        req = C.StreamJobLogsRequest(job_id=job_id, **kw)
        yield from asyncio.run(collect(LogStream(self.view, self.logs_.read, 1, poll_s=0.001).stream(job_id, req)))

    def close(self) -> None:
        pass


def logs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], client: Client,
         *argv: str) -> tuple[int, str]:
    """(lines printed, stderr)."""
    monkeypatch.setattr(tessctl, "connect", lambda *_a, **_k: client)
    capsys.readouterr()
    out = io.StringIO()
    assert tessctl.main(["logs", "j-1", *argv], out=out) == 0
    return out.getvalue().count("\n"), capsys.readouterr().err


def test_a_log_over_the_cap_is_said_to_be_cut(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ((), ("--tail", "100000"), ("-f",)):
        src = AtPath()
        src.data[(1, 0)] = BIG
        n, err = logs(monkeypatch, capsys, Client(src), *argv)
        assert 50_000 < n < 100_000
        shown = f"{n:,} of the 100,000 lines asked" if "--tail" in argv else f"its last {n:,} lines"
        assert err == (f"tessctl: rank 0's log (attempt 1): showing {shown} (4.0 MiB): the controller sends only "
                       f"the last 4 MiB of a log, so its earlier lines are not shown; the agent's file is {PATH} "
                       "on node n1\n"), argv


def test_a_whole_log_or_tail_says_nothing(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    src = AtPath()
    src.data[(1, 0)] = BIG
    client = Client(src)
    assert logs(monkeypatch, capsys, client, "--tail", "10") == (10, "")
    src.data[(1, 0)] = BIG[:1_000 * 71]
    assert logs(monkeypatch, capsys, client) == (1_000, "")
    # Just under the cap, and exactly at it: whole.
    for size in ((4 * 1024 * 1024 - 1_000) // 71 * 71, 4 * 1024 * 1024):
        src.data[(1, 0)] = BIG[:size]
        n, err = logs(monkeypatch, capsys, client)
        assert err == "" and n == -(-size // 71), size
    # A followed log that grew past the cap after its tail was read: what came after is whole.
    grown = Growing(BIG[:71 * 100_000])
    grown.data[(1, 0)] = BIG[:71 * 100]
    n, err = logs(monkeypatch, capsys, Client(grown), "-f")
    assert (n, err) == (100_100, "")


def messages(src: Logs, **kw: Any) -> list[C.LogLines]:
    req = C.StreamJobLogsRequest(job_id="j-1", **kw)
    view = View(running(ranks=1).with_(state=P.JOB_STATE_SUCCEEDED))
    return asyncio.run(collect(LogStream(view, src.read, 1, poll_s=0.001).stream("j-1", req)))


def test_the_stream_marks_the_last_message_of_a_cut_tail() -> None:
    src = AtPath()
    src.data[(1, 0)] = BIG
    msgs = messages(src)
    assert len(msgs) > 1 and [m.cut for m in msgs] == [False] * (len(msgs) - 1) + [True]
    assert msgs[-1].path == PATH and all(not m.path for m in msgs[:-1])
    assert messages(src, tail_lines=100_000)[-1].cut
    # The lines asked for were all there: not cut, though the log is longer.
    assert not any(m.cut for m in messages(src, tail_lines=50_000))
    # One line longer than the cap and no newline yet: no whole line, but still said.
    src.data[(1, 0)] = b"x" * (5 * 1024 * 1024)
    (only,) = messages(src)
    assert only.cut and list(only.lines) == [b"x" * (4 * 1024 * 1024)] and only.path == PATH
