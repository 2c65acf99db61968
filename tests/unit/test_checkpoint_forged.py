"""A rank's checkpoint_iteration is its own number: kept in -1 (none yet)..iteration by
common/progress.py, so a forged one cannot serve the agent's pending checkpoint request; a report
that leaves it unset claims none.

Before: the supervisor compared the raw report with the request's floor, and nothing bounded it, so
any rank reporting checkpoint_iteration=2**62 cleared its job's request without checkpointing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.common.progress import sanitized
from tessera.nodeagent.supervisor import Supervisor
from tessera.nodeagent.workers import Attempt, Worker
from tessera.v1 import common_pb2 as P


@pytest.mark.parametrize(("iteration", "checkpoint", "kept"), [
    (7, 2**62, 7), (7, 8, 7), (7, -5, -1), (7, -2**63, -1), (-3, 4, 0), (0, 0, 0),
])
def test_a_checkpoint_is_kept_between_none_and_the_reported_iteration(iteration: int, checkpoint: int,
                                                                      kept: int) -> None:
    p = P.Progress(iteration=iteration, checkpoint_iteration=checkpoint, loss=1.5)
    s = sanitized(p)
    assert (s.iteration, s.checkpoint_iteration, s.loss) == (max(0, iteration), kept, 1.5)
    assert p.checkpoint_iteration == checkpoint  # the report itself untouched


@pytest.mark.parametrize("checkpoint", [-1, 0, 6, 7])
def test_a_sound_checkpoint_is_kept_as_is(checkpoint: int) -> None:
    p = P.Progress(iteration=7, checkpoint_iteration=checkpoint)
    assert sanitized(p) is p


def _running(tmp_path: Path) -> Supervisor:
    """A supervisor with one running rank of job-1 attempt 1 (no process: report_progress reads the record)."""
    sup = Supervisor(tmp_path, range(1), declared=True)
    w = Worker("job-1", 1, 0, 0, (0,), tmp_path / "rank-0.log")
    sup._attempts[("job-1", 1)] = Attempt("job-1", 1, 1, [w])
    return sup


def test_a_forged_checkpoint_does_not_serve_a_pending_request(tmp_path: Path) -> None:
    sup = _running(tmp_path)
    assert sup.report_progress("job-1", 1, 0, P.Progress(iteration=5, checkpoint_iteration=5)) == (False, False)
    assert sup.request_checkpoint("job-1", 1)  # the floor: the checkpoint at 5
    forged = P.Progress(iteration=5, checkpoint_iteration=2**62)
    assert sup.report_progress("job-1", 1, 0, forged) == (True, False)  # before: (False, False), served
    assert sup.statuses()[0].progress.checkpoint_iteration == 5  # what the controller is told, too
    assert sup.report_progress("job-1", 1, 0, None) == (True, False)
    # a real checkpoint past the floor (at the iteration reported) serves it
    assert sup.report_progress("job-1", 1, 0, P.Progress(iteration=6, checkpoint_iteration=6)) == (False, False)


def test_a_report_that_does_not_say_claims_no_checkpoint(tmp_path: Path) -> None:
    """Before: an unset field read as proto3's 0, i.e. a checkpoint at iteration 0, so the first
    report of a client built without the SDK served a checkpoint request no rank had answered."""
    assert sanitized(P.Progress(iteration=5)).checkpoint_iteration == -1
    assert sanitized(P.Progress(iteration=5, checkpoint_iteration=0)).checkpoint_iteration == 0  # said: kept
    sup = _running(tmp_path)
    assert sup.request_checkpoint("job-1", 1)  # no rank has reported: the floor is -1
    assert sup.report_progress("job-1", 1, 0, P.Progress(iteration=5)) == (True, False)  # before: (False, False)
    assert sup.statuses()[0].progress.checkpoint_iteration == -1
    assert sup.report_progress("job-1", 1, 0, P.Progress(iteration=5, checkpoint_iteration=0)) == (False, False)
