"""Reading a small file whose path an operator or a user gave: a certificate or key, a job, cluster
or tenants file, a config.json.

A FIFO, socket or device in its place is refused, not read: reading a FIFO waits for a writer for
ever, and /dev/zero never ends. At most the caller's limit plus one byte is read, so the caller
tells "too large" by the length. The stat returned is the very file's (fstat of the descriptor
read), for a check of its mode that no later rename can dodge.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class NotPlainFile(OSError):
    """The path names a FIFO, socket or device."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(errno.EINVAL, "not a plain file (a FIFO, socket or device)", str(path))


def read_plain(path: str | Path, limit: int) -> tuple[bytes, os.stat_result]:
    """At most `limit` + 1 bytes of the plain file at `path`, and its stat. OSError as open raises it
    (FileNotFoundError, PermissionError), IsADirectoryError for a directory, NotPlainFile for the rest."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block the open
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(st.st_mode):
            raise NotPlainFile(path)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit + 1), st
    finally:
        os.close(fd)
