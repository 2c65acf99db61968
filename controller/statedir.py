"""One controller per state directory, and a database no older than the directory's last run.

SQLite lets two processes open one database, and two controllers on one `--state-dir` both serve:
each takes an epoch, each fences the other's launches, and the second requeued a job that ran
healthily under the first (an audit saw it within 6 s). So a controller holds an exclusive
`flock` on the state directory for its whole life; the kernel drops it when the process ends, kill
-9 included, so there is no stale lock to clean up. `<state-dir>/controller.lock` holds the
holder's pid for the message (deleting it unlocks nothing). `<state-dir>/controller.epoch` holds the
epoch of the last start (`check_epoch`).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from tessera.common.privatefile import write_private
from tessera.controller.store import StateError

LOCK_FILE = "controller.lock"
# The epoch this state directory last ran under, kept outside the database: a database behind it has
# lost its latest writes (a deleted controller.db-wal) or is an older copy put back without raising
# its epoch, which the agents would fence (every launch refused as "stale controller epoch").
EPOCH_FILE = "controller.epoch"


class StateDirLock:
    def __init__(self, state: Path) -> None:
        self.path = state / LOCK_FILE
        try:
            # The lock is on the directory itself: a lock file's could be deleted (it looks like a
            # stale pid file), and a second controller then locked a new file of the same name.
            self._fd = os.open(state, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            pid_fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StateError(f"{state}: cannot write the state directory ({exc.strerror}); give this user "
                             "write access to it (the state in it is not touched)") from exc
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(pid_fd, 32, 0).decode(errors="replace").strip()
            os.close(pid_fd)
            os.close(self._fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StateError(f"{state} is in use by another tessera-controller"
                                 f"{f' (pid {holder})' if holder.isdigit() else ''}: one controller per "
                                 "--state-dir (for a standby, use --store etcd)") from None
            raise StateError(f"{state}: cannot lock: {exc.strerror}") from exc
        os.ftruncate(pid_fd, 0)
        os.pwrite(pid_fd, f"{os.getpid()}\n".encode(), 0)
        os.close(pid_fd)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing drops the flock
            self._fd = -1


def check_epoch(state: Path, epoch: int, db: Path) -> None:
    """Refuse a database whose new `epoch` is not above the one this state directory last ran under,
    then record `epoch` as that one (flushed to disk before any agent can see it)."""
    marker = state / EPOCH_FILE
    try:
        last = int(marker.read_text().strip())
    except FileNotFoundError:
        last = 0  # the first start here, or a state directory from before this check
    except (OSError, ValueError) as exc:
        raise StateError(f"{marker}: cannot read the last epoch ({exc}); remove it to skip the check once") from exc
    if epoch <= last:
        raise StateError(f"{db} is behind this state directory: its epoch ({epoch - 1}) is below {last}, the "
                         f"epoch it last ran under ({marker}). Its latest writes are lost (a deleted "
                         f"controller.db-wal?), or it was put back from an older copy. After a restore, raise its "
                         f"epoch to at least {last} and to the agents' highest (docs/operations.md, Restoring); to "
                         f"accept the loss, remove {marker}")
    write_private(marker, f"{epoch}\n")
