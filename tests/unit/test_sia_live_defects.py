"""Sia on the demo cluster of a live audit (4 x A100-80GB, 2 x A40-48GB, two nodes of 4 x A10-24GB):
an opaque job runs on exactly the GPUs it asked for, in both modes, whatever Sia's configuration
counts (a `3 x A10-24GB` job sat at "fits nowhere" on an idle cluster), and the reasons of a waiting
job and of one no configuration runs name the configurations and the cause. Literal snapshots and
tables."""

from __future__ import annotations

import pytest

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.opaque import PLACEHOLDER_MODEL, OpaqueAware, opaque_key
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import plan_round
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    Decision,
    JobView,
    NodeView,
    PendingKind,
    RunningView,
    Slice,
    Snapshot,
)
from tessera.estimator.models import ModelDims
from tests.unit.demo_cluster import A10, A40, A100, GB, node

REGISTERED = ((A100, 80 * GB, 4), (A40, 48 * GB, 2), (A10, 24 * GB, 8))
M = ModelDims(1024, 24, 16, 32000, 1024, "m")
# "k": 2 or 4 x A100, 8 x A10 (none on A40); "r": 4 x A100; "big": 16 x A100; "six": 6 x A10 only;
# "none": no Cell anywhere.
EST = OpaqueAware(TableEstimates({("k", A100, 2): 2.0, ("k", A100, 4): 1.2, ("k", A10, 8): 3.0, ("r", A100, 4): 1.0,
                                  ("big", A100, 16): 1.0, ("six", A10, 6): 1.0}))
FREE = "free now: 8/8 A10-24GB, 0/4 A100-80GB, 2/2 A40-48GB"


def demo(a100_busy: tuple[int, ...] = (), a10_up: int = 2) -> tuple[NodeView, ...]:
    """The demo cluster's READY nodes: the first `a10_up` A10 nodes (the others down)."""
    a10 = (node("a10-1", A10, 4, 24), node("a10-2", A10, 4, 24))[:a10_up]
    return (node("a100", A100, 4, 80, a100_busy), node("a40", A40, 2, 48), *a10)


def opaque(jid: str, gpus: int, types: tuple[str, ...] = (), keyed: bool = True) -> JobView:
    """An opaque job as controller/snapshots.py `opaque_view` builds it (`keyed`: with its estimate key)."""
    return JobView(jid, 1.0, PLACEHOLDER_MODEL, 1, gpus, types, types[0] if len(types) == 1 else "", 1,
                   estimate_key=opaque_key(gpus, types) if keyed else "", opaque=True)


def job(key: str) -> JobView:
    return JobView("j", 5.0, M, 64, 0, iterations=100, estimate_key=key)


def decide(snap: Snapshot, mode: str = "paper") -> dict[str, Decision]:
    return {d.job_id: d for d in plan_round(snap, EST, make_policy("sia", mode)).decisions}


def gpus(d: Decision) -> int:
    return sum(len(s.gpu_indices) for s in d.slices)


@pytest.mark.parametrize("mode", ["paper", "artifact"])
@pytest.mark.parametrize(("count", "types"), [(3, (A10,)), (3, ()), (6, (A10,))])
def test_an_opaque_job_runs_on_exactly_its_count(mode: str, count: int, types: tuple[str, ...]) -> None:
    # Was "sia: fits nowhere: no configuration is feasible": 3 and 6 are none of Sia's counts
    # (paper: 1, 2, 4, 8 on A10; artifact: 1, 2, 4, 8, 16).
    o = opaque("o", count, types)
    d = decide(Snapshot(demo(), (o,), REGISTERED), mode)["o"]
    assert d.action == Action.START and d.cell is not None, d.reason
    assert (d.cell.gpu_type, d.cell.gpus, gpus(d)) == (A10, count, count)
    # Running on an idle cluster, it is never scaled (Sia would double a job that gains from it).
    running = RunningView(o, d.cell, d.slices)
    kept = decide(Snapshot(demo(), (), REGISTERED, running=(running,), arrivals=()), mode)["o"]
    assert kept.action == Action.KEEP, kept.reason


@pytest.mark.parametrize("mode", ["paper", "artifact"])
def test_opaque_jobs_of_several_counts_keep_their_own_configurations(mode: str) -> None:
    # JobViews without their estimate key share the placeholder model's: each keeps its own count.
    snap = Snapshot(demo(), (opaque("one", 1, (A10,), keyed=False), opaque("three", 3, (A10,), keyed=False)), REGISTERED)
    d = decide(snap, mode)
    assert (gpus(d["one"]), gpus(d["three"])) == (1, 3), (d["one"].reason, d["three"].reason)


@pytest.mark.parametrize("mode", ["paper", "artifact"])
def test_an_opaque_job_waits_for_its_nodes_with_its_count(mode: str) -> None:
    # Both A10 nodes down: its 3 x A10 runs once they are back. Was "fits nowhere".
    d = decide(Snapshot(demo(a10_up=0), (opaque("o", 3, (A10,)),), REGISTERED), mode)["o"]
    assert d.pending is PendingKind.NO_ROOM_NOW
    # "runs on", not "fits in memory on": an opaque job has no memory figure (why_not.back_text).
    assert d.reason == ("sia: waiting for nodes: no configuration is feasible on the READY nodes; it runs "
                        "on 3 x A10-24GB (registered: 8 x A10-24GB; READY: 0 x A10-24GB)")


@pytest.mark.parametrize(("count", "types", "why"), [
    (5, (), "it runs on exactly 5 GPUs of one type, which 2 nodes of A10-24GB cannot split evenly"),
    (3, (A40,), "opaque job asks for 3 GPUs of one type; the most the cluster has of A40-48GB is 2"),
])
def test_an_opaque_count_no_type_holds_says_why(count: int, types: tuple[str, ...], why: str) -> None:
    d = decide(Snapshot(demo(), (opaque("o", count, types),), REGISTERED))["o"]
    assert d.pending is PendingKind.FITS_NOWHERE
    assert d.reason == f"sia: fits nowhere: no configuration is feasible; {why}"


def test_a_waiting_job_names_its_smallest_configuration_and_the_free_gpus() -> None:
    # A100 is held by "r" (4 GPUs, its only Cell: not halved); "k"'s smallest is 2 x A100, and a
    # waiting job starts on its smallest only, not on 8 x A10. Was "sia: waiting: no smallest
    # configuration fits now".
    r = JobView("r", 0.0, M, 64, 4, iterations=100, estimate_key="r")
    run = RunningView(r, Cell(A100, 4), (Slice("a100", (0, 1, 2, 3)),))
    d = decide(Snapshot(demo((0, 1, 2, 3)), (job("k"),), REGISTERED, running=(run,), now=10.0))["j"]
    assert d.pending is PendingKind.NO_ROOM_NOW
    assert d.reason == ("sia: waiting for its smallest configuration 2 x A100-80GB, the only one it starts on "
                        "(A10-24GB: 8 GPUs at least; A40-48GB: none): it does not fit the free GPUs, and no halving "
                        f"of a running job that pays for it makes room; {FREE}")


def test_a_waiting_opaque_job_names_its_count_on_each_type() -> None:
    # Every A100 and A10 busy: its 3 GPUs on either type, the only configurations it has.
    busy = (node("a100", A100, 4, 80, (0, 1, 2, 3)), node("a40", A40, 2, 48),
            node("a10-1", A10, 4, 24, (0, 1)), node("a10-2", A10, 4, 24, (0, 1)))
    d = decide(Snapshot(busy, (opaque("o", 3),), REGISTERED))["o"]
    assert d.pending is PendingKind.NO_ROOM_NOW
    assert d.reason == ("sia: waiting for its smallest configuration 3 x A10-24GB or 3 x A100-80GB, the only ones it "
                        "starts on (A40-48GB: none): it does not fit the free GPUs, and no halving of a running job "
                        "that pays for it makes room; free now: 4/8 A10-24GB, 0/4 A100-80GB, 2/2 A40-48GB")


@pytest.mark.parametrize(("key", "why"), [
    ("big", "; it fits in memory on no fewer than 16 x A100-80GB (registered: 4)"),
    ("six", ("; the estimates have no Cell of 1, 2, 4 or 8 x A10-24GB; it fits in memory on no fewer than "
             "6 x A10-24GB (registered: 8)")),
    ("none", ("; no count of A10-24GB or A100-80GB or A40-48GB GPUs fits it (out of memory or not covered by "
              "the estimates)")),  # as gavel says it
])
def test_fits_nowhere_says_why_where_it_is_known(key: str, why: str) -> None:
    d = decide(Snapshot(demo(), (job(key),), REGISTERED))["j"]
    assert d.pending is PendingKind.FITS_NOWHERE
    assert d.reason == f"sia: fits nowhere: no configuration is feasible{why}"
