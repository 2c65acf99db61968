"""Live step times of running attempts, turned into measured Cell iteration times.

Rank 0 of an attempt reports, with each progress message, the seconds of its latest optimizer step.
Heartbeats sample those reports, so the same iteration may be seen twice and most iterations never.
`StepTimes` keeps, per attempt, a window of distinct iterations past a warm-up (the first steps of
an attempt pay for allocator growth, kernel selection, data-loader start and, after a migration, the
restore) and answers the window's median: one slow step (a checkpoint, a straggler) does not move it.

It says when the estimates should learn: once `min_samples` steps are in, then every `every` new
steps, so the controller's estimates and the estimator service (perf_model.refit) are updated at a
bounded rate whatever the heartbeat rate. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

# A measured iteration time more than this factor off its Cell's estimate is not believed. A job's
# workers run the user's code, and what they report reaches beyond the job: a Cell's measured time
# is shared by every job of the model in the tenant (MeasuredKey), and the forecast of every job
# replays the running ones at their measured speed. A report of 1e-300 s would otherwise make every
# such Cell look instant, or move other tenants' forecast start times.
PLAUSIBLE_FACTOR = 100.0


def plausible(measured_s: float, estimate_s: float) -> bool:
    """Whether a measured iteration time may be believed against its estimate (none: always)."""
    return estimate_s <= 0 or estimate_s / PLAUSIBLE_FACTOR <= measured_s <= estimate_s * PLAUSIBLE_FACTOR


@dataclass(frozen=True)
class StepTimeConfig:
    # Iterations <= warmup_steps of an attempt are not learned from (counted from the attempt's
    # first reported iteration: a resumed attempt starts past its checkpoint).
    warmup_steps: int = 3
    min_samples: int = 3
    # Learn again after this many new distinct iterations.
    every: int = 8
    window: int = 32

    def __post_init__(self) -> None:
        for name in ("min_samples", "every", "window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps: must be >= 0, got {self.warmup_steps}")
        if self.min_samples > self.window:
            raise ValueError(f"min_samples: {self.min_samples} exceeds window {self.window}")


@dataclass(frozen=True)
class StepSample:
    iteration: int
    seconds: float
    time: float


@dataclass(frozen=True)
class Learned:
    """What to learn from an attempt now: the window's median and the steps not handed out before."""

    job_id: str
    attempt: int
    seconds: float
    samples: int
    new_steps: tuple[StepSample, ...]
    # True the first time this attempt is learned from.
    first: bool


@dataclass
class _Attempt:
    attempt: int
    first_iteration: int
    steps: dict[int, StepSample] = field(default_factory=dict)
    unsent: list[StepSample] = field(default_factory=list)
    learned: bool = False


class StepTimes:
    def __init__(self, config: StepTimeConfig | None = None) -> None:
        self.config = config or StepTimeConfig()
        self._jobs: dict[str, _Attempt] = {}

    def add(self, job_id: str, attempt: int, iteration: int, seconds: float, time: float = 0.0) -> Learned | None:
        """Fold one rank-0 report in; a `Learned` when the estimates should learn from it now."""
        if not (math.isfinite(seconds) and seconds > 0) or iteration < 1:
            return None  # a report before the first step, or a worker's garbage: nothing to learn
        cur = self._jobs.get(job_id)
        if cur is None or attempt > cur.attempt:
            cur = self._jobs[job_id] = _Attempt(attempt, iteration)
        elif attempt < cur.attempt:
            return None  # a late report of an attempt already replaced
        cfg = self.config
        if iteration <= cur.first_iteration + cfg.warmup_steps - 1 or iteration in cur.steps:
            return None
        sample = StepSample(iteration, seconds, time if math.isfinite(time) and time >= 0 else 0.0)  # 0: unknown
        cur.steps[iteration] = sample
        if len(cur.steps) > cfg.window:
            del cur.steps[min(cur.steps)]
        cur.unsent.append(sample)
        if len(cur.steps) < cfg.min_samples or (cur.learned and len(cur.unsent) < cfg.every):
            return None
        first = not cur.learned
        cur.learned = True
        new, cur.unsent = tuple(cur.unsent), []
        median = statistics.median(s.seconds for s in cur.steps.values())
        return Learned(job_id, attempt, median, len(cur.steps), new, first)

    def forget(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)

    def __len__(self) -> int:
        return len(self._jobs)
