"""A cap on a rank's log: the keeper copies the worker's output into it and keeps the newest part.

Without it a worker printing in a loop fills the agent's file system, and every job's checkpoints
and logs on the node fail with it. With `--log-max-bytes N` the worker writes into a pipe; the
keeper appends what it reads to the rank's log, and when the log passes N bytes it keeps the last
N/2 (from a line start) at the front of the same file, after one line saying how much was dropped:
the tail, where a failure's traceback is, is what a log is read for. Kubernetes caps container
logs too (the kubelet's containerLogMaxSize, 10 MiB by default), by rotating files; a rotation
here would mean making files by path in the worker's folder.

Only the file descriptor the agent opened is used, never the log's path: the attempt folder belongs
to the worker's user, and the keeper may be root. A log is rewritten in place, so a reader that
keeps an offset (a follower) sees the file shrink; controller/logstream.py then tails it again.
Output that cannot be written (a full disk) is dropped rather than left in the pipe: a worker must
never block on its own log. Standard library only (the keeper's rule).
"""

from __future__ import annotations

import fcntl
import os
import select
from collections.abc import Callable

MIN_MAX_BYTES = 64 * 1024  # the note line must fit well inside the half that is kept
_CHUNK = 1 << 20
_PIPE_SIZE = 1 << 20
_F_SETPIPE_SZ = 1031
# What one pump() copies at most before the keeper gets back to its fence and signals.
_PUMP_BUDGET = 16 << 20


def compact(fd: int, keep: int, note: Callable[[int], bytes]) -> int:
    """Rewrite the file `fd` as note(dropped) + its last `keep` bytes from the first line start among
    them; the number of bytes dropped (0 when the file holds at most `keep`). The note must be
    shorter than what is dropped."""
    size = os.fstat(fd).st_size
    if size <= keep:
        return 0
    start = size - keep
    newline = os.pread(fd, 4096, start).find(b"\n")
    if newline >= 0:
        start += newline + 1
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    # pwrite() on an O_APPEND file appends whatever the offset (Linux, pwrite(2) BUGS).
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_APPEND)
    try:
        head = note(start)
        _write_at(fd, head, 0)
        src, dst = start, len(head)
        while src < size:  # dst < src throughout: a forward copy never reads what it overwrote
            chunk = os.pread(fd, min(_CHUNK, size - src), src)
            if not chunk:
                break
            _write_at(fd, chunk, dst)
            src, dst = src + len(chunk), dst + len(chunk)
        os.ftruncate(fd, dst)
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    return start


def _write_at(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class LogPump:
    """The pipe a worker writes into and the copy into its log (`log_fd`, kept under `max_bytes`)."""

    def __init__(self, log_fd: int, max_bytes: int, label: str) -> None:
        if max_bytes < MIN_MAX_BYTES:
            raise ValueError(f"a log cap under {MIN_MAX_BYTES} bytes")
        if fcntl.fcntl(log_fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDWR:
            raise ValueError("the log is not open for reading and writing, so it cannot be cut in place")
        self.log_fd, self.max_bytes, self.label = log_fd, max_bytes, label
        self.read_fd, self.write_fd = os.pipe2(os.O_CLOEXEC)
        try:
            fcntl.fcntl(self.read_fd, _F_SETPIPE_SZ, _PIPE_SIZE)
        except OSError:
            pass  # the default 64 KiB works, with more wake-ups
        os.set_blocking(self.read_fd, False)
        self.dropped = 0  # bytes of output no longer in the log (cut by the cap or not written)
        self.eof = False
        self._note_len = 0

    def close_writer(self) -> None:
        """The keeper's copy of the write end, once the worker holds its own: EOF comes when the
        worker and everything it started have closed theirs."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def pump(self, timeout: float) -> None:
        """Wait up to `timeout` s for output, then copy what is there (a bounded amount)."""
        if self.eof:
            return
        ready, _, _ = select.select([self.read_fd], [], [], timeout)  # retried on a signal (PEP 475)
        if ready:
            self._copy(_PUMP_BUDGET)

    def drain(self) -> None:
        """Copy whatever is left, without waiting for writers that never close."""
        while not self.eof and self._copy(_PUMP_BUDGET):
            pass

    def _copy(self, budget: int) -> int:
        copied = 0
        while copied < budget:
            try:
                data = os.read(self.read_fd, _CHUNK)
            except BlockingIOError:
                break
            if not data:
                self.eof = True
                break
            copied += len(data)
            self._append(data)
        return copied

    def _append(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.log_fd, view):]
        except OSError:  # ENOSPC, EIO: this output is lost, the worker goes on
            self.dropped += len(view)
            return
        try:
            if os.fstat(self.log_fd).st_size > self.max_bytes:
                self._cut()
        except OSError:
            pass

    def _cut(self) -> None:
        before = self._note_len  # the previous note is in the part cut, and is no output
        cut = compact(self.log_fd, self.max_bytes // 2, lambda start: self._note(self.dropped + start - before))
        if cut:
            self.dropped += cut - before
            self._note_len = len(self._note(self.dropped))

    def _note(self, dropped: int) -> bytes:
        # One length whatever the count: a fixed-width field.
        return (f"tessera-keeper[{self.label[:200]}]: this log passed its cap of {self.max_bytes} bytes; "
                f"{dropped:>20} bytes of earlier output were dropped\n").encode()

    def close(self) -> None:
        self.close_writer()
        os.close(self.read_fd)

