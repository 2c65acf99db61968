"""Whether `tessctl logs` printed less than the log (or the --tail) asked for: the controller sends at
most the last 4 MiB of a log (controller/logstream.py TAIL_READS) and its stream does not say when
it cut one. A live audit's `logs J`, `logs J --tail 100000` and `logs J -f` of a 400,001-line log
printed its last 37,118 lines and nothing on stderr.

The client counts what each log's tail brought (the stream sends a log's tail first, in messages of
about 1 MiB: controller/logstream.py `batches`); a tail within 64 KiB of the cap, short of the lines
asked, is checked with GetJobLogs, whose answer of the cap's size means the log is longer, and says
where the agent keeps the file. StreamJobLogs has no field for it (protos/tessera/v1/controller.proto).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tessera.clients.sdk import RpcError
from tessera.v1 import controller_pb2

CAP_MIB = 4
CAP = CAP_MIB * 1024 * 1024  # the controller's largest tail read of a log
MESSAGE_BYTES = 1024 * 1024  # its messages' bytes of lines, counting 2 a line
NEAR = 64 * 1024  # a cut tail lacks its first, partial line: within this much of the cap


class ReadsLogs(Protocol):
    def logs(self, job_id: str, rank: int = 0, attempt: int = 0,
             tail_bytes: int = 0) -> controller_pb2.GetJobLogsResponse: ...


@dataclass
class Tail:
    rank: int
    attempt: int
    lines: int = 0
    bytes: int = 0
    closed: bool = False


class TailCheck:
    """The tails of one `logs` stream. `add` each message; in a follow, it answers the tail that
    message ended (what follows is new lines); `open_tails` answers the rest when the stream ends."""

    def __init__(self, tail_lines: int, follow: bool) -> None:
        self.tail_lines, self.follow = tail_lines, follow
        self.tails: dict[tuple[int, int], Tail] = {}

    def add(self, msg: controller_pb2.LogLines) -> Tail | None:
        t = self.tails.setdefault((msg.rank, msg.attempt), Tail(msg.rank, msg.attempt))
        if t.closed:
            return None
        t.lines += len(msg.lines)
        t.bytes += sum(len(line) + 1 for line in msg.lines)
        # A message short of full is the last of the tail's read (or a follow's read): what comes
        # next of this log was written after.
        if self.follow and sum(len(line) + 2 for line in msg.lines) < MESSAGE_BYTES - NEAR:
            t.closed = True
            return t
        return None

    def open_tails(self) -> list[Tail]:
        out = [t for t in self.tails.values() if not t.closed]
        for t in out:
            t.closed = True
        return out

    def suspect(self, t: Tail) -> bool:
        """Whether the tail may have been cut at the cap: within NEAR of it and short of the lines asked."""
        return t.bytes >= CAP - NEAR and (not self.tail_lines or t.lines < self.tail_lines)


def mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


def notice(client: ReadsLogs, job_id: str, check: TailCheck, t: Tail) -> str:
    """The line for stderr when tail `t` is not the whole log (or --tail) asked for; "" when it is.
    Asks GetJobLogs only for a tail near the cap."""
    if not check.suspect(t):
        return ""
    shown = f"{t.lines:,} of the {check.tail_lines:,} lines asked" if check.tail_lines else f"its last {t.lines:,} lines"
    head = f"tessctl: rank {t.rank}'s log (attempt {t.attempt}): showing {shown} ({mib(t.bytes)})"
    try:
        resp = client.logs(job_id, rank=t.rank, attempt=t.attempt, tail_bytes=CAP)
    except RpcError:  # the lines were printed: only what they are is left unsure
        return (f"{head}, as much as the controller sends of a log (its last {CAP_MIB} MiB): earlier lines may "
                "not be shown")
    if len(resp.data) < CAP:
        return ""  # the whole log is smaller than the cap: the tail was all of it
    return (f"{head}: the controller sends only the last {CAP_MIB} MiB of a log, so its earlier lines are not "
            f"shown; the agent's file is {resp.path} on node {resp.node_id}")
