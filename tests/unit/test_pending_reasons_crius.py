"""Crius's reasons for a job none of whose Cells runs (controller/core/policies/crius.py `_no_cell`)
and the reason the live controller stores for it (controller/rounds.py `pending_reason`): literal
snapshots, a literal table of iteration times, each reason pinned. A reason names the cause (the
gpus hint larger than the cluster or than any Cell, no READY node, no GPU of the allowed types,
memory) and says "out of memory" only where Cells the cluster can hold were refused."""

from __future__ import annotations

import pytest

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.frenzy import FrenzyConfig
from tessera.controller.core.opaque import OpaqueAware
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policies.crius import CriusOptions, CriusPolicy
from tessera.controller.core.policy import Estimates, Policy, RoundConfig, plan_round
from tessera.controller.core.snapshot import (
    Action,
    Decision,
    GpuView,
    JobView,
    NodeView,
    PendingKind,
    Snapshot,
)
from tessera.controller.rounds import pending_reason
from tessera.estimator.models import ModelDims

GB = 1000**3
M = ModelDims(1024, 24, 16, 32000, 1024, "m")
BIG = ModelDims(8192, 80, 64, 128256, 4096, "big")  # 70B-like: no Cell of 4 x 80 GB holds it
A100, V100 = "A100-80GB", "V100-32GB"
# Key "k" runs on 1, 2 or 4 GPUs of either type; "k16" only on 16 A100 (the fewest it fits on).
EST = TableEstimates({("k", t, n): 8.0 / n for t in (A100, V100) for n in (1, 2, 4)}
                     | {("k16", A100, 16): 1.0})
NOWHERE, NO_ROOM = PendingKind.FITS_NOWHERE, PendingKind.NO_ROOM_NOW


def node(nid: str, model: str = A100, n: int = 4, mem_gb: int = 80) -> NodeView:
    return NodeView(nid, tuple(GpuView(i, model, mem_gb * GB) for i in range(n)))


def registered(*nodes: NodeView) -> tuple[tuple[str, int, int], ...]:
    """The snapshot's cluster_gpus: every registered node's GPUs, READY or not."""
    seen: dict[tuple[str, int], int] = {}
    for nd in nodes:
        for g in nd.gpus:
            seen[(g.model, g.memory_bytes)] = seen.get((g.model, g.memory_bytes), 0) + 1
    return tuple(sorted((m, b, c) for (m, b), c in seen.items()))


def job(gpus: int = 0, key: str = "k", model: ModelDims = M, gpu_types: tuple[str, ...] = (),
        deadline: float = 0.0) -> JobView:
    return JobView("j", 0.0, model, 64, gpus, gpu_types, deadline=deadline, estimate_key=key)


def decide(ready: tuple[NodeView, ...], registered_gpus: tuple[tuple[str, int, int], ...], j: JobView,
           est: Estimates = EST, policy: Policy | None = None) -> tuple[Decision, str]:
    """The round's decision for the one job, and the reason the live controller stores for it."""
    snap = Snapshot(ready, (j,), registered_gpus)
    plan = plan_round(snap, est, policy or make_policy("crius"))
    (d,) = plan.decisions
    stored = pending_reason(d, {j.id: j}, snap, plan.policy, FrenzyConfig()) if d.action != Action.START else ""
    assert "among none" not in d.reason and "among none" not in stored
    return d, stored


A = node("a")


def test_a_hint_larger_than_the_cluster_is_named_not_memory() -> None:
    d, stored = decide((A,), registered(A), job(gpus=64))
    assert d.pending is NOWHERE
    assert stored == d.reason == ("crius: fits nowhere: its gpus hint is 64: its smallest Cell (half the hint) is 32 "
                                  "GPUs of one type, more than the cluster has (4: 4 x A100-80GB)")
    # The same job with a hint of 8 runs on 4 GPUs (half the hint).
    d, _ = decide((A,), registered(A), job(gpus=8))
    assert d.action == Action.START and d.cell is not None and d.cell.gpus == 4


def test_a_hint_larger_than_any_cell_says_a_cell_is_one_gpu_type() -> None:
    v = node("v", V100, 4, 32)
    d, stored = decide((A, v), registered(A, v), job(gpus=16))
    assert d.pending is NOWHERE
    assert stored == d.reason == ("crius: fits nowhere: its gpus hint is 16: its smallest Cell (half the hint) is 8 "
                                  "GPUs of one type and the cluster has at most 4 of one type "
                                  "(4 x A100-80GB, 4 x V100-32GB)")


def test_a_hint_over_the_per_job_limit_names_the_limit() -> None:
    b = node("b")
    snap = Snapshot((A, b), (job(gpus=8),), registered(A, b))
    plan = plan_round(snap, EST, make_policy("crius"), RoundConfig(max_gpus_per_job=2))
    assert plan.decisions[0].reason == ("crius: fits nowhere: its gpus hint is 8: its smallest Cell (half the hint) "
                                        "is 4 GPUs of one type and a job may have at most 2")


def test_a_requeued_job_with_no_ready_node_waits_for_nodes() -> None:
    # Its only node drained: registered, not READY. It fits once the node is back.
    d, stored = decide((), registered(A), job())
    assert d.pending is NO_ROOM
    assert stored == d.reason == "crius: waiting for nodes: no READY node (registered: 4 x A100-80GB)"


def test_a_gpus_hint_too_small_for_memory_says_how_many_gpus_the_job_needs() -> None:
    # Was "no feasible Cell among 1 x A100-80GB, 2 x A100-80GB, 4 x A100-80GB (out of memory or not
    # covered by the estimates)": true, but the cluster has the 16 GPUs it fits on.
    four = tuple(node(f"n{i}") for i in range(4))
    d, _ = decide(four, registered(*four), job(gpus=2, key="k16"))
    assert d.pending is NOWHERE
    assert d.reason == ("crius: fits nowhere: its gpus hint is 2: its largest Cell is 4 GPUs; it fits in memory "
                        "on no fewer than 16 x A100-80GB (registered: 16)")
    d, _ = decide(four, registered(*four), job(gpus=8, key="k16"))  # a hint whose 2N is 16: it runs
    assert d.action == Action.START and d.cell is not None and d.cell.gpus == 16


def test_no_ready_node_and_no_count_that_holds_it_in_memory_fits_nowhere() -> None:
    # Was "waiting for nodes: no READY node": its node coming back would not run it either.
    d, stored = decide((), registered(A), job(key="k16"))
    assert d.pending is NOWHERE
    assert stored == d.reason == ("crius: fits nowhere: it fits in memory on no fewer than 16 x A100-80GB "
                                  "(registered: 4)")
    d, _ = decide((), registered(A), job(key="none", model=BIG))
    assert d.pending is NOWHERE
    assert d.reason == "crius: fits nowhere: no count of A100-80GB GPUs fits it (out of memory or not covered by the estimates)"
    # The same with 16 A100 registered: it waits for them.
    four = tuple(node(f"n{i}") for i in range(4))
    d, _ = decide((), registered(*four), job(key="k16"))
    assert d.pending is NO_ROOM and d.reason == "crius: waiting for nodes: no READY node (registered: 16 x A100-80GB)"


def test_no_ready_node_and_a_hint_over_the_registered_gpus_fits_nowhere() -> None:
    d, stored = decide((), registered(A), job(gpus=64))
    assert d.pending is NOWHERE
    assert stored == d.reason == ("crius: fits nowhere: its gpus hint is 64: its smallest Cell (half the hint) is 32 "
                                  "GPUs of one type, more than the cluster has (4: 4 x A100-80GB)")


def test_a_hint_the_ready_nodes_cannot_hold_but_the_registered_can_waits_for_nodes() -> None:
    # Its Cell of 8 x A100 is covered by the estimates: it runs once b is back. (Under EST it has no
    # Cell of 8 and fits nowhere, as with b READY: tests/unit/test_pending_nodes_back_cells.py.)
    est = TableEstimates(EST.table | {("k", A100, 8): 1.0})
    d, stored = decide((A,), registered(A, node("b")), job(gpus=16), est)
    assert d.pending is NO_ROOM
    assert stored == d.reason == ("crius: waiting for nodes: its gpus hint is 16: its smallest Cell (half the hint) "
                                  "is 8 GPUs of one type and READY nodes have at most 4 of one type "
                                  "(registered: 8 x A100-80GB)")


def test_allowed_types_only_on_nodes_not_ready_wait_for_nodes() -> None:
    v = node("v", V100, 4, 32)
    d, stored = decide((A,), registered(A, v), job(gpu_types=(V100,)))
    assert d.pending is NO_ROOM
    assert stored == d.reason == "crius: waiting for nodes: no READY node has V100-32GB (registered: 4 x V100-32GB)"


def test_a_gpu_type_the_cluster_lacks_is_the_whole_reason_once() -> None:
    d, stored = decide((A,), registered(A), job(gpu_types=("H100-80GB",)))
    assert d.pending is NOWHERE
    # docs/cli.md, "GPU types": the MARP account the controller would append says the same: not twice.
    assert stored == d.reason == ("crius: fits nowhere: no GPU of type H100-80GB in the cluster (it has "
                                  "4 x A100-80GB (74.5 GiB)); did you mean A100-80GB?")


def test_an_opaque_job_of_a_type_the_cluster_lacks_is_told_so_once() -> None:
    opaque = JobView("j", 0.0, M, 1, 2, ("A40-48GB",), opaque=True)
    d, stored = decide((A,), registered(A), opaque, OpaqueAware(EST))
    assert d.pending is NOWHERE
    assert stored == d.reason == ("crius: fits nowhere: opaque job asks for A40-48GB: no such GPU in the cluster "
                                  "(it has A100-80GB)")


def test_an_opaque_job_larger_than_the_ready_nodes_waits_for_nodes_not_memory() -> None:
    opaque = JobView("j", 0.0, M, 1, 8, (A100,), opaque=True)
    d, stored = decide((A,), registered(A, node("b")), opaque, OpaqueAware(EST))
    assert d.pending is NO_ROOM
    assert stored == d.reason == ("crius: waiting for nodes: it runs on exactly 8 GPUs of one type and READY nodes "
                                  "have at most 4 of one type (registered: 8 x A100-80GB)")


def test_memory_is_named_where_cells_the_cluster_holds_are_refused() -> None:
    d, stored = decide((A,), registered(A), job(gpus=2, key="none", model=BIG))
    assert d.pending is NOWHERE
    assert d.reason == ("crius: fits nowhere: no feasible Cell among 1 x A100-80GB, 2 x A100-80GB, 4 x A100-80GB "
                        "(out of memory or not covered by the estimates)")
    assert stored == d.reason + ("; needs at least 16739.7 GiB per GPU (MARP, dp=2 tp=1, +1.0 GiB "
                                 "reserve); the cluster has 4 x A100-80GB (74.5 GiB)")
    d, _ = decide((A,), registered(A), job(key="none", model=BIG))
    assert d.reason == ("crius: fits nowhere: no count of A100-80GB GPUs fits it (out of memory or not covered by "
                        "the estimates)")


def test_the_fewest_gpus_a_job_fits_on_against_the_registered_and_the_ready() -> None:
    d, stored = decide((A,), registered(A), job(key="k16"))
    assert d.pending is NOWHERE
    assert stored == d.reason == "crius: fits nowhere: it fits in memory on no fewer than 16 x A100-80GB (registered: 4)"
    more = registered(A, node("b"), node("c"), node("d"))
    d, stored = decide((A,), more, job(key="k16"))
    assert d.pending is NO_ROOM
    assert stored == d.reason == ("crius: waiting for nodes: it fits in memory on no fewer than 16 x A100-80GB "
                                  "(registered: 16); READY: 4 x A100-80GB")


@pytest.mark.parametrize("ready", [(), (A,)])
def test_the_deadline_variant_drops_a_job_that_fits_nowhere_but_not_one_waiting_for_nodes(
        ready: tuple[NodeView, ...]) -> None:
    ddl = CriusPolicy(CriusOptions(deadline_aware=True))
    d, stored = decide(ready, registered(A), job(gpus=64 if ready else 0, deadline=1e6), policy=ddl)
    if ready:
        assert d.action == Action.DROP
        assert stored == d.reason == ("crius-ddl: dropped: its gpus hint is 64: its smallest Cell (half the hint) is "
                                      "32 GPUs of one type, more than the cluster has (4: 4 x A100-80GB)")
    else:
        assert d.pending is NO_ROOM
        assert stored == d.reason == "crius-ddl: waiting for nodes: no READY node (registered: 4 x A100-80GB)"


def test_a_snapshot_without_cluster_gpus_counts_the_ready_nodes() -> None:
    # Snapshots built by hand (tests, tools) leave cluster_gpus empty: the nodes are the cluster.
    d, _ = decide((A,), (), job(gpus=64))
    assert d.reason == ("crius: fits nowhere: its gpus hint is 64: its smallest Cell (half the hint) is 32 GPUs of "
                        "one type, more than the cluster has (4: 4 x A100-80GB)")
    d, _ = decide((A,), (), job(gpu_types=("H100-80GB",)))
    assert d.reason == ("crius: fits nowhere: no GPU of type H100-80GB in the cluster (it has 4 x A100-80GB "
                        "(74.5 GiB)); did you mean A100-80GB?")


def test_out_of_memory_on_the_registered_gpus_fits_nowhere_while_nodes_are_down() -> None:
    # Was "crius: waiting for nodes: its gpus hint is 16: ... READY nodes have at most 4 of one type ...",
    # without the memory account: nodes coming back would not run it.
    d, stored = decide((A,), registered(A, node("b"), node("c"), node("d")), job(gpus=16, key="none", model=BIG))
    assert d.pending is NOWHERE
    assert d.reason == ("crius: fits nowhere: no count of A100-80GB GPUs fits it (out of memory or not covered by "
                        "the estimates)")
    assert stored.startswith(d.reason + "; needs at least ")
    d, stored = decide((A,), registered(A, node("b")), job(gpus=16, key="k16"))
    assert d.pending is NOWHERE
    assert stored == d.reason == "crius: fits nowhere: it fits in memory on no fewer than 16 x A100-80GB (registered: 8)"
    # It fits in memory on the registered GPUs: it waits for the nodes.
    d, _ = decide((A,), registered(A, node("b"), node("c"), node("d")), job(gpus=16, key="k16"))
    assert d.pending is NO_ROOM and d.reason.startswith("crius: waiting for nodes: its gpus hint is 16")


def test_the_fewest_gpus_a_job_fits_on_over_the_per_job_cap_names_the_cap() -> None:
    # Was "crius: fits nowhere: it fits in memory on no fewer than 16 x A100-80GB (registered: 16)".
    nodes = (A, node("b"), node("c"), node("d"))
    snap = Snapshot(nodes, (job(key="k16"),), registered(*nodes))
    plan = plan_round(snap, EST, make_policy("crius"), RoundConfig(max_gpus_per_job=8))
    assert plan.decisions[0].pending is NOWHERE
    assert plan.decisions[0].reason == ("crius: fits nowhere: it fits in memory on no fewer than 16 x A100-80GB "
                                        "(registered: 16); a job may have at most 8")
