"""What the dashboard draws over time, kept in the controller's memory (lost on a restart; the
Prometheus metrics are the durable record): GPUs by type and state per scheduling round, and the
progress reports of each job (its loss curve).

Both are bounded whatever the cluster does: a ring buffer of capacity samples, and per job at most
MAX_POINTS progress points (thinned to every other one when full, so a long job keeps its whole
curve at a coarser grain) for at most MAX_JOBS jobs (the least recently reported forgotten first).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tessera.controller.metrics import GPU_STATES
from tessera.v1 import common_pb2

CAPACITY_SAMPLES = 720  # a day at the sampler's 2-minute floor; more when rounds are frequent
MAX_POINTS = 400
MAX_JOBS = 256


@dataclass(frozen=True)
class CapacitySample:
    time: float  # wall
    round: int
    gpus: Mapping[str, Mapping[str, int]]  # type -> state (GPU_STATES) -> count


@dataclass(frozen=True)
class ProgressPoint:
    time: float
    iteration: int
    loss: float
    samples_per_second: float
    step_time_seconds: float


class CapacityHistory:
    def __init__(self, size: int = CAPACITY_SAMPLES) -> None:
        self.samples: deque[CapacitySample] = deque(maxlen=size)

    def add(self, time: float, round_no: int, tally: Mapping[tuple[str, str], int]) -> None:
        gpus: dict[str, dict[str, int]] = {}
        for (gpu_type, state), n in tally.items():
            gpus.setdefault(gpu_type, {s: 0 for s in GPU_STATES})[state] = n
        self.samples.append(CapacitySample(time, round_no, gpus))

    def types(self) -> list[str]:
        return sorted({t for s in self.samples for t in s.gpus})


class ProgressHistory:
    def __init__(self, max_points: int = MAX_POINTS, max_jobs: int = MAX_JOBS) -> None:
        self.max_points, self.max_jobs = max_points, max_jobs
        self._jobs: OrderedDict[str, list[ProgressPoint]] = OrderedDict()

    def add(self, job_id: str, p: common_pb2.Progress) -> None:
        points = self._jobs.setdefault(job_id, [])
        self._jobs.move_to_end(job_id)
        point = ProgressPoint(p.time, p.iteration, p.loss, p.samples_per_second, p.step_time_seconds)
        if points and (points[-1].iteration, points[-1].time) == (point.iteration, point.time):
            return
        if points and point.iteration < points[-1].iteration:
            # An attempt resumed from an older checkpoint: the curve continues from there.
            while points and points[-1].iteration >= point.iteration:
                points.pop()
        points.append(point)
        if len(points) > self.max_points:
            last = points[-1]
            points[:] = points[::2]
            if points[-1] is not last:
                points.append(last)
        while len(self._jobs) > self.max_jobs:
            self._jobs.popitem(last=False)

    def points(self, job_id: str) -> list[ProgressPoint]:
        return list(self._jobs.get(job_id, ()))


class History:
    """The sampler's state: `observe` is called on every change the engine notifies (and at least
    every `floor_s`); it samples capacity once per new round or once per `floor_s`, and records the
    latest progress of every active job."""

    def __init__(self, floor_s: float = 120.0) -> None:
        self.capacity = CapacityHistory()
        self.progress = ProgressHistory()
        self.floor_s = floor_s
        self._last_round = -1
        self._last_time = 0.0

    def observe(self, now: float, round_no: int, tally: Callable[[], Mapping[tuple[str, str], int]],
                active: Mapping[str, common_pb2.Progress | None]) -> None:
        if round_no != self._last_round or now - self._last_time >= self.floor_s:
            self.capacity.add(now, round_no, tally())
            self._last_round, self._last_time = round_no, now
        for job_id, p in active.items():
            if p is not None and p.time > 0:
                self.progress.add(job_id, p)
