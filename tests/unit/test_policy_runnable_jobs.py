"""Each root cause that left Morphling's jobs that fit the cluster never started, pinned on literal
clusters and estimates (docs/simulator.md, "Jobs never started")."""

from __future__ import annotations

from collections.abc import Sequence

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policies.sia import COUNTS, sia_counts
from tessera.controller.core.policy import CellEstimate, plan_round
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    Decision,
    GpuView,
    JobView,
    NodeView,
    PendingKind,
    Slice,
    Snapshot,
)
from tessera.estimator.models import ModelDims

GB = 1000**3
M = ModelDims(64, 2, 4, 256, 64, "m")


def node(nid: str, n: int = 8, busy: tuple[int, ...] = (), model: str = "X", mem_gb: int = 80) -> NodeView:
    return NodeView(nid, tuple(GpuView(i, model, mem_gb * GB) for i in range(n)), frozenset(busy))


def cluster(nodes: Sequence[NodeView]) -> tuple[tuple[str, int, int], ...]:
    return (("X", 80 * GB, sum(len(n.gpus) for n in nodes)),)


def job(jid: str, key: str, gpus: int, batch: int = 1, t: float = 0.0) -> JobView:
    # Morphling's trace carries no global batch (1): MARP's DP degree must divide it.
    return JobView(jid, t, M, batch, gpus, (), "X", 1000, estimate_key=key)


def by_id(decisions: tuple[Decision, ...]) -> dict[str, Decision]:
    return {d.job_id: d for d in decisions}


def snap(nodes: Sequence[NodeView], *jobs: JobView) -> Snapshot:
    return Snapshot(tuple(nodes), jobs, cluster(nodes), arrivals=tuple(j.id for j in jobs))


# ---------------------------------------------------------------- Sia: configurations beyond 16 GPUs

def test_sia_configurations_are_sias_own_set() -> None:
    # sia-simulator CONFIGS_8GPU: 1, 2, 4, 8, then whole nodes, up to the type's GPUs
    assert sia_counts(8, 64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert sia_counts(4, 16) == (1, 2, 4, 8, 12, 16)
    assert sia_counts(8, 4) == (1, 2, 4)
    assert COUNTS == (1, 2, 4, 8, 16)  # the Crius artifact's SiaSched keeps its own


def test_sia_paper_starts_a_job_that_needs_24_gpus() -> None:
    # LLaMA-30B on Morphling's cluster runs on 24 GPUs at least; 1..16 had no configuration.
    est = TableEstimates({("big", "X", 24): 3.0, ("big", "X", 48): 2.0})
    nodes = [node(f"n{i}") for i in range(4)]
    d = by_id(plan_round(snap(nodes, job("B", "big", 24)), est, make_policy("sia", "paper")).decisions)["B"]
    assert d.action is Action.START and d.cell == Cell("X", 24)
    assert [len(s.gpu_indices) for s in d.slices] == [8, 8, 8]
    art = by_id(plan_round(snap(nodes, job("B", "big", 24)), est, make_policy("sia", "artifact")).decisions)["B"]
    assert art.action is not Action.START


# ---------------------------------------------------------------- ElasticFlow: shares beyond 16 GPUs

def test_elasticflow_paper_admits_a_job_whose_smallest_share_is_32() -> None:
    est = TableEstimates({("big", "X", 32): 2.0})
    nodes = [node(f"n{i}") for i in range(4)]
    for name in ("elasticflow", "elasticflow-l"):
        d = by_id(plan_round(snap(nodes, job("B", "big", 32)), est, make_policy(name, "paper")).decisions)["B"]
        assert d.action is Action.START and d.cell == Cell("X", 32), (name, d.reason)
    # the artifact caps shares at 16: the job waits there, as before
    art = by_id(plan_round(snap(nodes, job("B", "big", 32)), est,
                           make_policy("elasticflow-l", "artifact")).decisions)["B"]
    assert art.action is Action.PENDING


# ---------------------------------------------------------------- Frenzy: no MARP plan, but a Cell

def test_frenzy_starts_a_job_marp_has_no_plan_for_on_a_cell_of_the_estimates() -> None:
    # Global batch 1 and 24 GPUs asked: DP must divide 1 and TP 24 is not in (1, 2, 4, 8), so MARP
    # has no plan; the estimates run it on 24 GPUs. n0 has 2 GPUs taken: best fit is n1..n3.
    est = TableEstimates({("big", "X", 24): 3.0})
    nodes = [node("n0", busy=(0, 1)), node("n1"), node("n2"), node("n3")]
    d = by_id(plan_round(snap(nodes, job("B", "big", 24)), est, make_policy("frenzy")).decisions)["B"]
    assert d.action is Action.START and d.cell == Cell("X", 24) and d.iteration_s == 3.0
    assert d.slices == tuple(Slice(f"n{i}", tuple(range(8))) for i in (1, 2, 3))
    assert "no MARP plan" in d.reason and "24 x X" in d.reason


def test_frenzy_fallback_keeps_submission_order_and_waits_when_nothing_is_free() -> None:
    est = TableEstimates({("big", "X", 16): 3.0, ("small", "X", 1): 1.0})
    nodes = [node("n0"), node("n1", busy=(0,))]
    # The 16-GPU job came first but only 15 GPUs are free: it waits (not "fits nowhere"), and the
    # 1-GPU job behind it backfills (MARP plans it: dp 1, tp 1).
    plan = by_id(plan_round(snap(nodes, job("B", "big", 16), job("S", "small", 1, t=1.0)), est,
                            make_policy("frenzy")).decisions)
    assert plan["B"].action is Action.PENDING and plan["B"].pending is PendingKind.NO_ROOM_NOW
    assert "16 x X" in plan["B"].reason
    assert plan["S"].action is Action.START


def test_frenzy_job_the_estimates_cannot_run_stays_fits_nowhere() -> None:
    est = TableEstimates({("other", "X", 24): 3.0})
    nodes = [node(f"n{i}") for i in range(4)]
    d = by_id(plan_round(snap(nodes, job("B", "big", 24)), est, make_policy("frenzy")).decisions)["B"]
    assert d.action is Action.PENDING and d.pending is PendingKind.FITS_NOWHERE


class SpreadEstimates(TableEstimates):
    """Times 8 GPUs only as 2 nodes x 4 (a measured placement table, like Morphling's, covers some
    spreads and not others)."""

    def cells(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> Sequence[CellEstimate]:
        return super().cells(job, gpu_type, gpus, nodes) if nodes == 2 else ()


def test_frenzy_fallback_places_only_on_a_spread_the_estimates_cover() -> None:
    est = SpreadEstimates({("big", "X", 8): 2.0})
    nodes = [node("n0"), node("n1")]
    d = by_id(plan_round(snap(nodes, job("B", "big", 8)), est, make_policy("frenzy")).decisions)["B"]
    # one node holds all 8, but the estimates time 8 GPUs only on 2 nodes
    assert d.action is Action.START
    assert [len(s.gpu_indices) for s in d.slices] == [4, 4]


def test_frenzy_does_not_place_marp_plans_where_the_estimates_cannot_run_the_job() -> None:
    # MARP's memory fit puts the job on the type with the least memory (SMALL); the estimates (the
    # arena table: over 300 s per iteration there, say) time it only on BIG. Before, the job held
    # SMALL's GPU without progress to the end of the run (43 jobs in 24 h of Philly).
    nodes = [node("s0", 2, model="SMALL", mem_gb=40), node("b0", 2, model="BIG")]
    cl = (("BIG", 80 * GB, 2), ("SMALL", 40 * GB, 2))
    j = JobView("J", 0.0, M, 16, 1, estimate_key="k")
    s = Snapshot(tuple(nodes), (j,), cl, arrivals=("J",))
    d = by_id(plan_round(s, TableEstimates({("k", "BIG", 1): 1.0}), make_policy("frenzy")).decisions)["J"]
    assert d.action is Action.START and d.cell is not None and d.cell.gpu_type == "BIG" and d.slices[0].node_id == "b0"
    # a job the estimates know nothing of keeps MARP's placement: HAS's least sufficient memory
    d0 = by_id(plan_round(s, TableEstimates({}), make_policy("frenzy")).decisions)["J"]
    assert d0.action is Action.START and d0.slices[0].node_id == "s0"
    # the runnable type busy: the job waits for it instead of taking SMALL
    busy = Snapshot((nodes[0], node("b0", 2, busy=(0, 1), model="BIG")), (j,), cl, arrivals=("J",))
    w = by_id(plan_round(busy, TableEstimates({("k", "BIG", 1): 1.0}), make_policy("frenzy")).decisions)["J"]
    assert w.action is Action.PENDING and w.pending is PendingKind.NO_ROOM_NOW
    assert "estimates cannot run it on" in w.reason and "1 x BIG" in w.reason
