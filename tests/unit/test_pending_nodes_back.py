"""A job that registered nodes which are down (drained, unhealthy) would run waits for nodes: it is
neither "fits nowhere" nor dropped (crius, crius-ddl, fcfs, elasticflow), and one whose own Cells
never fit in memory fits nowhere whatever nodes come back (crius); frenzy tells whether the estimates
know a job over every registered type, READY or not (controller/core/policies/why_not.py `if_back`).
Literal snapshots and tables: a node in `registered(...)` but not in the ready nodes is down."""

from __future__ import annotations

import pytest

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import Estimates, plan_round
from tessera.controller.core.snapshot import Action, Cell, Decision, JobView, NodeView, PendingKind, Snapshot
from tessera.estimator.models import REGISTERED, ModelDims
from tests.unit.test_pending_reasons_crius import node, registered

M = ModelDims(1024, 24, 16, 32000, 1024, "m")
A100, V100 = "A100-80GB", "V100-32GB"
# "k8" fits in memory on 8 A100 only; "k16" on 16 A100 only; "v" on 1, 2 or 4 V100 only.
EST = TableEstimates({("k8", A100, 8): 1.0, ("k16", A100, 16): 1.0} | {("v", V100, n): 4.0 / n for n in (1, 2, 4)})
NOWHERE, NO_ROOM = PendingKind.FITS_NOWHERE, PendingKind.NO_ROOM_NOW
A, B, C, D = node("a"), node("b"), node("c"), node("d")
V = node("v", V100, 4, 32)


def job(key: str, gpus: int = 0, deadline: float = 0.0) -> JobView:
    return JobView("j", 0.0, M, 64, gpus, iterations=100, deadline=deadline, estimate_key=key)


def decide(policy: str, ready: tuple[NodeView, ...], reg: tuple[NodeView, ...], j: JobView,
           mode: str = "paper", est: Estimates = EST) -> Decision:
    (d,) = plan_round(Snapshot(ready, (j,), registered(*reg)), est, make_policy(policy, mode)).decisions
    return d


def waits_then_starts(policy: str, ready: tuple[NodeView, ...], reg: tuple[NodeView, ...], j: JobView,
                      reason: str, mode: str = "paper") -> Cell:
    """`j` waits for nodes with `reason` while only `ready` are READY, and starts once every node of
    `reg` is: the Cell it starts on."""
    d = decide(policy, ready, reg, j, mode)
    assert (d.action, d.pending, d.reason) == (Action.PENDING, NO_ROOM, reason)
    up = decide(policy, reg, reg, j, mode)
    assert up.action == Action.START and up.cell is not None
    return up.cell


def test_crius_a_hint_whose_cells_never_fit_in_memory_fits_nowhere_with_no_ready_node() -> None:
    # Hint 4: Cells of 2, 4 and 8 GPUs; it fits in memory on 16 only. Was "waiting for nodes: no READY
    # node (registered: 16 x A100-80GB)": 16 fit the registered GPUs, but no Cell of the job has 16.
    d = decide("crius", (), (A, B, C, D), job("k16", 4))
    assert d.pending is NOWHERE
    assert d.reason == ("crius: fits nowhere: its gpus hint is 4: its largest Cell is 8 GPUs; it fits in memory "
                        "on no fewer than 16 x A100-80GB (registered: 16)")
    assert decide("crius", (A, B, C, D), (A, B, C, D), job("k16", 4)).pending is NOWHERE  # the nodes back
    # Hint 8 (Cells 4, 8, 16): 16 is a Cell of it, and it waits.
    d = decide("crius", (), (A, B, C, D), job("k16", 8))
    assert d.pending is NO_ROOM and d.reason == "crius: waiting for nodes: no READY node (registered: 16 x A100-80GB)"


def test_crius_a_cell_only_the_registered_gpus_hold_waits_for_nodes() -> None:
    # Hint 4: Cells 2 and 4 x A100 on the READY node (out of memory), 8 x A100 once b is back. Was
    # "fits nowhere: no feasible Cell among 2 x A100-80GB, 4 x A100-80GB (out of memory ...)".
    cell = waits_then_starts("crius", (A,), (A, B), job("k8", 4), (
        "crius: waiting for nodes: no Cell on the READY nodes (2 x A100-80GB, 4 x A100-80GB); it fits in memory "
        "on 8 x A100-80GB (registered: 8 x A100-80GB; READY: 4 x A100-80GB)"))
    assert cell.gpus == 8
    # Nothing registered holds 8: it fits nowhere, as before.
    assert decide("crius", (A,), (A,), job("k8", 4)).pending is NOWHERE


@pytest.mark.parametrize("gpus", [1, 0])
def test_crius_a_job_that_fits_only_a_type_whose_nodes_are_down_waits_for_nodes(gpus: int) -> None:
    d = decide("crius", (A,), (A, V), job("v", gpus))
    assert d.pending is NO_ROOM and d.reason.startswith("crius: waiting for nodes: ")
    if gpus:  # Cells 1 and 2 x A100 READY, refused; was "fits nowhere: no feasible Cell among ..."
        assert d.reason == ("crius: waiting for nodes: no Cell on the READY nodes (1 x A100-80GB, 2 x A100-80GB); "
                            "it fits in memory on 1 x V100-32GB or 2 x V100-32GB (registered: 4 x A100-80GB, "
                            "4 x V100-32GB; READY: 0 x V100-32GB)")
    up = decide("crius", (A, V), (A, V), job("v", gpus))
    assert up.action == Action.START and up.cell is not None and up.cell.gpu_type == V100


def test_crius_ddl_does_not_drop_a_job_that_a_node_down_would_run() -> None:
    # Was "crius-ddl: dropped: no feasible Cell among 1 x A100-80GB, 2 x A100-80GB ...".
    d = decide("crius-ddl", (A,), (A, V), job("v", 1, deadline=1e6))
    assert d.action == Action.PENDING and d.pending is NO_ROOM
    assert d.reason.startswith("crius-ddl: waiting for nodes: no Cell on the READY nodes")
    assert decide("crius-ddl", (A, V), (A, V), job("v", 1, deadline=1e6)).action == Action.START
    # Nothing registered runs it: still dropped.
    assert decide("crius-ddl", (A,), (A,), job("v", 1, deadline=1e6)).action == Action.DROP


@pytest.mark.parametrize("mode", ["paper", "artifact"])
def test_fcfs_a_job_that_fits_only_a_type_whose_nodes_are_down_waits_for_nodes(mode: str) -> None:
    # Was "fcfs: fits nowhere: it does not fit in memory on 1 x A100-80GB, nor on any other count of
    # A100-80GB" (paper) and "fcfs: dropped: ... infeasible even with the best locality" (artifact).
    cell = waits_then_starts("fcfs", (A,), (A, V), job("v", 1), (
        "fcfs: waiting for nodes: it does not fit in memory on 1 x A100-80GB, nor on any other count of A100-80GB; "
        "it fits in memory on 1 x V100-32GB (registered: 4 x A100-80GB, 4 x V100-32GB; READY: 0 x V100-32GB)"), mode)
    assert cell.gpu_type == V100
    d = decide("fcfs", (A,), (A, V), job("v"), mode)  # no count: the fewest it fits on
    assert d.pending is NO_ROOM and d.reason == (
        "fcfs: waiting for nodes: no count of A100-80GB GPUs fits it (out of memory or not covered by the "
        "estimates); it fits in memory on 1 x V100-32GB (registered: 4 x A100-80GB, 4 x V100-32GB; READY: "
        "0 x V100-32GB)")
    d = decide("fcfs", (A,), (A,), job("v", 1), mode)  # nothing registered runs it
    assert d.action == Action.DROP if mode == "artifact" else d.pending is NOWHERE


@pytest.mark.parametrize("name", ["elasticflow", "elasticflow-l"])
def test_elasticflow_waits_for_a_node_that_is_down_instead_of_declining(name: str) -> None:
    # Was dropped: "declined: no data-parallel share of 1-4 GPUs of any type fits its memory ...".
    d = decide(name, (A,), (A, V), job("v", 1))
    assert d.action == Action.PENDING and d.pending is NO_ROOM
    assert d.reason == (f"{name}: waiting for nodes: no share of the READY nodes serves it; it fits in memory on "
                        "1 x V100-32GB (registered: 4 x A100-80GB, 4 x V100-32GB; READY: 0 x V100-32GB)")
    assert decide(name, (A, V), (A, V), job("v", 1)).action == Action.START
    assert decide(name, (A,), (A,), job("v", 1)).action == Action.DROP  # nothing registered serves it
    # No READY node: was "fits nowhere: no GPU type in the cluster" while the cluster registers V100.
    d = decide(name, (), (A, V), job("v", 1))
    assert d.pending is NO_ROOM
    assert d.reason == (f"{name}: waiting for nodes: no READY node; it fits in memory on 1 x V100-32GB (registered: "
                        "4 x A100-80GB, 4 x V100-32GB; READY: 0 x V100-32GB)")
    # Nothing registered serves it: declined, as with the node READY (was "fits nowhere: ..."), for
    # memory, as fcfs says it (was "the estimates have no Cell of a data-parallel share of 1-4 GPUs").
    d = decide(name, (), (A,), job("v", 1))
    assert (d.action, d.reason) == (Action.DROP, (f"{name}: declined: no count of A100-80GB GPUs fits it (out of "
                                                 "memory or not covered by the estimates)"))
    assert d.reason == decide(name, (A,), (A,), job("v", 1)).reason


def test_frenzy_knows_a_job_by_every_registered_type_not_only_the_ready_ones() -> None:
    # MARP plans the small job on 1 GPU; the estimates run it on V100 only. With V100 READY but busy
    # it is refused A100; with the V100 node down it was started on A100 (no Cell there, iteration_s
    # 0): the estimates counted as not knowing it.
    small = JobView("j", 0.0, REGISTERED["gpt2-small"], 16, 1, estimate_key="v")
    busy = NodeView("v", V.gpus, frozenset(range(4)))
    for ready in ((A, busy), (A,)):
        d = decide("frenzy", ready, (A, V), small)
        assert d.action == Action.PENDING and d.pending is NO_ROOM, d.reason
    d = decide("frenzy", (A,), (A, V), small)
    assert d.reason.startswith("frenzy: waiting for nodes: no MARP plan (MARP's plans fit only GPUs the estimates "
                               "cannot run it on (")
    assert d.reason.endswith("the estimates run it on 1 x V100-32GB, more than READY nodes have (0 x V100-32GB)")
    d = decide("frenzy", (A, V), (A, V), small)
    assert d.action == Action.START and d.cell is not None and d.cell.gpu_type == V100


def test_frenzy_waits_for_nodes_where_only_nodes_down_run_a_job_marp_has_no_plan_for() -> None:
    # MARP fits "m" (batch 64) on no GPU here; the estimates run it on V100, whose node is down. Was
    # "frenzy: fits nowhere: needs at least 177.2 GiB per GPU ...": the estimates' Cells were sought
    # on READY types only.
    d = decide("frenzy", (A,), (A, V), job("v", 1))
    assert d.pending is NO_ROOM
    assert d.reason.startswith("frenzy: waiting for nodes: no MARP plan (fits nowhere: needs at least ")
    assert d.reason.endswith("the estimates run it on 1 x V100-32GB, more than READY nodes have (0 x V100-32GB)")
    d = decide("frenzy", (A, V), (A, V), job("v", 1))
    assert d.action == Action.START and d.cell is not None and d.cell.gpu_type == V100
    assert decide("frenzy", (A,), (A,), job("v", 1)).pending is NOWHERE  # nothing registered runs it
