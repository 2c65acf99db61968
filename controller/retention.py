"""Retention: finished jobs and their events leave the store after a TTL, and the checkpoint
folders of finished (or forgotten) jobs leave --checkpoint-root after theirs (docs/operations.md,
"Retention"). A TTL of 0 keeps forever.

The controller makes --checkpoint-root (when missing); each agent makes `<root>/<job id>` as the
worker's user, mode 0700, and inside it the layout is the trainer's and the fencing code's business.
A sweep only ever removes a whole `<root>/<job id>` folder, never follows a symbolic link, and never
touches a folder of a job that is not finished. Removing a folder the workers' users own needs more
than the shipped unit's dynamic user has (docs/operations.md, "Retention"): such a failure lasts, so
each folder's is logged once, not at every sweep.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import structlog

from tessera.controller.core.validate import JOB_ID_RE
from tessera.controller.store import TERMINAL, Store

log = structlog.get_logger("controller.retention")

DAY = 86400.0
PRUNE_HINT = ("job folders belong to the workers' users (mode 0700, made by the agents): the controller needs "
              "CAP_DAC_OVERRIDE or root to remove them, or set --checkpoint-ttl 0 and prune on the storage "
              "side (docs/operations.md, \"Retention\")")


@dataclass(frozen=True)
class RetentionConfig:
    job_ttl_s: float = 7 * DAY  # finished jobs and their events
    checkpoint_ttl_s: float = 30 * DAY  # checkpoint folders of finished or forgotten jobs
    interval_s: float = 600.0
    batch: int = 500  # jobs deleted per transaction (a sweep runs as many as it needs)


class Retention:
    def __init__(self, store: Store, checkpoint_root: str, cfg: RetentionConfig,
                 wall: Callable[[], float] = time.time) -> None:
        self.store, self.root, self.cfg, self.wall = store, Path(checkpoint_root), cfg, wall
        # Expired folders the last sweep could not remove: their failure was logged, and is not again
        # while it lasts (one warning per folder every --retention-interval buried the log).
        self._failing: set[Path] = set()

    def sweep_jobs(self) -> list[str]:
        """Delete the finished jobs past the job TTL; their ids."""
        gone: list[str] = []
        for batch in self._batches():
            gone += batch
        return gone

    def _batches(self) -> Iterator[list[str]]:
        if self.cfg.job_ttl_s <= 0:
            return
        before = self.wall() - self.cfg.job_ttl_s
        while True:
            batch = self.store.delete_finished_jobs(before, self.cfg.batch)
            yield batch
            if len(batch) < self.cfg.batch:
                return

    def expired_checkpoints(self) -> list[Path]:
        """Folders `<root>/<job id>` past the checkpoint TTL: of a job that finished that long ago, or
        of a job the store no longer has (retention removed it) last written that long ago."""
        if self.cfg.checkpoint_ttl_s <= 0:
            return []
        before = self.wall() - self.cfg.checkpoint_ttl_s
        out: list[Path] = []
        try:
            entries = list(os.scandir(self.root))
        except OSError:
            return []
        for entry in entries:
            if not JOB_ID_RE.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False):
                continue
            job = self.store.get_job(entry.name)
            if job is None:
                try:
                    expired = entry.stat(follow_symlinks=False).st_mtime < before
                except OSError:
                    continue
            else:
                expired = job.state in TERMINAL and max(job.end_time, job.submit_time) < before
            if expired:
                out.append(Path(entry.path))
        return out

    def sweep_checkpoints(self) -> list[Path]:
        removed, failing = [], set()
        for path in self.expired_checkpoints():
            try:
                shutil.rmtree(path)  # unlinks symbolic links inside, never follows them
                removed.append(path)
            except OSError as exc:
                failing.add(path)
                if path not in self._failing:
                    hint = {"hint": PRUNE_HINT} if isinstance(exc, PermissionError) else {}
                    log.warning("checkpoint_prune_failed", path=str(path), error=str(exc),
                                detail="logged once per folder; retried at every sweep", **hint)
        self._failing = failing  # a folder removed or gone meanwhile is logged again if it fails again
        return removed

    async def sweep(self) -> tuple[list[str], list[Path]]:
        jobs: list[str] = []
        for batch in self._batches():  # one transaction each, the event loop served in between
            jobs += batch
            await asyncio.sleep(0)
        folders = await asyncio.to_thread(self.sweep_checkpoints)  # shared storage may be slow
        if jobs or folders:
            log.info("retention_sweep", jobs_removed=len(jobs), checkpoints_removed=len(folders))
        return jobs, folders

    async def loop(self, changed: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                jobs, _ = await self.sweep()
                if jobs:
                    await changed()
            except Exception:
                log.exception("retention_failed")
            await asyncio.sleep(self.cfg.interval_s)
