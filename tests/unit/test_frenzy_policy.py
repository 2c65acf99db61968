"""MARP and HAS on literal clusters, with golden outputs."""

from __future__ import annotations

from tessera.controller.core.frenzy import (
    GIB,
    FrenzyConfig,
    ResourcePlan,
    has_place,
    plan_round,
    resource_plans,
)
from tessera.controller.core.snapshot import GpuView, JobView, NodeView, PendingKind, Slice, Snapshot
from tessera.estimator.memory import marp_memory, marp_params
from tessera.estimator.models import REGISTERED, ModelDims

GB = 1000**3
CFG = FrenzyConfig()


def node(nid: str, model: str, mem_gb: int, n: int, busy: tuple[int, ...] = ()) -> NodeView:
    return NodeView(nid, tuple(GpuView(i, model, mem_gb * GB) for i in range(n)), frozenset(busy))


def cluster(*nodes: NodeView) -> tuple[tuple[str, int, int], ...]:
    tot: dict[tuple[str, int], int] = {}
    for n in nodes:
        for g in n.gpus:
            tot[(g.model, g.memory_bytes)] = tot.get((g.model, g.memory_bytes), 0) + 1
    return tuple(sorted((m, b, c) for (m, b), c in tot.items()))


TINY = ModelDims(64, 2, 4, 256, 64, "tiny")


def job(jid: str, model: ModelDims = TINY, batch: int = 16, t: float = 0.0, gpus: int = 0,
        types: tuple[str, ...] = ()) -> JobView:
    return JobView(jid, t, model, batch, gpus, types)


def test_marp_formula_golden() -> None:
    m = REGISTERED["gpt2-small"]
    # W = V h + l (12 h^2 + 13 h), by hand: 50257*768 + 12*(12*768^2 + 13*768)
    assert marp_params(m) == 123_651_840
    est = marp_memory(m, micro_batch=8, tp=1)
    assert est.static_bytes == 20 * 123_651_840
    # s b h l (10 + 24/t + 5 a s / (h t)) = 1024*8*768*12*(10 + 24 + 80)
    assert est.activation_bytes == 1024 * 8 * 768 * 12 * 114
    half = marp_memory(m, micro_batch=8, tp=2)
    assert half.static_bytes == est.static_bytes // 2


def test_resource_plans_ranked_fewest_gpus_then_smallest_tp() -> None:
    plans = resource_plans(job("a", batch=4), max_gpus=8, cfg=CFG)
    assert [(p.dp, p.tp) for p in plans][:6] == [(1, 1), (2, 1), (1, 2), (4, 1), (2, 2), (1, 4)]
    assert all(4 % p.dp == 0 for p in plans)
    hinted = resource_plans(job("a", batch=4, gpus=4), max_gpus=8, cfg=CFG)
    assert {(p.dp, p.tp) for p in hinted} == {(4, 1), (2, 2), (1, 4)}


def test_has_prefers_single_node_smallest_memory_then_best_fit() -> None:
    nodes = (node("a100", "A100-80GB", 80, 4), node("a40", "A40-48GB", 48, 2), node("a10", "A10-24GB", 24, 4),
             node("a10b", "A10-24GB", 24, 4, busy=(0, 1)))
    plan = ResourcePlan(dp=2, tp=1, micro_batch=8, bytes_per_gpu=5 * GIB)
    # Smallest sufficient memory is A10; among A10 nodes the one with fewest free GPUs that fit (a10b: 2).
    assert has_place(plan, nodes, (), CFG) == (Slice("a10b", (2, 3)),)
    big = ResourcePlan(dp=2, tp=1, micro_batch=8, bytes_per_gpu=30 * GIB)
    assert has_place(big, nodes, (), CFG) == (Slice("a40", (0, 1)),)
    only = ResourcePlan(dp=1, tp=1, micro_batch=8, bytes_per_gpu=5 * GIB)
    assert has_place(only, nodes, ("A100-80GB",), CFG) == (Slice("a100", (0,)),)


def test_has_multi_node_greedy_whole_gang_or_nothing() -> None:
    nodes = (node("a100", "A100-80GB", 80, 4), node("a40", "A40-48GB", 48, 2), node("a10", "A10-24GB", 24, 4))
    six = ResourcePlan(dp=6, tp=1, micro_batch=4, bytes_per_gpu=1 * GIB)
    # No node has 6 and no GPU model has 6 free: a gang never mixes models (one Cell, one type).
    assert has_place(six, nodes, (), CFG) is None
    # Two A10 nodes and two A100 nodes hold 6: greedily the most free inside the model with the
    # least sufficient memory, then the rest.
    more = (*nodes, node("a10b", "A10-24GB", 24, 4, busy=(0,)), node("a100b", "A100-80GB", 80, 4))
    assert has_place(six, more, (), CFG) == (Slice("a10", (0, 1, 2, 3)), Slice("a10b", (1, 2)))
    eleven = ResourcePlan(dp=11, tp=1, micro_batch=1, bytes_per_gpu=1 * GIB)
    assert has_place(eleven, nodes, (), CFG) is None
    # A TP group never straddles nodes: 3 free on one node holds only one TP-2 group.
    odd = (node("x", "A10-24GB", 24, 4, busy=(0,)), node("y", "A10-24GB", 24, 4, busy=(0,)))
    tp2 = ResourcePlan(dp=2, tp=2, micro_batch=1, bytes_per_gpu=1 * GIB)
    assert has_place(tp2, odd, (), CFG) == (Slice("x", (1, 2)), Slice("y", (1, 2)))


def test_plan_round_places_in_submission_order_with_backfill() -> None:
    nodes = (node("a100", "A100-80GB", 80, 4), node("a10", "A10-24GB", 24, 4), node("a10b", "A10-24GB", 24, 4))
    huge = ModelDims(25600, 128, 160, 50257, 2048, "huge")
    snap = Snapshot(nodes, (job("j2", t=2.0), job("j1", t=1.0), job("big", model=huge, t=0.5),
                            job("wide", t=3.0, gpus=6, batch=24)), cluster(*nodes))
    rp = plan_round(snap, CFG)
    by = {d.job_id: d for d in rp.decisions}
    assert [d.job_id for d in rp.decisions] == ["big", "j1", "j2", "wide"]
    assert by["big"].action == "pending" and "fits nowhere" in by["big"].reason
    assert by["big"].pending is PendingKind.FITS_NOWHERE and by["j1"].pending is None
    assert "4 x A100-80GB" in by["big"].reason and "8 x A10-24GB" in by["big"].reason
    assert by["j1"].action == "start" and by["j1"].slices == (Slice("a10", (0,)),)
    assert by["j2"].slices == (Slice("a10", (1,)),)
    assert by["j1"].plan is not None and (by["j1"].plan.dp, by["j1"].plan.tp) == (1, 1)
    # 6 GPUs: a10 has 2 left, a10b 4: greedy multi-node inside one model, whole gang.
    assert by["wide"].action == "start"
    assert by["wide"].slices == (Slice("a10b", (0, 1, 2, 3)), Slice("a10", (2, 3)))
    assert "multi-node" in by["wide"].reason


def test_pending_reasons() -> None:
    nodes = (node("a10", "A10-24GB", 24, 2, busy=(0, 1)),)
    snap = Snapshot(nodes, (job("w"), job("many", gpus=8)), cluster(*nodes))
    by = {d.job_id: d for d in plan_round(snap, CFG).decisions}
    assert by["w"].action == "pending" and by["w"].reason.startswith("waiting for GPUs")
    assert by["many"].reason == "asks for 8 GPUs; the cluster has 2: 2 x A10-24GB (22.4 GiB)"
    # More GPUs than the cluster has can never run; waiting for busy GPUs is no room now.
    assert (by["w"].pending, by["many"].pending) == (PendingKind.NO_ROOM_NOW, PendingKind.FITS_NOWHERE)
    empty = {d.job_id: d for d in plan_round(Snapshot((), (job("w"),), ()), CFG).decisions}
    assert (empty["w"].reason, empty["w"].pending) == ("waiting for nodes: no GPUs registered",
                                                       PendingKind.NO_ROOM_NOW)


def test_foreign_memory_and_reserve_count() -> None:
    g = GpuView(0, "A10-24GB", 24 * GB, foreign_used_bytes=20 * GIB)  # 24 GB - 20 GiB = 2.53 GB usable
    nodes = (NodeView("n", (g,)),)
    plan = ResourcePlan(1, 1, 1, 2 * GIB)
    assert has_place(plan, nodes, (), CFG) is None
    assert has_place(plan, nodes, (), FrenzyConfig(reserve_bytes=0)) == (Slice("n", (0,)),)
