"""`tessctl logs` says on stderr when what it printed is not the whole log, or not the --tail asked:
the controller sends at most the last 4 MiB of a log, and a live audit's `logs J`, `logs J --tail
100000` and `logs J -f` of a 400,001-line log printed its last lines and nothing else. The
messages come from the controller's own LogStream over an in-memory agent log; GetJobLogs confirms
the cut and says where the agent keeps the file."""

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


class Growing(Logs):
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
    """tessctl's client over the controller's LogStream; `logs` answers GetJobLogs as the controller does."""

    def __init__(self, logs: Logs) -> None:
        self.logs_ = logs
        self.got: list[int] = []  # GetJobLogs's tail_bytes asked
        self.view = View(running(ranks=1).with_(state=P.JOB_STATE_SUCCEEDED))  # a follow ends once read

    def stream_logs(self, job_id: str, **kw: Any) -> Any:
        req = C.StreamJobLogsRequest(job_id=job_id, **kw)
        yield from asyncio.run(collect(LogStream(self.view, self.logs_.read, 1, poll_s=0.001).stream(job_id, req)))

    def logs(self, job_id: str, rank: int = 0, attempt: int = 0, tail_bytes: int = 0) -> C.GetJobLogsResponse:
        self.got.append(tail_bytes)
        data = self.logs_.data[(attempt or 1, rank)]
        return C.GetJobLogsResponse(node_id="node-a", path=PATH, data=data[-min(tail_bytes, 4 * 1024 * 1024):])

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
        src = Logs()
        src.data[(1, 0)] = BIG
        n, err = logs(monkeypatch, capsys, Client(src), *argv)
        assert 50_000 < n < 100_000
        shown = f"{n:,} of the 100,000 lines asked" if "--tail" in argv else f"its last {n:,} lines"
        assert err == (f"tessctl: rank 0's log (attempt 1): showing {shown} (4.0 MiB): the controller sends only "
                       f"the last 4 MiB of a log, so its earlier lines are not shown; the agent's file is {PATH} "
                       "on node node-a\n"), argv


def test_a_whole_log_or_tail_says_nothing(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    src = Logs()
    src.data[(1, 0)] = BIG
    client = Client(src)
    assert logs(monkeypatch, capsys, client, "--tail", "10") == (10, "")
    src.data[(1, 0)] = BIG[:1_000 * 71]
    assert logs(monkeypatch, capsys, client) == (1_000, "")
    assert client.got == []  # nothing near the cap: no GetJobLogs
    # Just under the cap: checked, and GetJobLogs's answer shorter than the cap says it is whole.
    src.data[(1, 0)] = BIG[:(4 * 1024 * 1024 - 1_000) // 71 * 71]
    n, err = logs(monkeypatch, capsys, client)
    assert err == "" and n == len(src.data[(1, 0)]) // 71 and client.got == [4 * 1024 * 1024]
    # A followed log that grew past the cap after its tail was read: what came after is whole.
    grown = Growing(BIG[:71 * 100_000])
    grown.data[(1, 0)] = BIG[:71 * 100]
    n, err = logs(monkeypatch, capsys, Client(grown), "-f")
    assert (n, err) == (100_100, "")
