"""The rate and ETA of `tessctl wait`: iterations over the wall time of the reports seen, not one
step's time (docs/cli.md, "Wait"). Before: 1/step_time_seconds of the last report, which after a
checkpoint read 0.11 s where the run averaged 0.35 s: the ETA was off 2-7x."""

from __future__ import annotations

import io

from tessera.clients import waiting
from tessera.clients.progress_rate import RateMeter
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2

RUNNING = P.JOB_STATE_RUNNING


def job(iteration: int, at: float = 0.0, step: float = 0.35, attempt: int = 1,
        total: int = 1000) -> controller_pb2.Job:
    return controller_pb2.Job(id="j-1", state=RUNNING, attempt=attempt, spec=P.JobSpec(iterations=total),
                              progress=P.Progress(iteration=iteration, step_time_seconds=step, time=at))


def rates(reports: list[controller_pb2.Job], seen: list[float] | None = None) -> list[float | None]:
    meter = RateMeter()
    return [meter.observe(j, t) for j, t in zip(reports, seen or [0.0] * len(reports), strict=True)]


def test_the_rate_spans_the_reports_seen_checkpoints_included() -> None:
    # 10 steps of 0.35 s, then a checkpoint of 3 s, then 10 steps the last of which reported 0.11 s.
    seq = [job(100, 1000.0), job(110, 1003.5), job(120, 1010.0, step=0.11)]
    assert rates(seq) == [None, 10 / 3.5, 2.0]
    meter = RateMeter()
    for j in seq:
        rate = meter.observe(j, 0.0)
    # 880 iterations left at 2 it/s; the last step's 0.11 s said 9.09 it/s and ETA 1m37s.
    assert waiting.progress_text(seq[-1], rate) == "120/1000 (12%)  2 it/s  ETA 7m20s"


def test_one_report_falls_back_to_its_step_time() -> None:
    assert rates([job(100, 1000.0, step=0.5)]) == [None]
    assert waiting.progress_text(job(100, 1000.0, step=0.5), None) == "100/1000 (10%)  2 it/s  ETA 7m30s"
    # The same iteration again is the same report: still one.
    assert rates([job(100, 1000.0, step=0.5), job(100, 1002.0, step=0.5)]) == [None, None]


def test_a_new_attempt_or_a_restore_starts_the_window_again() -> None:
    # Requeued: attempt 2 resumes from a checkpoint at 50 an hour later; the hour is no pace.
    seq = [job(100, 1000.0), job(120, 1010.0), job(50, 4600.0, attempt=2), job(60, 4605.0, attempt=2)]
    assert rates(seq) == [None, 2.0, None, 2.0]
    # Within one attempt, an iteration that went back (a restore) resets too.
    assert rates([job(100, 1000.0), job(120, 1010.0), job(110, 1100.0), job(130, 1104.0)]) == [None, 2.0, None, 5.0]


def test_reports_without_their_own_time_use_the_waiters_clock_from_the_first_change() -> None:
    # The first report seen may be old: its seen time says nothing; the window starts at the change.
    seq = [job(100), job(110), job(130), job(130)]
    assert rates(seq, seen=[0.0, 50.0, 60.0, 70.0]) == [None, None, 2.0, 2.0]


def test_wait_prints_the_smoothed_rate() -> None:
    clock = [0.0]
    out = io.StringIO()
    printer = waiting.Printer(out, clock=lambda: clock[0])
    for j in (job(100, 1000.0), job(120, 1010.0, step=0.11)):
        printer.progress(j)
        clock[0] += 60.0  # piped: a line at most every 10 s
    printer.close()
    assert out.getvalue().splitlines() == ["j-1 progress: 100/1000 (10%)  2.86 it/s  ETA 5m15s",
                                           "j-1 progress: 120/1000 (12%)  2 it/s  ETA 7m20s"]
