"""The two small files the agent and the keepers share, and the signal that means "kill now".

Standard library only: the keeper (tessera.nodeagent.keeper) imports this and nothing else of
Tessera, so it starts fast and keeps working whatever the agent's process is doing.

- The **fence file** (`<work-dir>/fence.json`), written by the agent each time the controller
  acknowledges a Register or Heartbeat: `{"deadline": D, "renewed": S, "fence_seconds": F, "check": K}`
  padded to FENCE_RECORD bytes, K a hash of D and S (write_fence: overwritten in place when the file
  system is full), where S
  is the time.monotonic() at which the acknowledged call was *sent* and D = S + F. CLOCK_MONOTONIC is
  one clock for the whole machine on Linux, so the keepers compare it with their own time.monotonic();
  no wall clock is involved (a stepped clock cannot lengthen or shorten the fence). No fsync: the
  monotonic clock restarts at boot, and so do the keepers.
- The **exit file** (`<attempt dir>/rank-<r>.exit`), written by a keeper when its worker has ended:
  `{"exit_code": C, "reason": R, "worker_pid": P}`, C as the agent reports it (-N for signal N), R
  empty or a reason the agent cannot know ("fenced: ..."). It lets an agent that restarted while the
  worker finished report the real exit code instead of "exit status unknown".

Both are replaced atomically (a fresh temporary name opened O_EXCL|O_NOFOLLOW, then rename), so a
reader sees the old or the new content. The attempt folder belongs to the worker's uid, so a worker
can write its own rank-<r>.exit before it ends: the keeper's rename replaces it afterwards, and at
most a worker lies about its own exit, which it decides anyway. Readers bound the size and check
every type.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import signal
import stat
from pathlib import Path
from typing import Any

FENCE_FILE = "fence.json"
FENCE_RECORD = 256  # bytes of every fence record (write_fence)
MAX_FILE_BYTES = 4096
# Sent by the agent to a keeper: SIGKILL the worker's process group now (the stop's grace is over).
# SIGKILL to the keeper itself would leave the worker's children running and no exit file behind.
KILL_NOW = signal.SIGUSR1


def exit_path(attempt_dir: Path, rank: int) -> Path:
    return attempt_dir / f"rank-{rank}.exit"


def write_atomic(path: Path, data: dict[str, Any], *, durable: bool, pad: int = 0) -> None:
    """Replace `path` with `data` as JSON (padded with spaces to `pad` bytes); never follows a
    symlink planted at a temporary name."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    # 0600: only the agent and its keepers (the same user) read these; agent-state.json lists every
    # job on the node with its pids and GPUs, which is no other tenant's business.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, _encode(data, pad))
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)  # a full disk left one empty temporary file per try (2 a second)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        try:
            dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return
        try:
            os.fsync(dfd)
        except OSError:
            pass
        finally:
            os.close(dfd)


def read_json(path: Path) -> dict[str, Any] | None:
    """A small JSON object from `path`, None when missing, too big, not JSON or not an object."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        raw = os.read(fd, MAX_FILE_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) > MAX_FILE_BYTES:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # [[[[... under the size bound: the worker may write the exit file
        return None
    return data if isinstance(data, dict) else None


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _encode(data: dict[str, Any], pad: int = 0) -> bytes:
    return json.dumps(data, separators=(",", ":")).ljust(pad).encode()


def _check(deadline: float, renewed: float) -> str:
    return hashlib.sha256(f"{deadline!r},{renewed!r}".encode()).hexdigest()[:16]


def write_fence(path: Path, renewed: float, fence_seconds: float) -> float:
    """Record that the lease was renewed by a call sent at monotonic time `renewed`; the deadline.

    Every record has FENCE_RECORD bytes, so that on a full file system (a tenant filled it with
    logs; no new file can be made) the renewal overwrites the file in place, in blocks it already
    has, instead of failing: every job on the node was fenced. A reader that catches such a write
    half done finds a record whose check does not match and keeps the deadline it had."""
    deadline = renewed + fence_seconds
    data = {"deadline": deadline, "renewed": renewed, "fence_seconds": fence_seconds,
            "check": _check(deadline, renewed)}
    try:
        write_atomic(path, data, durable=False, pad=FENCE_RECORD)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not _overwrite(path, _encode(data, FENCE_RECORD)):
            raise
    return deadline


def _overwrite(path: Path, record: bytes) -> bool:
    """`record` over the file's bytes, in place; False when the file is not a plain file of that size."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != len(record):
            return False
        return os.pwrite(fd, record, 0) == len(record)
    except OSError:
        return False
    finally:
        os.close(fd)


def read_fence(path: Path) -> tuple[float, float] | None:
    """(deadline, renewed) from the fence file; None when there is none or it is unreadable, or its
    check does not match (a write caught half done)."""
    data = read_json(path)
    if data is None:
        return None
    deadline, renewed = _finite(data.get("deadline")), _finite(data.get("renewed"))
    if deadline is None or renewed is None:
        return None
    if "check" in data and data["check"] != _check(deadline, renewed):
        return None
    return deadline, renewed


def write_exit(path: Path, exit_code: int, reason: str, worker_pid: int) -> None:
    write_atomic(path, {"exit_code": exit_code, "reason": reason, "worker_pid": worker_pid}, durable=True)


def read_exit(path: Path) -> tuple[int, str] | None:
    """(exit_code, reason) from a keeper's exit file; None when missing or malformed."""
    data = read_json(path)
    if data is None:
        return None
    code, reason = data.get("exit_code"), data.get("reason", "")
    if isinstance(code, bool) or not isinstance(code, int) or not -1000 <= code <= 255:
        return None
    if not isinstance(reason, str):
        return None
    # The worker's uid may write this file: no NUL or lone surrogate reaches the agent's status.
    return code, reason[:500].replace("\0", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
