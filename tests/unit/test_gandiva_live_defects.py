"""Gandiva on the demo cluster of the live audit (4 x A100-80GB on one node, 2 x A40-48GB, two nodes of
4 x A10-24GB): a job without a GPU count asks, on each type, for the fewest GPUs it fits on there, and
grow-shrink shrinks it back to that count for a waiting job; a waiting job's reason names the types
and counts it waits for; a job that fits nowhere says why. Literal tables (TableEstimates): "llama"
fits on 2 or 4 x A100 and 8 x A10, never on A40, as llama2-7b does; "small" fits on every count of
every type up to a node, 8 x A10 included."""

from __future__ import annotations

import pytest

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.opaque import PLACEHOLDER_MODEL, OpaqueAware
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
from tests.unit.demo_cluster import A10, A40, A100, LLAMA_AND_SMALL, cluster
from tests.unit.test_pending_reasons_crius import M, registered

EST = OpaqueAware(TableEstimates(LLAMA_AND_SMALL))
NOWHERE, NO_ROOM = PendingKind.FITS_NOWHERE, PendingKind.NO_ROOM_NOW
MODES = ["paper", "artifact"]


DEMO = cluster()
ALL = (0, 1, 2, 3)


def job(key: str, gpus: int = 0, types: tuple[str, ...] = (), jid: str = "j") -> JobView:
    return JobView(jid, 0.0, M, 64, gpus, types, iterations=100, estimate_key=key)


def opaque_job(gpus: int, types: tuple[str, ...] = (), jid: str = "o") -> JobView:
    return JobView(jid, 1.0, PLACEHOLDER_MODEL, 1, gpus, types, opaque=True)


def plan(jobs: tuple[JobView, ...], mode: str = "paper", nodes: tuple[NodeView, ...] = DEMO,
         running: tuple[RunningView, ...] = ()) -> dict[str, Decision]:
    snap = Snapshot(nodes, jobs, registered(*DEMO), running=running)
    return {d.job_id: d for d in plan_round(snap, EST, make_policy("gandiva", mode)).decisions}


def decide(j: JobView, mode: str = "paper", nodes: tuple[NodeView, ...] = DEMO) -> Decision:
    return plan((j,), mode, nodes)[j.id]


# ------------------------------------------------------------------------- 1: a job without a count

def test_paper_a_job_without_a_count_runs_on_the_idle_a100_while_the_a10_are_busy() -> None:
    # Was "gandiva: waiting for 8 GPUs (any type)": the count was the first type's by name (A10: 8),
    # more than the 4 idle A100. (It starts on 2 and grows onto the other two: nobody waits.)
    d = decide(job("llama"), nodes=cluster(a10_busy=ALL))
    assert d.action == Action.START and d.cell is not None and d.cell.gpu_type == A100, d.reason
    assert "affinity placement on A100-80GB" in d.reason


def test_paper_a_job_with_a_count_keeps_it_on_every_type() -> None:
    d = decide(job("llama", 8), nodes=cluster(a10_busy=ALL))
    assert d.pending is NO_ROOM and d.reason.startswith("gandiva: waiting for 8 x A10-24GB; free now: "), d.reason
    assert decide(job("llama", 2), nodes=cluster(a10_busy=ALL)).action == Action.START


# --------------------------------------------------------------------------- 3: what a job waits for

@pytest.mark.parametrize(("j", "asked"), [
    (job("small", 3, (A100,)), "3 x A100-80GB"),  # it read "3 GPUs (any type)"
    (job("llama", 8), "8 x A10-24GB"),  # "8 GPUs (any type)": A100 and A40 have fewer
    (job("llama"), "8 x A10-24GB or 2 x A100-80GB"),  # "8 GPUs (any type)": A10's count on every type
])
def test_paper_a_waiting_job_names_the_types_and_counts_it_waits_for_and_what_is_free(j: JobView, asked: str) -> None:
    # One A100 free, the A10 busy; "small" has a Cell of 3 x A100 here.
    est = TableEstimates(LLAMA_AND_SMALL | {("small", A100, 3): 1.0})
    d = plan_round(Snapshot(cluster(ALL, (0, 1, 2)), (j,), registered(*DEMO)), est, make_policy("gandiva")).decisions[0]
    assert (d.pending, d.reason) == (NO_ROOM, (f"gandiva: waiting for {asked}; free now: 0/8 A10-24GB, "
                                               "1/4 A100-80GB, 2/2 A40-48GB"))


def test_artifact_a_waiting_job_keeps_its_text() -> None:
    d = decide(job("llama", 8), "artifact", cluster(a10_busy=ALL))
    assert (d.pending, d.reason) == (NO_ROOM, "gandiva: waiting for 8 GPUs (of A10-24GB)")


# ------------------------------------------------------------------------------------ 2: grow-shrink

@pytest.mark.parametrize("mode", MODES)
def test_a_grown_job_without_a_count_is_shrunk_back_for_a_waiting_job(mode: str) -> None:
    # "small" runs on 1 A100 at least and grew onto all four; an opaque 3 x A100 job arrives. Was: the
    # grown job counted as at its request (its count), so the opaque job waited while it held 4.
    grown = job("small", 0, (A100,), "s")
    held = RunningView(grown, Cell(A100, 4, 1), (Slice("a100", ALL),))
    d = plan((opaque_job(3, (A100,)),), mode, cluster(a100_busy=ALL), (held,))
    assert d["o"].action == Action.START and d["o"].cell == Cell(A100, 3, 1), d["o"].reason
    assert d["s"].action == Action.MIGRATE and d["s"].cell == Cell(A100, 1), d["s"].reason
    assert "shrunk back toward its request to make room (grow-shrink)" in d["s"].reason


@pytest.mark.parametrize("mode", MODES)
def test_an_opaque_job_never_grows_nor_shrinks(mode: str) -> None:
    # A guard: an opaque job runs on the GPUs it asked for (docs/opaque-jobs.md), whatever is idle.
    o = opaque_job(1, (A100,))
    d = plan((), mode, cluster(a100_busy=(0,)), (RunningView(o, Cell(A100, 1, 1), (Slice("a100", (0,)),)),))
    assert d["o"].action == Action.KEEP and d["o"].cell == Cell(A100, 1, 1)
    o2 = opaque_job(2, (A100,))
    d = plan((job("small", 4, (A100,), "w"),), mode, cluster(a100_busy=(0, 1)),
             (RunningView(o2, Cell(A100, 2, 1), (Slice("a100", (0, 1)),)),))
    assert d["o"].action == Action.KEEP and d["w"].pending is NO_ROOM


def test_paper_no_job_grows_onto_a_type_a_waiting_job_may_run_on() -> None:
    # A 4-GPU job that may use A100 or A10 waits (3 A100 free, the A10 busy). Was: the 1-GPU job grew
    # onto the A100 (the waiting job counted as waiting for A10, the first type by name only).
    s = job("small", 1, (A100,), "s")
    held = RunningView(s, Cell(A100, 1, 1), (Slice("a100", (0,)),))
    d = plan((job("small", 4, (), "w"),), "paper", cluster(ALL, (0,)), (held,))
    assert d["s"].action == Action.KEEP, d["s"].reason
    assert d["w"].reason.startswith("gandiva: waiting for 4 x A10-24GB or 4 x A100-80GB; free now: "), d["w"].reason


# ---------------------------------------------------------------------------------- 4: fits nowhere

@pytest.mark.parametrize(("j", "paper", "artifact"), [
    (job("small", 16), ("it asks for 16 GPUs of one type, more than the cluster has (14: 8 x A10-24GB, "
                        "4 x A100-80GB, 2 x A40-48GB)"),
     "it asks for 16 GPUs of A10-24GB, more than the cluster has (8: 8 x A10-24GB)"),
    (job("small", 3), ("the estimates have no Cell of 3 x A10-24GB (out of memory or not covered; it fits in "
                       "memory on 1, 2, 4 or 8 x A10-24GB); the estimates have no Cell of 3 x A100-80GB (out of "
                       "memory or not covered; it fits in memory on 1, 2 or 4 x A100-80GB); 3 x A40-48GB is more "
                       "than the cluster has (2)"),
     ("the estimates have no Cell of 3 x A10-24GB (out of memory or not covered; it fits in memory on "
      "1, 2, 4 or 8 x A10-24GB)")),
    (job("small", 4, (A40,)), "it asks for 4 GPUs of one type, more than the cluster has (2: 2 x A40-48GB)",
     "it asks for 4 GPUs of A40-48GB, more than the cluster has (2: 2 x A40-48GB)"),
    (opaque_job(5), ("it runs on exactly 5 GPUs of one type, which the nodes of A10-24GB cannot split evenly; "
                     "5 x A100-80GB is more than the cluster has (4); 5 x A40-48GB is more than the cluster has (2)"),
     "it runs on exactly 5 GPUs of one type, which the nodes of A10-24GB cannot split evenly"),
    (job("llama", 2, (A10,)), "it asks for 2 GPUs; it fits in memory on no fewer than 8 x A10-24GB (registered: 8)",
     "it asks for 2 GPUs; it fits in memory on no fewer than 8 x A10-24GB (registered: 8)"),
    (job("llama", 0, (A40,)), "no count of A40-48GB GPUs fits it (out of memory or not covered by the estimates)",
     "no count of A40-48GB GPUs fits it (out of memory or not covered by the estimates)"),
])
def test_a_job_that_fits_nowhere_says_why(j: JobView, paper: str, artifact: str) -> None:
    # Was "gandiva: fits nowhere as requested" alone. The artifact judges the type it asks for only.
    for mode, why in (("paper", paper), ("artifact", artifact)):
        d = decide(j, mode)
        assert (d.pending, d.reason) == (NOWHERE, f"gandiva: fits nowhere as requested: {why}"), mode
