"""Agent calls of many jobs at once: a node that answers slowly costs a round or an inspection pass
one call's time, not one call's time per job (an audit's node answering each Launch after 4.9 s,
under the 5 s deadline, held a round of 8 starts for 39 s, and every other tenant's start behind
it)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable

import structlog

log = structlog.get_logger("controller")

LIMIT = 64  # calls in flight at once: a pass over thousands of jobs does not open thousands of calls


async def each_job(work: Iterable[tuple[str, Awaitable[None]]], failed: str, limit: int = LIMIT) -> None:
    """Await every (job id, step) concurrently, at most `limit` at once; a step that raises is
    logged as `failed` with its job id, and the others go on."""
    gate = asyncio.Semaphore(limit)

    async def one(job_id: str, step: Awaitable[None]) -> None:
        async with gate:
            try:
                await step
            except Exception:
                log.exception(failed, job_id=job_id)

    await asyncio.gather(*(one(j, s) for j, s in work))
