"""Whether the workers' users can pass (search, x) the folders above their checkpoint folders.

A worker runs as its tenant's unprivileged user and opens `<checkpoint root>/<job id>`; every folder
above that must let it through. A state dir made by hand with mode 0700, holding the default
checkpoint root, kept every worker out: each attempt failed with "Permission denied" until the
job's retries were spent, and nothing said why at start (docs/operations.md, `--state-dir`).

The controller, at start, widens those it owns between its state dir and a checkpoint root below
it, and refuses to start on one it does not own that others cannot pass (`open_for_workers`).
The folders above those (all of them, for a root outside the state dir) are not its to change:
one of root's that others cannot pass stops the start, since workers never run as root (the
systemd unit's default root lay under `/var/lib/private`, mode 0700: every job failed), and
one of another user's is a warning, since the workers may run as that user (`closed_above`).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# Search (x) for group and others: passable by any user, still not listable (no r).
SEARCH_BITS = stat.S_IXGRP | stat.S_IXOTH


@dataclass(frozen=True)
class Widened:
    """A folder this process owns that it made passable: its mode before and after."""

    path: Path
    old: int
    new: int


class NotPassable(Exception):
    """A folder the workers' users cannot pass, which this process may not change (not its own).
    Not an OSError: a daemon's start says it and exits 2 (a configuration to fix), not 1."""

    def __init__(self, path: Path, mode: int, owner: int, below: Path) -> None:
        self.path, self.mode, self.owner = path, mode, owner
        super().__init__(
            f"{path} (mode {mode:04o}, owner uid {owner}) cannot be passed by the workers' users, who must reach "
            f"{below} below it; give it the search bit for others (chmod o+x {path}: mode "
            f"{mode | stat.S_IXOTH:04o}), or choose a --checkpoint-root outside it")


def folders_down(top: Path, bottom: Path) -> list[Path]:
    """`top`, then each folder down to `bottom` (included); `bottom` must lie below `top`."""
    out = [top]
    for part in bottom.relative_to(top).parts:
        out.append(out[-1] / part)
    return out


def verdict(mode: int, owner: int, me: int) -> Literal["ok", "widen", "blocked"]:
    """What a folder of `mode` and `owner` needs so that every user may pass it, for a process of
    uid `me`: "ok", "widen" (ours: add SEARCH_BITS), or "blocked" (not ours, others cannot pass)."""
    if mode & SEARCH_BITS == SEARCH_BITS:
        return "ok"
    if owner == me:
        return "widen"
    # Not ours: others' search bit is what lets the workers through; the group's is its owner's.
    return "ok" if mode & stat.S_IXOTH else "blocked"


def closed_above(bottom: Path, below: Path | None = None) -> list[tuple[Path, int, int]]:
    """The existing folders from `/` down to `bottom` that others cannot pass (no S_IXOTH), as
    (path, mode, owner uid); from `below` down they are `open_for_workers`'s, and skipped. Paths
    are taken as given: resolve them first."""
    out: list[tuple[Path, int, int]] = []
    for path in (bottom, *bottom.parents)[::-1]:
        if below is not None and path.is_relative_to(below):
            break
        try:
            st = os.stat(path, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            break
        if stat.S_ISDIR(st.st_mode) and not st.st_mode & stat.S_IXOTH:
            out.append((path, stat.S_IMODE(st.st_mode), st.st_uid))
    return out


def open_for_workers(top: Path, bottom: Path, me: int | None = None) -> list[Widened]:
    """Give each existing folder from `top` down to `bottom` that `me` (default: this process's
    uid) owns the search bits for group and others it lacks; NotPassable for the first one `me`
    does not own and others cannot pass. Returns what it changed, for the log. Paths are taken
    as given: resolve them first (a symlink is not followed when changing a mode)."""
    me = os.geteuid() if me is None else me
    changed: list[Widened] = []
    for path in folders_down(top, bottom):
        try:
            st = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            break  # below here nothing exists yet: what is made later is made passable
        if not stat.S_ISDIR(st.st_mode):
            break
        old = stat.S_IMODE(st.st_mode)
        what = verdict(old, st.st_uid, me)
        if what == "ok":
            continue
        if what == "blocked":
            raise NotPassable(path, old, st.st_uid, bottom)
        new = old | SEARCH_BITS
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, new)
        finally:
            os.close(fd)
        changed.append(Widened(path, old, new))
    return changed
