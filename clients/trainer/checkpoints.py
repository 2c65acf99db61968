"""Checkpoints on disk: <dir>/step-<N>/ (complete once it holds meta.json), <dir>/latest = "step-<N>",
fenced by attempt (docs/trainer.md, "Checkpoint layout").

Written atomically by one process (rank 0) and found again by any: a directory gets its final name
only when complete, so discovery never trusts a half-written one. Every attempt of a job shares the
directory, and an attempt whose node was lost may still be running when the next one starts (issue
13, finding 4), so writes carry the attempt: each attempt stages in `staging/attempt-<A>/`, and
promotion (the rename to `step-<N>`) and pruning happen under an exclusive flock of `.lock`, only
while `FENCE` holds this attempt's number. A new attempt raises `FENCE` before it reads the latest
checkpoint, so a stale attempt can neither overwrite nor prune what the current one resumed from.
"""

from __future__ import annotations

import contextlib
import fcntl
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
FENCE_FILE = "FENCE"
LOCK_FILE = ".lock"
STAGING_DIR = "staging"
DAMAGED = ".damaged-"  # step-<N>.damaged-<attempt>: set aside, never listed or loaded
_STEP_DIR = re.compile(r"^step-(\d+)$")


class StaleAttempt(RuntimeError):
    """A later attempt of the job has claimed its checkpoint directory (FENCE): this attempt must
    neither promote nor prune, and should stop training (it runs on as a duplicate)."""

    def __init__(self, checkpoint_dir: Path, attempt: int, fence: int) -> None:
        super().__init__(f"attempt {attempt} is stale: attempt {fence} has claimed the checkpoints in "
                         f"{checkpoint_dir} ({FENCE_FILE} = {fence}); this attempt must stop and not write them")
        self.checkpoint_dir, self.attempt, self.fence = checkpoint_dir, attempt, fence


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
        m = _STEP_DIR.fullmatch(entry.name)
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


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """The job's checkpoint lock: an exclusive flock of <dir>/.lock (released when the descriptor
    closes, also when the process dies, so a killed writer never leaves it held)."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_fence(checkpoint_dir: str | os.PathLike[str]) -> int:
    """The highest attempt that has claimed the directory (0 = none). A FENCE that is not a
    non-negative integer is refused: guessing could let a stale attempt write."""
    path = Path(checkpoint_dir) / FENCE_FILE
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return 0
    text = raw.strip()
    if not text.isdigit() or len(text) > 18:
        raise ValueError(f"{path}: not an attempt number: {raw[:40]!r}")
    return int(text)


def claim(checkpoint_dir: str | os.PathLike[str], attempt: int) -> int:
    """Raise FENCE to `attempt` (under the lock) before reading the checkpoint to resume from: from
    then on no older attempt promotes or prunes. StaleAttempt if a later attempt claimed it first."""
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    root = Path(checkpoint_dir)
    with _locked(root):
        fence = read_fence(root)
        if fence > attempt:
            raise StaleAttempt(root, attempt, fence)
        if fence < attempt:
            write_text_atomic(root / FENCE_FILE, f"{attempt}\n")
    return attempt


def set_aside(checkpoint_dir: str | os.PathLike[str], iteration: int, *, attempt: int) -> Path | None:
    """Rename the complete checkpoint of `iteration` to `step-<N>.damaged-<attempt>` (kept for a person
    to look at, never listed, loaded or pruned), under the lock and only while `attempt` holds the
    fence (StaleAttempt otherwise): one that cannot be loaded must not stay the newest, or every
    later attempt trips on it again. Returns the new path; None when it was gone already."""
    root = Path(checkpoint_dir)
    with _locked(root):
        _check_fence(root, attempt)
        path = checkpoint_path(root, iteration)
        if not path.is_dir():
            return None
        aside = path.with_name(f"{path.name}{DAMAGED}{attempt}")
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(path, aside)
        _fsync_dir(root)
        newest = list_checkpoints(root)
        write_text_atomic(root / LATEST_FILE, (newest[-1].path.name if newest else "") + "\n")
        return aside


def damaged_checkpoints(checkpoint_dir: str | os.PathLike[str]) -> list[Path]:
    """The checkpoints `set_aside` renamed, by name."""
    return sorted(Path(checkpoint_dir).glob(f"step-*{DAMAGED}*"))


def staging_dir(checkpoint_dir: str | os.PathLike[str], attempt: int) -> Path:
    """Where `attempt` stages its checkpoints before promotion; no other attempt touches it."""
    return Path(checkpoint_dir) / STAGING_DIR / f"attempt-{attempt}"


def _check_fence(root: Path, attempt: int) -> None:
    """Under the lock: StaleAttempt if a later attempt holds the fence; claims it if none did (a
    script that never called `claim`)."""
    fence = read_fence(root)
    if fence > attempt:
        raise StaleAttempt(root, attempt, fence)
    if fence < attempt:
        write_text_atomic(root / FENCE_FILE, f"{attempt}\n")


def _prune_locked(root: Path, keep: int, attempt: int) -> list[Path]:
    ckpts = list_checkpoints(root)
    doomed = [c.path for c in ckpts[: max(0, len(ckpts) - keep)]] if keep > 0 else []
    own = staging_dir(root, attempt)
    if own.is_dir():
        doomed += sorted(own.iterdir())  # this attempt's unfinished or replaced leftovers
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def prune_checkpoints(checkpoint_dir: str | os.PathLike[str], keep: int = 2, *, attempt: int = 1) -> list[Path]:
    """Delete all but the `keep` newest complete checkpoints and `attempt`'s own staging leftovers,
    under the lock and only while `attempt` holds the fence (StaleAttempt otherwise). Other attempts'
    staging folders are never touched: a stale attempt may still be writing there. Returns what was
    deleted."""
    root = Path(checkpoint_dir)
    with _locked(root):
        _check_fence(root, attempt)
        return _prune_locked(root, keep, attempt)


@contextlib.contextmanager
def checkpoint_writer(
    checkpoint_dir: str | os.PathLike[str],
    iteration: int,
    meta: Mapping[str, Any] | None = None,
    keep: int = 2,
    *,
    attempt: int = 1,
) -> Iterator[Path]:
    """Write the checkpoint of `iteration` for `attempt`; only one process (rank 0) should call this.

    Yields an empty directory `<dir>/staging/attempt-<A>/step-<N>/` to fill. On a clean exit from
    the block it writes meta.json (`iteration`, `attempt`, `time` and `meta`) and fsyncs; then, under
    the lock and only if FENCE does not name a later attempt, renames it to `<dir>/step-<N>/`
    (replacing an older attempt's copy of the same step), points `latest` at it and keeps the `keep`
    newest checkpoints. A stale attempt gets StaleAttempt (its staged copy is removed, nothing else
    changes), before writing anything if the fence was already raised. If the block raises, the
    staged directory is removed and nothing else changes.
    """
    root = Path(checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    fence = read_fence(root)
    if fence > attempt:  # fail before the (possibly long) write; promotion checks again, locked
        raise StaleAttempt(root, attempt, fence)
    final = checkpoint_path(root, iteration)
    stage = staging_dir(root, attempt) / final.name
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    try:
        yield stage
        record = {"iteration": iteration, "time": time.time(), **(meta or {}), "attempt": attempt}
        (stage / CHECKPOINT_META).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        _fsync_tree(stage)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    with _locked(root):
        try:
            _check_fence(root, attempt)
        except StaleAttempt:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        replaced = stage.with_name(stage.name + ".replaced")
        if final.exists():  # an older attempt's copy of the same step: the fence holder's wins
            os.rename(final, replaced)
        os.rename(stage, final)
        _fsync_dir(root)
        write_text_atomic(root / LATEST_FILE, final.name + "\n")
        _prune_locked(root, keep, attempt)  # also removes `replaced`
