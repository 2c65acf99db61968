"""ElasticFlow on the demo cluster of a live audit (4 x A100-80GB, 2 x A40-48GB, two nodes of 4 x
A10-24GB): an opaque job runs on exactly the GPUs it asked for, in both modes, and is never scaled (a
3-GPU job was declined: shares were powers of two only); declined and waiting reasons name the
cause (memory, GPU types, an opaque count) and what is free; and a running job grows only where
the iterations it has left pay for the restart. Literal snapshots and tables."""

from __future__ import annotations

import pytest

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.opaque import OpaqueAware
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import plan_round
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    Decision,
    JobView,
    PendingKind,
    RunningView,
    Slice,
    Snapshot,
)
from tests.unit.test_sia_live_defects import A10, A40, A100, REGISTERED, M, demo, gpus, node, opaque

# "k": 2 or 4 x A100, 8 x A10; "r": 4 x A100; "big": 16 x A100; "six": 6 x A10 only; "none": no Cell
# anywhere; "g": 1, 2 or 4 x A100 at 1% gained per doubling; "fast": 1 or 2 x A100, twice as fast on 2.
EST = OpaqueAware(TableEstimates({("k", A100, 2): 2.0, ("k", A100, 4): 1.2, ("k", A10, 8): 3.0, ("r", A100, 4): 1.0,
                                  ("big", A100, 16): 1.0, ("six", A10, 6): 1.0, ("fast", A100, 1): 2.0,
                                  ("fast", A100, 2): 1.0} | {("g", A100, n): 1.0 / (1.01 ** (n.bit_length() - 1))
                                                             for n in (1, 2, 4)}))
NAMES = ["elasticflow", "elasticflow-l"]
MODES = ["paper", "artifact"]


def job(key: str, jid: str = "j", gpus: int = 0, iterations: int = 100) -> JobView:
    return JobView(jid, 5.0, M, 64, gpus, iterations=iterations, estimate_key=key)


def decide(snap: Snapshot, name: str = "elasticflow-l", mode: str = "paper") -> dict[str, Decision]:
    return {d.job_id: d for d in plan_round(snap, EST, make_policy(name, mode)).decisions}


def alone(j: JobView, name: str = "elasticflow-l", mode: str = "paper") -> Decision:
    return decide(Snapshot(demo(), (j,), REGISTERED), name, mode)[j.id]


def running(j: JobView, cell: Cell, *slices: Slice) -> RunningView:
    return RunningView(j, cell, slices)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("count", "types", "on"), [(3, (A10,), A10), (3, (), A10), (6, (A10,), A10), (2, (A40,), A40)])
def test_an_opaque_job_runs_on_exactly_its_count_and_is_never_scaled(name: str, mode: str, count: int,
                                                                   types: tuple[str, ...], on: str) -> None:
    # Was "declined: the estimates have no Cell of a data-parallel share of 1-8 GPUs of any type" (paper)
    # and "not admitted on A10-24GB: ..." (artifact) for 3 and 6: shares were powers of two only.
    o = opaque("o", count, types)
    d = alone(o, name, mode)
    assert d.action == Action.START and d.cell is not None, d.reason
    assert (d.cell.gpu_type, d.cell.gpus, gpus(d)) == (on, count, count)
    # Running alone on an idle cluster, it stays as it is (no doubling, no other type).
    kept = decide(Snapshot(demo(), (), REGISTERED, running=(running(o, d.cell, *d.slices),), arrivals=()),
                  name, mode)["o"]
    assert kept.action == Action.KEEP, kept.reason


def test_the_artifact_starts_an_opaque_job_on_a_type_that_holds_its_count() -> None:
    # The controller names the first allowed type as the hint (A40: 2 GPUs); its 3 GPUs run on A10.
    o = JobView("o", 1.0, opaque("x", 3).model, 1, 3, (A40, A10), A40, 1, estimate_key="opaque-3-A40+A10", opaque=True)
    d = alone(o, "elasticflow-l", "artifact")
    assert d.action == Action.START and d.cell == Cell(A10, 3, 1), d.reason


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("o", "why"), [
    (opaque("o", 5), "it runs on exactly 5 GPUs of one type, which 2 nodes of A10-24GB cannot split evenly"),
    (opaque("o", 3, (A40,)), "opaque job asks for 3 GPUs of one type; the most the cluster has of A40-48GB is 2"),
    (opaque("o", 2, ("H100-80GB",)),
     "opaque job asks for H100-80GB: no such GPU in the cluster (it has A10-24GB, A100-80GB, A40-48GB)"),
])
def test_an_opaque_job_no_type_runs_says_why_without_cells(name: str, o: JobView, why: str) -> None:
    # Was "... the estimates have no Cell of a data-parallel share of 1-8 GPUs of any type", the
    # missing type's text appended after it by the controller: the two halves contradicted each other.
    d = alone(o, name)
    assert (d.action, d.reason) == (Action.DROP, f"{name}: declined: {why}")
    art = alone(o, name, "artifact")
    assert art.pending is PendingKind.NO_ROOM_NOW
    where = " on A10-24GB" if o.gpus_hint == 5 else " on A40-48GB" if o.gpu_types == (A40,) else ""
    assert art.reason == f"{name}: not admitted{where}: {why}"
    assert not any(w in r for r in (d.reason, art.reason) for w in ("Cell", "data-parallel"))
    # No READY node at all: what it gets with every node READY, where no node coming back could run it
    # (5 GPUs may split evenly over nodes whose sizes the snapshot does not know: it waits for them).
    down = decide(Snapshot((), (o,), REGISTERED), name)["o"]
    if o.gpus_hint == 5:
        assert down.pending is PendingKind.NO_ROOM_NOW and "waiting for nodes" in down.reason
    else:
        assert (down.action, down.reason) == (d.action, d.reason)


@pytest.mark.parametrize(("key", "why", "art"), [
    # A 1T-parameter job read "the estimates have no Cell of a data-parallel share of 1-8 GPUs of any type".
    ("big", "it fits in memory on no fewer than 16 x A100-80GB (registered: 4)",
     "no count of A10-24GB GPUs fits it (out of memory or not covered by the estimates)"),
    ("none", ("no count of A10-24GB or A100-80GB or A40-48GB GPUs fits it (out of memory or not covered by the "
              "estimates)"), "no count of A10-24GB GPUs fits it (out of memory or not covered by the estimates)"),
    ("six", ("the estimates have no Cell of a data-parallel share of 1-8 GPUs of any type; it fits in memory on no "
             "fewer than 6 x A10-24GB (registered: 8)"),
     ("the estimates have no Cell of a data-parallel share of 1-8 GPUs; it fits in memory on no fewer than "
      "6 x A10-24GB (registered: 8)")),
])
def test_a_declined_job_names_its_memory(key: str, why: str, art: str) -> None:
    d = alone(job(key))
    assert (d.action, d.reason) == (Action.DROP, f"elasticflow-l: declined: {why}")
    a = alone(job(key), mode="artifact")  # the artifact keeps a job on its type: the first, A10, here
    assert (a.pending, a.reason) == (PendingKind.NO_ROOM_NOW, f"elasticflow-l: not admitted on A10-24GB: {art}")


def busy_cluster() -> tuple[Snapshot, ...]:
    """Every GPU held: "g" grown to the 4 A100 (its minimum share is 1), an opaque job on both A40,
    "k" on all 8 A10; waiting, a job of "g" (snapshot 1) or of "k" (snapshot 2)."""
    a100 = node("a100", A100, 4, 80, (0, 1, 2, 3))
    nodes = (a100, node("a40", A40, 2, 48, (0, 1)), node("a10-1", A10, 4, 24, (0, 1, 2, 3)),
             node("a10-2", A10, 4, 24, (0, 1, 2, 3)))
    run = (running(job("g", "g", 1, 10**6), Cell(A100, 4), Slice("a100", (0, 1, 2, 3))),
           running(opaque("o", 2, (A40,)), Cell(A40, 2, 1), Slice("a40", (0, 1))),
           running(job("k", "k8", 8), Cell(A10, 8), Slice("a10-1", (0, 1, 2, 3)), Slice("a10-2", (0, 1, 2, 3))))
    return tuple(Snapshot(nodes, (w,), REGISTERED, run, now=10.0) for w in (job("g", "w"), job("k", "w")))


def test_an_admitted_job_that_waits_says_what_it_waits_for_and_what_is_free() -> None:
    # Was "admitted (minimum share 1) but no type has 1 free GPUs together".
    one, two = busy_cluster()
    free = "free now: 0/8 A10-24GB, 0/4 A100-80GB, 0/2 A40-48GB"
    d = decide(one)["w"]
    assert d.pending is PendingKind.NO_ROOM_NOW
    assert d.reason == f"elasticflow-l: admitted (minimum share 1) but no GPU type it may use has 1 free GPU together; {free}"
    d = decide(two)["w"]  # its minimum share differs by type
    assert d.reason == ("elasticflow-l: admitted (minimum share 2) but no GPU type it may use has its minimum share "
                        f"free together (8 x A10-24GB or 2 x A100-80GB); {free}")


def idle_with(j: JobView, cell: Cell, restart_cost_s: float = 0.0) -> Decision:
    run = running(j, cell, Slice("a100", tuple(range(cell.gpus))))
    snap = Snapshot(demo(tuple(range(cell.gpus))), (), REGISTERED, (run,), now=10.0, arrivals=(),
                    restart_cost_s=restart_cost_s)
    return decide(snap)[j.id]


def test_a_running_job_grows_only_where_its_iterations_left_pay_for_the_restart() -> None:
    # "g" gains 1% per doubling: 100 iterations left save 1 s against a restart of 300 s (2 GPUs):
    # it was scaled up at once (a live audit: a job grown a second after it started, for 0.1%).
    d = idle_with(job("g", iterations=100), Cell(A100, 1))
    assert d.action == Action.KEEP, d.reason
    # 100,000 iterations left save ~990 s: worth the restart (and 4 GPUs next round, or now).
    d = idle_with(job("g", iterations=100_000), Cell(A100, 1))
    assert d.action == Action.MIGRATE and d.cell is not None and d.cell.gpus > 1, d.reason
    # "fast" saves 1 s an iteration on 2 GPUs: 280 iterations pay for the snapshot's 260 s restart,
    # not for the policy's own 300 s (2 GPUs at 150 s) when the snapshot names none.
    assert idle_with(job("fast", iterations=280), Cell(A100, 1), 260.0).action == Action.MIGRATE
    assert idle_with(job("fast", iterations=280), Cell(A100, 1)).action == Action.KEEP


def test_a_job_started_this_round_still_takes_its_elastic_share() -> None:
    # Its launch is a restart anyway: the marginal return alone decides, as ElasticFlow's does.
    d = alone(job("g", iterations=100))
    assert d.action == Action.START and d.cell is not None and d.cell.gpus == 4, d.reason


@pytest.mark.parametrize("name", NAMES)
def test_the_artifact_waits_for_any_type_that_runs_an_opaque_count_with_its_nodes_down(name: str) -> None:
    # No READY node: 3 GPUs run on A10 once they are back, whatever type the controller named first
    # (A40, 2 GPUs). It read "not admitted on A10-24GB: the estimates have no Cell of ... 1-8 GPUs".
    o = JobView("o", 1.0, opaque("x", 3).model, 1, 3, (A40, A10), A40, 1, estimate_key="opaque-3-A40+A10", opaque=True)
    d = decide(Snapshot((), (o,), REGISTERED), name, "artifact")["o"]
    assert (d.pending, d.reason) == (PendingKind.NO_ROOM_NOW, (
        f"{name}: waiting for nodes: no READY node; it runs on 3 x A10-24GB (registered: 8 x A10-24GB, 2 x A40-48GB; "
        "READY: 0 x A10-24GB)"))


def test_the_deadline_check_charges_the_rules_restart_cost() -> None:
    # "fast" on 1 x A100: 100 iterations x 2 s. From now (0), one round (300 s) and the rules' 10 s
    # restart, it ends at 510 s, within its 540 s deadline. Charged the artifact's 150 s per GPU
    # (650 s on 1, 550 s on 2, no Cell of 4), it was declined.
    j = JobView("d", 0.0, M, 64, 1, iterations=100, estimate_key="fast", deadline=540.0)
    snap = Snapshot(demo(), (j,), REGISTERED, restart_cost_s=10.0)
    d = decide(snap, "elasticflow")["d"]
    assert d.action == Action.START and d.cell is not None and d.cell.gpu_type == A100, d.reason
