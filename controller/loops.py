"""The controller's three periodic loops over an Engine: rounds, liveness, inspection.

Each survives a failing pass (logged with its traceback) and goes on: a bug in one pass must not
stop scheduling, fencing or the jobs' time limits for good.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog

from tessera.controller import metrics
from tessera.controller.engine import Engine
from tessera.controller.store import ACTIVE

log = structlog.get_logger("controller")


def loops(engine: Engine) -> list[Coroutine[Any, Any, None]]:
    return [round_loop(engine), liveness_loop(engine), inspect_loop(engine)]


async def round_loop(engine: Engine) -> None:
    while True:
        await engine.round_due()
        try:
            await engine.run_round()
        except Exception:
            log.exception("round_failed")


async def liveness_loop(engine: Engine) -> None:
    period = max(0.2, min(1.0, engine.cfg.liveness.lease_s / 4))
    while True:
        await asyncio.sleep(period)
        try:
            await engine.liveness_tick()
            metrics.update_nodes(engine.view, engine.wall())
            engine.gpu_seconds.tick(engine.view.jobs(states=ACTIVE), engine.mono())
        except Exception:
            log.exception("liveness_failed")


async def inspect_loop(engine: Engine) -> None:
    while True:
        await asyncio.sleep(engine.cfg.inspect_interval_s)
        try:
            await engine.inspect()
            metrics.update_jobs(engine.view)
        except Exception:
            log.exception("inspect_failed")
