"""The rate and ETA `tessctl wait` shows: iterations over the wall time between the first and the
latest progress report one waiter has seen of an attempt (docs/cli.md, "Wait").

One report's step time is noisy and leaves out what happens between steps (a step after a
checkpoint reported 0.11 s where the run averaged 0.35 s with its checkpoints): an ETA from it was
off 2-7x. The window's times are the reports' own (`Progress.time`, the worker's clock) when both
ends have one, else the waiter's clock when it saw the iteration change. It starts again on a new
attempt or an iteration that went back (a restore from a checkpoint): the time in between is a
stop, not the run's pace.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.v1 import controller_pb2


@dataclass(frozen=True)
class _Seen:
    iteration: int
    reported: float | None  # the report's own time (Progress.time), when it has one
    seen: float | None  # the waiter's clock when it saw the iteration change; None: unknown


class RateMeter:
    """Iterations per second over the reports of one job seen so far; None before two that differ."""

    def __init__(self) -> None:
        self.attempt: int | None = None
        self.first: _Seen | None = None
        self.latest: _Seen | None = None

    def observe(self, job: controller_pb2.Job, now: float) -> float | None:
        """Take the job's report as seen at `now` (any monotonic clock); the rate so far."""
        if not job.HasField("progress"):
            return self.rate()
        p = job.progress
        reported = p.time if p.time > 0 else None  # 0: not reported (common/progress.py clears bad times)
        if self.first is None or self.latest is None or job.attempt != self.attempt or p.iteration < self.latest.iteration:
            # The first report of a watch may be old: when the waiter saw it says nothing of its age.
            self.attempt = job.attempt
            self.first = self.latest = _Seen(p.iteration, reported, None)
        elif p.iteration != self.latest.iteration:
            self.latest = _Seen(p.iteration, reported, now)
            if self.first.reported is None and self.first.seen is None:
                self.first = self.latest  # no time for the first: the window starts at this change
        return self.rate()

    def rate(self) -> float | None:
        f, last = self.first, self.latest
        if f is None or last is None or last.iteration <= f.iteration:
            return None
        if f.reported is not None and last.reported is not None:
            dt = last.reported - f.reported
        elif f.seen is not None and last.seen is not None:
            dt = last.seen - f.seen
        else:
            return None
        return (last.iteration - f.iteration) / dt if dt > 0 else None
