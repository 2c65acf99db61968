"""A worker's progress numbers are its own: the agent and the controller clear the unusable ones
(common/progress.py), and tessctl shows "-" for any time it cannot print rather than stopping."""

from __future__ import annotations

import math

import pytest

from tessera.clients import output, waiting
from tessera.clients.output_forecast import clock
from tessera.common.progress import sanitized
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2


def test_sound_progress_is_kept_as_is() -> None:
    p = P.Progress(iteration=7, samples_per_second=80.0, loss=1.25, step_time_seconds=0.5, time=1e9,
                   checkpoint_iteration=-1)
    assert sanitized(p) is p


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, -1.0])
def test_rates_and_times_that_are_no_numbers_are_cleared(bad: float) -> None:
    p = P.Progress(iteration=7, samples_per_second=bad, loss=bad, step_time_seconds=bad, time=bad,
                   checkpoint_iteration=-1)
    s = sanitized(p)
    assert (s.samples_per_second, s.step_time_seconds, s.time) == (0.0, 0.0, 0.0)
    assert s.iteration == 7 and s.checkpoint_iteration == -1
    assert s.loss == bad or (math.isnan(bad) and math.isnan(s.loss))  # a diverged loss is news, kept
    assert p.step_time_seconds == bad or math.isnan(p.step_time_seconds)  # the report itself untouched


def test_negative_counts_are_cleared() -> None:
    s = sanitized(P.Progress(iteration=-5, peak_memory_bytes=-1))
    assert (s.iteration, s.peak_memory_bytes) == (0, 0)


@pytest.mark.parametrize("t", [math.inf, math.nan, 5e18, 1e300])
def test_tessctl_prints_a_dash_for_a_time_it_cannot_show(t: float) -> None:
    assert output.age(t, 1e9) in ("-", "0s")
    assert output._fmt_time(t) == "-"
    assert clock(t, 1e9) == "-"


def test_wait_shows_no_rate_for_an_infinite_step_time() -> None:
    """Before: ZeroDivisionError (rate = 1/inf = 0, then remaining / rate), exit 1 while the job ran."""
    job = controller_pb2.Job(spec=P.JobSpec(iterations=10),
                             progress=P.Progress(iteration=3, step_time_seconds=math.inf))
    assert waiting.progress_text(job) == "3/10 (30%)"
