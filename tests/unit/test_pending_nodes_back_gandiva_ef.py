"""Gandiva and ElasticFlow with registered nodes down (drained, unhealthy): a job gets what it gets with
every registered node READY, except that one those nodes would run waits for them ("waiting for
nodes", PendingKind.NO_ROOM_NOW) rather than being called fits nowhere or declined (why_not.if_back).
Literal snapshots and tables: a node in `registered(...)` but not in the ready nodes is down."""

from __future__ import annotations

import pytest

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.snapshot import Action, Decision, JobView, NodeView
from tests.unit.test_pending_nodes_back import A100, NO_ROOM, NOWHERE, V100, A, B, M, V
from tests.unit.test_pending_nodes_back import decide as decide_with

# "q" runs on 2, 4, 6 or 8 A100; "p" on 2, 4 or 8 (no Cell of 6); "k8" on 8 A100 only; "v" on 1, 2 or
# 4 V100 only; "zz" is in no table (no Cell anywhere); "big" has Cells on 1-8 A100 but its
# data-parallel replica fits on none (ElasticFlow runs data parallelism only).
EST = TableEstimates({("q", A100, n): 8.0 / n for n in (2, 4, 6, 8)} | {("p", A100, n): 8.0 / n for n in (2, 4, 8)}
                     | {("k8", A100, 8): 1.0} | {("v", V100, n): 4.0 / n for n in (1, 2, 4)}
                     | {("big", A100, n): 8.0 / n for n in (1, 2, 4, 8)},
                     dp_ok={("big", A100, n): False for n in (1, 2, 4, 8)})
Nodes = tuple[tuple[NodeView, ...], tuple[NodeView, ...]]  # (ready, registered)
FULL, DOWN, NONE = ((A, B), (A, B)), ((A,), (A, B)), ((), (A, B))
V_FULL, V_DOWN, V_NONE = ((A, V), (A, V)), ((A,), (A, V)), ((), (A, V))
MODES = ["paper", "artifact"]
NO_COUNT = "no count of A100-80GB GPUs fits it (out of memory or not covered by the estimates)"


def job(key: str, gpus: int, hint: str = A100, deadline: float = 0.0, types: tuple[str, ...] = ()) -> JobView:
    return JobView("j", 0.0, M, 64, gpus, types, iterations=100, deadline=deadline, estimate_key=key,
                   gpu_type_hint=hint)


def decide(policy: str, nodes: Nodes, j: JobView, mode: str = "paper") -> Decision:
    return decide_with(policy, nodes[0], nodes[1], j, mode, EST)


def outcome(d: Decision) -> tuple[str, object, str]:
    return d.action, d.pending, d.reason


# ---------------------------------------------------------------------------------------- gandiva

@pytest.mark.parametrize("mode", MODES)
def test_gandiva_waits_for_nodes_that_would_run_a_6_gpu_job(mode: str) -> None:
    # Was "gandiva: fits nowhere as requested" with no READY node, "waiting for 6 GPUs (...)" with b down.
    assert decide("gandiva", FULL, job("q", 6), mode).action == Action.START
    asked = "6 GPUs (of A100-80GB)" if mode == "artifact" else "6 x A100-80GB"  # paper: was "6 GPUs (any type)"
    d = decide("gandiva", NONE, job("q", 6), mode)
    assert d.pending is NO_ROOM
    assert d.reason == ("gandiva: waiting for nodes: no READY node runs it as requested; it fits in memory on "
                        "6 x A100-80GB (registered: 8 x A100-80GB; READY: 0 x A100-80GB)")
    d = decide("gandiva", DOWN, job("q", 6), mode)
    assert d.pending is NO_ROOM
    assert d.reason == (f"gandiva: waiting for nodes: {asked} are more than the READY nodes have; it fits "
                        "in memory on 6 x A100-80GB (registered: 8 x A100-80GB; READY: 4 x A100-80GB)")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("nodes", [V_DOWN, V_NONE])
def test_gandiva_waits_for_the_type_whose_nodes_are_down(mode: str, nodes: Nodes) -> None:
    # "v" runs on V100 only. Was "gandiva: fits nowhere as requested" (its request tried on A100 only).
    assert decide("gandiva", V_FULL, job("v", 1, V100), mode).action == Action.START
    d = decide("gandiva", nodes, job("v", 1, V100), mode)
    assert d.pending is NO_ROOM
    assert d.reason == ("gandiva: waiting for nodes: no READY node runs it as requested; it fits in memory on "
                        "1 x V100-32GB (registered: 4 x A100-80GB, 4 x V100-32GB; READY: 0 x V100-32GB)")


@pytest.mark.parametrize("mode", MODES)
def test_gandiva_a_job_no_registered_node_runs_gets_its_outcome_with_every_node_ready(mode: str) -> None:
    # No Cell of 6 ("p"), none at all ("zz"), or only on V100, which the job may not use ("v"): fits
    # nowhere with the nodes down as with all of them READY.
    # The reason names the cause (it read "gandiva: fits nowhere as requested" alone).
    only_a100 = job("v", 1, types=(A100,))
    no_count = "no count of A100-80GB GPUs fits it (out of memory or not covered by the estimates)"
    no_six = ("the estimates have no Cell of 6 x A100-80GB (out of memory or not covered; it fits in memory on "
              "2, 4 or 8 x A100-80GB)")
    for j, nodes, full, why in [(job("p", 6), (DOWN, NONE), FULL, no_six), (job("zz", 2), (DOWN, NONE), FULL, no_count),
                                (only_a100, (V_DOWN, V_NONE), V_FULL, no_count)]:
        up = decide("gandiva", full, j, mode)
        assert up.pending is NOWHERE and up.reason == f"gandiva: fits nowhere as requested: {why}"
        for n in nodes:
            assert outcome(decide("gandiva", n, j, mode)) == outcome(up), (j.estimate_key, n)
    # Against it: "q" has a Cell of 6, which b coming back runs (was "fits nowhere as requested").
    assert decide("gandiva", NONE, job("q", 6), mode).pending is NO_ROOM


# ------------------------------------------------------------------------------------ elasticflow

@pytest.mark.parametrize("name", ["elasticflow", "elasticflow-l"])
def test_elasticflow_paper_declines_with_no_ready_node_what_it_declines_with_every_node_ready(name: str) -> None:
    # "zz" has no Cell, "big" no data-parallel share that fits. Was "fits nowhere: no data-parallel share
    # of the registered GPUs fits its memory (8 x A100-80GB)" with no READY node, dropped with both READY.
    # "zz" fits on no count at all: memory (or estimates that do not cover it), as gavel and sia say it;
    # it read "the estimates have no Cell of a data-parallel share of 1-8 GPUs of any type".
    for key, why in [("zz", NO_COUNT),
                     ("big", "no data-parallel share of 1-8 GPUs of any type fits its memory")]:
        full = decide(name, FULL, job(key, 2))
        assert full.action == Action.DROP and full.reason == f"{name}: declined: {why}"
        assert outcome(decide(name, NONE, job(key, 2))) == outcome(full)
    # What b would serve still waits for it.
    d = decide(name, NONE, job("k8", 8))
    assert d.pending is NO_ROOM and d.reason.startswith(f"{name}: waiting for nodes: no READY node; ")


@pytest.mark.parametrize("name", ["elasticflow", "elasticflow-l"])
def test_elasticflow_artifact_keeps_waiting_with_no_ready_node_as_with_every_node_ready(name: str) -> None:
    # The artifact lets a job no share serves wait ("not admitted"). Was "fits nowhere: ..." with no
    # READY node; and "not admitted on A100-80GB: no share meets its deadline" whatever the cause.
    for key, why in [("zz", NO_COUNT), ("big", "no data-parallel share of 1-8 GPUs fits its memory")]:
        full = decide(name, FULL, job(key, 2), "artifact")
        assert full.pending is NO_ROOM and full.reason == f"{name}: not admitted on A100-80GB: {why}"
        assert outcome(decide(name, NONE, job(key, 2), "artifact")) == outcome(full)


@pytest.mark.parametrize("name", ["elasticflow", "elasticflow-l"])
def test_elasticflow_artifact_waits_for_nodes_that_hold_the_share_the_ready_ones_do_not(name: str) -> None:
    # "k8" needs 8 A100; b is down. Was "not admitted on A100-80GB: no share meets its deadline".
    assert decide(name, FULL, job("k8", 8), "artifact").action == Action.START
    d = decide(name, DOWN, job("k8", 8), "artifact")
    assert d.pending is NO_ROOM
    assert d.reason == (f"{name}: waiting for nodes: no share of the READY A100-80GB serves it; it fits in memory "
                        "on 8 x A100-80GB (registered: 8 x A100-80GB; READY: 4 x A100-80GB)")
    # The paper's mode said so already.
    assert decide(name, DOWN, job("k8", 8)).reason.startswith(f"{name}: waiting for nodes: ")


@pytest.mark.parametrize("mode", MODES)
def test_elasticflow_names_the_deadline_when_a_share_runs_but_too_slowly(mode: str) -> None:
    # "q" runs on 2-8 A100 in 1-4 s/iteration, but its deadline is 10 s away (a restart alone costs
    # 150 s). Was "... fits its memory and meets its deadline" (paper), "no share meets its deadline"
    # (artifact): now the one cause, in both.
    d = decide("elasticflow", FULL, job("q", 2, deadline=10.0), mode)
    why = "no data-parallel share of 1-8 GPUs" + (" of any type" if mode == "paper" else "") + " meets its deadline"
    if mode == "paper":
        assert d.action == Action.DROP and d.reason == f"elasticflow: declined: {why}"
    else:
        assert d.pending is NO_ROOM and d.reason == f"elasticflow: not admitted on A100-80GB: {why}"


@pytest.mark.parametrize("mode", MODES)
def test_gandiva_calls_a_request_larger_than_its_type_fits_nowhere(mode: str) -> None:
    # The estimates time a Cell of 16 A100 where the cluster registers 8: it waited "for 16 GPUs" for ever.
    est = TableEstimates({("x16", A100, 16): 1.0, ("x16", A100, 8): 2.0})
    d = decide_with("gandiva", FULL[0], FULL[1], job("x16", 16), mode, est)
    of = "A100-80GB" if mode == "artifact" else "one type"
    assert (d.action, d.pending, d.reason) == (Action.PENDING, NOWHERE, (
        f"gandiva: fits nowhere as requested: it asks for 16 GPUs of {of}, more than the cluster has (8: 8 x A100-80GB)"))
    assert decide_with("gandiva", FULL[0], FULL[1], job("x16", 8), mode, est).action == Action.START


def test_gandiva_paper_waits_for_any_type_it_may_use_not_only_the_named_one() -> None:
    # Heterogeneity-blind: a job naming V100 whose V100 node is READY but too small, and whose A100
    # nodes are down, runs on A100 once they are back: it waits for them (was "fits nowhere").
    ready, registered = (V,), (A, B, V)
    d = decide_with("gandiva", ready, registered, job("q", 6, hint=V100), "paper", EST)
    assert d.pending is NO_ROOM and d.reason.startswith("gandiva: waiting for nodes: no READY node runs it as "
                                                        "requested; it fits in memory on 6 x A100-80GB")
    assert decide_with("gandiva", registered, registered, job("q", 6, hint=V100), "paper", EST).action == Action.START
    d = decide_with("gandiva", ready, registered, job("q", 6, hint=V100), "artifact", EST)
    assert (d.pending, d.reason) == (NOWHERE, ("gandiva: fits nowhere as requested: it asks for 6 GPUs of V100-32GB, "
                                               "more than the cluster has (4: 4 x V100-32GB)"))  # the artifact keeps V100


def test_elasticflow_on_one_gpu_says_one_gpu() -> None:
    # (It read "a data-parallel share of 1-1 GPUs".)
    one = NodeView("one", A.gpus[:1])
    d = decide("elasticflow", ((one,), (one,)), job("big", 1))
    assert d.reason == "elasticflow: declined: no data-parallel share of 1 GPU of any type fits its memory"
