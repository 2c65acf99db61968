"""A job's record read before an await is not written back after it.

The engine awaits agents (a Stop, a ReadLog of the failed rank's last line) between reading a job
and storing what it decided. A CancelJob answered during such a call was overwritten by the call's
outcome (the failed attempt requeued the job, and the next round launched the cancelled job
again). The engine now re-reads the job after its awaits, and `_save` refuses a write whose basis
the store has moved past: terminal states are final, attempts never go back.

Also: GPUs freed by workers exiting after their job left (a cancel) ask for a round at once."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc

from tessera.v1 import agent_pb2
from tessera.v1 import common_pb2 as P
from tests.unit.test_engine import Harness, run_to_running, tiny


async def test_a_cancel_during_the_failed_ranks_log_call_stays_cancelled() -> None:
    h = Harness()
    await h.register("a", "b")
    jid = await h.submit(tiny(max_retries=2))
    await h.round()
    await h.heartbeat("a")
    assert h.state(jid) == "RUNNING"
    entered, gate = asyncio.Event(), asyncio.Event()
    real = h.agents.read_log

    async def slow_read_log(node_id: str, address: str, req: agent_pb2.ReadLogRequest) -> agent_pb2.ReadLogResponse:
        entered.set()
        await gate.wait()  # a busy node answers late
        return await real(node_id, address, req)

    h.agents.read_log = slow_read_log  # type: ignore[method-assign]
    h.agents.exit(jid, 1, code=1)  # rank 0 fails: the engine reads its last log line
    beat = asyncio.create_task(h.engine.heartbeat(h.agents.status("a"), h.engine.epoch))
    await entered.wait()
    assert P.JobState.Name((await h.engine.cancel(jid)).state) == "JOB_STATE_CANCELLED"
    gate.set()
    await beat
    assert h.state(jid) == "CANCELLED"
    assert h.kinds(jid)[-1] == "CANCELLED" and "ATTEMPT_FAILED" not in h.kinds(jid)
    await h.round()
    assert h.state(jid) == "CANCELLED" and h.job(jid).attempt == 1
    assert [c.attempt for c in h.agents.launches() if c.job_id == jid] == [1]


async def test_a_stale_write_is_dropped_and_says_so() -> None:
    h = Harness()
    await h.register("a")
    jid = await h.submit(tiny())
    await h.round()
    await h.heartbeat("a")
    running = h.job(jid)
    await h.engine.cancel(jid)
    # The record as it was before the cancel, moved on by some path that awaited meanwhile.
    assert not await h.engine._save(replace(running, state=P.JOB_STATE_PENDING, reason="requeued"),
                                    [("REQUEUED", "stale")])
    assert h.state(jid) == "CANCELLED" and "REQUEUED" not in h.kinds(jid)
    # An older attempt's write is dropped too, whatever its state.
    h2 = Harness()
    await h2.register("a")
    j2 = await h2.submit(tiny())
    await h2.round()
    first = h2.job(j2)
    await h2.engine._save(replace(first, attempt=first.attempt + 1), [])
    assert not await h2.engine._save(replace(first, reason="late"), [])
    assert h2.job(j2).attempt == first.attempt + 1


async def test_workers_of_a_cancelled_job_exiting_ask_for_a_round() -> None:
    """A job cancelled while its workers stop (a checkpoint can take seconds): the round its
    cancel asked for still saw their GPUs held, so the heartbeat that reports them exited asks
    for the next (an audit's guaranteed job waited a whole --round-interval for a free A40)."""
    h = Harness()
    await h.register("a")
    jid = await h.submit(tiny())
    await h.round()
    await run_to_running(h, jid)
    await h.engine.cancel(jid)
    await h.round()  # the round the cancel asked for (the loop clears the request when it runs it)
    h.engine._kick.clear()
    await h.heartbeat("a")  # the agent stopped them: exited
    assert h.engine.round_requested
    h.engine._kick.clear()
    await h.heartbeat("a")  # nothing new freed: no round
    assert not h.engine.round_requested


async def test_two_launches_of_one_attempt_that_fail_blame_the_node_once() -> None:
    # The round's launch and the inspection's re-send of the same attempt were both in flight and
    # both failed: two LAUNCH_FAILED events, the node blamed twice (a hostile-peer audit's log).
    h = Harness(policy="frenzy", nodes=("a",))
    await h.register("a")
    jid = await h.submit(tiny())
    gate = h.agents.launch_gate["a"] = asyncio.Event()
    h.agents.fail_launch["a"] = grpc.StatusCode.UNAVAILABLE
    calls = [asyncio.create_task(h.engine.run_round())]
    while h.agents.in_flight < 1:
        await asyncio.sleep(0)
    calls.append(asyncio.create_task(h.engine.inspect()))  # re-sends the launch not yet answered
    while h.agents.in_flight < 2:
        await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*calls)
    h.check()
    assert h.kinds(jid).count("LAUNCH_FAILED") == 1, h.kinds(jid)
    assert h.engine._live.records["a"].launch_failures == 1
