"""Traced-mode memory estimates in a child process, under a wall-clock budget.

A traced estimate (tessera.estimator.torch.traced.traced_memory, or realtrace.real_memory for a
`traced:<stack>` mode) runs one training step under fake tensors: seconds for a real model (32
layers at hidden 4,096 took 10 s), but the largest model the request bounds admit took 148 s of a
core and grew the process by 300 MB (audit of 2026-11-27), and a thread running it cannot be
stopped. So each estimate runs in a fresh `python -m tessera.estimator.service.traced_child`, one
at a time (fake-tensor tracing is CPU-heavy), and the parent kills it (SIGKILL to its process
group) when the budget passes, answering RESOURCE_EXHAUSTED naming the mode and the budget, or
when the caller gives up (`cancel`: its cancel, its deadline, the server stopping). The budget
counts from the child's start, torch's import (about 3 s) included.

A fresh child pays seconds before any trace of its own (the interpreter, torch's import, and a
first trace's one-time warm-up: 1.9 s, where the same tiny model's later traces take 0.2 s). With
`spare`, which the estimator service sets (tessctl's one-shot in-process runs do not), the runner
starts the next child as soon as one ends: it imports torch and traces a tiny model while it waits
on its stdin, so the next estimate pays only its own trace. The budget then counts from the
hand-over (bench/traced_spare.py: a tiny model's estimate 2.33 s, 0.28 s with the spare). The spare
costs an idle process with torch loaded, from the first traced estimate on; `close` ends it, and it
dies with the estimator like any child (its parent-death signal fires when the thread that started
it ends, too: a spare found dead is replaced by a fresh child, so only its head start is lost).

The wire: the parent writes a pickle of a TracedJob on the child's stdin; the child writes a pickle
of ("ok", MemoryBreakdown) or ("error", exception, its traceback) on its stdout (a copy of fd 1
taken first: fd 1 then goes to stderr, so nothing torch prints can corrupt the answer). Both ends
are this module of the same install, so pickle carries the library's errors as they were raised
(a PlanInputError keeps its field and reason). Only the child imports the torch layer.
"""

from __future__ import annotations

import importlib.util
import math
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import NoReturn

from tessera.common.errors import Code, FailedPrecondition, ResourceExhausted, TesseraError
from tessera.estimator.memory_terms import MemoryBreakdown
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan

# Wall-clock seconds of one traced estimate: a real model takes seconds to tens of seconds (32
# layers at hidden 4,096: 10 s, plus the child's 3 s of torch import); the bounds' largest, 148 s.
TRACED_BUDGET_S = 120.0
MODULE = "tessera.estimator.service.traced_child"
POLL_S = 0.1  # how soon a cancel or the budget's end is seen
STDERR_TAIL = 2000  # characters of a crashed child's stderr kept in the error (the log's, not the caller's)


class TracedUnavailable(FailedPrecondition, RuntimeError):
    """Traced mode was asked for where torch cannot be imported."""


class TracedTooSlow(ResourceExhausted):
    """The traced estimate did not finish within the budget; its child was killed."""


class TracedCancelled(TesseraError):
    """The caller gave up; the child was killed (nobody reads this answer)."""

    code = Code.CANCELLED


@dataclass(frozen=True)
class TracedJob:
    """One traced estimate: `stack` "" is Tessera's traced module, else a realtrace stack."""

    model: ModelDims
    plan: ExecutionPlan
    stack: str = ""
    gpu: str | None = None


def require_importable(mode: str) -> None:
    """TracedUnavailable unless torch (and the mode's stack) can be imported here."""
    stack = mode.partition(":")[2]
    for needed in ("torch", *([stack] if stack else [])):
        if importlib.util.find_spec(needed) is None:
            raise TracedUnavailable(f"mode: {mode} mode needs {needed}, which this estimator cannot import")


class TracedRunner:
    """Runs traced estimates one at a time, each in a child process killed past `budget_s`."""

    def __init__(self, budget_s: float = TRACED_BUDGET_S, spare: bool = False) -> None:
        if not (math.isfinite(budget_s) and budget_s > 0):
            raise ValueError(f"the traced budget must be a number of seconds > 0, got {budget_s!r}")
        self.budget_s = budget_s
        self.spare = spare
        self._lock = threading.Lock()
        self.last_pid: int | None = None  # the latest child's (tests check that it is gone)
        self._spare: subprocess.Popen[bytes] | None = None  # warming up for the next estimate
        # Guards `spare` and `_spare` only, so that close does not wait for a running estimate (up
        # to the budget: longer than systemd's stop timeout), which its caller's cancel ends.
        self._spare_lock = threading.Lock()

    def close(self) -> None:
        """End the spare child, if any (the estimator stopping); later runs start fresh ones."""
        with self._spare_lock:
            self.spare = False
            spare, self._spare = self._spare, None
        if spare is not None:
            _kill(spare)

    def _child(self, warm: bool) -> subprocess.Popen[bytes]:
        # Its own session: the kill reaches whatever it started, and a signal meant for the daemon's
        # group is the daemon's to handle.
        return subprocess.Popen([sys.executable, "-P", "-m", MODULE, str(os.getpid()), *(["warm"] if warm else [])],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)

    def run(self, job: TracedJob, mode: str, cancel: threading.Event | None = None) -> MemoryBreakdown:
        """The estimate as the child computed it, or the error it raised there; TracedTooSlow past
        the budget, TracedCancelled once `cancel` is set (waiting for a turn, or running)."""
        require_importable(mode)
        while not self._lock.acquire(timeout=POLL_S):
            if cancel is not None and cancel.is_set():
                raise TracedCancelled(f"mode: the {mode} estimate was cancelled before it started")
        try:
            return self._run(job, mode, cancel)
        finally:
            try:
                with self._spare_lock:
                    if self.spare:
                        self._spare = self._child(warm=True)
            except OSError:  # no process to spare now (fork refused, no fds): the next run starts one
                pass
            finally:
                self._lock.release()

    def _run(self, job: TracedJob, mode: str, cancel: threading.Event | None) -> MemoryBreakdown:
        data: bytes | None = pickle.dumps(job)  # before the child exists: nothing to clean up if it fails
        deadline = time.monotonic() + self.budget_s
        with self._spare_lock:
            proc, self._spare = self._spare, None
        if proc is None or proc.poll() is not None:  # none yet, or it died waiting (killed by hand)
            if proc is not None:
                proc.communicate()
            proc = self._child(warm=False)
        self.last_pid = proc.pid
        try:
            while True:
                try:
                    out, err = proc.communicate(data, timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    data = None  # written (or being written): communicate goes on from where it was
                if cancel is not None and cancel.is_set():
                    raise TracedCancelled(f"mode: the {mode} estimate was cancelled")
                if time.monotonic() >= deadline:
                    raise TracedTooSlow(f"mode: {mode} estimate exceeded its {self.budget_s:g} s budget "
                                        "(--traced-budget); the formula modes answer at once")
        finally:
            if proc.returncode is None:
                _kill(proc)
        return _answer(out, err, proc.returncode, mode)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    # SIGKILL at once: the child holds nothing to clean up (no files, no locks), and a trace deep in
    # torch's C++ would not see a gentler signal before it returns to Python.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone, group and all
        pass
    proc.communicate()  # reaps it and closes the pipes


def _answer(out: bytes, err: bytes, returncode: int, mode: str) -> MemoryBreakdown:
    if returncode != 0 or not out:
        tail = err.decode(errors="replace")[-STDERR_TAIL:]
        raise RuntimeError(f"the {mode} estimate's child process exited with status {returncode}: {tail}")
    reply = pickle.loads(out)  # our own child's answer, over a pipe only it and we hold
    if reply[0] == "ok":
        result: MemoryBreakdown = reply[1]
        return result
    exc: BaseException = reply[1]
    exc.add_note(f"raised in the {mode} estimate's child process:\n{reply[2]}")
    raise exc


# -- the child --------------------------------------------------------------------------------------


def _estimate(job: TracedJob) -> MemoryBreakdown:
    if job.stack:
        from tessera.estimator.torch.realtrace import real_memory

        return real_memory(job.model, job.plan, stack=job.stack, gpu=job.gpu)
    from tessera.estimator.torch.traced import traced_memory

    return traced_memory(job.model, job.plan, gpu=job.gpu)


def _error_reply(exc: Exception) -> bytes:
    """("error", exc, traceback) as a pickle the parent can load; an exception that does not survive
    the round trip (torch's may hold what pickle cannot carry) goes as a RuntimeError of its text."""
    tb = traceback.format_exc()
    try:
        data = pickle.dumps(("error", exc, tb))
        pickle.loads(data)  # our own bytes
        return data
    except Exception:  # noqa: BLE001 - whatever pickle cannot carry goes as text
        return pickle.dumps(("error", RuntimeError(f"{type(exc).__name__}: {exc}"), tb))


def _warm_up() -> None:
    """A spare's wait: torch imported and one tiny model traced, which takes a first trace's
    one-time costs (traced.py's imports, torch's dispatch caches) off the next estimate. Best effort:
    a failure here is the real estimate's to meet and report."""
    try:
        _estimate(TracedJob(ModelDims(64, 1, 2, 64, 16, "warm-up"), ExecutionPlan()))
    except Exception:  # noqa: BLE001, S110 - see above
        pass


def _die_with(parent: int) -> None:
    """SIGKILL this child when the estimator dies (Linux: PR_SET_PDEATHSIG), so a SIGKILLed or
    crashed estimator leaves no trace running on; the thread that started the child waits for it,
    so the signal comes only with the process. Gone already: exit at once."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    if os.getppid() != parent:
        sys.exit(1)


def main() -> NoReturn:
    if len(sys.argv) > 1:
        _die_with(int(sys.argv[1]))
    answer = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    if sys.argv[2:] == ["warm"]:
        _warm_up()
    job: TracedJob = pickle.loads(sys.stdin.buffer.read())  # the parent's job
    try:
        data = pickle.dumps(("ok", _estimate(job)))
    except Exception as exc:  # noqa: BLE001 - every error is the parent's to raise, as it was
        data = _error_reply(exc)
    answer.write(data)
    answer.close()
    sys.stderr.flush()
    # No interpreter teardown: with torch loaded it took 0.6 s, and the parent waits for the exit
    # (the end of stderr); the child holds nothing that needs it.
    os._exit(0)


if __name__ == "__main__":
    main()
