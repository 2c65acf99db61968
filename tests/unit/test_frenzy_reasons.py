"""Frenzy's reasons for a job MARP + HAS cannot place (controller/core/frenzy.py `_pending_reason`):
a gang runs on one GPU type, so a plan is quoted only where one type has its GPUs and each holds
its bytes, free GPUs are counted among those that could hold it, and a job no one type can take
fits nowhere. Before (an audit of the texts' figures): "smallest plan needs 1 x 366.4 GiB" where no
GPU holds 366 GiB; "8 GPUs free now" where the 8 were of a type the job may not use; and a job of
8 GPUs on 4 + 4 of two types "waiting for GPUs" for ever."""

from __future__ import annotations

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.frenzy import plan_round
from tessera.controller.core.opaque import OpaqueAware
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import plan_round as policy_round
from tessera.controller.core.snapshot import GpuView, JobView, NodeView, PendingKind, Snapshot
from tessera.estimator.models import ModelDims

GB = 1000**3
A100, A10 = "A100-80GB", "A10-24GB"
SMALL = ModelDims(768, 12, 12, 50257, 1024, "small")


def node(nid: str, model: str, n: int, mem_gb: int, busy: frozenset[int] = frozenset()) -> NodeView:
    return NodeView(nid, tuple(GpuView(i, model, mem_gb * GB) for i in range(n)), busy)


def decide(nodes: tuple[NodeView, ...], cluster: tuple[tuple[str, int, int], ...], job: JobView) -> tuple[PendingKind | None, str]:
    (d,) = plan_round(Snapshot(nodes, (job,), cluster)).decisions
    return d.pending, d.reason


def test_the_plan_quoted_is_the_smallest_that_fits_a_gpu() -> None:
    # 1.3B parameters, batch 32: MARP's 1-GPU plan needs 366 GiB; the first that fits 80 GB is 8 GPUs.
    job = JobView("j", 0.0, ModelDims(2048, 24, 16, 50257, 2048, "1.3b"), 32)
    busy = (node("a", A100, 4, 80, frozenset({0, 1, 2, 3})), node("b", A100, 4, 80, frozenset({0, 1, 2})))
    assert decide(busy, ((A100, 80 * GB, 8),), job) == (
        PendingKind.NO_ROOM_NOW, ("waiting for GPUs: its smallest plan that fits needs 8 x 67.2 GiB (dp=8 tp=1) of "
                                 "one GPU type; 1 of them free now"))


def test_free_gpus_are_counted_among_the_types_it_may_use() -> None:
    nodes = (node("a", A100, 4, 80, frozenset({0, 1, 2, 3})), node("b", A10, 8, 24))
    cluster = ((A10, 24 * GB, 8), (A100, 80 * GB, 4))
    kind, why = decide(nodes, cluster, JobView("j", 0.0, SMALL, 8, 2, (A100,)))
    assert kind is PendingKind.NO_ROOM_NOW and why.endswith("; 0 of them free now")


def test_a_gang_no_one_type_can_take_fits_nowhere() -> None:
    nodes = (node("a", A100, 4, 80), node("b", A10, 4, 24))  # all idle
    cluster = ((A10, 24 * GB, 4), (A100, 80 * GB, 4))
    for types in ((), (A100,)):
        assert decide(nodes, cluster, JobView("j", 0.0, SMALL, 8, 8, types)) == (
            PendingKind.FITS_NOWHERE,
            ("fits nowhere: its smallest plan that fits in memory needs 8 x 3.3 GiB (dp=8 tp=1) of one GPU type, and "
            "no type that holds it has more than 4: the cluster has 4 x A10-24GB (22.4 GiB), 4 x A100-80GB (74.5 GiB)"))
    # An opaque job likewise.
    opaque = JobView("o", 0.0, SMALL, 1, 8, (), opaque=True)
    assert decide(nodes, cluster, opaque) == (
        PendingKind.FITS_NOWHERE, ("fits nowhere: it runs on 8 GPUs of one type, and no type it may use has more "
                                  "than 4: the cluster has 4 x A10-24GB (22.4 GiB), 4 x A100-80GB (74.5 GiB)"))
    # On 8 of one type it places at once.
    d = plan_round(Snapshot((node("c", A10, 8, 24),), (JobView("j", 0.0, SMALL, 8, 8),), ((A10, 24 * GB, 8),)))
    assert [x.action.value for x in d.decisions] == ["start"]


def test_one_model_reporting_two_memories_is_still_one_type() -> None:
    # cluster_gpus has a row per (model, memory): 4 + 4 A100 whose NVML totals differ by 512 MiB
    # were two types of 4, and a gang of 8 that waits for one busy GPU "fit nowhere" (a review).
    a, b = node("a", A100, 4, 80, frozenset({0})), NodeView("b", tuple(GpuView(i, A100, 80 * GB - 2**29) for i in range(4)))
    cluster = ((A100, 80 * GB - 2**29, 4), (A100, 80 * GB, 4))
    kind, why = decide((a, b), cluster, JobView("j", 0.0, SMALL, 8, 8))
    assert kind is PendingKind.NO_ROOM_NOW and why.endswith("of one GPU type; 7 of them free now")


def test_free_gpus_of_a_type_too_small_for_the_gang_are_not_counted() -> None:
    nodes = (node("a", A100, 4, 80), node("b", A10, 8, 24, frozenset(range(8))))
    cluster = ((A10, 24 * GB, 8), (A100, 80 * GB, 4))
    kind, why = decide(nodes, cluster, JobView("j", 0.0, SMALL, 8, 8))
    assert kind is PendingKind.NO_ROOM_NOW and why.endswith("of one GPU type; 0 of them free now")
    kind, why = decide((node("a", A100, 4, 80, frozenset({0, 1, 2})),), ((A100, 80 * GB, 4),),
                       JobView("j", 0.0, SMALL, 8, 4))
    assert why.endswith("; 1 of them free now")


def test_a_hint_the_estimates_have_no_cell_of_fits_nowhere_not_waiting() -> None:
    # (A live audit: a `gpus: 3` job waited for ever on an idle cluster, "waiting for GPUs".)
    est = TableEstimates({("k", A10, n): 1.0 / n for n in (1, 2, 4, 8)})
    nodes = (node("a", A10, 4, 24), node("b", A10, 4, 24))
    snap = Snapshot(nodes, (JobView("j", 0.0, SMALL, 48, 3, estimate_key="k"),), ((A10, 24 * GB, 8),))
    (d,) = policy_round(snap, est, make_policy("frenzy")).decisions
    assert d.pending is PendingKind.FITS_NOWHERE
    assert d.reason == ("frenzy: fits nowhere: the estimates run none of MARP's plans, and no GPU type it may use "
                        "runs a Cell of 3 GPUs laid out evenly over its nodes")
    # A count they have runs at once.
    snap = Snapshot(nodes, (JobView("j", 0.0, SMALL, 48, 4, estimate_key="k"),), ((A10, 24 * GB, 8),))
    (d,) = policy_round(snap, est, make_policy("frenzy")).decisions
    assert d.action.value == "start"



def test_an_opaque_count_no_node_layout_holds_fits_nowhere() -> None:
    # 5 GPUs on two nodes of 4: no even layout, so never (it read "waiting for GPUs ... not free now").
    nodes = (node("a", A10, 4, 24), node("b", A10, 4, 24))
    opaque = JobView("o", 0.0, SMALL, 1, 5, (A10,), opaque=True)
    (d,) = policy_round(Snapshot(nodes, (opaque,), ((A10, 24 * GB, 8),)), OpaqueAware(TableEstimates({})),
                        make_policy("frenzy")).decisions
    assert d.pending is PendingKind.FITS_NOWHERE and d.reason.startswith("frenzy: fits nowhere: "), d.reason
    six = JobView("o", 0.0, SMALL, 1, 6, (A10,), opaque=True)  # 3 + 3 runs
    (d,) = policy_round(Snapshot(nodes, (six,), ((A10, 24 * GB, 8),)), OpaqueAware(TableEstimates({})),
                        make_policy("frenzy")).decisions
    assert d.action.value == "start"


def test_a_gang_the_ready_nodes_cannot_take_waits_for_nodes() -> None:
    # 8 x A10 registered, 4 on a drained node (not in the snapshot's READY nodes): it read "4 free GPUs
    # could hold it now" of a plan of 8 (a live audit).
    kind, why = decide((node("a", A10, 4, 24),), ((A10, 24 * GB, 8),), JobView("j", 0.0, SMALL, 8, 8))
    assert kind is PendingKind.NO_ROOM_NOW
    assert why.startswith("waiting for nodes: its smallest plan that fits needs 8 x ")
    assert why.endswith("the READY nodes have 4 of a type that holds it, the others are on nodes drained, "
                        "unreachable or down")
