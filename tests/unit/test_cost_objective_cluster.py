"""The cost pass's whole-cluster question (controller/core/cost_objective.py `_infeasible`): asked
when no GPU the job may use is free too, with the memory the registered records declare for a type
whose nodes are not READY, and a type only on such nodes needing no price. A live audit found a
job whose SLO no plan meets "waiting for GPUs" while every GPU was busy, its best time quoted for an
A40 of the catalog's 48 GB whose node (declaring 1.63 GB) was down, and a down T4 without a price
holding every unrestricted cost job."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from tessera.controller.core import cost_objective as co
from tessera.controller.core.snapshot import (
    Action,
    GpuView,
    JobView,
    NodeView,
    Objective,
    PendingKind,
    Snapshot,
)
from tessera.controller.registry import LiveNode
from tessera.controller.snapshots import build_snapshot
from tessera.controller.store import JobRecord, NodeRecord
from tessera.estimator.cells import CellModel
from tessera.estimator.cost_tree import GpuOffer, NoFeasiblePlan
from tessera.estimator.models import ModelDims
from tessera.v1 import agent_pb2
from tessera.v1 import common_pb2 as P
from tests.unit.test_cost_objective_texts import Plan, Stage

A10, A40, A100, T4 = "A10-24GB", "A40-48GB", "A100-80GB", "T4-16GB"
DECLARED = 1_630_000_000  # the e2e's inventories: memory_gb 1.63
TINY = ModelDims(64, 12, 4, 256, 64, "tiny")
PRICES = ((A10, 1.0), (A40, 2.0), (A100, 4.0))
WHY = "slo_s: no allocation of 2 GPU type(s) runs 100 iterations within 10 s; the fastest takes 812.0 s (x)"


# One A10 stage of the whole model, whose whole run takes 50 s at 0.07 (the reasons below quote it).
WHOLE = Plan((Stage(A10, 1, 0, 12),), iter_time_s=0.5, total_time_s=50.0, cost=0.07)


class Asked:
    """A solver giving one answer (raising a NoFeasiblePlan), recording the offers of each call."""

    def __init__(self, answer: Plan | NoFeasiblePlan) -> None:
        self.answer = answer
        self.offers: list[list[GpuOffer]] = []

    def __call__(self, model: CellModel, offers: Sequence[GpuOffer], iterations: int, slo_s: float) -> Plan:
        self.offers.append(list(offers))
        if isinstance(self.answer, NoFeasiblePlan):
            raise self.answer
        return self.answer


def _job(slo_s: float = 10.0, **kw: object) -> JobView:
    return JobView("c", 0.0, TINY, 16, iterations=100, objective=Objective.COST, slo_s=slo_s, **kw)  # type: ignore[arg-type]


def _busy_snap(cluster: tuple[tuple[str, int, int], ...] = ((A10, 24 * 10**9, 2), (A100, 24 * 10**9, 1)),
               prices: tuple[tuple[str, float], ...] = PRICES) -> Snapshot:
    nodes = (NodeView("a10", tuple(GpuView(i, A10, 24 * 10**9) for i in range(2)), frozenset({0, 1})),
             NodeView("a100", (GpuView(0, A100, 24 * 10**9),), frozenset({0})))
    return Snapshot(nodes, (), cluster, (), prices=prices)


def test_with_every_gpu_busy_an_slo_no_plan_meets_is_said_at_once() -> None:
    # It read "waiting for GPUs: none of the types it may use is free" until a GPU was free.
    solver = Asked(NoFeasiblePlan(812.0, WHY))
    (d,), _ = co.place(_busy_snap(), (_job(),), solver)
    assert d.action is Action.PENDING and d.pending is PendingKind.FITS_NOWHERE
    assert d.reason == ("no plan meets the SLO (10 s for 100 iterations) even on the whole cluster: the best any "
                        f"plan reaches is 812 s ({WHY})")
    assert [[(o.gpu_type, o.quota) for o in offers] for offers in solver.offers] == [[(A10, 2), (A100, 1)]]


def test_with_every_gpu_busy_a_job_the_cluster_could_run_waits_saying_what_it_would_reach() -> None:
    (d,), _ = co.place(_busy_snap(), (_job(slo_s=3600.0),), Asked(WHOLE))
    assert d.pending is PendingKind.NO_ROOM_NOW
    assert d.reason == "waiting for GPUs: none of the types it may use is free; the whole cluster would (50 s at 0.0700)"


def test_with_every_gpu_busy_a_model_no_gpu_holds_is_said_so() -> None:
    (d,), _ = co.place(_busy_snap(), (_job(),), Asked(NoFeasiblePlan(math.inf, "no allocation holds tiny")))
    assert d.pending is PendingKind.FITS_NOWHERE
    assert d.reason == "no plan fits in memory, even on the whole cluster: no allocation holds tiny"


def test_the_whole_cluster_offers_a_type_of_nodes_not_ready_at_the_memory_its_records_declare() -> None:
    # An A40 only on a node that is down: the catalog's 48 GB (offer memory 0) stood for its 1.63 GB.
    cluster = ((A10, 24 * 10**9, 2), (A100, 24 * 10**9, 1), (A40, DECLARED, 1))
    solver = Asked(NoFeasiblePlan(812.0, WHY))
    co.place(_busy_snap(cluster), (_job(),), solver)
    (whole,) = solver.offers
    assert {o.gpu_type: o.memory_bytes for o in whole}[A40] == DECLARED
    # A READY type: the least of what its nodes report and what the records declare.
    held = (NodeView("a10", (GpuView(0, A10, 24 * 10**9, foreign_used_bytes=4 * 10**9),)),)
    for declared, least in ((2 * 10**9, 2 * 10**9), (24 * 10**9, 20 * 10**9), (None, 20 * 10**9)):
        got = co._offer(A10, 1.0, 3, held, declared)
        assert got is not None and got.memory_bytes == least


def test_a_type_only_on_nodes_not_ready_needs_no_price() -> None:
    # A down T4 without a price held every unrestricted cost job until the node was deleted.
    nodes = (NodeView("a10", tuple(GpuView(i, A10, 24 * 10**9) for i in range(2))),)
    snap = Snapshot(nodes, (), ((A10, 24 * 10**9, 2), (T4, 16 * 10**9, 4)), (), prices=((A10, 1.0),))
    (d,), _ = co.place(snap, (_job(slo_s=3600.0),), Asked(WHOLE))
    assert d.action is Action.START, d.reason
    # On a READY node it still does: the job may use it, and without a price no plan can weigh it.
    ready = Snapshot((*nodes, NodeView("t4", (GpuView(0, T4, 16 * 10**9),))), (), snap.cluster_gpus, (),
                     prices=((A10, 1.0),))
    (d,), _ = co.place(ready, (_job(slo_s=3600.0),), Asked(WHOLE))
    assert d.pending is PendingKind.FITS_NOWHERE and d.reason.startswith(f"no price for GPU type {T4}")


def _live(down: Sequence[str], busy: dict[str, set[int]]) -> Snapshot:
    """The e2e's cluster as the controller builds its snapshot: one GPU of 1.63 GB per node, the
    nodes in `down` DOWN (their records kept), a T4 node DOWN without a price."""
    def inv(model: str) -> P.NodeInventory:
        return P.NodeInventory(source=P.INVENTORY_SOURCE_DECLARED,
                               gpus=[P.Gpu(index=0, model=model, memory_bytes=DECLARED)])

    records, nodes, states = {}, {}, {}
    for nid, model in (("node-a10", A10), ("node-a40", A40), ("node-a100", A100), ("node-t4", T4)):
        records[nid] = NodeRecord(nid, f"{nid}:1", inv(model))
        nodes[nid] = LiveNode(nid, f"{nid}:1", inv(model), agent_pb2.NodeStatus(), 0.0, 0.0,
                              liveness=P.NODE_STATE_READY)
        states[nid] = P.NODE_STATE_DOWN if nid in (*down, "node-t4") else P.NODE_STATE_READY
    spec = P.JobSpec(name="never", model=P.ModelSpec(hidden_size=128, num_layers=6, num_heads=4, vocab_size=4096,
                                                     seq_length=128),
                     global_batch_size=16, iterations=100000, objective=P.OBJECTIVE_COST,
                     slo=P.Slo(iterations_within_seconds=60))
    waiting = JobRecord("j-w", "w", spec, P.JOB_STATE_PENDING, "", 0.0)
    return build_snapshot(records, nodes, states, busy, [waiting], [], {}, 0.0, dict(PRICES))


@pytest.mark.parametrize("busy", [{}, {"node-a10": {0}, "node-a100": {0}}], ids=["free", "all-busy"])
def test_the_e2e_cluster_with_the_a40_down_quotes_a_plan_its_gpus_can_hold(busy: dict[str, set[int]]) -> None:
    snap = _live(["node-a40"], busy)
    (d,), _ = co.place(snap, snap.pending)
    # Before: 5,577 s with every layer on one A40 (the catalog's 48 GB), or, all busy, "waiting for
    # GPUs: none of the types it may use is free"; and with the T4's record, "no price for T4-16GB".
    assert d.pending is PendingKind.FITS_NOWHERE, d.reason
    assert d.reason.startswith("no plan meets the SLO (60 s for 100,000 iterations) even on the whole cluster: "
                               "the best any plan reaches is 12,174 s"), d.reason
    assert f"[1 x {A40}: layers 0-2, 1 x {A100}: layers 3-5] dp1 mb8" in d.reason
