"""tessctl wait, submit --wait, logs and the job watches, over the controller's streams (docs/cli.md).

Everything here reads server-streaming RPCs (WatchJob, WatchJobs, StreamJobLogs): the controller
pushes a job's state changes, events and progress reports as they happen; nothing polls. A stream
broken by a failover (or a restart) is opened again at the controller that leads (docs/ha.md,
"Agents and clients follow the leader"): a watch from the whole list or the job again, `logs -f`
from after the last lines it printed (`LogPrinter`).

Exit status of `wait`, `submit --wait` and `get jobs ID --watch` (the job's end as a number):
  0    the job SUCCEEDED (with --for done: the job ended, however)
  1    the job FAILED (or tessctl itself failed: the message on stderr says which)
  4    the job was CANCELLED
  124  --timeout passed first (the job goes on)
  130  interrupted (Ctrl-C; the job goes on)
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from tessera.clients import logcut, output, terminal
from tessera.clients.progress_rate import RateMeter
from tessera.clients.sdk import UNAVAILABLE_GRACE_S, Client, ControllerUnreachable, RpcError
from tessera.common.durations import format_duration
from tessera.v1 import common_pb2, controller_pb2

P = common_pb2
EXIT_OK, EXIT_FAILED, EXIT_CANCELLED, EXIT_TIMEOUT = 0, 1, 4, 124
TERMINAL = (P.JOB_STATE_SUCCEEDED, P.JOB_STATE_FAILED, P.JOB_STATE_CANCELLED)
BAR_WIDTH = 24
PIPE_EVERY_S = 10.0  # piped progress lines, at most one this often


def add_arguments(sub: Any, command: Callable[..., argparse.ArgumentParser]) -> None:
    """`tessctl wait`."""
    p = command(sub, "wait", cmd_wait, "wait for a job to end, showing its state changes and progress "
                                       "(--timeout DURATION: give up after that long, exit 124)")
    p.add_argument("id", metavar="ID")
    p.add_argument("--for", dest="wait_for", choices=("succeeded", "done"), default="succeeded",
                   help="succeeded: exit 0 only if the job succeeds (default); done: exit 0 once it ends at all")


def cmd_wait(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    # The global --timeout (a duration here) is how long to wait; each call's deadline is its default.
    limit = getattr(args, "timeout", None)
    return follow_job(client, args.id, out, args.wait_for, limit, quiet=args.output == "json")


def end_code(state: int, wait_for: str = "succeeded") -> int:
    """The exit status of a job that ended in `state` (module docstring)."""
    if state == P.JOB_STATE_SUCCEEDED or (wait_for == "done" and state in TERMINAL):
        return EXIT_OK
    return EXIT_CANCELLED if state == P.JOB_STATE_CANCELLED else EXIT_FAILED


def state_name(state: int) -> str:
    return P.JobState.Name(state).removeprefix("JOB_STATE_")


def progress_text(job: controller_pb2.Job, rate: float | None = None) -> str:
    """Iteration (of the total), loss, rate and ETA of the job's last report; "" before any.

    `rate` is the iterations per second over the reports seen (progress_rate.RateMeter); without
    one (a single report), the last report's step time stands in for it."""
    if not job.HasField("progress"):
        return ""
    p, total = job.progress, job.spec.iterations
    parts = [f"{p.iteration}/{total} ({100 * p.iteration / total:.0f}%)" if total else f"iteration {p.iteration}"]
    if p.loss:
        parts.append(f"loss {p.loss:.4g}")
    if rate is None and 0 < p.step_time_seconds < math.inf:  # the worker's own figure (common/progress.py)
        rate = 1.0 / p.step_time_seconds
    if rate is not None and 0 < rate < math.inf:
        parts.append(f"{rate:.3g} it/s")
        if total and p.iteration < total and job.state not in TERMINAL:  # an ended job has no ETA
            parts.append(f"ETA {format_duration(max(1.0, (total - p.iteration) / rate))}")
    return "  ".join(parts)


def bar(job: controller_pb2.Job) -> str:
    total = job.spec.iterations
    if not total or not job.HasField("progress"):
        return ""
    done = min(BAR_WIDTH, int(BAR_WIDTH * job.progress.iteration / total))
    return "[" + "#" * done + "." * (BAR_WIDTH - done) + "] "


class Printer:
    """State changes and events as lines; progress as a bar redrawn in place on a terminal, as a
    plain line when piped: at most one every PIPE_EVERY_S (a log of a days-long job stays short),
    and the latest report before any other line, so the last progress always shows."""

    def __init__(self, out: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out
        self.tty = out.isatty()
        self.clock = clock
        self.bar_shown = False
        self.last_progress = ""
        self.held = ""  # a piped progress line not printed yet
        self.printed_at: float | None = None
        self.meter = RateMeter()

    def line(self, text: str) -> None:
        self._flush_held()
        self._write(text)

    def _write(self, text: str) -> None:
        if self.bar_shown:
            self.out.write("\r\x1b[K")
            self.bar_shown = False
        self.out.write(output.safe(text) + "\n")
        self.out.flush()

    def progress(self, job: controller_pb2.Job) -> None:
        text = progress_text(job, self.meter.observe(job, self.clock()))
        if not text or text == self.last_progress:
            return
        self.last_progress = text
        if self.tty:
            self.out.write("\r\x1b[K" + bar(job) + output.safe(text))
            self.out.flush()
            self.bar_shown = True
            return
        now = self.clock()
        self.held = f"{job.id} progress: {text}"
        if self.printed_at is None or now - self.printed_at >= PIPE_EVERY_S:
            self.printed_at = now
            self._flush_held()

    def _flush_held(self) -> None:
        held, self.held = self.held, ""
        if held:
            self._write(held)

    def close(self) -> None:
        self._flush_held()
        if self.bar_shown:
            self.out.write("\n")
            self.out.flush()
            self.bar_shown = False


def updates(client: Client, job_id: str, deadline: float | None) -> Iterator[controller_pb2.JobUpdate]:
    """WatchJob's updates, reopened after a broken stream (a controller restart, a leader change).

    A controller unreachable gets the SDK's grace for a restart or a leader change (UNAVAILABLE_GRACE_S),
    within the deadline; one never reached ends as "cannot reach" (exit 1), never as a timeout, which
    says the job was seen and had not ended."""
    down_since: float | None = None
    opened = False
    last_error: RpcError | None = None
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            if not opened and last_error is not None:
                raise last_error  # the job was never seen: why is the controller's answer
            raise RpcError("DEADLINE_EXCEEDED", f"job {job_id} did not end in time")
        try:
            for update in client.watch_job(job_id, timeout=remaining):
                opened, down_since = True, None
                yield update
            return
        except RpcError as exc:
            if exc.code == "DEADLINE_EXCEEDED" and not opened:
                # WatchJob sends the job at once: silence until the deadline is no controller answering.
                raise ControllerUnreachable(client.target, "no answer before the --timeout") from None
            if exc.code != "UNAVAILABLE":
                raise
            last_error = exc
            now = time.monotonic()
            down_since = down_since or now
            if now - down_since > UNAVAILABLE_GRACE_S:  # the SDK's own wait for a restarting controller
                raise
            time.sleep(0.5)


def follow_job(client: Client, job_id: str, out: TextIO, wait_for: str = "succeeded",
               timeout: float | None = None, quiet: bool = False) -> int:
    """Print the job's state changes, events and progress until it ends; its exit status."""
    printer = Printer(out if not quiet else io.StringIO())  # quiet: only the ended job
    deadline = None if timeout is None else time.monotonic() + timeout
    seen_seq, state, job = 0, 0, controller_pb2.Job()
    try:
        for update in updates(client, job_id, deadline):
            job = update.job
            printer.progress(job)  # before the update's lines: the last report shows before SUCCEEDED
            last = ""  # the kind of the update's last event printed
            for e in update.events:
                if e.seq <= seen_seq:
                    continue  # resent after a reopened stream
                seen_seq = e.seq
                if e.kind != "PROGRESS":
                    last = e.kind
                    printer.line(f"{time.strftime('%H:%M:%SZ', time.gmtime(e.time))} {job_id} {e.kind}: {e.message}")
            if job.state != state:
                state = job.state
                why = f": {job.reason}" if job.reason else ""
                if state_name(state) != last:  # the update's last event said it, with its time
                    printer.line(f"{job_id} {state_name(state)}{why}")
    except RpcError as exc:
        printer.close()
        if exc.code == "DEADLINE_EXCEEDED":
            print(f"tessctl: timed out after {format_duration(timeout or 0)}: job {job_id} is "
                  f"{state_name(state) if state else 'not ended'}", file=sys.stderr)
            return EXIT_TIMEOUT
        raise
    printer.close()
    if quiet:
        out.write(output.dumps(output.to_dict(job), compact=True) + "\n")
        out.flush()
    return end_code(job.state, wait_for)


# A followed log resumed after a failover: the new stream's tail of each log (this many lines at
# most) is searched for the last MATCH_LINES lines printed, and only what follows them is printed.
RESUME_TAIL_LINES = 5000
MATCH_LINES = 32


class Reopen:
    """When a broken stream of `get jobs --watch` or `logs -f` is opened again: at once, then every
    0.5 s while it keeps failing, for the SDK's grace (a failover takes seconds). A controller never
    reached (ControllerUnreachable before any message) is an error at once, as for any other call."""

    def __init__(self) -> None:
        self.down_since: float | None = None

    def ok(self) -> None:
        self.down_since = None

    def again(self, exc: RpcError, opened: bool) -> bool:
        if exc.code != "UNAVAILABLE" or (not opened and isinstance(exc, ControllerUnreachable)):
            return False
        now = time.monotonic()
        if self.down_since is None:
            self.down_since = now
            return True
        if now - self.down_since > UNAVAILABLE_GRACE_S:
            return False
        time.sleep(0.5)
        return True


@dataclass
class _Resync:
    """A log whose resumed tail is being matched against the last lines printed of it."""

    attempt: int
    target: list[bytes]
    window: deque[bytes] = field(default_factory=deque)
    held: list[bytes] = field(default_factory=list)  # tail lines not matched yet
    started: bool = False  # the new stream sent a message of it
    node_id: str = ""


class LogPrinter:
    """`tessctl logs` output, keeping the last lines printed of each rank for a resumed follow."""

    def __init__(self, args: argparse.Namespace, out: TextIO) -> None:
        self.args, self.out = args, out
        # A worker's bytes reach a terminal only as text and colours (terminal.terminal_safe); a pipe
        # or a file gets them as they are, as does --raw.
        self.raw = args.raw or not out.isatty()
        self.count = logcut.TailCount(args.tail)  # tails cut at the controller's 4 MiB: said on stderr
        self.attempt = 0
        self.recent: dict[int, tuple[int, deque[bytes]]] = {}  # rank -> (attempt, last lines printed)
        self.resync: dict[int, _Resync] = {}
        self.resumed = False
        self.got = False

    def resume(self) -> None:
        """The stream broke: print each log of the next one from after the lines printed of it."""
        self.resumed = True
        self.resync = {r: _Resync(a, list(lines), deque(maxlen=len(lines))) for r, (a, lines) in self.recent.items()}

    def add(self, msg: controller_pb2.LogLines) -> None:
        self.got = True
        for rank in [q for q, rs in self.resync.items() if q != msg.rank and (msg.rank > q or rs.started)]:
            self._give_up(rank, "its tail in the new stream ended")  # tails come one rank after another
        if msg.attempt != self.attempt and self.attempt:
            print(f"tessctl: attempt {msg.attempt} started", file=sys.stderr)
        self.attempt = msg.attempt
        lines = list(msg.lines)
        rs = self.resync.get(msg.rank)
        if rs is not None and rs.attempt != msg.attempt:
            self._give_up(msg.rank, f"attempt {msg.attempt} started meanwhile")
        elif rs is not None:
            rs.started, rs.node_id = True, msg.node_id
            lines = self._match(msg.rank, rs, lines)
            if msg.rank in self.resync and (msg.cut or len(rs.held) >= RESUME_TAIL_LINES):
                self._give_up(msg.rank, f"not among its last {len(rs.held):,} lines")
        notice = "" if self.resumed else self.count.add(msg)  # the cut of a resumed tail is not the user's
        self._print(msg.rank, msg.attempt, msg.node_id, lines)
        if notice:
            print(notice, file=sys.stderr, flush=True)

    def end(self) -> None:
        for rank in list(self.resync):
            self._give_up(rank, "the stream ended first")

    def _match(self, rank: int, rs: _Resync, lines: list[bytes]) -> list[bytes]:
        """The lines after the last ones printed (the first place the new tail repeats them);
        none while they have not been found."""
        for i, line in enumerate(lines):
            rs.window.append(line)
            rs.held.append(line)
            if list(rs.window) == rs.target:
                del self.resync[rank]
                return lines[i + 1:]
        return []

    def _give_up(self, rank: int, why: str) -> None:
        rs = self.resync.pop(rank)
        print(f"tessctl: rank {rank}'s log: the lines printed before the controller changed were not found "
              f"again ({why}): lines written meanwhile may be missing, or printed twice", file=sys.stderr)
        self._print(rank, rs.attempt, rs.node_id, rs.held)

    def _print(self, rank: int, attempt: int, node_id: str, lines: list[bytes]) -> None:
        if not lines:
            return
        was, recent = self.recent.get(rank, (attempt, deque(maxlen=MATCH_LINES)))
        if was != attempt:
            recent = deque(maxlen=MATCH_LINES)
        self.recent[rank] = (attempt, recent)
        for line in lines:
            recent.append(line)
            if self.args.output == "json":
                rec = {"rank": rank, "attempt": attempt, "node_id": node_id, "line": line.decode("utf-8", errors="replace")}
                self.out.write(json.dumps(rec) + "\n")
            else:
                prefix = f"[rank {rank}] ".encode() if self.args.all_ranks else b""
                # The reference trainer prefixes its own lines when it runs several ranks: once is enough.
                text = (b"" if line.startswith(prefix) else prefix) + line
                terminal.write_bytes(self.out, (text if self.raw else terminal.terminal_safe(text)) + b"\n")
        self.out.flush()


def cmd_logs(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """`tessctl logs ID [--rank N | --all-ranks] [--tail N] [-f] [--raw]`: whole lines from StreamJobLogs.
    A follow broken by a failover goes on at the new leader without printing a line twice."""
    # --all-ranks is not with --rank: argparse's group refuses both (exit 2)
    printer = LogPrinter(args, out)
    reopen, tail = Reopen(), args.tail
    while True:
        fresh = False  # this stream sent something: it broke, rather than being refused
        try:
            for msg in client.stream_logs(args.id, rank=args.rank, all_ranks=args.all_ranks, attempt=args.attempt,
                                          tail_lines=tail, follow=args.follow):
                fresh = True
                reopen.ok()
                printer.add(msg)
            printer.end()
            return 0
        except RpcError as exc:
            if not args.follow or not reopen.again(exc, printer.got):
                raise
            if fresh:
                print(f"tessctl: the log stream broke ({exc}): following on at the leader, after the last line "
                      "printed", file=sys.stderr, flush=True)
            if printer.recent:
                printer.resume()
                tail = RESUME_TAIL_LINES


def watch_list(client: Client, states: list[int], tenant: str, render: Callable[..., None]) -> int:
    """`get jobs --watch`: the table again after each batch of changes WatchJobs pushes; after a
    failover, from the whole list the new leader sends."""
    jobs: dict[str, controller_pb2.Job] = {}
    first, opened, reopen = True, False, Reopen()
    while True:
        try:
            for update in client.watch_jobs(states, tenant):
                opened = True
                reopen.ok()
                if update.batch_end:
                    listed = sorted(jobs.values(), key=lambda j: (j.submit_time, j.id))
                    render(listed, first=first, watching=True)
                    first = False
                elif update.removed:
                    jobs.pop(update.job.id, None)
                else:
                    jobs[update.job.id] = update.job
            return 0
        except RpcError as exc:
            if not reopen.again(exc, opened):
                raise
            jobs = {}  # the new stream sends every job again, then a batch_end


def watch_one(client: Client, job_id: str, render: Callable[..., None]) -> int:
    """`get jobs ID --watch`: the row again on every change until the job ends; the job's exit status."""
    first, job = True, controller_pb2.Job()
    for update in updates(client, job_id, None):
        job = update.job
        render([job], first=first, watching=True)
        first = False
    return end_code(job.state)
