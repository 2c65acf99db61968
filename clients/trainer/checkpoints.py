"""Checkpoints on disk: <dir>/step-<N>/ (complete once it holds meta.json), <dir>/latest = "step-<N>".

Written atomically by one process (rank 0) and found again by any: a directory gets its final name
only when complete, so discovery never trusts a half-written one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKPOINT_META = "meta.json"
LATEST_FILE = "latest"
_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class CheckpointRef:
    """A complete checkpoint on disk."""

    iteration: int
    path: Path

    def meta(self) -> dict[str, Any]:
        """The checkpoint's meta.json."""
        meta: dict[str, Any] = json.loads((self.path / CHECKPOINT_META).read_text())
        return meta


def checkpoint_path(checkpoint_dir: str | os.PathLike[str], iteration: int) -> Path:
    """Where the checkpoint of `iteration` lives (complete or not)."""
    return Path(checkpoint_dir) / f"step-{iteration}"


def list_checkpoints(checkpoint_dir: str | os.PathLike[str]) -> list[CheckpointRef]:
    """The complete checkpoints in the directory, oldest first. Missing directory = []."""
    root = Path(checkpoint_dir)
    try:
        entries = list(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    found: list[CheckpointRef] = []
    for entry in entries:
        m = _STEP_DIR.match(entry.name)
        if m and (entry / CHECKPOINT_META).is_file():
            found.append(CheckpointRef(int(m.group(1)), entry))
    return sorted(found, key=lambda c: c.iteration)


def latest_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> CheckpointRef | None:
    """The newest complete checkpoint, or None.

    A checkpoint directory only gets its final name `step-<N>` (by an atomic rename) once it is
    complete, so the highest complete `step-<N>` wins. The `latest` file is a pointer for people and
    other tools; it is not trusted here, so a stale or dangling `latest` (a crash between the rename
    and its update) changes nothing.
    """
    all_ckpts = list_checkpoints(checkpoint_dir)
    return all_ckpts[-1] if all_ckpts else None


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(Path(dirpath))


def write_text_atomic(path: Path, text: str) -> None:
    """Write a small file atomically: temp file in the same directory, fsync, os.replace."""
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def prune_checkpoints(checkpoint_dir: str | os.PathLike[str], keep: int = 2) -> list[Path]:
    """Delete all but the `keep` newest complete checkpoints, and leftover `step-<N>.tmp` directories
    older than the newest one. Returns what was deleted."""
    root = Path(checkpoint_dir)
    ckpts = list_checkpoints(root)
    removed: list[Path] = []
    doomed = [c.path for c in ckpts[: max(0, len(ckpts) - keep)]]
    if ckpts:
        newest = ckpts[-1].iteration
        for entry in root.iterdir():
            m = re.match(r"^step-(\d+)\.tmp(\.\d+)?$", entry.name)
            if m and int(m.group(1)) < newest:
                doomed.append(entry)
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


@contextlib.contextmanager
def checkpoint_writer(
    checkpoint_dir: str | os.PathLike[str],
    iteration: int,
    meta: Mapping[str, Any] | None = None,
    keep: int = 2,
) -> Iterator[Path]:
    """Write the checkpoint of `iteration` atomically; only one process (rank 0) should call this.

    Yields an empty directory `<dir>/step-<N>.tmp/` to fill. On a clean exit from the block it writes
    meta.json (`iteration`, `time` and `meta`), fsyncs, renames the directory to `step-<N>/`, points
    `latest` at it and keeps the `keep` newest checkpoints. If the block raises, the temporary
    directory is removed and nothing else changes.
    """
    root = Path(checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(root, iteration)
    # Per-process temporary name: a stale attempt still running on a lost node may write the same
    # step into the same directory; neither may clobber the other's half-written files.
    tmp = final.with_name(f"{final.name}.tmp.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        record = {"iteration": iteration, "time": time.time(), **(meta or {})}
        (tmp / CHECKPOINT_META).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        _fsync_tree(tmp)
        if final.exists():  # e.g. a previous attempt wrote the same step: the new one replaces it
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / CHECKPOINT_META).exists():
                raise
            # Another writer completed the same step first: training is deterministic in
            # (seed, step), so its checkpoint stands for ours.
            shutil.rmtree(tmp, ignore_errors=True)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_text_atomic(root / LATEST_FILE, final.name + "\n")
    if keep > 0:
        prune_checkpoints(root, keep)

