"""Process plumbing for the supervisor: spawn, wait for exit, signal a process group, liveness.

Workers are spawned with subprocess.Popen and watched through a pidfd on the event loop, not with
asyncio.create_subprocess_exec: asyncio's subprocess transport SIGKILLs its child when the transport
is closed or garbage-collected (asyncio/base_subprocess.py, close()), so any agent exit, crash or
cancelled task would take the workers with it. The agent's choice is the opposite: workers outlive
the agent (systemd KillMode=process style) and the next agent re-adopts them. A Popen object never
kills its child. The spawn itself is the same call asyncio makes: fork/exec of the argv, no shell.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import structlog

log = structlog.get_logger("tessera.nodeagent.process")


def spawn(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], log_file: IO[bytes], pass_fds: Sequence[int] = ()
) -> subprocess.Popen[bytes]:
    """Start argv (never through a shell) as the leader of a new session and process group.

    stdin is /dev/null; stdout and stderr both go to `log_file` (opened for append by the caller).
    Raises OSError (missing executable, bad cwd...) or ValueError (NUL byte) when exec fails.
    """
    return subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # own session and process group: signals reach the worker's children
        close_fds=True,
        pass_fds=tuple(pass_fds),
    )


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: taskset, systemd CPUAffinity=, cpusets)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), None if unknown.

    Stored beside a pid so that a pid reused by an unrelated process is never taken for a worker.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat.rpartition(")")[2].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rpartition(")")[2].split()
    return bool(fields) and fields[0] in ("Z", "X")


def is_alive(pid: int, started: int | None) -> bool:
    """True when pid runs and, if `started` is known, is the same process that started then."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else: only the start time can tell whether it is ours
    if _is_zombie(pid):
        return False
    if started is not None:
        now = start_time(pid)
        if now is not None and now != started:
            return False
    return True


def signal_group(pgid: int, sig: int) -> bool:
    """Send sig to a process group; False when the group is gone. Never raises for a vanished group."""
    if pgid <= 1:  # 0 and 1 would signal our own group or every process: never
        return False
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError as exc:
        log.warning("cannot signal worker group", pgid=pgid, signal=signal.Signals(sig).name, error=str(exc))
        return False


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # kernel < 5.3, not Linux, or already reaped
        return None


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def on_ready() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, on_ready)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def wait_child(proc: subprocess.Popen[bytes], poll_interval: float = 0.5) -> int:
    """Wait for a child to exit and reap it; returns its exit code, -N when killed by signal N."""
    fd = _pidfd(proc.pid)
    if fd is not None:
        try:
            await _readable(fd)  # a pidfd turns readable when the process exits
        finally:
            os.close(fd)
    while (rc := proc.poll()) is None:
        await asyncio.sleep(poll_interval)
    return rc


async def wait_gone(pid: int, started: int | None, poll_interval: float = 1.0) -> None:
    """Wait until a process that is not our child (a re-adopted worker) has exited."""
    fd = _pidfd(pid)
    if fd is not None:
        try:
            # Check after opening: the pidfd then pins this very process, so a reuse cannot fool it.
            if is_alive(pid, started):
                await _readable(fd)
            return
        finally:
            os.close(fd)
    while is_alive(pid, started):
        await asyncio.sleep(poll_interval)
