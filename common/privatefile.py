"""Files only their owner may read: the tokens file, signing keys (ListJobs continue tokens, the
agent's worker secret), and the PKI's keys and certificates (their own mode). Written atomically (a
temporary file, fsync, rename), of their mode whatever the umask, never through a symlink planted
at the temporary name. Also the daemons' state folders and SQLite databases, which a daemon run
outside systemd (no UMask=) made world-readable under the usual umask 022 (docs/security.md)."""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path


def others_may_replace(folder_mode: int) -> bool:
    """Whether another user may rename or remove files in a folder of this mode: group or others
    may write it, without the sticky bit (as /tmp has, where one may touch only one's own)."""
    return bool(folder_mode & (stat.S_IWGRP | stat.S_IWOTH)) and not folder_mode & stat.S_ISVTX


def open_to_others(st: os.stat_result) -> bool:
    """Whether users other than the owner may read or change a private key file of this stat: any access
    for others, or any group access but read, or group read on a file root does not own. PostgreSQL's
    rule for its ssl_key_file: 0600, or 0640 owned by root (a key group the operating system manages)."""
    mode = stat.S_IMODE(st.st_mode)
    group = mode & 0o070
    return bool(mode & 0o007) or (group != 0 and not (group == 0o040 and st.st_uid == 0))


def write_private(path: Path, data: str | bytes, mode: int = 0o600) -> None:
    """Replace `path` with `data`, of `mode` (default 0600: the owner only), through a temporary file
    of a random name made with O_EXCL and O_NOFOLLOW (another user of the folder can neither
    pre-create nor redirect it), flushed to disk before it replaces the old one. An existing file
    keeps its owner and group (a tokens file a non-root controller reads stays readable by it). A
    symlink at `path` is written through, to the file it names: replacing the link left that file,
    the one a daemon reads, unchanged (a revoked token stayed valid)."""
    raw = data.encode() if isinstance(data, str) else data
    path = Path(os.path.realpath(path))  # through a symlink, as an editor writes: the file it names
    try:
        old: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        old = None
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            if old is not None and os.geteuid() == 0:
                os.fchown(f.fileno(), old.st_uid, old.st_gid)
            os.fchmod(f.fileno(), mode)  # O_CREAT's mode is masked by the umask; never wider than `mode`
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def key_file(path: Path, size: int = 32) -> bytes:
    """The random key kept in `path`, made (`size` bytes, 0600) when missing or too short, so that
    what it signs outlives a restart."""
    try:
        key = path.read_bytes()
        if len(key) >= size:
            return key
    except FileNotFoundError:
        pass
    key = secrets.token_bytes(size)
    write_private(path, key)
    return key


def make_dir(path: Path, mode: int = 0o700) -> None:
    """Make the folder `path`, and those of its parents that are missing, of exactly `mode` whatever
    the umask (parents too: a checkpoint root's new parents of 0750 under a unit's UMask=0027 kept
    the workers out of it). mkdir's mode is masked by the umask, so a folder is never wider than
    `mode`; chmod then gives back what the umask took (the x of 0711). A folder already there is
    left as it is: the operator's, as they made it."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for p in reversed(missing):
        try:
            os.mkdir(p, mode)
        except FileExistsError:
            if not p.is_dir():
                raise
            continue  # made meanwhile by another: theirs
        fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    if not path.is_dir():
        raise FileExistsError(errno.EEXIST, "File exists", str(path))


def private_database(path: Path) -> None:
    """Ready `path` for SQLite to open, private. Missing, it is made empty (a valid empty database),
    0600 whatever the umask: SQLite makes a new database 0644 less the umask, and its -wal, -shm and
    -journal of the database's mode (umask aside), so these are 0600 too. Already there and open to
    other users (made by an older version under umask 022), it and its side files lose the others'
    access, best effort (a file of another owner is left as it is); the group's is the operator's.
    A symlink is followed first: SQLite opens the file it names, which must be made so too (a
    dangling one had SQLite create it, and its -wal and -shm, 0644)."""
    path = path.resolve()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        pass
    else:
        try:
            os.fchmod(fd, 0o600)  # a umask such as 0277 would leave it unwritable
        finally:
            os.close(fd)
    for side in ("", "-wal", "-shm", "-journal"):
        p = path.with_name(path.name + side)
        try:
            st = os.stat(p)
            if stat.S_ISREG(st.st_mode) and st.st_mode & 0o007:
                os.chmod(p, stat.S_IMODE(st.st_mode) & ~0o007)
        except OSError:
            continue
