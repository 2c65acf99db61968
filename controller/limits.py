"""The time limits of an attempt: `max_runtime` and the progress timeout (docs/opaque-jobs.md).

Pure: the engine's inspection pass asks these with its own clocks and carries out the answer.
"""

from __future__ import annotations

from tessera.common.durations import format_duration
from tessera.v1 import common_pb2


def expects_progress(spec: common_pb2.JobSpec) -> bool:
    """Whether the job promised progress reports: it counts iterations (success needs them reported).
    A job without iterations (an opaque program) succeeds by exiting 0 and reports only if it likes."""
    return spec.iterations > 0


def progress_timeout(spec: common_pb2.JobSpec, default: float, reported: bool) -> float:
    """Seconds rank 0 may stay silent (<= 0: never checked). The job's own value wins; the
    controller's default applies to jobs that expect progress, and to the others only once they
    have reported some (they opted in): an unchanged script is never failed as hung."""
    if spec.progress_timeout_seconds:
        return float(spec.progress_timeout_seconds)
    if expects_progress(spec) or reported:
        return default
    return -1.0


def over_runtime(spec: common_pb2.JobSpec, running_s: float) -> str | None:
    """The failure reason once the attempt has run past the job's max_runtime, else None."""
    limit = spec.max_runtime_seconds
    if limit <= 0 or running_s <= limit:
        return None
    return f"max_runtime {format_duration(limit)} exceeded"
