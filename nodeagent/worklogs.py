"""Reading and appending to the rank logs (`<work-dir>/jobs/<job>/attempt-<n>/rank-<r>.log`).

The attempt folder belongs to the worker's user, so a worker can put a symlink where a log is
expected (pointing at a system file, or at another tenant's log inside the work dir): the agent,
which may be root, opens logs with O_NOFOLLOW and never through such a link.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from tessera.nodeagent import contract
from tessera.nodeagent.errors import FailedPrecondition, InvalidArgument, NotFound

DEFAULT_LOG_TAIL = 64 * 1024
MAX_LOG_TAIL = 4 * 1024 * 1024
LOG_MODE = 0o644
# Read-write: the keeper cuts a log past its cap in place, through this descriptor (logcap.py).
_APPEND = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def open_for_append(path: Path) -> int:
    """A descriptor appending to the log (created 0644); OSError for a symlink, for anything but a
    plain file with one link, or any failure.

    Opened non-blocking, then checked: a worker that put a FIFO where a log goes made the agent's
    open() wait for a reader for good (its loop hung, every job on the node was fenced), and a hard
    link to a file of the agent's (the worker secret) would have the agent write into it.

    0644, not 0600: it holds the worker's own output, which the worker's user may read back; the
    attempt folder above it (0700, that user's) keeps every other user out. 0644 whatever the
    umask: O_CREAT's mode is masked by it, and the agent unit's UMask=0027 made logs 0640 root:root
    that the worker's user could not read. Only a log made here is changed: a file already there may
    be one of the agent's that the worker renamed into the log's place."""
    try:
        fd = os.open(path, _APPEND | os.O_EXCL | os.O_NONBLOCK, LOG_MODE)
        made = True
    except FileExistsError:
        fd = os.open(path, (_APPEND & ~os.O_CREAT) | os.O_NONBLOCK)
        made = False
    try:
        _plain_file(fd, path)
        if made:
            os.fchmod(fd, LOG_MODE)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _plain_file(fd: int, path: Path) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        raise OSError(errno.EINVAL, f"not a plain file with one link: {path}")


def append(path: Path, text: str) -> None:
    """Best effort: a note the agent adds to a rank's log (why a spawn failed, for instance)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_for_append(path)
    except OSError:
        return  # the reason is in the worker's status anyway
    try:
        os.write(fd, text.encode(errors="replace"))
    except OSError:
        pass
    finally:
        os.close(fd)


def latest_attempt(work_dir: Path, job_id: str, known: list[int]) -> int:
    job_dir = work_dir / "jobs" / job_id
    try:
        for entry in job_dir.iterdir():
            name = entry.name
            if name.startswith("attempt-") and name[8:].isdigit():
                known.append(int(name[8:]))
    except OSError:
        pass
    if not known:
        raise NotFound(f"no attempt of job {job_id} on this node")
    return max(known)


def read_tail(work_dir: Path, job_id: str, attempt: int, rank: int, tail_bytes: int,
              known_attempts: list[int]) -> tuple[str, bytes]:
    """The last `tail_bytes` (default 64 KiB, at most 4 MiB) of a rank's log; attempt 0 = latest."""
    path, data, _, _ = read_chunk(work_dir, job_id, attempt, rank, tail_bytes, known_attempts)
    return path, data


def read_chunk(work_dir: Path, job_id: str, attempt: int, rank: int, max_bytes: int, known_attempts: list[int],
               offset: int | None = None) -> tuple[str, bytes, int, int]:
    """(path, data, where data starts, the log's size): the last `max_bytes` (default 64 KiB, at most
    4 MiB) of a rank's log, or with `offset` at most that many bytes from there (a follower's read:
    each byte once). Attempt 0 = the latest."""
    contract.validate_job_id(job_id)
    if offset is not None and offset < 0:
        raise InvalidArgument("offset", f"must be >= 0, got {offset}")
    tail_bytes = max_bytes
    if attempt < 0:
        raise InvalidArgument("attempt", f"must be >= 0 (0 = latest), got {attempt}")
    if rank < 0:
        raise InvalidArgument("rank", f"must be >= 0, got {rank}")
    if tail_bytes < 0:
        raise InvalidArgument("tail_bytes", f"must be >= 0 (0 = default), got {tail_bytes}")
    if attempt == 0:
        attempt = latest_attempt(work_dir, job_id, known_attempts)
    path = contract.log_path(work_dir, job_id, attempt, rank)
    # The job id pattern forbids "/" and a leading ".", and only the agent writes jobs/: the folders
    # up to the attempt's are the agent's. The last component is refused when it is a symlink.
    if not path.parent.resolve().is_relative_to(work_dir.resolve()):
        raise FailedPrecondition(f"log path {path} leaves the work dir")
    n = min(tail_bytes or DEFAULT_LOG_TAIL, MAX_LOG_TAIL)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise NotFound(f"no log for job {job_id} attempt {attempt} rank {rank} on this node") from None
    except OSError as exc:
        raise FailedPrecondition(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        _plain_file(fd, path)  # a hard link to the agent's worker secret would be read out
    except OSError as exc:
        os.close(fd)
        raise FailedPrecondition(f"cannot read {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        try:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - n) if offset is None else min(offset, size)
            f.seek(start)
            return str(path), f.read(n), start, size
        except OSError as exc:
            raise FailedPrecondition(f"cannot read {path}: {exc.strerror or exc}") from None
