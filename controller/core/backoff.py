"""Launch-failure backoff for jobs and nodes (issue 13, finding 2). Pure: times are passed in.

A Launch the agent refuses (or that cannot reach it) is not the job's fault, so it does not count
against max_retries; left alone it turned into a PLACED -> LAUNCH_FAILED loop once a second. Each
consecutive launch failure of a job doubles the wait before the job may be placed again; a node
whose launches keep failing, whatever the job, takes no placements for a doubling period. A
successful Launch resets the job's count and the node's.

Times are wall-clock seconds: they are stored and shown to users, and nothing unsafe hangs on
them (a wrong clock only makes a retry come early or late).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BackoffConfig:
    job_base_s: float = 1.0
    job_cap_s: float = 300.0
    # Consecutive failed launches (any job) that make a node unhealthy.
    node_threshold: int = 3
    node_base_s: float = 30.0
    node_cap_s: float = 900.0


def job_delay(failures: int, cfg: BackoffConfig) -> float:
    """Seconds a job waits after its `failures`-th consecutive launch failure: base * 2^(n-1), capped."""
    if failures <= 0:
        return 0.0
    # The exponent is bounded so that a long-lived count cannot overflow the float.
    return min(cfg.job_cap_s, cfg.job_base_s * 2.0 ** min(failures - 1, 60))


def node_unhealthy_for(failures: int, cfg: BackoffConfig) -> float:
    """Seconds a node takes no placements after `failures` consecutive launch failures: 0 below the
    threshold, then base * 2^(n - threshold), capped."""
    if failures < cfg.node_threshold:
        return 0.0
    return min(cfg.node_cap_s, cfg.node_base_s * 2.0 ** min(failures - cfg.node_threshold, 60))


def may_launch(next_launch_time: float, now: float) -> bool:
    """Whether a PENDING job's backoff has run out (0 = never failed)."""
    return next_launch_time <= now


def healthy(unhealthy_until: float, now: float) -> bool:
    """Whether a node may take placements as far as its launch failures go."""
    return unhealthy_until <= now
