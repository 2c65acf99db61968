"""RoundContext.ideal_nodes: the node count of the fewest-node even layout of a gang
(placement.quotas, as ClusterState.place lays it out), not ceil(gpus / GPUs per node)."""

from __future__ import annotations

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.placement import ClusterState
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import CellEstimate, RoundConfig, RoundContext, plan_round
from tessera.controller.core.snapshot import GpuView, JobView, NodeView, Slice, Snapshot
from tessera.estimator.models import ModelDims

GB = 1000**3
M = ModelDims(64, 2, 4, 256, 64, "m")


def nodes(count: int, per_node: int) -> tuple[NodeView, ...]:
    return tuple(NodeView(f"n{i}", tuple(GpuView(g, "X", 40 * GB) for g in range(per_node))) for i in range(count))


class _EvenOnly(TableEstimates):
    """Cells only for an even spread of the GPUs over the nodes (as every real estimator)."""

    def cells(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> tuple[CellEstimate, ...]:
        return tuple(super().cells(job, gpu_type, gpus, nodes)) if nodes >= 1 and gpus % nodes == 0 else ()


def test_ideal_nodes_is_the_even_layout_of_placement() -> None:
    two = RoundContext(Snapshot(nodes(3, 2), (), (("X", 40 * GB, 6),)), TableEstimates({}), RoundConfig())
    # 3 GPUs on 2-GPU nodes: 1 + 1 + 1 on three nodes (ceil(3 / 2) = 2 nodes cannot split evenly);
    # 5 would need five nodes of 1: three nodes hold no even layout of 5 (the fallback below).
    assert [two.ideal_nodes("X", n) for n in (1, 2, 3, 4, 5, 6)] == [1, 1, 3, 2, 3, 3]
    assert ClusterState.from_nodes(nodes(3, 2)).place("X", 3) == tuple(Slice(f"n{i}", (0,)) for i in range(3))
    four = RoundContext(Snapshot(nodes(4, 4), (), (("X", 40 * GB, 16),)), TableEstimates({}), RoundConfig())
    assert [four.ideal_nodes("X", n) for n in (4, 6, 8, 12, 16)] == [1, 2, 2, 3, 4]
    assert two.ideal_nodes("Y", 2) == 0  # no such type
    # The even layout must be one the nodes hold: 12 GPUs on one 8-GPU and two 4-GPU nodes are
    # 3 x 4 (two nodes of 6 do not exist), as placement lays them out.
    mixed = nodes(1, 8) + tuple(NodeView(f"m{i}", tuple(GpuView(g, "X", 40 * GB) for g in range(4))) for i in range(2))
    ctx = RoundContext(Snapshot(mixed, (), (("X", 40 * GB, 16),)), TableEstimates({}), RoundConfig())
    assert ctx.ideal_nodes("X", 12) == 3 == len(ClusterState.from_nodes(mixed).place("X", 12) or ())
    # No even layout at all (5 GPUs on two 4-GPU nodes): the fewest nodes by count, which no Cell covers.
    few = RoundContext(Snapshot(nodes(2, 4), (), (("X", 40 * GB, 8),)), TableEstimates({}), RoundConfig())
    assert few.ideal_nodes("X", 5) == 2 and ClusterState.from_nodes(nodes(2, 4)).place("X", 5) is None


def test_a_three_gpu_gang_starts_on_three_idle_two_gpu_nodes() -> None:
    est = _EvenOnly({("k", "X", 3): 1.0})
    j = JobView("j", 0.0, M, 16, gpus_hint=3, gpu_type_hint="X", estimate_key="k")
    snap = Snapshot(nodes(3, 2), (j,), (("X", 40 * GB, 6),))
    for pol in ("fcfs", "gavel", "gandiva"):
        (d,) = plan_round(snap, est, make_policy(pol)).decisions
        assert d.action == "start", (pol, d.reason)
        assert d.slices == tuple(Slice(f"n{i}", (0,)) for i in range(3))
