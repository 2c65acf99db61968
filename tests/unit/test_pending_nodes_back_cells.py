"""A job waits for registered nodes that are down only when a Cell of it would run on them: its count
covered by the estimates on an even split of the registered GPUs (why_not.if_back / `covers`), not
memory alone. A count no Cell covers (6 or 3 GPUs where the estimates have powers of two only) gets
what its policy gives it with every node READY: fits nowhere, or dropped in the artifact modes.
Literal snapshots and tables: a node in `registered(...)` but not in the ready nodes is down."""

from __future__ import annotations

import pytest

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.policies import why_not
from tessera.controller.core.policy import RoundConfig, RoundContext
from tessera.controller.core.snapshot import Action, Decision, JobView, NodeView, Snapshot
from tests.unit.test_pending_nodes_back import A100, NO_ROOM, NOWHERE, A, B, M
from tests.unit.test_pending_nodes_back import decide as decide_with
from tests.unit.test_pending_reasons_crius import registered

# "p" runs on 2, 4 or 8 A100 only (powers of two): 3 and 6 are in memory (more than 2) but no Cell.
# "q" runs on 6 too.
EST = TableEstimates({("p", A100, n): 8.0 / n for n in (2, 4, 8)} | {("q", A100, n): 8.0 / n for n in (2, 4, 6, 8)})
Nodes = tuple[tuple[NodeView, ...], tuple[NodeView, ...]]  # (ready, registered)
DOWN: Nodes = ((A,), (A, B))
NONE: Nodes = ((), (A, B))
FULL: Nodes = ((A, B), (A, B))


def job(key: str, gpus: int) -> JobView:
    return JobView("j", 0.0, M, 64, gpus, iterations=100, estimate_key=key, gpu_type_hint=A100)


def decide(policy: str, nodes: Nodes, j: JobView,
           mode: str = "paper") -> Decision:
    return decide_with(policy, nodes[0], nodes[1], j, mode, EST)


def test_covers_asks_the_estimates_for_a_cell_on_an_even_split() -> None:
    ctx = RoundContext(Snapshot((A,), (), registered(A, B)), EST, RoundConfig())
    s = why_not.round_supply(ctx, job("p", 6))
    assert not why_not.covers(ctx, job("p", 6), A100, 6)
    assert why_not.covers(ctx, job("q", 6), A100, 6)
    # Was [(A100, 6)] for both: 6 is more than the 2 GPUs "p" fits on in memory.
    assert why_not.if_back(ctx, job("p", 6), s, [(A100, 6)]) == []
    assert why_not.if_back(ctx, job("q", 6), s, [(A100, 6)]) == [(A100, 6)]
    assert why_not.if_back(ctx, job("q", 6), s, [(A100, 16)]) == []  # more than registered: as before


@pytest.mark.parametrize("mode", ["paper", "artifact"])
@pytest.mark.parametrize("policy", ["crius", "crius-ddl"])
def test_crius_a_hint_no_cell_covers_fits_nowhere_with_nodes_down(policy: str, mode: str) -> None:
    # Hint 6 (paper: Cells 3, 6, 12; artifact: 6, 3, 1): none is a Cell of "p". Was "waiting for nodes:
    # no Cell on the READY nodes (...); it fits in memory on 6 x A100-80GB" with b down, and "waiting
    # for nodes: no READY node" with both down, while with both READY it fits nowhere.
    full = decide(policy, FULL, job("p", 6), mode)
    assert full.pending is NOWHERE
    for nodes in (DOWN, NONE):
        d = decide(policy, nodes, job("p", 6), mode)
        assert d.action == Action.PENDING and d.pending is NOWHERE
        assert d.reason == full.reason
    # "q" has a Cell of 6: it waits for b, and runs with b READY.
    for nodes in (DOWN, NONE):
        assert decide(policy, nodes, job("q", 6), mode).pending is NO_ROOM
    up = decide(policy, FULL, job("q", 6), mode)
    assert up.action == Action.START and up.cell is not None and up.cell.gpus == 6


def test_crius_a_smallest_cell_over_the_ready_gpus_that_no_cell_covers_fits_nowhere() -> None:
    # Hint 12: Cells 6, 12 (24 over the cluster). Was "waiting for nodes: its gpus hint is 12: its
    # smallest Cell (half the hint) is 6 GPUs of one type and READY nodes have at most 4 of one type".
    d = decide("crius", DOWN, job("p", 12))
    assert d.pending is NOWHERE
    assert d.reason == "crius: fits nowhere: no feasible Cell among 6 x A100-80GB (out of memory or not covered by the estimates)"
    assert d.reason == decide("crius", FULL, job("p", 12)).reason
    assert decide("crius", DOWN, job("q", 12)).pending is NO_ROOM


def test_crius_ddl_drops_a_job_no_cell_covers_with_nodes_down() -> None:
    # Was kept waiting for nodes (a Cell-less count never makes the deadline).
    j = JobView("j", 0.0, M, 64, 6, iterations=100, deadline=1e6, estimate_key="p", gpu_type_hint=A100)
    for nodes in (DOWN, NONE, FULL):
        assert decide("crius-ddl", nodes, j).action == Action.DROP
    q = JobView("j", 0.0, M, 64, 6, iterations=100, deadline=1e6, estimate_key="q", gpu_type_hint=A100)
    assert decide("crius-ddl", DOWN, q).pending is NO_ROOM


def test_fcfs_a_request_no_cell_covers_fits_nowhere_with_nodes_down() -> None:
    # Was "fcfs: waiting for nodes: it asks for 6 x A100-80GB and READY nodes have at most 4 of one
    # type (registered: 8 x A100-80GB)" (and "no READY node ..." with both down).
    assert decide("fcfs", FULL, job("p", 6)).pending is NOWHERE
    d = decide("fcfs", DOWN, job("p", 6))
    assert d.pending is NOWHERE
    assert d.reason == ("fcfs: fits nowhere: it asks for 6 x A100-80GB and READY nodes have at most 4 of one type "
                        "(registered: 8 x A100-80GB); the estimates have no Cell of 6 x A100-80GB on the registered nodes")
    d = decide("fcfs", NONE, job("p", 3))
    assert d.pending is NOWHERE
    assert d.reason == ("fcfs: fits nowhere: no READY node (registered: 8 x A100-80GB); the estimates have no Cell of "
                        "3 x A100-80GB on the registered nodes")
    for nodes in (DOWN, NONE):
        d = decide("fcfs", nodes, job("q", 6))
        assert d.pending is NO_ROOM and d.reason.startswith("fcfs: waiting for nodes: "), d.reason
    assert decide("fcfs", FULL, job("q", 6)).action == Action.START


@pytest.mark.parametrize(("count", "nodes"), [(6, DOWN), (6, NONE), (3, NONE)])
def test_fcfs_artifact_drops_a_request_no_cell_covers_with_nodes_down(count: int, nodes: Nodes) -> None:
    # Was kept waiting for nodes; with every node READY it is dropped.
    assert decide("fcfs", FULL, job("p", count), "artifact").action == Action.DROP
    d = decide("fcfs", nodes, job("p", count), "artifact")
    assert d.action == Action.DROP, d.reason
    assert decide("fcfs", nodes, job("q", 6), "artifact").pending is NO_ROOM


@pytest.mark.parametrize(("mode", "never"), [("paper", "pending"), ("artifact", "drop")])
def test_gavel_a_request_no_cell_covers_is_not_made_to_wait(mode: str, never: str) -> None:
    # Was "gavel: waiting for nodes: no READY GPU type runs its request; it fits in memory on 6 x
    # A100-80GB (...)"; with both nodes READY: "fits nowhere" (paper), dropped (artifact).
    full = decide("gavel", FULL, job("p", 6), mode)
    for nodes in (DOWN, NONE):
        d = decide("gavel", nodes, job("p", 6), mode)
        assert d.action == full.action == never and d.pending is full.pending and d.reason == full.reason
    for nodes in (DOWN, NONE):
        assert decide("gavel", nodes, job("q", 6), mode).pending is NO_ROOM
    d = decide("gavel", NONE, job("q", 6), mode)
    assert d.reason == ("gavel: waiting for nodes: no READY GPU type runs its request; it fits in memory on 6 x "
                        "A100-80GB (registered: 8 x A100-80GB; READY: 0 x A100-80GB)")


@pytest.mark.parametrize(("count", "nodes"), [(6, DOWN), (6, NONE), (3, NONE)])
def test_sia_artifact_drops_a_request_no_cell_covers_with_nodes_down(count: int, nodes: Nodes) -> None:
    # Was admitted (6 with b down: started on 4) or kept waiting for nodes; with every node READY the
    # artifact drops it: "sia: dropped: 6 GPUs of no type can run it".
    full = decide("sia", FULL, job("p", count), "artifact")
    d = decide("sia", nodes, job("p", count), "artifact")
    assert d.action == full.action == Action.DROP and d.reason == full.reason
    assert decide("sia", NONE, job("q", 6), "artifact").pending is NO_ROOM


@pytest.mark.parametrize("policy", ["sia", "elasticflow", "elasticflow-l"])
def test_power_of_two_shares_no_cell_covers_are_not_waited_for(policy: str) -> None:
    # "s" runs on 6 A100 only: no configuration of Sia, no power-of-two share of ElasticFlow. Was
    # "waiting for nodes: ...; it fits in memory on 8 x A100-80GB" (8 is more than 6 in memory, but
    # no Cell); with both nodes READY it fits nowhere (sia) or is declined (elasticflow).
    est = TableEstimates({("s", A100, 6): 1.0, ("s8", A100, 6): 1.0, ("s8", A100, 8): 1.0})
    j = JobView("j", 0.0, M, 64, 0, iterations=100, estimate_key="s")
    full = decide_with(policy, *FULL, j, est=est)
    assert full.pending is NOWHERE or full.action == Action.DROP
    d = decide_with(policy, *DOWN, j, est=est)
    # The same outcome and cause (ElasticFlow names the shares it tried: 1-4 GPUs with b down, 1-8 up).
    assert (d.action, d.pending, d.reason.split(":")[:2]) == (full.action, full.pending, full.reason.split(":")[:2])
    d = decide_with(policy, *DOWN, JobView("j", 0.0, M, 64, 0, iterations=100, estimate_key="s8"), est=est)
    assert d.pending is NO_ROOM and d.reason.endswith("it fits in memory on 8 x A100-80GB (registered: "
                                                      "8 x A100-80GB; READY: 4 x A100-80GB)"), d.reason


def test_crius_artifact_waits_for_nodes_for_a_job_whose_fewest_is_not_a_power_of_two() -> None:
    # No GPU count, fewest 3: the artifact's Cells halve from the fewest count (3, then 6 scaled up),
    # so nodes coming back run it; with them down it was "fits nowhere" (powers of two only were asked).
    est = TableEstimates({("t3", A100, 3): 1.0, ("t3", A100, 6): 0.5})
    free = JobView("j", 0.0, M, 64, 0, iterations=100, estimate_key="t3")
    d = decide_with("crius", (), (A, B), free, "artifact", est)
    assert (d.pending, d.reason) == (NO_ROOM, "crius: waiting for nodes: no READY node (registered: 8 x A100-80GB)")
    assert decide_with("crius", (A, B), (A, B), free, "artifact", est).action == Action.START
