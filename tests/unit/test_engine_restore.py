"""A controller restored from an older copy of its state (docs/operations.md, "Restoring"): a job
whose attempts moved on after the copy is relaunched under an attempt number no agent has used,
never one whose workers an agent already ran (the agent would answer with those, exited, and the
attempt would count as failed). The engine harness of test_engine.py (fake agents, fake clock)."""

from __future__ import annotations

from tessera.controller.store import JobRecord
from tests.unit.test_engine import REQUEUE, Harness, run_to_running, tiny


async def copied_then_failed_twice() -> tuple[Harness, str, JobRecord]:
    """One node; a job whose copy is taken at attempt 1, which then fails, and attempt 2 too."""
    h = Harness(policy="fcfs", nodes=("a",))
    await h.register("a")
    jid = await h.submit(tiny(max_retries=3))
    await h.round()
    await run_to_running(h, jid)
    backup = h.job(jid)  # the copy an operator takes: attempt 1, RUNNING
    h.agents.exit(jid, 1, code=1)  # after the copy: attempt 1 fails, attempt 2 runs
    await h.heartbeat("a")
    await h.round()
    assert await run_to_running(h, jid) == 2
    h.agents.exit(jid, 2, code=1)  # and fails too, so the restored controller relaunches
    return h, jid, backup


async def copied_then_drained() -> tuple[Harness, str, JobRecord, str]:
    """Two nodes; a job without retries whose copy is taken at attempt 1, after which the node it
    runs on (returned) is drained: the attempt stops with a checkpoint and the job is requeued."""
    h = Harness(policy="fcfs", nodes=("a", "b"))
    await h.register("a", "b")
    jid = await h.submit(tiny(max_retries=0))
    await h.round()
    await run_to_running(h, jid)
    backup, first = h.job(jid), h.nodes_of(jid)[0]
    await h.engine.drain(first, "maintenance")
    await h.heartbeat("a", "b")
    return h, jid, backup, first


def restore(h: Harness, jid: str, backup: JobRecord) -> None:
    """The restore: the copy put back (the fake store's internals) under a controller started on it.
    The harness's invariant (no agent ran an attempt past the stored one) is what a restore breaks:
    the tests drive the engine directly until the relaunch has restored it."""
    h.store._jobs[jid] = backup
    h.engine = h._engine()


async def test_a_relaunch_after_a_restore_skips_the_attempts_the_agents_ran() -> None:
    h, jid, backup = await copied_then_failed_twice()
    restore(h, jid, backup)
    await h.engine.register(h.agents.status("a"))
    assert await h.engine.heartbeat(h.agents.status("a"), h.engine.epoch)  # attempt 1 exited: failed
    await h.engine.run_round()
    assert h.state(jid) == "STARTING"
    h.check()
    assert h.job(jid).attempt == 3 and not h.agents.violations
    assert await run_to_running(h, jid) == 3


async def test_past_the_agents_retention_its_register_still_says_which_attempts_it_ran() -> None:
    """An hour after they exited the agent forgets an attempt's workers, not that it ran it: its
    Register carries the highest attempt per job (NodeStatus.attempt_marks), and the relaunch goes
    above it (the real agent would refuse one as old: FAILED_PRECONDITION, the node blamed)."""
    h, jid, backup = await copied_then_failed_twice()
    node = h.agents.nodes["a"]
    for key in [k for k in node.workers if k[0] == jid and k[1] == 2]:
        del node.workers[key]  # retention passed: attempt 2's workers are no longer reported
    restore(h, jid, backup)
    status = h.agents.status("a")
    status.attempt_marks.add(job_id=jid, attempt=2)
    await h.engine.register(status)
    assert await h.engine.heartbeat(h.agents.status("a"), h.engine.epoch)
    await h.engine.run_round()
    assert h.state(jid) == "STARTING" and h.job(jid).attempt == 3 and not h.agents.violations
    h.check()


async def test_the_earlier_attempt_is_recorded_under_its_own_number() -> None:
    """A review: the floor, applied to the record before the new attempt was made, filed the old
    placement (for its logs) under the skipped-to number."""
    h, jid, backup = await copied_then_failed_twice()
    restore(h, jid, backup)
    await h.engine.register(h.agents.status("a"))
    assert await h.engine.heartbeat(h.agents.status("a"), h.engine.epoch)
    await h.engine.run_round()
    placement = h.job(jid).placement
    assert placement is not None and h.job(jid).attempt == 3
    assert [e.attempt for e in placement.earlier] == [1]


async def test_an_attempt_stopped_after_the_copy_is_interrupted_not_failed() -> None:
    """A live audit: the copy's attempt, stopped by a drain after the copy was taken, exited 0 before
    its iterations; the restored controller, whose record did not ask for that stop, counted it a
    failure, and a job without retries FAILED. The agent says a stop was asked
    (WorkerStatus.stop_requested): the attempt is interrupted, and the job runs on."""
    h, jid, backup, first = await copied_then_drained()
    await h.engine.undrain(first)
    await h.round()
    assert await run_to_running(h, jid) == 2
    restore(h, jid, backup)
    for n in ("a", "b"):
        await h.engine.register(h.agents.status(n))
    await h.engine.inspect()
    assert h.state(jid) != "FAILED" and h.job(jid).retries == 0
    assert "interrupted" in h.job(jid).reason and "a stop this state does not record" in h.job(jid).reason


async def test_past_the_retention_an_attempt_a_node_ran_past_is_over_at_once() -> None:
    """A live audit: with the copy's attempt's workers forgotten by the agent, the restored job sat
    RUNNING with no workers until the progress timeout, then spent a retry as hung. The node's
    Register says it ran a later attempt: the copy's is over there, and the job is requeued."""
    h = Harness(policy="fcfs", nodes=("a",))
    await h.register("a")
    jid = await h.submit(tiny(max_retries=0))
    await h.round()
    await run_to_running(h, jid)
    backup = h.job(jid)
    node = h.agents.nodes["a"]
    node.workers.clear()  # the agent ran attempts 2 and 3 since, and forgot them all (retention)
    restore(h, jid, backup)
    status = h.agents.status("a")
    status.attempt_marks.add(job_id=jid, attempt=3)
    await h.engine.register(status)
    await h.engine.inspect()
    assert h.state(jid) == "PENDING" and h.job(jid).retries == 0
    assert "node a has run attempt 3 of the job since: this one is over there" in h.job(jid).reason
    await h.engine.run_round()
    assert h.job(jid).attempt == 4


async def test_no_attempt_number_is_chosen_before_every_node_has_reported() -> None:
    """A live audit: restored, the controller relaunched a job as attempt 2 on the first node back,
    while the second, not yet back, still ran attempt 2 of it: two copies of one attempt shared a
    checkpoint folder, and one failed the job. A job that ran before now waits until every node of
    the store has reported (or its lease since the start has passed), and goes above what they run;
    a node running the current attempt outside its placement is told to stop it."""
    h, jid, backup, first = await copied_then_drained()
    second = "b" if first == "a" else "a"
    await h.round()
    assert await run_to_running(h, jid) == 2 and h.nodes_of(jid) == [second]
    await h.engine.undrain(first)
    restore(h, jid, backup)
    await h.engine.register(h.agents.status(first))  # the second node is not back yet
    await h.engine.inspect()
    assert h.state(jid) == "PENDING"  # the copy's attempt 1 stopped on the first node: interrupted
    await h.engine.run_round()
    assert h.state(jid) == "PENDING" and h.job(jid).attempt == 1
    assert h.job(jid).reason.startswith(f"waiting for node {second} to report after the controller's start")
    await h.engine.register(h.agents.status(second))  # still running attempt 2: stopped as stale
    assert ("stop", second, jid, 2) in [(c.kind, c.node_id, c.job_id, c.attempt) for c in h.agents.stops()]
    await h.engine.run_round()
    assert h.state(jid) == "STARTING" and h.job(jid).attempt == 3 and not h.agents.violations


async def test_a_node_that_never_comes_back_holds_no_start_past_its_lease() -> None:
    h = Harness(policy="fcfs", nodes=("a", "b"))
    await h.register("a", "b")
    jid = await h.submit(tiny(max_retries=1))
    await h.round()
    await run_to_running(h, jid)
    h.agents.exit(jid, 1, code=1)
    await h.heartbeat("a", "b")  # attempt 1 failed: pending again, attempt 1 recorded
    await h.restart()
    await h.register(h.nodes_of(jid)[0])  # the other node is gone for good
    await h.round()
    assert h.state(jid) == "PENDING" and "to report after the controller's start" in h.job(jid).reason
    assert h.engine._live.wakes  # the round when the wait ends is asked for
    h.clock.advance(REQUEUE)
    await h.round()
    assert h.state(jid) == "STARTING" and h.job(jid).attempt == 2
