"""Every policy keeps a job to the GPU types it names (`gpu_types`), in both modes. A review found
gavel start a job restricted to H100-80GB on A100-80GB (its throughput tables spanned every type),
elasticflow likewise, and sia's artifact admission move a running H100-only job to A100. Literal
snapshots and a literal table of iteration times."""

from __future__ import annotations

import pytest

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import plan_round
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    GpuView,
    JobView,
    NodeView,
    PendingKind,
    RunningView,
    Slice,
    Snapshot,
)
from tessera.estimator.models import ModelDims

GB = 1000**3
A100, H100 = "A100-80GB", "H100-80GB"
M = ModelDims(1024, 24, 16, 32000, 1024, "m")
EST = TableEstimates({("k", t, n): (4.0 if t == A100 else 2.0) / n for t in (A100, H100) for n in (1, 2, 4)})
A = NodeView("a", tuple(GpuView(i, A100, 80 * GB) for i in range(4)))
H_BUSY = NodeView("h", tuple(GpuView(i, H100, 80 * GB) for i in range(4)), frozenset(range(4)))
CLUSTER = ((A100, 80 * GB, 4), (H100, 80 * GB, 4))


def holder() -> RunningView:
    j = JobView("holder", 0.0, M, 64, 4, (H100,), estimate_key="k")
    return RunningView(j, Cell(H100, 4, 1), (Slice("h", (0, 1, 2, 3)),))


@pytest.mark.parametrize("mode", ["paper", "artifact"])
def test_a_job_that_names_h100_never_starts_on_a100(mode: str) -> None:
    job = JobView("j", 1.0, M, 64, 2, (H100,), estimate_key="k")
    snap = Snapshot((A, H_BUSY), (job,), CLUSTER, (holder(),))
    got = {d.job_id: d for d in plan_round(snap, EST, make_policy("gavel", mode)).decisions}
    d = got["j"]
    assert d.action is not Action.START or all(s.node_id == "h" for s in d.slices), d
    assert d.action is Action.PENDING and d.pending is not PendingKind.FITS_NOWHERE, d
    # The holder is not moved to A100 to make room either: it names H100 too.
    assert got["holder"].action is Action.KEEP, got["holder"]
    # Without the restriction it runs on the free A100.
    free = JobView("f", 1.0, M, 64, 2, (), estimate_key="k")
    (d,) = [x for x in plan_round(Snapshot((A, H_BUSY), (free,), CLUSTER, (holder(),)), EST,
                                  make_policy("gavel", mode)).decisions if x.job_id == "f"]
    assert d.action is Action.START and d.cell is not None and d.cell.gpu_type == A100


NAMES = ["crius", "crius-ddl", "crius-na", "crius-nh", "crius-no", "fcfs", "frenzy", "gavel", "gandiva", "sia",
         "morphling", "elasticflow", "elasticflow-l"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", ["paper", "artifact"])
@pytest.mark.parametrize("hint", [2, 0])
def test_no_policy_runs_a_job_on_a_type_it_does_not_name(name: str, mode: str, hint: int) -> None:
    job = JobView("j", 1.0, M, 64, hint, (H100,), estimate_key="k", iterations=100, deadline=1e9)
    snap = Snapshot((A, H_BUSY), (job,), CLUSTER, (holder(),))
    for d in plan_round(snap, EST, make_policy(name, mode)).decisions:
        if d.action in (Action.START, Action.MIGRATE):
            assert d.cell is not None and d.cell.gpu_type == H100, (d.job_id, d.reason)
