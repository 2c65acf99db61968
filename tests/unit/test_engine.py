"""The engine end to end without processes: a real `Engine` over `MemoryStore`, in-memory agents
(tests/fake_agent_calls.py) and a fake clock; rounds, liveness and inspection are driven by calling
their steps (`run_round`, `liveness_tick`, `inspect`, `heartbeat`) directly.

After every step `check` asserts the engine's invariants: every submitted job exists exactly once;
the agents saw every agent call only after the state it acts on was stored (FakeAgents checks this
against the store at each call); no attempt was started twice and no job went back to an older
attempt; no GPU is held by two active jobs; nothing pending is forgotten (every job not finished is
either placed or PENDING with a reason).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import pytest

from tessera.controller.core.policies.frenzy import FrenzyPolicy
from tessera.controller.core.policy import RoundContext
from tessera.controller.core.snapshot import Decision, Slice
from tessera.controller.engine import Engine, EngineConfig, JobNotFound, NodeNotFound
from tessera.controller.store import ACTIVE, TERMINAL, JobRecord, MemoryStore
from tessera.v1 import common_pb2 as P
from tests.fake_agent_calls import ControllerKilled, FakeAgents, inventory

LEASE = 15.0
REQUEUE = LEASE + 10.0 + 1.0  # lease + the default fence grace + the margin (docs/fencing.md)


class Clock:
    """Wall and monotonic time at once: tests move it by hand."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def tiny(name: str = "tiny", iterations: int = 40, gpus: int = 0, max_retries: int = 0) -> P.JobSpec:
    return P.JobSpec(name=name, model=P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256,
                                                  seq_length=64),
                     global_batch_size=16, iterations=iterations, checkpoint_every=10, max_retries=max_retries,
                     hint=P.ResourceHint(gpus=gpus))


class ScriptedMoves:
    """Frenzy's placements, plus the migrations a test asks for (`move`): job id -> target slices."""

    def __init__(self) -> None:
        self.inner = FrenzyPolicy()
        self.move: dict[str, tuple[Slice, ...]] = {}

    @property
    def name(self) -> str:
        return "scripted"

    def plan(self, ctx: RoundContext) -> list[Decision]:
        out = []
        for job_id, slices in self.move.items():
            r = ctx.running[job_id]
            out.append(Decision(job_id, "migrate", "the test moves it", r.plan, slices, r.cell, r.cell, "move"))
        self.move = {}
        return out + [d for d in self.inner.plan(ctx) if d.job_id not in {o.job_id for o in out}]


class Harness:
    def __init__(self, policy: str = "frenzy", nodes: Sequence[str] = ("a", "b"), scripted: bool = False,
                 learn: str = "nvml") -> None:
        self.store = MemoryStore()
        self.agents = FakeAgents(self.store)
        self.clock = Clock()
        self.cfg = EngineConfig(policy=policy, learn_step_times=learn)
        self.policy = ScriptedMoves() if scripted else None
        self.engine = self._engine()
        self.submitted: list[str] = []
        for n in nodes:
            self.agents.add_node(n, inventory("A10-24GB", 4, 24))

    def _engine(self) -> Engine:
        return Engine(self.store, self.agents, self.cfg, self.store.next_epoch(), wall=self.clock, mono=self.clock,
                      policy=self.policy)

    async def register(self, *nodes: str) -> None:
        for n in nodes:
            await self.engine.register(self.agents.status(n))
        self.check()

    async def heartbeat(self, *nodes: str) -> None:
        for n in nodes:
            assert await self.engine.heartbeat(self.agents.status(n), self.engine.epoch)
        self.check()

    async def submit(self, spec: P.JobSpec) -> str:
        self.clock.advance(1)  # distinct submit times: the queue order is the submission order
        rec, created = await self.engine.submit(spec, f"req-{len(self.submitted)}")
        assert created
        self.submitted.append(rec.id)
        self.check()
        return rec.id

    async def round(self) -> None:
        await self.engine.run_round()
        self.check()

    async def inspect(self) -> None:
        await self.engine.inspect()
        self.check()

    async def restart(self) -> Engine:
        """A new controller over the same store (the old one is dropped, as if killed)."""
        self.engine = self._engine()
        self.check()
        return self.engine

    def job(self, job_id: str) -> JobRecord:
        rec = self.store.get_job(job_id)
        assert rec is not None
        return rec

    def state(self, job_id: str) -> str:
        return str(P.JobState.Name(self.job(job_id).state)[10:])

    def kinds(self, job_id: str) -> list[str]:
        return [e.kind for e in self.store.events(job_id)]

    def nodes_of(self, job_id: str) -> list[str]:
        placement = self.job(job_id).placement
        assert placement is not None
        return [s.node_id for s in placement.slices]

    def check(self) -> None:
        jobs = self.store.list_jobs()
        ids = [j.id for j in jobs]
        assert len(ids) == len(set(ids)) and sorted(ids) == sorted(self.submitted), "every job exactly once"
        assert not self.agents.violations
        for (job_id, attempt, _node) in self.agents.started:
            assert attempt <= self.job(job_id).attempt
        last: dict[str, int] = {}
        for c in self.agents.launches():
            assert c.attempt >= last.get(c.job_id, 0), f"{c.job_id} launched attempt {c.attempt} after a later one"
            last[c.job_id] = c.attempt
        held: dict[tuple[str, int], str] = {}
        for j in jobs:
            if j.state == P.JOB_STATE_PENDING:
                assert j.reason, f"{j.id} pending without a reason"
            elif j.state in ACTIVE:
                assert j.plan is not None and j.placement is not None and j.placement.slices, f"{j.id} not placed"
                for s in j.placement.slices:
                    for g in s.gpu_indices:
                        assert (s.node_id, g) not in held, f"GPU {s.node_id}/{g}: {held.get((s.node_id, g))} and {j.id}"
                        held[(s.node_id, g)] = j.id
            else:
                assert j.state in TERMINAL and j.end_time > 0


def iteration(progress: P.Progress | None) -> int:
    assert progress is not None
    return int(progress.iteration)


async def run_to_running(h: Harness, job_id: str) -> int:
    """The job's current attempt: its workers report in, the job is RUNNING."""
    await h.heartbeat(*h.nodes_of(job_id))
    assert h.state(job_id) == "RUNNING"
    return h.job(job_id).attempt


async def test_submit_place_lose_node_relaunch_restart_finish() -> None:
    h = Harness()
    await h.register("a", "b")
    jid = await h.submit(tiny())
    assert h.state(jid) == "PENDING" and h.engine.round_requested

    # round: placed on a (frenzy: best fit, first node), stored STARTING before the Launch
    await h.round()
    assert h.state(jid) == "STARTING" and h.nodes_of(jid) == ["a"] and h.job(jid).attempt == 1
    assert [(c.job_id, c.attempt, c.node_id) for c in h.agents.launches()] == [(jid, 1, "a")]
    assert await run_to_running(h, jid) == 1

    # progress: seen at the next heartbeat, persisted by the next inspection
    h.agents.report(jid, 1, iteration=12)
    await h.heartbeat("a")
    assert iteration(h.engine.view.progress(jid)) == 12
    await h.inspect()
    assert iteration(h.job(jid).progress) == 12

    # node a goes silent past its lease while b keeps beating: UNREACHABLE, but its job stays put
    # until a's agent has fenced its workers (lease + fence grace + margin after the last receipt)
    h.clock.advance(LEASE / 2)
    await h.heartbeat("b")
    h.clock.advance(LEASE / 2 + 1)
    await h.heartbeat("b")
    stops_before = len(h.agents.stops())
    await h.engine.liveness_tick()
    h.check()
    assert h.engine.view.node("a").state == P.NODE_STATE_UNREACHABLE
    assert h.state(jid) == "RUNNING" and h.job(jid).restarts == 0
    h.clock.advance(REQUEUE - LEASE - 1 - 0.01)  # just before the bound
    await h.heartbeat("b")
    await h.engine.liveness_tick()
    assert h.state(jid) == "RUNNING"
    h.clock.advance(0.02)
    await h.engine.liveness_tick()
    h.check()
    assert h.state(jid) == "PENDING" and h.kinds(jid)[-1] == "NODE_LOST" and h.job(jid).restarts == 1
    assert "node a is UNREACHABLE" in h.job(jid).reason
    assert len(h.agents.stops()) == stops_before  # a is unreachable: no call to it
    assert iteration(h.job(jid).progress) == 12  # resumes from what it reported

    # relaunched elsewhere: attempt 2 on b
    await h.round()
    assert h.state(jid) == "STARTING" and h.nodes_of(jid) == ["b"] and h.job(jid).attempt == 2
    assert await run_to_running(h, jid) == 2

    # a returns with the old attempt still running: it is stopped as stale (after the store moved on)
    await h.register("a")
    assert [(c.job_id, c.attempt, c.node_id) for c in h.agents.stops()][-1] == (jid, 1, "a")
    assert h.state(jid) == "RUNNING" and h.job(jid).attempt == 2

    # controller restart: new epoch, nodes unknown until their agents register again
    old_epoch = h.engine.epoch
    eng = await h.restart()
    assert eng.epoch == old_epoch + 1
    assert h.engine.view.node("b").state == P.NODE_STATE_UNREACHABLE
    assert not await eng.heartbeat(h.agents.status("b"), old_epoch)  # told to register again
    await h.register("a", "b")
    await h.inspect()
    await h.round()
    assert h.state(jid) == "RUNNING" and h.job(jid).attempt == 2
    assert len(h.agents.started) == 2  # nothing launched again

    # the job finishes: rank 0 reached the iterations, every rank exited 0
    h.agents.report(jid, 2, iteration=40)
    h.agents.exit(jid, 2, code=0)
    await h.heartbeat("b")
    assert h.state(jid) == "SUCCEEDED" and iteration(h.job(jid).progress) == 40
    assert h.kinds(jid) == ["SUBMITTED", "PLACED", "RUNNING", "NODE_LOST", "PLACED", "RUNNING", "SUCCEEDED"]
    assert sorted(h.agents.started) == [(jid, 1, "a"), (jid, 2, "b")]


async def test_restart_between_store_and_launch_relaunches_the_same_attempt_once() -> None:
    h = Harness()
    await h.register("a", "b")
    jid = await h.submit(tiny())
    h.agents.kill_on_launch.add(jid)
    with pytest.raises(ControllerKilled):
        await h.engine.run_round()
    # the attempt was stored before the call that never reached the agent
    assert h.state(jid) == "STARTING" and h.job(jid).attempt == 1 and not h.agents.started

    await h.restart()
    await h.register("a", "b")
    assert h.state(jid) == "STARTING"  # no workers yet: not judged lost within the start timeout
    await h.inspect()  # relaunches what is missing, same attempt, same request
    assert list(h.agents.started) == [(jid, 1, "a")]
    assert h.agents.launches()[-1].detail == f"{jid}/1/a"
    await h.inspect()  # workers not yet reported: the same request again, which the agent ignores
    assert list(h.agents.started) == [(jid, 1, "a")]
    assert await run_to_running(h, jid) == 1
    await h.inspect()
    assert len(h.agents.launches()) == 3  # the killed call and two resends; none once the workers show


async def test_policy_migration_stops_then_relaunches_on_the_target() -> None:
    h = Harness(scripted=True)
    await h.register("a", "b")
    jid = await h.submit(tiny())
    await h.round()
    await run_to_running(h, jid)
    h.agents.report(jid, 1, iteration=20)
    await h.heartbeat("a")

    assert isinstance(h.policy, ScriptedMoves)
    h.policy.move[jid] = (Slice("b", (2,)),)
    await h.round()
    assert h.state(jid) == "MIGRATING" and h.job(jid).stop_requested
    assert h.agents.stops()[-1].node_id == "a"
    assert h.engine.view.busy_gpus()["b"] == {2}  # the target is held while the old attempt stops

    h.clock.advance(3)
    await h.heartbeat("a")  # the old workers exited 0 after their checkpoint
    assert h.state(jid) == "STARTING" and h.job(jid).attempt == 2 and h.job(jid).restarts == 1
    placement = h.job(jid).placement
    assert placement is not None and [(s.node_id, list(s.gpu_indices)) for s in placement.slices] == [("b", [2])]
    assert "stopped in 3.0s" in h.job(jid).reason

    await run_to_running(h, jid)
    h.clock.advance(2)
    h.agents.report(jid, 2, iteration=21)
    await h.heartbeat("b")
    assert h.kinds(jid)[-4:] == ["MIGRATING", "MIGRATED", "RUNNING", "RESUMED"]
    assert "migration cost 5.0s" in h.store.events(jid)[-1].message
    assert sorted(h.agents.started) == [(jid, 1, "a"), (jid, 2, "b")]


async def test_drain_moves_jobs_off_and_undrain_takes_work_again() -> None:
    h = Harness()
    await h.register("a", "b")
    jid = await h.submit(tiny())
    await h.round()
    await run_to_running(h, jid)

    await h.engine.drain("a", "maintenance")
    h.check()
    assert [c.detail for c in h.agents.calls if c.kind == "drain"] == ["True"]
    assert h.state(jid) == "MIGRATING" and "node a is draining: maintenance" in h.job(jid).reason
    assert h.engine.view.node("a").state == P.NODE_STATE_DRAINING  # still holds the job

    await h.heartbeat("a")  # stopped with a checkpoint: back to PENDING
    assert h.state(jid) == "PENDING" and h.kinds(jid)[-1] == "STOPPED"
    assert h.engine.view.node("a").state == P.NODE_STATE_DRAINED
    await h.round()
    assert h.nodes_of(jid) == ["b"] and h.job(jid).attempt == 2

    other = await h.submit(tiny("other", gpus=4))
    await h.round()  # b has 3 GPUs left, a is drained: the 4-GPU job waits, with a reason
    assert h.state(other) == "PENDING" and h.job(other).reason != "waiting for the next scheduling round"
    await h.engine.undrain("a")
    h.check()
    assert h.engine.view.node("a").state == P.NODE_STATE_READY and h.engine.round_requested
    await h.round()
    assert h.state(other) == "STARTING" and h.nodes_of(other) == ["a"]
    with pytest.raises(NodeNotFound):
        await h.engine.drain("nope", "")


async def test_cancel_pending_and_running() -> None:
    h = Harness()
    await h.register("a")
    waiting = await h.submit(tiny("w"))
    running = await h.submit(tiny("r"))
    await h.engine.cancel(waiting)
    h.check()
    assert h.state(waiting) == "CANCELLED" and not h.agents.stops()
    await h.round()
    await run_to_running(h, running)
    await h.engine.cancel(running)  # stored CANCELLED before the Stop (FakeAgents checks)
    h.check()
    assert h.state(running) == "CANCELLED" and h.agents.stops()[-1].job_id == running
    await h.heartbeat("a")  # the stopped workers' exits change nothing
    assert h.state(running) == "CANCELLED"
    assert [c.job_id for c in h.agents.launches()] == [running]
    with pytest.raises(JobNotFound):
        await h.engine.cancel("j-000000000000")


async def test_failed_attempt_is_retried_then_fails_with_its_last_log_line() -> None:
    h = Harness()
    await h.register("a")
    jid = await h.submit(tiny(max_retries=1))
    await h.round()
    await run_to_running(h, jid)
    h.agents.log_lines[(jid, 0)] = "step 3\nRuntimeError: CUDA out of memory\n"
    h.agents.exit(jid, 1, code=1)
    await h.heartbeat("a")
    assert h.state(jid) == "PENDING" and h.kinds(jid)[-1] == "ATTEMPT_FAILED"
    assert "retry 1 of 1" in h.job(jid).reason and "CUDA out of memory" in h.job(jid).reason

    await h.round()
    await run_to_running(h, jid)
    h.agents.exit(jid, 2, code=1)
    await h.heartbeat("a")
    assert h.state(jid) == "FAILED" and h.job(jid).reason.endswith("(after 1 retry)")


async def test_a_spawn_failure_is_said_once() -> None:
    """The keeper's reason is the worker's status reason and also the log's last line: the job's
    reason says it once, without the guess an exit code 127 otherwise gets."""
    h = Harness()
    await h.register("a")
    jid = await h.submit(tiny())
    await h.round()
    why = "spawn failed: cannot run '/tmp' in /w as uid 1001: [Errno 13] Permission denied: '/tmp'"
    h.agents.log_lines[(jid, 0)] = f"tessera-keeper[{jid}/1/0]: {why}\n"
    h.agents.exit(jid, 1, code=127)
    for _, w in h.agents.workers(jid, 1):
        w.reason = f"{why}, exit code 127"
    await h.heartbeat("a")
    assert h.state(jid) == "FAILED"
    assert h.job(jid).reason.count("Permission denied") == 1 and "program not found" not in h.job(jid).reason


async def test_failed_launch_requeues_and_a_hung_start_fails_the_attempt() -> None:
    h = Harness(nodes=("a",))
    await h.register("a")
    jid = await h.submit(tiny(max_retries=1))
    h.agents.fail_launch["a"] = grpc.StatusCode.UNAVAILABLE
    await h.round()
    assert h.state(jid) == "PENDING" and h.kinds(jid)[-1] == "LAUNCH_FAILED"
    assert "launch on a failed: UNAVAILABLE" in h.job(jid).reason
    assert h.job(jid).launch_failures == 1 and h.job(jid).retries == 0  # not the job's fault: no retry spent

    del h.agents.fail_launch["a"]
    await h.round()
    assert h.state(jid) == "PENDING"  # backing off for 1 s
    h.clock.advance(1)
    await h.round()
    assert h.state(jid) == "STARTING" and h.job(jid).attempt == 2 and h.job(jid).launch_failures == 0
    h.agents.crash("a")  # the workers never show up
    await h.heartbeat("a")
    for _ in range(int(h.cfg.start_timeout_s // 5) + 1):  # a beats every 5 s meanwhile
        h.clock.advance(5)
        await h.heartbeat("a")
    await h.inspect()
    # no rank running start_timeout_s after the launch: the attempt failed (retried: back to PENDING)
    assert h.state(jid) == "PENDING" and h.kinds(jid)[-1] == "ATTEMPT_FAILED"
    assert "not every rank was running" in h.job(jid).reason


async def test_pending_reasons_without_nodes_and_for_a_job_that_fits_nowhere() -> None:
    h = Harness(policy="crius", nodes=("a",))
    jid = await h.submit(tiny())
    await h.round()
    assert h.job(jid).reason == "waiting for nodes: no GPUs registered" and h.kinds(jid)[-1] == "PENDING"
    await h.round()  # the same reason is not written again
    assert h.kinds(jid).count("PENDING") == 1

    await h.register("a")
    huge = await h.submit(P.JobSpec(name="huge", model=P.ModelSpec(hidden_size=12288, num_layers=96, num_heads=96,
                                                                     vocab_size=50257, seq_length=2048),
                                    global_batch_size=1024,
                                    iterations=10))
    await h.round()
    assert h.state(jid) == "STARTING"
    assert h.state(huge) == "PENDING" and "fits nowhere" in h.job(huge).reason


async def reported_steps(step_s: float) -> tuple[Harness, str]:
    """A job running on node "a" with step-time learning on, whose rank 0 reported `step_s` for
    3 warm-up steps, then 3 samples: enough for its first lesson."""
    h = Harness(policy="crius", nodes=("a",), learn="all")
    await h.register("a")
    jid = await h.submit(tiny())
    await h.round()
    attempt = await run_to_running(h, jid)
    for it in range(1, 7):
        h.agents.report(jid, attempt, iteration=it, step_s=step_s)
        await h.heartbeat("a")
    return h, jid


async def test_step_times_replace_the_cell_estimate() -> None:
    h, jid = await reported_steps(0.25)
    measured = [e.message for e in h.store.events(jid) if e.kind == "MEASURED"]
    assert len(measured) == 1 and "measured 0.25 s/iteration (median of 3 steps)" in measured[0]
    assert list(h.engine.learner.measured.values()) == [0.25]
    assert h.state(jid) == "RUNNING"  # the event did not overwrite the job


async def test_a_failed_relaunch_after_a_migration_requeues_the_job() -> None:
    h = Harness(scripted=True)
    await h.register("a", "b")
    jid = await h.submit(tiny())
    await h.round()
    await run_to_running(h, jid)
    assert isinstance(h.policy, ScriptedMoves)
    h.policy.move[jid] = (Slice("b", (0,)),)
    await h.round()
    h.agents.fail_launch["b"] = grpc.StatusCode.UNAVAILABLE
    await h.heartbeat("a")  # old attempt stopped; the relaunch on b is refused
    assert h.state(jid) == "PENDING" and h.kinds(jid)[-2:] == ["MIGRATED", "LAUNCH_FAILED"]
    assert h.engine.view.busy_gpus().get("b") == set()  # the move's hold on b is gone
    del h.agents.fail_launch["b"]
    h.clock.advance(1)  # the launch backoff
    await h.round()
    assert h.state(jid) == "STARTING" and h.job(jid).attempt == 3


async def test_a_launch_that_cannot_be_built_fails_the_job_and_blames_no_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """An argv past exec's limits is the job's own doing, the same on every node: FAILED at once with
    the reason, no Launch sent, the node not counted as failing; the next job starts there."""
    from tessera.controller.core import launchers

    h = Harness(nodes=("a",))
    await h.register("a")
    monkeypatch.setattr(launchers, "MAX_ARGV_BYTES", 8)
    jid = await h.submit(tiny(max_retries=3))
    await h.round()
    assert h.state(jid) == "FAILED" and "over what exec takes" in h.job(jid).reason
    assert not h.agents.launches()
    assert h.store.get_node("a").launch_failures == 0  # type: ignore[union-attr]
    monkeypatch.undo()
    ok = await h.submit(tiny())
    await h.round()
    assert h.state(ok) == "STARTING" and h.nodes_of(ok) == ["a"]


async def test_one_jobs_failing_inspection_does_not_hold_up_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug that raises while one job is inspected used to end the whole pass: the jobs after it
    were never checked (time limits, hangs, relaunches). The pass now goes on with the others."""
    h = Harness(nodes=("a",))
    await h.register("a")
    broken = await h.submit(tiny(gpus=1))
    limited = await h.submit(P.JobSpec(**{**_fields_of(tiny(gpus=1)), "max_runtime_seconds": 60}))
    await h.round()
    await h.heartbeat("a")
    assert h.state(broken) == h.state(limited) == "RUNNING"
    evaluate = h.engine._evaluate

    async def raising(job: JobRecord) -> None:
        if job.id == broken:
            raise RuntimeError("a bug in one job's inspection")
        await evaluate(job)

    for _ in range(13):  # 65 s, node a beating every 5 s
        h.clock.advance(5)
        await h.heartbeat("a")
    monkeypatch.setattr(h.engine, "_evaluate", raising)
    await h.inspect()
    assert h.state(limited) == "FAILED" and h.job(limited).reason == "max_runtime 1m exceeded"
    assert h.state(broken) == "RUNNING"


async def test_one_jobs_failing_step_does_not_drop_the_rounds_others(monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness(nodes=("a",))
    await h.register("a")
    first = await h.submit(tiny(gpus=1))
    second = await h.submit(tiny(gpus=1))
    place = h.engine._place

    async def raising(job: JobRecord, d: Decision) -> None:
        if job.id == first:
            raise RuntimeError("a bug in one job's placement")
        await place(job, d)

    monkeypatch.setattr(h.engine, "_place", raising)
    await h.round()
    assert (h.state(first), h.state(second)) == ("PENDING", "STARTING")


async def test_a_forged_step_time_from_a_node_is_cleared_before_use() -> None:
    """A node's heartbeat carries its workers' own numbers: inf and NaN are cleared (common/progress.py)
    before the controller keeps, learns from or shows them."""
    h = Harness(nodes=("a",))
    await h.register("a")
    jid = await h.submit(tiny(gpus=1))
    await h.round()
    await run_to_running(h, jid)
    h.agents.report(jid, 1, 5, step_s=float("inf"), time=float("nan"))
    await h.heartbeat("a")
    prog = h.engine.view.progress(jid)
    assert prog is not None and (prog.iteration, prog.step_time_seconds, prog.time) == (5, 0.0, 0.0)


def _fields_of(spec: P.JobSpec) -> dict[str, object]:
    return {f.name: v for f, v in spec.ListFields()}
