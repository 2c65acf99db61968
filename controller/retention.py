"""Retention: finished jobs and their events leave the store after a TTL, and the checkpoint
folders of finished (or forgotten) jobs leave --checkpoint-root after theirs (docs/operations.md,
"Retention"). A TTL of 0 keeps forever.

The controller owns --checkpoint-root; inside a job's folder the layout is the trainer's and the
fencing code's business: a sweep only ever removes a whole `<root>/<job id>` folder, never follows a
symbolic link, and never touches a folder of a job that is not finished.
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
        removed = []
        for path in self.expired_checkpoints():
            try:
                shutil.rmtree(path)  # unlinks symbolic links inside, never follows them
                removed.append(path)
            except OSError as exc:
                log.warning("checkpoint_prune_failed", path=str(path), error=str(exc))
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
