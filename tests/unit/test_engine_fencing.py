"""Fencing, launch backoff and honest drain in the engine (issue 13, findings 2 and 4), on MemoryStore
with the in-memory agents and a fake clock (the harness of tests/unit/test_engine.py), plus the pure
rules of controller/core/backoff.py and controller/registry.py."""

from __future__ import annotations

import itertools

import grpc
import pytest

from tessera.controller.core.backoff import BackoffConfig, healthy, job_delay, may_launch, node_unhealthy_for
from tessera.controller.main import parse_args
from tessera.controller.registry import (
    FENCE_MARGIN_S,
    LivenessConfig,
    default_fence,
    fence_problem,
    fence_seconds,
    requeue_after,
)
from tessera.v1 import common_pb2 as P
from tests.unit.test_engine import Harness, run_to_running, tiny

CFG = BackoffConfig()


def test_job_backoff_doubles_from_one_second_and_is_capped() -> None:
    assert [job_delay(n, CFG) for n in range(6)] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0]
    assert job_delay(9, CFG) == 256.0 and job_delay(10, CFG) == 300.0 and job_delay(10**6, CFG) == 300.0
    assert may_launch(0.0, 5.0) and may_launch(5.0, 5.0) and not may_launch(5.1, 5.0)


def test_node_is_unhealthy_from_the_threshold_with_a_doubling_hold() -> None:
    assert [node_unhealthy_for(n, CFG) for n in range(6)] == [0.0, 0.0, 0.0, 30.0, 60.0, 120.0]
    assert node_unhealthy_for(10**6, CFG) == 900.0
    assert healthy(0.0, 1.0) and not healthy(2.0, 1.0)


def test_fence_defaults_validation_and_requeue_bound() -> None:
    assert default_fence(15, 5) == 10 and default_fence(30, 1) == 15 and default_fence(3, 0.5) == 1.5
    assert fence_seconds(LivenessConfig(lease_s=15, heartbeat_interval_s=5)) == 10
    assert fence_seconds(LivenessConfig(lease_s=15, heartbeat_interval_s=5, fence_s=12)) == 12
    assert fence_problem(15, 5, 10) == ""
    assert "at least 2 heartbeat intervals" in fence_problem(15, 5, 9)
    assert "shorter than the lease" in fence_problem(15, 5, 15)
    assert requeue_after(LivenessConfig(lease_s=15, fence_grace_s=10)) == 26 == 15 + 10 + FENCE_MARGIN_S


async def test_requeue_waits_for_the_fence_even_when_the_controller_restarted() -> None:
    h = Harness()
    await h.register("a", "b")
    jid = await h.submit(tiny())
    await h.round()
    await run_to_running(h, jid)
    # controller restart: a is silent from now on; its last heartbeat to the old controller came
    # before the restart, so the bound counts from the new controller's start
    await h.restart()
    await h.register("b")
    bound = requeue_after(h.cfg.liveness)
    h.clock.advance(bound - 0.5)
    await h.heartbeat("b")
    await h.engine.liveness_tick()
    assert h.state(jid) == "RUNNING" and h.engine.view.node("a").state == P.NODE_STATE_UNREACHABLE
    h.clock.advance(1)
    await h.heartbeat("b")
    await h.engine.liveness_tick()
    h.check()
    assert h.state(jid) == "PENDING" and h.kinds(jid)[-1] == "NODE_LOST"
    assert "fence grace" in h.job(jid).reason


async def test_launch_failures_back_off_exponentially_without_a_tight_loop() -> None:
    h = Harness(nodes=("a",))
    await h.register("a")
    jid = await h.submit(tiny())
    h.agents.fail_launch["a"] = grpc.StatusCode.FAILED_PRECONDITION
    tries: list[float] = []
    for _ in range(60):  # one round a second for a minute, as a busy controller would run them
        before = len(h.agents.launches())
        await h.round()
        if len(h.agents.launches()) > before:
            tries.append(h.clock.now)
        h.clock.advance(1)
        await h.heartbeat("a")  # the agent is alive and beating: it only refuses launches
        await h.engine.liveness_tick()
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    # node unhealthy after the 3rd failure (30 s), so the 4th try waits for the node, not the job
    assert len(tries) == 4, tries
    assert gaps[:2] == [1.0, 2.0] and gaps[2] >= 30
    job = h.job(jid)
    assert job.launch_failures == 4 and job.retries == 0 and job.state == P.JOB_STATE_PENDING
    assert job.next_launch_time == tries[-1] + 8.0
    failed = [e.message for e in h.store.events(jid) if e.kind == "LAUNCH_FAILED"]
    assert len(failed) == 4 and failed[-1].endswith("launch failure 4, next try in 8s")
    assert job.reason.endswith("left out as unhealthy (launches failing): a")


async def test_success_resets_the_job_and_the_node() -> None:
    h = Harness(nodes=("a",))
    await h.register("a")
    jid = await h.submit(tiny())
    h.agents.fail_launch["a"] = grpc.StatusCode.UNAVAILABLE
    await h.round()
    h.clock.advance(1)
    await h.round()
    assert h.job(jid).launch_failures == 2 and h.store.get_node("a").launch_failures == 2  # type: ignore[union-attr]
    del h.agents.fail_launch["a"]
    h.clock.advance(2)
    await h.round()
    assert h.state(jid) == "STARTING" and h.job(jid).launch_failures == 0 and h.job(jid).next_launch_time == 0
    node = h.store.get_node("a")
    assert node is not None and node.launch_failures == 0 and node.unhealthy_until == 0
    await run_to_running(h, jid)


async def test_an_unhealthy_node_is_skipped_and_shown() -> None:
    h = Harness(nodes=("a", "b"))
    await h.register("a", "b")
    h.agents.fail_launch["a"] = grpc.StatusCode.FAILED_PRECONDITION
    jobs = [await h.submit(tiny(f"j{i}")) for i in range(3)]
    await h.round()  # frenzy places all three on a first (best fit): three failures make a unhealthy
    assert all(h.job(j).launch_failures == 1 for j in jobs)
    h.clock.advance(1)
    await h.heartbeat("a", "b")
    node = h.engine.view.node("a")
    assert node.launch_failures == 3 and node.unhealthy_until > h.clock.now
    assert node.state == P.NODE_STATE_READY and node.reason.startswith("unhealthy: 3 consecutive launches failed")
    await h.round()  # a takes nothing: everything goes to b
    assert all(h.state(j) == "STARTING" and h.nodes_of(j) == ["b"] for j in jobs)
    assert {c.node_id for c in h.agents.launches()[-3:]} == {"b"}
    # a's hold runs out: a round is due, and a is placeable again
    h.clock.advance(node.unhealthy_until - h.clock.now)
    await h.heartbeat("a", "b")
    h.engine._kick.clear()
    await h.engine.liveness_tick()
    assert h.engine.round_requested
    assert h.engine.view.node("a").reason == ""


async def test_backoff_survives_a_controller_restart() -> None:
    h = Harness(nodes=("a",))
    await h.register("a")
    jid = await h.submit(tiny())
    h.agents.fail_launch["a"] = grpc.StatusCode.UNAVAILABLE
    for _ in range(3):
        await h.round()
        h.clock.advance(job_delay(h.job(jid).launch_failures, CFG))
    until = h.store.get_node("a").unhealthy_until  # type: ignore[union-attr]
    assert until > h.clock.now
    del h.agents.fail_launch["a"]
    await h.restart()
    await h.register("a")
    await h.round()
    assert h.state(jid) == "PENDING"  # the node's hold is in the store, not only in memory
    h.clock.advance(until - h.clock.now)
    await h.round()
    assert h.state(jid) == "STARTING"


async def test_drain_refused_by_the_agent_holds_in_the_controller_and_says_so() -> None:
    h = Harness()
    await h.register("a", "b")
    jid = await h.submit(tiny())
    await h.round()
    await run_to_running(h, jid)
    h.agents.fail_drain["a"] = "FAILED_PRECONDITION: stale controller epoch 1 < 1000000000000"
    rec, unconfirmed = await h.engine.drain("a", "maintenance")
    h.check()
    assert rec.drained and unconfirmed == ("the agent did not confirm: FAILED_PRECONDITION: stale controller "
                                           "epoch 1 < 1000000000000")
    assert h.state(jid) == "MIGRATING"  # the controller moves the job off anyway
    del h.agents.fail_drain["a"]
    rec, unconfirmed = await h.engine.undrain("a")
    assert not rec.drained and unconfirmed == ""
    h.clock.advance(h.cfg.liveness.lease_s + 1)
    await h.heartbeat("b")
    await h.engine.liveness_tick()
    rec, unconfirmed = await h.engine.drain("a", "")
    assert unconfirmed == "node a is UNREACHABLE: its agent is told when it registers again"


async def test_a_node_back_after_a_silence_past_the_fence_has_its_jobs_requeued_not_failed() -> None:
    """Its agent fenced the workers (SIGTERM: the reference trainer checkpoints and exits 0 early,
    a custom one dies of the signal): those exits say nothing about the job, so no retry is spent
    and the job does not fail."""
    h = Harness()
    await h.register("a", "b")
    jid = await h.submit(tiny())  # max_retries 0: judged as a failure, the job would be FAILED
    await h.round()
    await run_to_running(h, jid)
    fence = fence_seconds(h.cfg.liveness)
    assert fence == 10
    h.clock.advance(fence - 1)  # within the fence: nothing happens
    await h.heartbeat("a", "b")
    assert h.state(jid) == "RUNNING"
    h.clock.advance(fence + 1)
    await h.heartbeat("b")
    h.agents.exit(jid, 1, code=-15)  # fenced by its agent
    await h.heartbeat("a")
    assert h.state(jid) == "PENDING" and h.kinds(jid)[-1] == "NODE_LOST" and h.job(jid).retries == 0
    assert "node a was silent 11.0s, past the 10s fence: its agent stopped the workers" in h.job(jid).reason
    await h.round()
    assert h.state(jid) == "STARTING" and h.job(jid).attempt == 2


def test_controller_flags_validate_the_fence(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse_args(["--insecure", "--state-dir", "/tmp/x"])
    assert (args.fence, args.fence_grace) == (0.0, 10.0)  # 0 = derived: 10 s with lease 15, interval 5
    for argv, message in [
        (["--fence", "9"], "--fence: the fence (9s) must be at least 2 heartbeat intervals (10s)"),
        (["--fence", "15"], "--fence: the fence (15s) must be shorter than the lease (15s)"),
        (["--lease", "8"], "(lengthen --lease or shorten --heartbeat-interval)"),
        (["--fence-grace", "-1"], "--fence and --fence-grace must be >= 0"),
        (["--down-after", "20"], "--down-after (20s) must be at least lease + fence grace + 1s (26s)"),
    ]:
        with pytest.raises(SystemExit) as exc:
            parse_args(["--insecure", "--state-dir", "/tmp/x", *argv])
        assert exc.value.code == 2
        assert message in capsys.readouterr().err


def test_a_rank_its_agent_fenced_interrupts_the_attempt_whatever_its_exit() -> None:
    """The agent's keeper reports the workers it stopped with the reason "fenced: ..." (the
    interface of tessera.common.contract.FENCED_REASON): a SIGTERM'd reference trainer exits 0 early
    after its checkpoint, a custom program dies of the signal; neither is the job's failure."""
    from tessera.controller.core.attempts import RankStatus, judge

    why = "fenced: no heartbeat acknowledged for 10.0s"
    for code in (0, -15, -9):
        ranks = {0: RankStatus(0, False, code, why, 5), 1: RankStatus(1, False, 0, "", 5)}
        v = judge(2, ranks, 100, stop_requested=False)
        assert (v.kind, v.reason, v.rank) == ("interrupted", f"rank 0: {why}", 0)
    # a stop the controller asked for is settled as a stop; other reasons are judged as before
    assert judge(1, {0: RankStatus(0, False, 0, why, 5)}, 100, stop_requested=True).kind == "stopped"
    assert judge(1, {0: RankStatus(0, False, -15, "fenceless", 5)}, 100, False).kind == "failed"


async def test_fenced_workers_requeue_the_job_without_a_retry() -> None:
    """The case the controller cannot time itself: it restarted, so it never saw the silence that
    made the agent fence; the agent's report says so."""
    h = Harness()
    await h.register("a", "b")
    jid = await h.submit(tiny())  # max_retries 0
    await h.round()
    await run_to_running(h, jid)
    await h.restart()
    for _, w in h.agents.workers(jid, 1):
        w.state, w.exit_code, w.reason = P.WORKER_STATE_EXITED, 0, "fenced: no heartbeat acknowledged for 10.0s"
    await h.register("a", "b")
    assert h.state(jid) == "PENDING" and h.kinds(jid)[-1] == "REQUEUED" and h.job(jid).retries == 0
    assert "fenced: no heartbeat acknowledged" in h.job(jid).reason
