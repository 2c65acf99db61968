"""Gandiva's grow-shrink (controller/core/policies/gandiva.py): a grown job is shrunk back for a
waiting job only when that makes room for it, and a step that applies twice in a round is said once.
Before (a live audit on the demo cluster): g1, grown to 2 x A40, was halved (a restart) for gop, an
opaque 2 x A40 job, which still waited ("free now: 1/2 A40-48GB"); and a job doubled twice read
"grown onto idle GPUs of its node (grow-shrink); grown onto idle GPUs of its node (grow-shrink)"."""

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
from tests.unit.demo_cluster import A10, A40, A100, LLAMA_AND_SMALL, node
from tests.unit.test_pending_reasons_crius import M, registered

EST = OpaqueAware(TableEstimates(LLAMA_AND_SMALL))


def demo(a40_busy: tuple[int, ...] = (), a100_busy: tuple[int, ...] = ()) -> tuple[NodeView, ...]:
    return (node("a100", A100, 4, 80, a100_busy), node("a40", A40, 2, 48, a40_busy),
            node("a10", A10, 4, 24), node("a10b", A10, 4, 24))


def plan(nodes: tuple[NodeView, ...], jobs: tuple[JobView, ...], running: tuple[RunningView, ...],
         mode: str) -> dict[str, Decision]:
    snap = Snapshot(nodes, jobs, registered(*nodes), running=running)
    return {d.job_id: d for d in plan_round(snap, EST, make_policy("gandiva", mode)).decisions}


@pytest.mark.parametrize("mode", ["paper", "artifact"])
def test_a_shrink_that_does_not_make_room_is_undone(mode: str) -> None:
    g1 = JobView("g1", 0.0, M, 64, 0, (A40,), iterations=100, estimate_key="small")  # asks for 1 A40
    gop = JobView("gop", 1.0, PLACEHOLDER_MODEL, 1, 2, (A40,), opaque=True)
    held = RunningView(g1, Cell(A40, 2, 1), (Slice("a40", (0, 1)),))
    d = plan(demo(a40_busy=(0, 1)), (gop,), (held,), mode)
    assert d["g1"].action == Action.KEEP, d["g1"].reason
    assert d["gop"].pending is PendingKind.NO_ROOM_NOW
    assert "1/2" not in d["gop"].reason, d["gop"].reason  # (paper: "free now: 0/2 A40-48GB")


def test_a_job_doubled_twice_in_a_round_says_so_once() -> None:
    s = JobView("s", 0.0, M, 64, 0, (A100,), iterations=100, estimate_key="small")
    held = RunningView(s, Cell(A100, 1, 1), (Slice("a100", (0,)),))
    d = plan(demo(a100_busy=(0,)), (), (held,), "paper")["s"]
    assert d.action == Action.MIGRATE and d.cell is not None and d.cell.gpus == 4, d.reason
    assert d.reason.count("grown onto idle GPUs of its node (grow-shrink)") == 1, d.reason


@pytest.mark.parametrize("mode", ["paper", "artifact"])
def test_a_job_halved_twice_for_room_says_so_once(mode: str) -> None:
    s = JobView("s", 0.0, M, 64, 0, (A100,), iterations=100, estimate_key="small")  # asks for 1 A100
    held = RunningView(s, Cell(A100, 4, 1), (Slice("a100", (0, 1, 2, 3)),))
    o = JobView("o", 1.0, PLACEHOLDER_MODEL, 1, 3, (A100,), opaque=True)
    d = plan(demo(a100_busy=(0, 1, 2, 3)), (o,), (held,), mode)
    assert d["o"].action == Action.START and d["s"].cell is not None and d["s"].cell.gpus == 1
    assert d["s"].reason.count("shrunk back toward its request to make room (grow-shrink)") == 1, d["s"].reason
