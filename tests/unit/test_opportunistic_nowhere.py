"""A job that fits nowhere makes no later job opportunistic (controller/core/policies/common.py
`Board.earliest_waiting`): it can never start, so there is nothing to give way to. A live audit saw
every placement read "opportunistic: an earlier job is still waiting" behind a job too large for any
GPU (and such jobs marked suspendable for it). Literal snapshot and table."""

from __future__ import annotations

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import plan_round
from tessera.controller.core.snapshot import Action, GpuView, JobView, NodeView, PendingKind, Snapshot
from tessera.estimator.models import ModelDims

GB = 1000**3
M = ModelDims(1024, 24, 16, 32000, 1024, "m")
EST = TableEstimates({("k", "A100-80GB", n): 4.0 / n for n in (1, 2, 4)})  # "none" has no Cell at all


def test_a_job_that_fits_nowhere_makes_no_later_one_opportunistic() -> None:
    node = NodeView("a", tuple(GpuView(i, "A100-80GB", 80 * GB) for i in range(4)))
    big = JobView("big", 0.0, M, 64, 0, (), estimate_key="none")
    small = JobView("small", 1.0, M, 64, 0, (), estimate_key="k")
    got = {d.job_id: d for d in plan_round(Snapshot((node,), (big, small), (("A100-80GB", 80 * GB, 4),)), EST,
                                           make_policy("crius")).decisions}
    assert got["big"].pending is PendingKind.FITS_NOWHERE
    assert got["small"].action is Action.START and not got["small"].opportunistic
    assert "opportunistic" not in got["small"].reason
