"""Crius takes an opaque job's Cells at exactly the GPUs it asked for (controller/core/policies/crius.py
`target_cells`): its reasons listed half and twice the count ("no feasible Cell among 2 x A10-24GB,
5 x A10-24GB (out of memory or ...)") for a job that runs on exactly 5 and has no memory figure (a
live audit). Literal snapshots."""

from __future__ import annotations

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.opaque import OpaqueAware
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import plan_round
from tessera.controller.core.snapshot import GpuView, JobView, NodeView, PendingKind, Snapshot
from tessera.estimator.models import ModelDims

GB = 1000**3
A10 = "A10-24GB"
M = ModelDims(768, 12, 12, 50257, 1024, "m")
NODES = tuple(NodeView(n, tuple(GpuView(i, A10, 24 * GB) for i in range(4))) for n in ("a", "b"))


def decide(gpus: int) -> tuple[str, PendingKind | None, str]:
    job = JobView("o", 0.0, M, 1, gpus, (A10,), opaque=True)
    (d,) = plan_round(Snapshot(NODES, (job,), ((A10, 24 * GB, 8),)), OpaqueAware(TableEstimates({})),
                      make_policy("crius")).decisions
    return d.action.value, d.pending, d.reason


def test_an_opaque_count_no_layout_holds_is_named_alone_and_without_memory() -> None:
    assert decide(5) == ("pending", PendingKind.FITS_NOWHERE, "crius: fits nowhere: no node layout holds 5 x A10-24GB evenly")
    assert decide(6)[0] == decide(3)[0] == "start"
