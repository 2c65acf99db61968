"""A rank's log is 0644 whatever the agent's umask (docs/security.md, "Files on disk"): made with
os.open(..., 0o644) alone, under the agent unit's UMask=0027 it was 0640 root:root, and the
worker's user could not read its own output back."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.nodeagent import worklogs


@pytest.fixture
def umask027() -> Iterator[None]:
    old = os.umask(0o027)  # the agent unit's UMask=
    try:
        yield
    finally:
        os.umask(old)


def mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


def test_a_new_rank_log_is_0644_under_umask_027(tmp_path: Path, umask027: None) -> None:
    log = tmp_path / "rank-0.log"
    os.close(worklogs.open_for_append(log))
    assert oct(mode(log)) == oct(0o644)
    worklogs.append(tmp_path / "rank-1.log", "tessera-agent: spawn failed: ...\n")  # the agent's notes
    assert oct(mode(tmp_path / "rank-1.log")) == oct(0o644)


def test_a_log_already_there_keeps_its_mode_and_is_appended_to(tmp_path: Path, umask027: None) -> None:
    # Not made here: it may be another file of the agent's that the worker renamed into place.
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"before\n")
    log.chmod(0o600)
    fd = worklogs.open_for_append(log)
    try:
        os.write(fd, b"after\n")
    finally:
        os.close(fd)
    assert (mode(log), log.read_bytes()) == (0o600, b"before\nafter\n")


def test_a_symlink_or_fifo_in_its_place_is_still_refused(tmp_path: Path, umask027: None) -> None:
    target = tmp_path / "target"
    target.write_text("x")
    target.chmod(0o600)
    (tmp_path / "link.log").symlink_to(target)
    os.mkfifo(tmp_path / "fifo.log")
    for name in ("link.log", "fifo.log"):
        with pytest.raises(OSError):
            worklogs.open_for_append(tmp_path / name)
    assert mode(target) == 0o600
