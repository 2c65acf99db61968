"""The forecast core (controller/core/forecast.py) on literal snapshots."""

from __future__ import annotations

import pytest

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.forecast import (
    BEYOND,
    FAR,
    NO_ITERATIONS,
    NO_PROGRESS,
    ForecastConfig,
    ForecastInputError,
    forecast,
)
from tessera.controller.core.opaque import OpaqueAware, opaque_key
from tessera.controller.core.policies import make_policy
from tessera.controller.core.snapshot import Cell, GpuView, JobView, NodeView, RunningView, Slice, Snapshot
from tessera.estimator.models import ModelDims

GB = 1000**3
M = ModelDims(1024, 24, 16, 32000, 1024, "m")
# 2 s per iteration on one X GPU, 1 s on two ("table": a measured source, 5 % band by default).
EST = TableEstimates({("k", "X", 1): 2.0, ("k", "X", 2): 1.0})
FCFS = make_policy("fcfs")


def node(busy: tuple[int, ...] = ()) -> NodeView:
    return NodeView("x0", tuple(GpuView(i, "X", 40 * GB) for i in range(2)), frozenset(busy))


def job(jid: str, t: float, n: int, iters: int = 100, done: float = 0.0) -> JobView:
    return JobView(jid, t, M, 64, n, (), "X", iters, done, estimate_key="k")


def two_jobs(restart: float = 30.0) -> Snapshot:
    """One job on both GPUs with 50 of 100 iterations left (1 s each), one waiting for them."""
    run = RunningView(job("a", 0, 2, done=50), Cell("X", 2), (Slice("x0", (0, 1)),))
    return Snapshot((node((0, 1)),), (job("b", 10, 2, iters=200),), running=(run,), now=1000.0,
                    arrivals=(), restart_cost_s=restart)


def test_waiting_job_starts_at_the_running_jobs_end_plus_restart_cost() -> None:
    cfg = ForecastConfig(interval_s=60.0, rounds_at_departures=True, band=False)
    f = forecast(two_jobs(), EST, FCFS, config=cfg, started={"a": 900.0})
    # a: 50 iterations x 1 s left, no start cost (it runs): ends at 1050; its start is its attempt's.
    assert f["a"].start == 900.0 and f["a"].end == pytest.approx(1050.0)
    # b starts in the round at a's finish, pays 30 s, then 200 iterations x 1 s.
    assert f["b"].start == pytest.approx(1050.0)
    assert f["b"].end == pytest.approx(1050.0 + 30.0 + 200.0)
    assert f["a"].note == f["b"].note == ""


def test_rounds_on_boundaries_as_the_simulator() -> None:
    cfg = ForecastConfig(interval_s=60.0, band=False)
    f = forecast(two_jobs(restart=0.0), EST, FCFS, config=cfg)
    # Rounds every 60 s from the snapshot's 1000: a ends at 1050, b starts at the 1060 boundary.
    assert f["b"].start == pytest.approx(1060.0) and f["b"].end == pytest.approx(1260.0)


def test_measured_step_time_wins_and_band_widens_by_source() -> None:
    cfg = ForecastConfig(interval_s=60.0, rounds_at_departures=True, measured_error=0.1, estimate_error=0.2)
    f = forecast(two_jobs(restart=0.0), EST, FCFS, config=cfg, step_s={"a": 2.0})
    assert f["a"].end == pytest.approx(1100.0)  # 50 x 2 s measured, not the table's 1 s
    assert f["a"].end_low == pytest.approx(1090.0) and f["a"].end_high == pytest.approx(1110.0)
    assert f["b"].start_low == pytest.approx(1090.0) and f["b"].start_high == pytest.approx(1110.0)
    # b's own time is the table's ("table": measured error): 200 s +- 10 %, after a's band.
    assert f["b"].end_low == pytest.approx(1090.0 + 180.0) and f["b"].end_high == pytest.approx(1110.0 + 220.0)
    assert f["b"].start_low <= f["b"].start <= f["b"].start_high  # type: ignore[operator]


@pytest.mark.parametrize("forged", [1e-9, 1e6])
def test_a_step_time_far_off_the_estimate_moves_no_other_jobs_forecast(forged: float) -> None:
    """Job a's workers run its user's code: a report 100x off the Cell's estimate is not believed
    (PLAUSIBLE_FACTOR, as for learning), so b's forecast is the honest one. Before, 1e-9 s moved b's
    start 50 s earlier and 1e6 s left b with no forecast at all."""
    cfg = ForecastConfig(interval_s=60.0, rounds_at_departures=True, band=False)
    honest = forecast(two_jobs(restart=0.0), EST, FCFS, config=cfg, step_s={"a": 1.0}, started={"a": 900.0})
    got = forecast(two_jobs(restart=0.0), EST, FCFS, config=cfg, step_s={"a": forged}, started={"a": 900.0})
    assert honest["b"].start == pytest.approx(1050.0)
    assert (got["b"].start, got["b"].end) == (honest["b"].start, honest["b"].end)
    # Within the factor a measurement still wins (test_measured_step_time_wins_...): 50 x 90 s.
    slow = forecast(two_jobs(restart=0.0), EST, FCFS, config=cfg, step_s={"a": 90.0}, started={"a": 900.0})
    assert slow["a"].end == pytest.approx(1000.0 + 50 * 90.0)


def test_beyond_the_horizon_has_no_forecast() -> None:
    cfg = ForecastConfig(interval_s=60.0, horizon_s=30.0, band=False)
    f = forecast(two_jobs(), EST, FCFS, config=cfg)
    assert f["b"].start is None and f["b"].note == BEYOND
    assert f["a"].end == pytest.approx(1050.0)  # a running job ends at its remaining time from the bound


def test_opaque_job_without_progress_gets_no_end_and_blocks_nothing_it_does_not_hold() -> None:
    est = OpaqueAware(EST)
    opq = JobView("o", 0, M, 1, 1, ("X",), "X", 1, 0.0, estimate_key=opaque_key(1, ("X",)), opaque=True)
    run = RunningView(opq, Cell("X", 1, 1), (Slice("x0", (0,)),))
    snap = Snapshot((node((0,)),), (job("b", 10, 1, iters=10),), running=(run,), now=0.0, arrivals=())
    f = forecast(snap, est, FCFS, config=ForecastConfig(interval_s=60.0, band=False))
    assert f["o"].end is None and f["o"].note == NO_PROGRESS
    assert f["b"].start == 0.0 and f["b"].end == pytest.approx(20.0)
    # With its own step times (it reports progress: 5 iterations of 10 done, 3 s each) it has one.
    opq10 = JobView("o", 0, M, 1, 1, ("X",), "X", 10, 5.0, estimate_key=opaque_key(1, ("X",)), opaque=True)
    snap2 = Snapshot(snap.nodes, (), running=(RunningView(opq10, Cell("X", 1, 1), (Slice("x0", (0,)),)),))
    g = forecast(snap2, est, FCFS, config=ForecastConfig(interval_s=60.0, band=False), step_s={"o": 3.0})
    assert g["o"].note == "" and g["o"].end == pytest.approx(15.0)


def test_a_job_that_states_no_iterations_gets_no_end_and_holds_its_gpus() -> None:
    """A job with its own entrypoint and `iterations: 0` (it succeeds when its ranks exit): its
    forecast ended "now" (a live audit: "ends ~16:45 UTC, overdue" 17 s after its start), and the
    job waiting for its GPUs was forecast to start at once."""
    cfg = ForecastConfig(interval_s=60.0, rounds_at_departures=True, band=False)
    run = RunningView(job("a", 0, 2, iters=0), Cell("X", 2), (Slice("x0", (0, 1)),))
    snap = Snapshot((node((0, 1)),), (job("b", 10, 2, iters=200),), running=(run,), now=1000.0, arrivals=())
    f = forecast(snap, EST, FCFS, config=cfg, started={"a": 900.0})
    assert f["a"].end is None and f["a"].note == NO_ITERATIONS
    assert f["b"].start is None and f["b"].note == BEYOND


def test_an_end_past_ten_years_is_no_forecast() -> None:
    """An opaque job's step time is its own report, whatever it is: 1e18 s per iteration made its end
    5e18, which no clock can show (the dashboard's pages answered 500, tessctl exited 1)."""
    est = OpaqueAware(EST)
    opq = JobView("o", 0, M, 1, 1, ("X",), "X", 10, 5.0, estimate_key=opaque_key(1, ("X",)), opaque=True)
    snap = Snapshot((node((0,)),), (), running=(RunningView(opq, Cell("X", 1, 1), (Slice("x0", (0,)),)),))
    f = forecast(snap, est, FCFS, config=ForecastConfig(interval_s=60.0), step_s={"o": 1e18})
    assert (f["o"].end, f["o"].end_low, f["o"].end_high, f["o"].note) == (None, None, None, FAR)
    near = forecast(snap, est, FCFS, config=ForecastConfig(interval_s=60.0), step_s={"o": 3.0})
    assert near["o"].end == pytest.approx(15.0) and near["o"].note == ""


def test_future_arrivals_delay_a_later_job() -> None:
    # One GPU free; an arrival model says "c" arrives at 100 and is ahead of nobody: "b" (queued
    # first) still starts first, but on a cluster with no room left, "c" waits for "b".
    snap = Snapshot((node((0,)),), (job("b", 10, 1, iters=50),), now=0.0, arrivals=())
    run = RunningView(job("a", 0, 1, iters=1000), Cell("X", 1), (Slice("x0", (0,)),))
    snap = Snapshot(snap.nodes, snap.pending, running=(run,), now=0.0, arrivals=())
    cfg = ForecastConfig(interval_s=60.0, band=False, arrivals=(job("c", 100.0, 1, iters=10),))
    f = forecast(snap, EST, FCFS, config=cfg)
    assert f["b"].start == 0.0 and f["b"].end == pytest.approx(100.0)
    assert "c" not in f  # only the snapshot's jobs are answered
    plain = forecast(snap, EST, FCFS, config=ForecastConfig(interval_s=60.0, band=False))
    assert plain["a"].end == f["a"].end == pytest.approx(2000.0)


def test_the_live_policy_is_not_touched() -> None:
    policy = make_policy("crius")
    before = repr(vars(policy))
    forecast(two_jobs(), EST, policy, config=ForecastConfig(interval_s=60.0))
    assert repr(vars(policy)) == before


@pytest.mark.parametrize(("field", "kw"), [("max_rounds", {"max_rounds": 0}), ("horizon_s", {"horizon_s": 0.0}),
                                           ("estimate_error", {"estimate_error": 1.5}),
                                           ("start_cost_s", {"start_cost_s": -1.0})])
def test_bad_config_names_the_field(field: str, kw: dict[str, float]) -> None:
    with pytest.raises(ForecastInputError, match=field):
        ForecastConfig(**kw)  # type: ignore[arg-type]
