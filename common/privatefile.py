"""Files only their owner may read: the tokens file, signing keys (ListJobs continue tokens, the
agent's worker secret). Written atomically (a temporary file, fsync, rename), mode 0600 whatever the
umask, never through a symlink planted at the temporary name."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_private(path: Path, data: str | bytes) -> None:
    """Replace `path` with `data`, readable and writable by the owner only (0600)."""
    raw = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)  # O_CREAT's mode is masked by the umask; never wider than 0600 anyway
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
