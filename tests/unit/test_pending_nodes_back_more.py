"""A job that registered nodes which are down (drained, unhealthy) would run waits for nodes in
gavel, sia and morphling too: it is neither "fits nowhere" nor dropped, and it starts once the node
is READY (controller/core/policies/why_not.py `if_back`; tests/unit/test_pending_nodes_back.py has
the other policies). Literal snapshots and tables: a node in `registered(...)` but not in the ready
nodes is down."""

from __future__ import annotations

import dataclasses

import pytest

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.opaque import OpaqueAware
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import plan_round
from tessera.controller.core.snapshot import Action, JobView, Snapshot
from tests.unit.test_pending_nodes_back import (
    A100,
    NO_ROOM,
    NOWHERE,
    V100,
    A,
    B,
    M,
    V,
    decide,
    job,
    waits_then_starts,
)
from tests.unit.test_pending_reasons_crius import registered

REG = "registered: 4 x A100-80GB, 4 x V100-32GB; READY: 0 x V100-32GB"
ON_V = f"it fits in memory on 1 x V100-32GB or 2 x V100-32GB or 4 x V100-32GB ({REG})"


def as_before(policy: str, mode: str, nowhere: str) -> None:
    """A 1-GPU V100 job on a cluster that registers no V100: dropped by the artifact, else `nowhere`."""
    d = decide(policy, (A,), (A,), job("v", 1), mode)
    if mode == "artifact":
        assert d.action == Action.DROP and d.reason == f"{policy}: dropped: 1 GPUs of no type can run it"
    else:
        assert d.pending is NOWHERE and d.reason == nowhere


@pytest.mark.parametrize("mode", ["paper", "artifact"])
@pytest.mark.parametrize("gpus", [1, 0])
def test_gavel_a_job_that_fits_only_a_type_whose_nodes_are_down_waits_for_nodes(mode: str, gpus: int) -> None:
    # Was "gavel: fits nowhere: no GPU type runs its request" (paper; a job without a count was
    # "gavel: waiting") and "gavel: dropped: 1 GPUs of no type can run it" (artifact).
    cell = waits_then_starts("gavel", (A,), (A, V), job("v", gpus), (
        f"gavel: waiting for nodes: no READY GPU type runs its request; it fits in memory on 1 x V100-32GB ({REG})"),
        mode)
    assert (cell.gpu_type, cell.gpus) == (V100, 1)
    as_before("gavel", mode, "gavel: fits nowhere: no count of A100-80GB GPUs fits it (out of memory or not covered by the estimates)")


def test_gavel_a_request_only_the_registered_gpus_of_its_type_hold_waits_for_nodes() -> None:
    # 8 x A100 asked, 4 READY, 8 registered: was "gavel: fits nowhere: no GPU type runs its request".
    cell = waits_then_starts("gavel", (A,), (A, B), job("k8", 8), (
        "gavel: waiting for nodes: no READY GPU type runs its request; it fits in memory on 8 x A100-80GB "
        "(registered: 8 x A100-80GB; READY: 4 x A100-80GB)"))
    assert (cell.gpu_type, cell.gpus) == (A100, 8)


@pytest.mark.parametrize("mode", ["paper", "artifact"])
def test_sia_a_job_that_fits_only_a_type_whose_nodes_are_down_waits_for_nodes(mode: str) -> None:
    # Was "sia: fits nowhere: no configuration is feasible" (paper) and "sia: dropped: 1 GPUs of no
    # type can run it" (artifact).
    cell = waits_then_starts("sia", (A,), (A, V), job("v", 1),
                             f"sia: waiting for nodes: no configuration is feasible on the READY nodes; {ON_V}", mode)
    assert cell.gpu_type == V100
    as_before("sia", mode, "sia: fits nowhere: no configuration is feasible; no count of A100-80GB GPUs fits it "
              "(out of memory or not covered by the estimates)")


def test_sia_paper_counts_the_configurations_of_the_registered_gpus() -> None:
    # Sia's configurations of A100 with one 4-GPU node READY are 1, 2 and 4; with both back, 8 too.
    cell = waits_then_starts("sia", (A,), (A, B), job("k8"), (
        "sia: waiting for nodes: no configuration is feasible on the READY nodes; it fits in memory on "
        "8 x A100-80GB (registered: 8 x A100-80GB; READY: 4 x A100-80GB)"))
    assert (cell.gpu_type, cell.gpus) == (A100, 8)


@pytest.mark.parametrize("mode", ["paper", "artifact"])  # one algorithm, the mode recorded only
def test_morphling_a_job_that_fits_only_a_type_whose_nodes_are_down_waits_for_nodes(mode: str) -> None:
    # Was "morphling: fits nowhere: no plan of this job runs on any GPU count of this cluster".
    cell = waits_then_starts("morphling", (A,), (A, V), job("v"),
                             f"morphling: waiting for nodes: no plan of this job runs on the READY nodes; {ON_V}", mode)
    assert cell.gpu_type == V100
    d = decide("morphling", (A,), (A,), job("v"), mode)  # nothing registered runs it: as before
    assert d.pending is NOWHERE
    assert d.reason == "morphling: fits nowhere: no plan of this job runs on any GPU count of this cluster"


def test_gavel_artifact_a_job_waiting_for_nodes_blocks_no_later_job() -> None:
    """In a round with a departure the waiting jobs are retried in FIFO order and one that does not
    fit blocks its type; one that waits for its down nodes blocked every later job without a hint,
    though the READY A100 node was idle and ran them (review)."""
    est = TableEstimates({("v", V100, 1): 4.0, ("k", A100, 1): 4.0})
    waiting = job("v", 1)
    later = dataclasses.replace(job("k", 1), id="later", submit_time=1.0)
    snap = Snapshot((A,), (waiting, later), registered(A, V), arrivals=(), departures=1, now=10.0)
    d = {x.job_id: x for x in plan_round(snap, est, make_policy("gavel", "artifact")).decisions}
    assert d["j"].pending is NO_ROOM
    assert d["later"].action == Action.START


@pytest.mark.parametrize(("name", "mode"), [("elasticflow", "paper"), ("sia", "paper"), ("sia", "artifact")])
def test_an_opaque_job_waits_for_nodes_only_for_its_exact_count(name: str, mode: str) -> None:
    """A 3-GPU opaque job runs on 3, never on a power-of-two share of 4 or 8: with one of two 4-GPU
    nodes down it was told it "fits in memory on 8 x A100" and waited for nodes; it is what it is
    with both READY (declined, or fits nowhere), as before."""
    est = OpaqueAware(TableEstimates({}))
    j = JobView("j", 0.0, M, 1, 3, iterations=1, opaque=True, estimate_key="opaque-3-any")
    for ready in ((A,), (A, B)):
        (d,) = plan_round(Snapshot(ready, (j,), registered(A, B), arrivals=("j",)), est,
                          make_policy(name, mode)).decisions
        assert d.pending is not NO_ROOM, d.reason
