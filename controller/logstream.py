"""StreamJobLogs: a job's worker logs as whole lines, tailed and followed through the agents.

The controller reads each rank's log with the agent's ReadLog (the only peer that may: agents
answer the controller's certificate only) and streams lines to the client:
- the tail: the last N lines, never starting mid-line: the read grows (64 KiB, 512 KiB, 4 MiB)
  until it holds N whole lines or reaches the log's start; a cut first line is dropped; a tail
  that lacks earlier lines it asked for says so on its last message (LogLines.cut, with the path);
- follow: reads from the byte after the last one read (ReadLog's offset), so nothing is read or
  sent twice; a line still being written waits for its newline; a log the agent's cap cut (it
  shrank) is tailed again, after a line that says so; a new attempt of the job is
  followed from its start; the stream ends once the job has ended and its logs are read to the end.
- where: the current attempt's ranks are on the nodes of the job's placement (launches.rank_node),
  an earlier attempt's on the nodes its placement recorded (Placement.earlier, the last 32
  attempts: controller/transitions.py); an attempt with no record (older, or placed before the
  record was kept) is FAILED_PRECONDITION, not looked for node by node.
- a log that cannot be read (none there, its node unreachable) ends the stream with an error that
  names each such rank and why, after the lines of the logs that were read: all_ranks never ends
  with success while a rank's log went unread (before, it sent nothing and ended OK). A follow
  says so when it ends: until then a log not yet there may still come.
The service checks that the caller may read the job before this runs (controller/access.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc

from tessera.common.errors import FailedPrecondition, InvalidArgument, NotFound
from tessera.controller.judging import launcher_name, processes
from tessera.controller.launches import rank_node
from tessera.controller.loggaps import Gap, node_words, unread
from tessera.controller.store import TERMINAL, JobRecord
from tessera.controller.transitions import EARLIER_KEPT
from tessera.controller.view import EngineView
from tessera.v1 import agent_pb2, common_pb2, controller_pb2

TAIL_READS = (64 * 1024, 512 * 1024, 4 * 1024 * 1024)  # the agent's largest read is 4 MiB
FOLLOW_READ = 1024 * 1024
MAX_TAIL_LINES = 1_000_000
# Bytes of lines per message (the gRPC limit is far above; a client renders as they come).
MESSAGE_BYTES = 1024 * 1024
POLL_S = 0.5
IDLE_POLLS = 8  # quiet logs are read at most this many POLL_S apart
# A followed log that shrank was cut by the agent's log cap: this line says so, then its last lines.
CUT_NOTE = b"[tessera: this log passed the agent's --log-max-bytes and was cut to its newest part; " \
           b"following on from its last lines, some of which may repeat]"
CUT_TAIL_LINES = 10
# all_ranks reads this many logs at most: a follow polls each one every POLL_S, and every read is a
# call to an agent on the caller's behalf.
MAX_ALL_RANKS = 256

# (node_id, address, request) -> the agent's answer.
ReadLog = Callable[[str, str, agent_pb2.ReadLogRequest], Awaitable[agent_pb2.ReadLogResponse]]


def no_rank_text(job: JobRecord, what: str, rank: int, world: int) -> str:
    """Why `rank` names no log of `what` (of `world` processes). Under a per-node launcher a log is
    a node's and the rank asked for a node rank: a live audit read `has no rank 1 (ranks 0..0)` of
    a torchrun job whose events counted 2 ranks."""
    name = launcher_name(job)
    if not name:
        return f"{what} has no rank {rank} (ranks 0..{world - 1})"
    unit = "launcher" if name == "launcher" else f"{name} launcher"
    return (f"{what} has no node rank {rank}: under its per-node {unit} a rank is a node rank "
            f"(0..{world - 1}), whose log holds the ranks it starts")


@dataclass
class _Cursor:
    rank: int
    node_id: str
    offset: int = 0
    partial: bytes = b""
    read: bool = False  # a ReadLog of it answered: the log is there
    gap: Gap | None = None  # why the last read got nothing
    cut: str = ""  # the agent's path of a log whose tail lacks earlier lines it asked for


def check_request(req: controller_pb2.StreamJobLogsRequest) -> None:
    if req.rank < 0 or req.attempt < 0:
        raise InvalidArgument("rank, attempt", "must be >= 0")
    if not 0 <= req.tail_lines <= MAX_TAIL_LINES:
        raise InvalidArgument("tail_lines", f"must be between 0 (all) and {MAX_TAIL_LINES:,}")
    if req.all_ranks and req.rank:
        raise InvalidArgument("rank", "give a rank or all_ranks, not both")


def split_lines(data: bytes) -> tuple[list[bytes], bytes]:
    """Whole lines (without newlines) and the unfinished rest."""
    cut = data.rfind(b"\n")
    if cut < 0:
        return [], data
    return data[:cut].split(b"\n"), data[cut + 1:]


def batches(rank: int, attempt: int, node_id: str, lines: list[bytes]) -> list[controller_pb2.LogLines]:
    out: list[controller_pb2.LogLines] = []
    cur: list[bytes] = []
    size = 0
    for line in lines:
        if cur and size + len(line) > MESSAGE_BYTES:
            out.append(controller_pb2.LogLines(rank=rank, attempt=attempt, node_id=node_id, lines=cur))
            cur, size = [], 0
        cur.append(line)
        size += len(line) + 2
    if cur:
        out.append(controller_pb2.LogLines(rank=rank, attempt=attempt, node_id=node_id, lines=cur))
    return out


class LogStream:
    """One StreamJobLogs call. `read` calls an agent; `epoch` is the controller's."""

    def __init__(self, view: EngineView, read: ReadLog, epoch: int, poll_s: float = POLL_S) -> None:
        self.view, self.read, self.epoch, self.poll_s = view, read, epoch, poll_s

    async def _read(self, job: JobRecord, attempt: int, c: _Cursor, n: int,
                    offset: int | None) -> agent_pb2.ReadLogResponse | None:
        """The agent's answer, or None when the log is not there (yet) or its node is not reachable
        (`c.gap` says which)."""
        ran = f"rank {c.rank} of attempt {attempt} ran on node {c.node_id}"
        address = self.view.agent_address(c.node_id)
        if address is None:
            c.gap = Gap(c.rank, f"{ran}, which is {node_words(self.view, c.node_id)}", unreachable=True)
            return None
        req = agent_pb2.ReadLogRequest(controller_epoch=self.epoch, job_id=job.id, attempt=attempt, rank=c.rank,
                                       tail_bytes=n, from_offset=offset is not None, offset=offset or 0)
        try:
            resp = await self.read(c.node_id, address, req)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                c.gap = Gap(c.rank, f"no log of rank {c.rank} attempt {attempt} on node {c.node_id} (not started "
                                    "yet, or the agent removed it after its --attempt-ttl)")
                return None
            if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                c.gap = Gap(c.rank, f"{ran}, whose agent did not answer ({e.code().name}); the node is "
                                    f"{node_words(self.view, c.node_id)}", unreachable=True)
                return None
            raise FailedPrecondition(f"cannot read the log of rank {c.rank} on {c.node_id}: "
                                     f"{e.code().name}: {e.details()}") from None
        c.read, c.gap = True, None
        if len(resp.data) > n:  # never more than asked, whatever the node sends: its start from an
            # offset, its end for a tail (a node answering 15 MiB to every poll grew the controller by GBs)
            cut = len(resp.data) - n
            resp.data, resp.offset = (resp.data[:n], resp.offset) if offset is not None else \
                (resp.data[cut:], resp.offset + cut)
        return resp

    async def _tail(self, job: JobRecord, attempt: int, c: _Cursor, n: int) -> list[bytes]:
        """The last `n` whole lines (0: all the largest read holds); the cursor moves past them."""
        resp = None
        lines: list[bytes] = []
        for size in TAIL_READS if n else TAIL_READS[-1:]:
            resp = await self._read(job, attempt, c, size, None)
            if resp is None:
                return []
            lines, c.partial = split_lines(resp.data)
            if resp.offset > 0 and lines:
                lines = lines[1:]  # cut by the read: not a whole line
            if not n or len(lines) >= n or resp.offset == 0:
                break
        assert resp is not None
        c.offset = resp.offset + len(resp.data)
        c.cut = (resp.path or "?") if resp.offset > 0 and (not n or len(lines) < n) else ""
        return lines[-n:] if n else lines

    async def _follow(self, job: JobRecord, attempt: int, c: _Cursor) -> list[bytes]:
        resp = await self._read(job, attempt, c, FOLLOW_READ, c.offset)
        if resp is not None and resp.size < c.offset:
            # The keeper cut the log to its newest part (nodeagent/logcap.py): the offset no longer
            # points into it. Its last lines are read again, and the reader told why.
            c.partial = b""
            return [CUT_NOTE, *await self._tail(job, attempt, c, CUT_TAIL_LINES)]
        if resp is None or not resp.data:
            return []
        c.offset = resp.offset + len(resp.data)
        lines, c.partial = split_lines(c.partial + resp.data)
        while len(c.partial) > MESSAGE_BYTES:  # a line longer than a message goes out in pieces
            lines.append(c.partial[:MESSAGE_BYTES])
            c.partial = c.partial[MESSAGE_BYTES:]
        return lines

    def _cursors(self, job: JobRecord, req: controller_pb2.StreamJobLogsRequest, what: str = "",
                 world: int | None = None) -> list[_Cursor]:
        """The logs asked for, on the nodes of the job's placement (`what` names it and `world`
        counts its processes: the job's current attempt by default, or an earlier one)."""
        what = what or f"job {job.id}"
        world = processes(job) if world is None else world
        if req.all_ranks and world > MAX_ALL_RANKS:
            raise InvalidArgument("all_ranks", f"{what} has {world} ranks; all_ranks reads at most "
                                               f"{MAX_ALL_RANKS} logs: name a rank")
        ranks = list(range(world)) if req.all_ranks else [req.rank]
        out = []
        for r in ranks:
            node = rank_node(job, r)
            if node is None or r >= world:
                raise InvalidArgument("rank", no_rank_text(job, what, r, world))
            out.append(_Cursor(r, node))
        return out

    def _earlier(self, job: JobRecord, attempt: int, req: controller_pb2.StreamJobLogsRequest) -> list[_Cursor]:
        """An earlier attempt's logs asked for, on the nodes its placement recorded."""
        assert job.placement is not None
        past = next((e for e in job.placement.earlier if e.attempt == attempt), None)
        if past is None:
            raise FailedPrecondition(f"where attempt {attempt} of job {job.id} ran is not recorded: the controller "
                                     f"keeps the nodes of a job's last {EARLIER_KEPT} attempts, recorded since "
                                     "Tessera 0.1 (an agent keeps the log for its --attempt-ttl)")
        # Its own slices and process count: the job's plan is the current attempt's.
        then = job.with_(placement=common_pb2.Placement(slices=past.slices))
        return self._cursors(then, req, f"attempt {attempt} of job {job.id}", past.world_size)

    async def node_of(self, job: JobRecord, attempt: int, rank: int) -> str:
        """The node that holds (or held) the rank's log of the attempt, for GetJobLogs: the current
        placement's for the current attempt, else found as StreamJobLogs finds it; the same errors."""
        req = controller_pb2.StreamJobLogsRequest(job_id=job.id, rank=rank, attempt=attempt)
        cursors = self._cursors(job, req) if attempt == job.attempt else self._earlier(job, attempt, req)
        return cursors[0].node_id

    @staticmethod
    def _all_read(job_id: str, attempt: int, cursors: list[_Cursor]) -> None:
        """Raise the error naming every log asked for that was not read (none, with all_ranks, was
        an empty success before)."""
        missing = [c.gap or Gap(c.rank, f"rank {c.rank} of attempt {attempt}: not read") for c in cursors if not c.read]
        if missing:
            raise unread(job_id, attempt, missing, sum(c.read for c in cursors))

    async def stream(self, job_id: str, req: controller_pb2.StreamJobLogsRequest) -> AsyncIterator[controller_pb2.LogLines]:
        check_request(req)
        job = self.view.get(job_id)
        while job.placement is None or not job.placement.slices or job.plan is None:
            if not req.follow or job.state in TERMINAL:
                raise FailedPrecondition(f"job {job.id} has not been placed yet")
            await self.view.wait_changed(self.poll_s * 10)
            job = self.view.get(job_id)
        attempt = req.attempt or job.attempt
        if attempt > job.attempt:
            raise NotFound(f"job {job.id} has no attempt {attempt} (its latest is {job.attempt})")
        if attempt == job.attempt:
            cursors = self._cursors(job, req)
        else:
            cursors = self._earlier(job, attempt, req)
        for c in cursors:
            lines = await self._tail(job, attempt, c, req.tail_lines)
            if not req.follow and c.partial:
                lines.append(c.partial)  # the log as it is now, its last line unfinished
            msgs = batches(c.rank, attempt, c.node_id, lines)
            if c.cut:  # said after the tail's lines, where a reader sees it
                if not msgs:
                    msgs = [controller_pb2.LogLines(rank=c.rank, attempt=attempt, node_id=c.node_id)]
                msgs[-1].cut, msgs[-1].path = True, c.cut
            for msg in msgs:
                yield msg
        if not req.follow:
            self._all_read(job.id, attempt, cursors)
            return
        idle = self.poll_s
        while True:
            # Read before the last read: what it wrote is in there. An attempt asked for by number
            # that is no longer the job's current one has ended too (such a follow never ended).
            ended = job.state in TERMINAL or bool(req.attempt and job.attempt != req.attempt)
            got = False
            for c in cursors:
                lines = await self._follow(job, attempt, c)
                got = got or bool(lines)
                for msg in batches(c.rank, attempt, c.node_id, lines):
                    yield msg
            if ended and not got:
                for c in cursors:  # what the workers left without a newline
                    if c.partial:
                        yield controller_pb2.LogLines(rank=c.rank, attempt=attempt, node_id=c.node_id,
                                                      lines=[c.partial])
                self._all_read(job.id, attempt, cursors)
                return
            job = self.view.get(job_id)
            if not req.attempt and job.attempt != attempt and job.placement is not None and job.plan is not None:
                # A new attempt: from its start (the last one's logs not read are not said: it is over).
                try:
                    attempt, cursors = job.attempt, self._cursors(job, req)
                except InvalidArgument as e:  # the request was sound: the new attempt has other ranks
                    raise FailedPrecondition(f"the follow ends: attempt {job.attempt} of job {job.id} started "
                                             f"without what it followed ({e.reason})") from None
                continue
            # Quiet logs are read less often, up to IDLE_POLLS x poll_s: a follow of 256 ranks read each
            # every POLL_S, about 500 calls to the agents a second whether anything was written or not.
            idle = self.poll_s if got else min(idle * 2, IDLE_POLLS * self.poll_s)
            if not got:
                await asyncio.sleep(idle)
