"""The live side of forecasts (controller/forecasting.py): the replay in a thread after a round, its
result by job, the measured step times it reads, and a forecast that fails never failing a round."""

from __future__ import annotations

import threading

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.forecast import ForecastConfig
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import RoundConfig
from tessera.controller.core.snapshot import Cell, GpuView, JobView, NodeView, RunningView, Slice, Snapshot
from tessera.controller.forecasting import Forecaster, step_seconds
from tessera.controller.store import JobRecord
from tessera.estimator.models import ModelDims
from tessera.v1 import common_pb2 as P

M = ModelDims(1024, 24, 16, 32000, 1024, "m")
EST = TableEstimates({("k", "X", 2): 1.0})


def snap() -> Snapshot:
    node = NodeView("x0", tuple(GpuView(i, "X", 40 * 1000**3) for i in range(2)), frozenset({0, 1}))
    run = RunningView(JobView("a", 0, M, 64, 2, (), "X", 100, 50, estimate_key="k"), Cell("X", 2), (Slice("x0", (0, 1)),))
    return Snapshot((node,), (JobView("b", 10, M, 64, 2, (), "X", 200, estimate_key="k"),), running=(run,),
                    now=1000.0, arrivals=())


async def test_after_round_stores_each_jobs_forecast() -> None:
    f = Forecaster(ForecastConfig(rounds_at_departures=True, band=False))
    f.after_round(snap(), EST, make_policy("fcfs"), RoundConfig(interval_s=60.0), {"a": 2.0}, {"a": 900.0})
    await f.wait_idle()
    a, b = f.get("a"), f.get("b")
    assert a is not None and b is not None
    assert a.start_time == 900.0 and a.end_time == 1100.0 and a.made_at == 1000.0  # 50 x 2 s measured
    assert b.start_time == 1100.0 and b.end_time == 1300.0
    assert f.get("nobody") is None


async def test_a_policy_that_cannot_be_copied_makes_no_forecast_and_raises_nothing() -> None:
    class Locked:
        name = "locked"

        def __init__(self) -> None:
            self.lock = threading.Lock()  # deepcopy refuses locks

        def plan(self, ctx):  # type: ignore[no-untyped-def]
            return []

    f = Forecaster(ForecastConfig(band=False))
    f.after_round(snap(), EST, Locked(), RoundConfig(interval_s=60.0), {}, {})  # type: ignore[arg-type]
    await f.wait_idle()
    assert f.get("a") is None


async def test_off_makes_none() -> None:
    f = Forecaster(enabled=False)
    f.after_round(snap(), EST, make_policy("fcfs"), RoundConfig(), {}, {})
    await f.wait_idle()
    assert f.get("a") is None


def test_step_seconds_from_progress() -> None:
    spec = P.JobSpec(global_batch_size=64)
    rec = JobRecord.__new__(JobRecord)
    object.__setattr__(rec, "spec", spec)
    got = step_seconds({"a": P.Progress(step_time_seconds=0.5), "b": P.Progress(samples_per_second=32.0),
                        "c": P.Progress(iteration=3)}, {"b": rec})
    assert got == {"a": 0.5, "b": 2.0}
