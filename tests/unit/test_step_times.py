"""StepTimes (controller/core/step_times.py) and the measured Cells of the live controller's estimates."""

from __future__ import annotations

import threading

import pytest

from tessera.controller.cell_estimates import CellEstimates
from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.policy import CachedEstimates
from tessera.controller.core.snapshot import Cell, JobView
from tessera.controller.core.step_times import StepTimeConfig, StepTimes
from tessera.estimator.models import registered


def feed(st: StepTimes, job: str, attempt: int, steps: list[tuple[int, float]]) -> list[tuple[float, int, list[int], bool]]:
    out = []
    for it, s in steps:
        got = st.add(job, attempt, it, s, time=float(it))
        if got is not None:
            out.append((got.seconds, got.samples, [x.iteration for x in got.new_steps], got.first))
    return out


def test_warmup_then_min_samples_then_every() -> None:
    st = StepTimes(StepTimeConfig(warmup_steps=2, min_samples=3, every=2, window=8))
    got = feed(st, "j", 1, [(1, 9.0), (2, 9.0), (3, 1.0), (4, 2.0), (5, 3.0), (6, 4.0), (7, 5.0)])
    # 1 and 2 are warm-up; learned at 3 samples (3, 4, 5), then after 2 more (6, 7).
    assert got == [(2.0, 3, [3, 4, 5], True), (3.0, 5, [6, 7], False)]


def test_repeated_iterations_and_garbage_are_ignored() -> None:
    st = StepTimes(StepTimeConfig(warmup_steps=0, min_samples=2, every=1, window=8))
    got = feed(st, "j", 1, [(1, 1.0), (1, 5.0), (0, 1.0), (2, float("nan")), (2, -1.0), (2, float("inf")), (2, 3.0)])
    assert got == [(2.0, 2, [1, 2], True)]


def test_window_keeps_the_latest_iterations() -> None:
    st = StepTimes(StepTimeConfig(warmup_steps=0, min_samples=1, every=1, window=2))
    got = feed(st, "j", 1, [(1, 10.0), (2, 1.0), (3, 1.0)])
    assert [g[0] for g in got] == [10.0, 5.5, 1.0]


def test_new_attempt_starts_over_and_late_reports_of_old_ones_are_dropped() -> None:
    st = StepTimes(StepTimeConfig(warmup_steps=1, min_samples=1, every=1, window=8))
    assert feed(st, "j", 1, [(1, 5.0), (2, 5.0)]) == [(5.0, 1, [2], True)]
    # Attempt 2 resumes from a checkpoint at 100: its own warm-up counts from its first report.
    assert feed(st, "j", 2, [(101, 1.0), (102, 1.0)]) == [(1.0, 1, [102], True)]
    assert feed(st, "j", 1, [(3, 50.0)]) == []
    st.forget("j")
    assert len(st) == 0


@pytest.mark.parametrize("kw", [{"min_samples": 0}, {"every": 0}, {"window": 0}, {"warmup_steps": -1},
                                {"min_samples": 9, "window": 8}])
def test_bad_config(kw: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        StepTimeConfig(**kw)


def test_measured_cell_replaces_the_estimate_and_survives_a_rebuild() -> None:
    model = registered("gpt2-small")
    assert model is not None
    job = JobView("j", 0.0, model, 8)
    pools = {"A100-80GB": (2, 2, True)}
    cached = CachedEstimates(CellEstimates(pools))
    (est,) = [c for c in cached.cells(job, "A100-80GB", 2, 1) if c.cell.stages == 1]
    assert est.source != "measured"
    inner = cached.inner
    assert isinstance(inner, CellEstimates)
    key = inner.record_measured(job, Cell("A100-80GB", 2, 1), 0.75)
    assert key is not None
    # Memoised answers are stale until forgotten.
    assert [c.source for c in cached.cells(job, "A100-80GB", 2, 1) if c.cell.stages == 1] == [est.source]
    cached.forget(job.key)
    (now,) = [c for c in cached.cells(job, "A100-80GB", 2, 1) if c.cell.stages == 1]
    assert (now.iteration_s, now.source) == (0.75, "measured")
    # Other Cells keep their estimates; a rebuilt estimator (new pools) starts with the measurement.
    one_gpu = list(cached.cells(job, "A100-80GB", 1, 1))
    assert one_gpu  # without a 1-GPU Cell the next line would pass on nothing
    assert all(c.source != "measured" for c in one_gpu)
    rebuilt = CellEstimates({"A100-80GB": (4, 2, True)}, measured={key: 0.75})
    assert [c.source for c in rebuilt.cells(job, "A100-80GB", 2, 1) if c.cell.stages == 1] == ["measured"]


def test_forgetting_a_key_while_another_thread_memoises() -> None:
    """A measured step time makes the event loop forget a key while the warm-up or forecast
    thread fills the same caches; a comprehension over the growing dict raised in 288 of 300 calls."""
    cache = CachedEstimates(TableEstimates({}))
    model = registered("gpt2-small")

    def memoise(key: str) -> None:
        cache.gpu_counts(JobView(key, 0.0, model, 8, estimate_key=key), "X")

    memoise("kept")
    stop = threading.Event()

    def grow() -> None:
        i = 0
        while not stop.is_set():
            memoise(f"k{i}")
            i += 1

    t = threading.Thread(target=grow)
    t.start()
    try:
        for _ in range(300):
            cache.forget("k5")
    finally:
        stop.set()
        t.join()
    assert cache.known(JobView("kept", 0.0, model, 8, estimate_key="kept"), "X")
    assert not cache.known(JobView("k5", 0.0, model, 8, estimate_key="k5"), "X")
