"""Pruning of exited attempts' folders (their rank logs, working directories) on this node after a
TTL (`tessera-agent --attempt-ttl`, docs/agent.md, "Retention").

An attempt folder is `<work-dir>/jobs/<job>/attempt-<n>/` (nodeagent/contract.py). It is removed
once the supervisor has no record of the attempt (no live worker, no exited one it still reports)
and nothing in it was written for the TTL. Symbolic links are never followed; other entries of a
job's folder (a default checkpoint folder) are never touched.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Collection
from pathlib import Path

import structlog

log = structlog.get_logger("tessera.nodeagent.retention")

DEFAULT_TTL_S = 7 * 86400.0
INTERVAL_S = 600.0


def _newest_mtime(path: Path) -> float:
    """The latest mtime of the folder and of the entries directly in it (the rank logs)."""
    newest = path.stat(follow_symlinks=False).st_mtime
    with os.scandir(path) as it:
        for entry in it:
            try:
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
            except OSError:
                continue
    return newest


def expired_attempts(work_dir: Path, ttl_s: float, keep: Collection[tuple[str, int]], now: float) -> list[Path]:
    """Attempt folders past the TTL that the supervisor no longer keeps (`keep`: (job, attempt))."""
    if ttl_s <= 0:
        return []
    jobs = work_dir / "jobs"
    out: list[Path] = []
    try:
        job_dirs = [e for e in os.scandir(jobs) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    for job_dir in job_dirs:
        try:
            entries = list(os.scandir(job_dir.path))
        except OSError:
            continue
        for entry in entries:
            name = entry.name
            if not (name.startswith("attempt-") and name[8:].isdigit()) or not entry.is_dir(follow_symlinks=False):
                continue
            if (job_dir.name, int(name[8:])) in keep:
                continue
            try:
                if _newest_mtime(Path(entry.path)) < now - ttl_s:
                    out.append(Path(entry.path))
            except OSError:
                continue
    return out


def prune_attempts(work_dir: Path, ttl_s: float, keep: Collection[tuple[str, int]], now: float) -> list[Path]:
    """Remove the expired attempt folders, then job folders left empty; the folders removed."""
    removed = []
    for path in expired_attempts(work_dir, ttl_s, keep, now):
        try:
            shutil.rmtree(path)
            removed.append(path)
        except OSError as exc:
            log.warning("attempt prune failed", path=str(path), error=str(exc))
            continue
        try:
            path.parent.rmdir()  # only when empty
        except OSError:
            pass
    if removed:
        log.info("attempts pruned", count=len(removed))
    return removed
