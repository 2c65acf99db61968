"""FCFS's reasons for a job it cannot run as asked (controller/core/policies/fcfs.py `_try`, the causes
shared with Crius in controller/core/policies/why_not.py) and the reason the live controller stores
for it (controller/rounds.py `pending_reason`): literal snapshots, a literal table of iteration
times, each cause pinned. FCFS runs n x t exactly as asked, so a reason names why n x t never runs:
more GPUs than the cluster has of t (or than its READY nodes have: it waits for nodes), more than a
job may have, an opaque job's exact count, GPU types missing or not READY, and otherwise memory on
n x t with the fewest GPUs of t the job fits on. None of these jobs blocks the jobs queued after it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.frenzy import FrenzyConfig
from tessera.controller.core.opaque import OpaqueAware
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import CellEstimate, Estimates, RoundConfig, plan_round
from tessera.controller.core.snapshot import (
    Action,
    Decision,
    JobView,
    NodeView,
    PendingKind,
    Snapshot,
)
from tessera.controller.rounds import pending_reason
from tessera.estimator.models import ModelDims
from tests.unit.test_pending_reasons_crius import node, registered

M = ModelDims(1024, 24, 16, 32000, 1024, "m")
BIG = ModelDims(8192, 80, 64, 128256, 4096, "big")  # 70B-like: MARP fits it on no count of 80 GB here
A100, V100 = "A100-80GB", "V100-32GB"
# Key "k" runs on 1 to 16 GPUs of either type; "k8" only on 8 A100 (the fewest it fits on); "gap" on
# 1, 2 or 8 A100 (not 4).
EST = TableEstimates({("k", t, n): 8.0 / n for t in (A100, V100) for n in (1, 2, 4, 8, 16)}
                     | {("k8", A100, 8): 1.0}
                     | {("gap", A100, n): 1.0 for n in (1, 2, 8)})
NOWHERE, NO_ROOM = PendingKind.FITS_NOWHERE, PendingKind.NO_ROOM_NOW



def job(gpus: int = 0, gtype: str = A100, key: str = "k", model: ModelDims = M,
        gpu_types: tuple[str, ...] = (), jid: str = "j", t: float = 0.0) -> JobView:
    return JobView(jid, t, model, 64, gpus, gpu_types, gtype, 100, estimate_key=key)


def opaque(gpus: int) -> JobView:
    return JobView("j", 0.0, M, 1, gpus, (A100,), opaque=True)


def decide(ready: tuple[NodeView, ...], registered_gpus: tuple[tuple[str, int, int], ...], j: JobView,
           est: Estimates = EST, mode: str = "paper", cfg: RoundConfig | None = None) -> tuple[Decision, str]:
    """The round's decision for the one job, and the reason the live controller stores for it."""
    snap = Snapshot(ready, (j,), registered_gpus)
    plan = plan_round(snap, est, make_policy("fcfs", mode), cfg or RoundConfig())
    (d,) = plan.decisions
    stored = pending_reason(d, {j.id: j}, snap, plan.policy, FrenzyConfig()) if d.action != Action.START else ""
    assert "infeasible (out of memory or not covered)" not in d.reason  # the old catch-all
    return d, stored


A = node("a")


@pytest.mark.parametrize("mode", ["paper", "artifact"])
def test_more_gpus_than_the_cluster_has_of_the_type_is_named(mode: str) -> None:
    # Was "fcfs: waiting for 16 x A100-80GB: free now: 4/4 A100-80GB" (no room now), blocking A100.
    d, stored = decide((A,), registered(A), job(gpus=16), mode=mode)
    assert d.pending is NOWHERE
    assert stored == d.reason == "fcfs: fits nowhere: it asks for 16 x A100-80GB, more than the cluster has (4: 4 x A100-80GB)"


def test_more_than_the_ready_nodes_hold_but_not_the_registered_waits_for_nodes() -> None:
    d, stored = decide((A,), registered(A, node("b")), job(gpus=8))
    assert d.pending is NO_ROOM
    assert stored == d.reason == ("fcfs: waiting for nodes: it asks for 8 x A100-80GB and READY nodes have at most 4 "
                                  "of one type (registered: 8 x A100-80GB)")


def test_no_ready_node_waits_for_nodes() -> None:
    # Was "fcfs: fits nowhere: no GPU type in the cluster holds the job".
    d, stored = decide((), registered(A), job(gpus=2))
    assert d.pending is NO_ROOM
    assert stored == d.reason == "fcfs: waiting for nodes: no READY node (registered: 4 x A100-80GB)"
    v = node("v", V100, 4, 32)
    d, stored = decide((A,), registered(A, v), job(gpus=2, gtype=V100, gpu_types=(V100,)))
    assert d.pending is NO_ROOM
    assert stored == d.reason == "fcfs: waiting for nodes: no READY node has V100-32GB (registered: 4 x V100-32GB)"


def test_no_ready_node_and_nothing_registered_that_runs_it_fits_nowhere() -> None:
    # Were "waiting for nodes: no READY node": its node coming back would not run it either.
    d, stored = decide((), registered(A), job(gpus=16))
    assert d.pending is NOWHERE
    assert stored == d.reason == "fcfs: fits nowhere: it asks for 16 GPUs of one type, more than the cluster has (4: 4 x A100-80GB)"
    b = node("b")
    d, _ = decide((), registered(A, b), job(gpus=4, key="k8"))
    assert d.pending is NOWHERE
    assert d.reason == ("fcfs: fits nowhere: it asks for 4 GPUs; it fits in memory on no fewer than 8 x A100-80GB "
                        "(registered: 8)")
    d, _ = decide((), registered(A), job(key="none", model=BIG))
    assert d.pending is NOWHERE
    assert d.reason == "fcfs: fits nowhere: no count of A100-80GB GPUs fits it (out of memory or not covered by the estimates)"
    # On 8 x A100 registered it runs on its 8 once they are back.
    d, _ = decide((), registered(A, b), job(gpus=8, key="k8"))
    assert d.pending is NO_ROOM and d.reason == "fcfs: waiting for nodes: no READY node (registered: 8 x A100-80GB)"


def test_a_gpu_type_the_cluster_lacks_is_the_whole_reason_once() -> None:
    d, stored = decide((A,), registered(A), job(gpus=2, gtype="", gpu_types=("H100-80GB",)))
    assert d.pending is NOWHERE
    assert stored == d.reason == ("fcfs: fits nowhere: no GPU of type H100-80GB in the cluster (it has "
                                  "4 x A100-80GB (74.5 GiB)); did you mean A100-80GB?")


def test_over_the_per_job_cap_names_the_cap() -> None:
    # Was started: FCFS did not apply RoundConfig.max_gpus_per_job.
    b = node("b")
    d, _ = decide((A, b), registered(A, b), job(gpus=8), cfg=RoundConfig(max_gpus_per_job=4))
    assert d.pending is NOWHERE
    assert d.reason == "fcfs: fits nowhere: it asks for 8 x A100-80GB and a job may have at most 4"


def test_an_opaque_job_is_told_its_exact_count() -> None:
    d, stored = decide((A,), registered(A), opaque(8), OpaqueAware(EST))
    assert d.pending is NOWHERE
    assert stored == d.reason == ("fcfs: fits nowhere: opaque job asks for 8 GPUs of one type; the most the cluster "
                                  "has of A100-80GB is 4")
    d, stored = decide((A,), registered(A, node("b")), opaque(8), OpaqueAware(EST))
    assert d.pending is NO_ROOM
    assert stored == d.reason == ("fcfs: waiting for nodes: it runs on exactly 8 GPUs of one type and READY nodes "
                                  "have at most 4 of one type (registered: 8 x A100-80GB)")
    b = node("b")
    d, _ = decide((A, b), registered(A, b), opaque(5), OpaqueAware(EST))
    assert d.pending is NOWHERE
    assert d.reason == ("fcfs: fits nowhere: it runs on exactly 5 GPUs of one type, which 2 nodes of A100-80GB "
                        "cannot split evenly")


def test_out_of_memory_names_the_fewest_gpus_it_fits_on() -> None:
    # Was "fcfs: fits nowhere: 4 x A100-80GB is infeasible (out of memory or not covered)".
    b = node("b")
    d, stored = decide((A, b), registered(A, b), job(gpus=4, key="k8"))
    assert d.pending is NOWHERE
    assert stored == d.reason == ("fcfs: fits nowhere: it does not fit in memory on 4 x A100-80GB; it fits in memory "
                                  "on no fewer than 8 x A100-80GB")


def test_out_of_memory_on_every_count_gets_the_memory_account() -> None:
    d, stored = decide((A,), registered(A), job(gpus=2, key="none", model=BIG))
    assert d.pending is NOWHERE
    assert d.reason == ("fcfs: fits nowhere: it does not fit in memory on 2 x A100-80GB, nor on any other count "
                        "of A100-80GB")
    assert stored == d.reason + ("; needs at least 16739.7 GiB per GPU (MARP, dp=2 tp=1, +1.0 GiB "
                                 "reserve); the cluster has 4 x A100-80GB (74.5 GiB)")


def test_a_count_between_those_it_fits_on_is_not_called_memory_alone() -> None:
    b = node("b")
    d, _ = decide((A, b), registered(A, b), job(gpus=4, key="gap"))
    assert d.pending is NOWHERE
    assert d.reason == ("fcfs: fits nowhere: the estimates have no Cell of 4 x A100-80GB on 1 node (out of memory "
                        "or not covered; it fits in memory on 1, 2 or 8 x A100-80GB)")


class _OneNode(TableEstimates):
    """The table's Cells on one node only (a count that fits in memory, not covered over nodes)."""

    def cells(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> Sequence[CellEstimate]:
        return super().cells(job, gpu_type, gpus, nodes) if nodes == 1 else ()


def test_a_count_it_fits_on_without_a_cell_names_the_estimates() -> None:
    b = node("b")
    d, _ = decide((A, b), registered(A, b), job(gpus=8), _OneNode(EST.table))
    assert d.pending is NOWHERE
    assert d.reason == ("fcfs: fits nowhere: the estimates have no Cell of 8 x A100-80GB on 2 nodes (it fits in "
                        "memory on 8 x A100-80GB)")


def test_no_count_of_the_type_fits_a_job_without_a_count() -> None:
    # Was "fcfs: fits nowhere: no GPU type in the cluster holds the job".
    d, _ = decide((A,), registered(A), job(key="none"))
    assert d.pending is NOWHERE
    assert d.reason == ("fcfs: fits nowhere: no count of A100-80GB GPUs fits it (out of memory or not covered by "
                        "the estimates)")


@pytest.mark.parametrize("first", [job(gpus=16, jid="big"), job(gpus=8, jid="big"), job(gpus=4, jid="big", key="k8")])
def test_a_job_that_never_runs_on_the_ready_nodes_blocks_nobody(first: JobView) -> None:
    later = job(gpus=2, jid="later", t=1.0)
    snap = Snapshot((A,), (first, later), registered(A, node("b")))
    d = {x.job_id: x for x in plan_round(snap, EST, make_policy("fcfs")).decisions}
    assert d["big"].action == Action.PENDING and d["big"].pending in (NOWHERE, NO_ROOM)
    assert "waiting for 16" not in d["big"].reason and "waiting for 8" not in d["big"].reason
    assert d["later"].action == Action.START


@pytest.mark.parametrize("mode", ["paper", "artifact"])
def test_a_type_with_too_few_ready_gpus_loses_to_a_slower_one_that_has_them(mode: str) -> None:
    # Was "fcfs: waiting for nodes: it asks for 8 x A100-80GB and READY nodes have at most 4 of one type
    # (registered: 8 x A100-80GB)" forever, while 8 READY V100 could run it (and did with no A100 READY).
    a, b, v1, v2 = node("a"), node("b"), node("v1", V100, 4, 32), node("v2", V100, 4, 32)
    j = job(gpus=8, gtype="", gpu_types=(A100, V100))
    d, _ = decide((a, v1, v2), registered(a, b, v1, v2), j, mode=mode)
    assert d.action == Action.START and d.cell is not None and (d.cell.gpu_type, d.cell.gpus) == (V100, 8)
    # No allowed type can run it now: the reason still names the preferred type's cause.
    d, stored = decide((a, v1), registered(a, b, v1, v2), j, mode=mode)
    assert d.pending is NO_ROOM
    assert stored == d.reason == ("fcfs: waiting for nodes: it asks for 8 x A100-80GB and READY nodes have at most "
                                  "4 of one type (registered: 8 x A100-80GB)")


def test_out_of_memory_on_the_registered_gpus_fits_nowhere_while_nodes_are_down() -> None:
    # Was "fcfs: waiting for nodes: it asks for 16 x A100-80GB and READY nodes have at most 4 ...", without
    # the memory account: nodes coming back would not run it.
    more = registered(A, node("b"), node("c"), node("d"))
    d, stored = decide((A,), more, job(gpus=16, key="none", model=BIG))
    assert d.pending is NOWHERE
    assert d.reason == ("fcfs: fits nowhere: it does not fit in memory on 16 x A100-80GB, nor on any other count "
                        "of A100-80GB")
    assert stored.startswith(d.reason + "; needs at least ")
    k16 = TableEstimates({("k16", A100, 16): 1.0})
    d, _ = decide((A,), more, job(gpus=8, key="k16"), k16)
    assert d.pending is NOWHERE
    assert d.reason == ("fcfs: fits nowhere: it does not fit in memory on 8 x A100-80GB; it fits in memory on no "
                        "fewer than 16 x A100-80GB")
    d, _ = decide((A,), more, job(gpus=16, key="k16"), k16)  # fits in memory: it waits for the nodes
    assert d.pending is NO_ROOM and d.reason.startswith("fcfs: waiting for nodes: it asks for 16 x A100-80GB")


def test_a_job_without_a_gpu_count_is_told_the_fewest_it_fits_on_not_what_it_asks() -> None:
    # Was "it asks for 8 x A100-80GB, ...": the job asked for no count.
    b = node("b")
    d, stored = decide((A,), registered(A), job(key="k8"))
    assert d.pending is NOWHERE
    assert stored == d.reason == ("fcfs: fits nowhere: it fits in memory on no fewer than 8 x A100-80GB, more than "
                                  "the cluster has (4: 4 x A100-80GB)")
    d, _ = decide((A, b), registered(A, b), job(key="k8"), cfg=RoundConfig(max_gpus_per_job=4))
    assert d.pending is NOWHERE
    assert d.reason == "fcfs: fits nowhere: it fits in memory on no fewer than 8 x A100-80GB and a job may have at most 4"
    d, _ = decide((A,), registered(A, b), job(key="k8"))
    assert d.pending is NO_ROOM
    assert d.reason == ("fcfs: waiting for nodes: it fits in memory on no fewer than 8 x A100-80GB and READY nodes "
                        "have at most 4 of one type (registered: 8 x A100-80GB)")


def test_a_job_no_type_runs_as_asked_is_told_of_the_type_closest_to_running_it() -> None:
    # A live audit: `gpus: 1` for a 7B model, any type, was told "it fits in memory on no fewer than
    # 8 x A10-24GB" (the first type by name) where 2 x A100-80GB hold it. Here V100 holds it on 2.
    est = TableEstimates({("fit", A100, 8): 1.0, ("fit", V100, 2): 1.0})
    ready = (node("a", n=8), node("v", V100, n=8, mem_gb=32))
    d, _ = decide(ready, registered(*ready), job(gpus=1, gtype="", key="fit"), est)
    assert d.pending is NOWHERE
    assert "it does not fit in memory on 1 x V100-32GB; it fits in memory on no fewer than 2 x V100-32GB" in d.reason
    # No count of any type holds a 16-GPU request: the type with the most GPUs is named.
    ready = (node("a", n=4), node("v", V100, n=8, mem_gb=32))
    d, _ = decide(ready, registered(*ready), job(gpus=16, gtype="", key="k"))
    assert "16 x V100-32GB, more than the cluster has (8" in d.reason


def test_free_now_in_a_reason_is_what_the_round_leaves() -> None:
    # A waits for the busy A100s; B, queued after it, takes every V100 in the same round. A's reason
    # said "free now: ... 4/4 V100-32GB" (counted before B's start) until the next round.
    busy = NodeView("a", node("a").gpus, frozenset(range(4)))
    ready = (busy, node("v", V100, n=4, mem_gb=32))
    a, b = job(gpus=2, gtype=A100, jid="A", t=0.0), job(gpus=4, gtype=V100, jid="B", t=1.0)
    plan = plan_round(Snapshot(ready, (a, b), registered(*ready)), EST, make_policy("fcfs"))
    d = {x.job_id: x for x in plan.decisions}
    assert d["B"].action == Action.START
    assert d["A"].reason == "fcfs: waiting for 2 x A100-80GB: free now: 0/4 A100-80GB, 0/4 V100-32GB"
