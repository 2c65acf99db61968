"""The live controller keeps a round's opportunistic mark (Placement.opportunistic) and gives it back
to the next round (RunningView.opportunistic), as the simulator does. Before, it kept none: crius
never suspended a job it had started ahead of an earlier waiting one, and that job waited until the
opportunistic one ended (a live audit: a 4-GPU job waited behind a 2-GPU job that had jumped it)."""

from __future__ import annotations

from tessera.controller.core.snapshot import (
    Action,
    Cell,
    Decision,
    GpuView,
    JobView,
    NodeView,
    RoundPlan,
    RunningView,
    Slice,
    Snapshot,
)
from tessera.controller.rounds import kept_notes
from tessera.controller.snapshots import RoundCursor
from tessera.controller.store import JobRecord
from tessera.estimator.models import ModelDims
from tessera.v1 import common_pb2 as P
from tests.unit.test_engine import Harness
from tests.unit.test_engine_opaque import plain

M = ModelDims(1024, 24, 16, 32000, 1024, "m")


async def test_crius_suspends_the_opportunistic_job_for_the_one_it_jumped() -> None:
    h = Harness(policy="crius", nodes=("a",))  # 4 x A10-24GB
    await h.register("a")
    first = await h.submit(plain("first", gpus=2))
    await h.round()
    await h.heartbeat("a")
    wide = await h.submit(plain("wide", gpus=4))
    late = await h.submit(plain("late", gpus=2))
    await h.round()
    assert h.state(wide) == "PENDING" and h.state(late) == "STARTING"
    assert "opportunistic: an earlier job is still waiting" in h.job(late).reason
    placement = h.job(late).placement
    assert placement is not None and placement.opportunistic
    await h.heartbeat("a")
    assert h.state(late) == "RUNNING"

    h.agents.exit(first, 1, 0)  # the first job ends: wide can start by taking late's GPUs
    await h.heartbeat("a")
    assert h.state(first) == "SUCCEEDED"
    await h.round()
    assert h.state(late) == "MIGRATING" and "suspended by crius" in h.job(late).reason
    h.agents.exit(late, 1, 0)  # its workers stop after their checkpoint
    await h.heartbeat("a")
    assert h.state(late) == "PENDING"
    await h.round()
    assert h.state(wide) == "STARTING"
    # While it waits, its reason still names the job that took its GPUs (before: only its STOPPED event).
    why = h.job(late).reason
    assert h.state(late) == "PENDING" and "; waiting since it was suspended by crius: " in why and wide in why


async def test_a_kept_jobs_mark_is_stored_when_the_round_changes_it() -> None:
    h = Harness(policy="crius", nodes=("a",))
    await h.register("a")
    jid = await h.submit(plain("j", gpus=2))
    await h.round()
    await h.heartbeat("a")
    job = h.job(jid)
    assert job.placement is not None and not job.placement.opportunistic
    snap, _ = h.engine.snapshot()
    (r,) = snap.running
    assert not r.opportunistic
    plan = RoundPlan((Decision(jid, Action.KEEP, "crius: running", r.plan, r.slices, r.cell, opportunistic=True),))
    ((after, events),) = kept_notes(plan, snap, {jid: job}.get)
    assert after.placement is not None and after.placement.opportunistic and after.reason == job.reason
    assert events == [] and list(after.placement.slices) == list(job.placement.slices)
    same = RoundPlan((Decision(jid, Action.KEEP, "crius: running", r.plan, r.slices, r.cell),))
    assert kept_notes(same, snap, {jid: job}.get) == []  # unchanged: nothing to write


def view(jid: str) -> JobView:
    return JobView(jid, 0.0, M, 8, 1, (), "X", 100)


def node(busy: int) -> NodeView:
    return NodeView("n", tuple(GpuView(i, "X", 40 * 1000**3) for i in range(4)), frozenset(range(busy)))


def test_arrivals_and_departures_between_rounds() -> None:
    stored = {"a": P.JOB_STATE_RUNNING, "b": P.JOB_STATE_PENDING, "c": P.JOB_STATE_PENDING}

    def get(jid: str) -> JobRecord | None:
        return JobRecord(jid, "", P.JobSpec(), stored[jid], "", 0.0) if jid in stored else None

    cur = RoundCursor()
    run_a = RunningView(view("a"), Cell("X", 1), (Slice("n", (0,)),))
    first = Snapshot((node(1),), (view("b"),), running=(run_a,))
    assert cur.mark(first, get) == first  # after a start: every pending job is new, as before
    # c arrived; b still waits; nothing left.
    s2 = cur.mark(Snapshot((node(1),), (view("b"), view("c")), running=(run_a,)), get)
    assert (s2.arrivals, s2.departures) == (("c",), 0)
    # a ended; c backs off after a failed launch (out of the snapshot, not ended): one departure.
    stored["a"] = P.JOB_STATE_SUCCEEDED
    s3 = cur.mark(Snapshot((node(0),), (view("b"),)), get)
    assert (s3.arrivals, s3.departures) == ((), 1)
    # c back: not an arrival; no job ended, no GPU freed.
    s4 = cur.mark(Snapshot((node(0),), (view("b"), view("c"))), get)
    assert (s4.arrivals, s4.departures) == ((), 0)
    # GPUs freed another way (a node back, a job stopped) count as a departure when none ended.
    cur.mark(Snapshot((node(3),), (view("b"), view("c"))), get)
    s6 = cur.mark(Snapshot((node(1),), (view("b"), view("c"))), get)
    assert (s6.arrivals, s6.departures) == ((), 1)
