"""The live forecasts (docs/forecasts.md): after each round the engine hands its snapshot here; the
replay (controller/core/forecast.py) runs in a worker thread, one at a time, and its result
replaces the previous one. The API reads the latest forecast of a job (Job.forecast)."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Mapping

import structlog

from tessera.controller import metrics
from tessera.controller.core.forecast import ForecastConfig, JobForecast, forecast
from tessera.controller.core.policy import Estimates, Policy, RoundConfig
from tessera.controller.core.snapshot import Snapshot
from tessera.controller.store import JobRecord
from tessera.v1 import common_pb2, controller_pb2

log = structlog.get_logger("tessera.controller.forecast")


def forecast_pb(f: JobForecast, made_at: float) -> controller_pb2.Forecast:
    return controller_pb2.Forecast(start_time=f.start or 0.0, end_time=f.end or 0.0, start_low=f.start_low or 0.0,
                                   start_high=f.start_high or 0.0, end_low=f.end_low or 0.0,
                                   end_high=f.end_high or 0.0, note=f.note, made_at=made_at)


def step_seconds(progress: Mapping[str, common_pb2.Progress], records: Mapping[str, JobRecord]) -> dict[str, float]:
    """Measured seconds per iteration of the running jobs: rank 0's latest step time, else its
    samples per second over the global batch."""
    out: dict[str, float] = {}
    for jid, p in progress.items():
        if p.step_time_seconds > 0:
            out[jid] = p.step_time_seconds
        elif p.samples_per_second > 0 and jid in records and records[jid].spec.global_batch_size > 0:
            out[jid] = records[jid].spec.global_batch_size / p.samples_per_second
    return out


class Forecaster:
    def __init__(self, config: ForecastConfig | None = None, enabled: bool = True) -> None:
        self.config = config or ForecastConfig()
        self.enabled = enabled
        self._latest: dict[str, controller_pb2.Forecast] = {}
        self._task: asyncio.Task[None] | None = None

    def get(self, job_id: str) -> controller_pb2.Forecast | None:
        return self._latest.get(job_id)

    def after_round(self, snap: Snapshot, estimates: Estimates, policy: Policy, rcfg: RoundConfig,
                    step_s: Mapping[str, float], started: Mapping[str, float]) -> None:
        """Start a forecast of this round's snapshot unless one is still running (the next round
        will start a fresh one): rounds never wait for it."""
        if not self.enabled or (self._task is not None and not self._task.done()):
            return
        if not snap.pending and not snap.running:
            self._latest = {}
            return
        # The policy is copied here, on the event loop, so the thread never reads it while a round
        # uses it. A forecast that cannot be made never fails the round.
        try:
            pol = copy.deepcopy(policy)
        except Exception:
            log.exception("forecast_failed")
            return
        cfg = self.config if self.config.interval_s == rcfg.interval_s else \
            type(self.config)(**{**self.config.__dict__, "interval_s": rcfg.interval_s})
        self._task = asyncio.get_running_loop().create_task(
            self._run(snap, estimates, pol, rcfg, cfg, dict(step_s), dict(started)))

    async def _run(self, snap: Snapshot, estimates: Estimates, policy: Policy, rcfg: RoundConfig,
                   cfg: ForecastConfig, step_s: dict[str, float], started: dict[str, float]) -> None:
        t0 = time.perf_counter()
        try:
            out = await asyncio.to_thread(forecast, snap, estimates, policy, rcfg, cfg, step_s, started)
        except Exception:
            log.exception("forecast_failed")
            return
        self._latest = {jid: forecast_pb(f, snap.now) for jid, f in out.items()}
        dt = time.perf_counter() - t0
        metrics.FORECAST_SECONDS.observe(dt)
        log.debug("forecast", jobs=len(out), seconds=round(dt, 4))

    async def wait_idle(self) -> None:
        """Until the forecast in flight (if any) is done (tests, shutdown)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
