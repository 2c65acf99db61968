"""Frenzy's reasons (controller/core/frenzy.py) quote a small plan's memory in MiB, not "0.0 GiB", and
name a job's gpu_types as why it fits nowhere where a type it may not use would take it. Before (a
live audit on the demo cluster): "needs 8 x 0.0 GiB (dp=8 tp=1)", "needs 0.0 GiB/GPU (MARP)"; and a
job with gpus: 8 and gpu_types [A40-48GB] read "no type that holds it has more than 2: the cluster
has 8 x A10-24GB ...", which 8 x A10 contradicts."""

from __future__ import annotations

from tessera.controller.core.frenzy import plan_round
from tessera.controller.core.snapshot import Action, GpuView, JobView, NodeView, PendingKind, Snapshot
from tessera.estimator.models import ModelDims

GB = 1000**3
A100, A40, A10 = "A100-80GB", "A40-48GB", "A10-24GB"
TINY = ModelDims(64, 2, 4, 256, 64, "tiny")  # the audit's lb.yaml: MARP's plan of 4 needs 5.6 MiB per GPU
CLUSTER = ((A10, 24 * GB, 8), (A100, 80 * GB, 4), (A40, 48 * GB, 2))


def node(nid: str, model: str, n: int, mem_gb: int, busy: tuple[int, ...] = ()) -> NodeView:
    return NodeView(nid, tuple(GpuView(i, model, mem_gb * GB) for i in range(n)), frozenset(busy))


def demo(busy: tuple[int, ...] = ()) -> tuple[NodeView, ...]:
    return (node("a100", A100, 4, 80, busy), node("a40", A40, 2, 48, busy[:2]),
            node("a10", A10, 4, 24, busy), node("a10b", A10, 4, 24, busy))


def test_a_small_plan_is_quoted_in_mib() -> None:
    job = JobView("lb", 0.0, TINY, 32, 4)
    (d,) = plan_round(Snapshot(demo((0, 1, 2, 3)), (job,), CLUSTER)).decisions
    assert d.pending is PendingKind.NO_ROOM_NOW
    assert d.reason.startswith("waiting for GPUs: its smallest plan that fits needs 4 x 5.6 MiB (dp=4 tp=1) "), d.reason
    (d,) = plan_round(Snapshot(demo(), (job,), CLUSTER)).decisions
    assert d.action is Action.START and "needs 5.6 MiB/GPU (MARP)" in d.reason, d.reason


def test_gpu_types_that_bar_the_types_that_would_take_it_are_named() -> None:
    job = JobView("ng", 0.0, TINY, 32, 8, (A40,))
    (d,) = plan_round(Snapshot(demo(), (job,), CLUSTER)).decisions
    assert (d.pending, d.reason) == (PendingKind.FITS_NOWHERE, (
        "fits nowhere: its smallest plan that fits in memory needs 8 x 3.9 MiB (dp=8 tp=1) of one GPU type, and no "
        "type it may use (its gpu_types: A40-48GB) has more than 2: the cluster has 8 x A10-24GB (22.4 GiB), "
        "4 x A100-80GB (74.5 GiB), 2 x A40-48GB (44.7 GiB)"))
