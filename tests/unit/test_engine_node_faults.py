"""The engine against node faults a node's own answers do not explain: a Launch refused as invalid
(the job's doing, not the node's), jobs placed on a node the store has no record of, and a node slow
to answer."""

from __future__ import annotations

import asyncio

import grpc

from tests.unit.test_engine import REQUEUE, Harness, run_to_running, tiny


async def test_a_launch_the_node_refuses_as_invalid_blames_the_job_not_the_node() -> None:
    """An agent answers INVALID_ARGUMENT when this job's request breaks its rules (its own env policy,
    say): the node is healthy. Counting it against the node let one job, relaunched with backoff, mark
    every node it touched unhealthy for everyone."""
    h = Harness(nodes=("a",))
    await h.register("a")
    jid = await h.submit(tiny())
    h.agents.fail_launch["a"] = grpc.StatusCode.INVALID_ARGUMENT
    for _ in range(6):  # past the node's unhealthy threshold had each failure counted
        await h.round()
        h.clock.advance(3600)
    assert h.state(jid) == "PENDING" and "launch on a failed: INVALID_ARGUMENT" in h.job(jid).reason
    assert h.job(jid).launch_failures >= 3
    node = h.store.get_node("a")
    assert node is not None and node.launch_failures == 0 and node.unhealthy_until == 0.0
    del h.agents.fail_launch["a"]
    other = await h.submit(tiny())
    await h.round()
    assert h.state(other) == "STARTING" and h.nodes_of(other) == ["a"]


async def test_a_job_on_a_node_the_store_does_not_know_is_requeued_after_the_lease_bound() -> None:
    """A node record the store cannot give back (unreadable, or a restore from before the node joined)
    left its jobs RUNNING for ever: only known nodes lose their lease. Now they are requeued once the
    node has been missing as long as a lost node's lease and fence grace, unless it registers first."""
    h = Harness(nodes=("a", "b"))
    await h.register("a", "b")
    jid = await h.submit(tiny())
    await h.round()
    assert await run_to_running(h, jid) == 1 and h.nodes_of(jid) == ["a"]
    h.store._nodes.pop("a")  # its record is gone; the controller restarts
    await h.restart()
    await h.inspect()  # first seen missing
    h.clock.advance(REQUEUE - 1)
    await h.inspect()
    assert h.state(jid) == "RUNNING"
    h.clock.advance(2)
    await h.inspect()
    assert h.state(jid) == "PENDING" and h.kinds(jid)[-1] == "NODE_LOST" and h.job(jid).restarts == 1
    assert "node a is unknown to the controller" in h.job(jid).reason
    # a node that registers in time keeps its jobs
    h.clock.advance(1)
    await h.register("b")  # with the restarted controller
    await h.round()
    assert h.state(jid) == "STARTING" and h.nodes_of(jid) == ["b"] and await run_to_running(h, jid) == 2
    h.store._nodes.pop("b")
    await h.restart()
    await h.inspect()
    for _ in range(int(REQUEUE // 5) + 1):  # b's agent beats every 5 s: it registers with the new controller
        h.clock.advance(5)
        await (h.heartbeat("b") if "b" in h.engine._live.nodes else h.register("b"))
        await h.inspect()
    assert h.state(jid) == "RUNNING" and h.job(jid).restarts == 1 and h.engine._live.unknown_since == {}


async def test_a_rounds_launches_go_out_together() -> None:
    """A node answering each Launch just under the deadline held a round for one call per job, and
    every other start behind it (controller/concurrently.py): the round's Launches now wait together."""
    h = Harness(nodes=("a",))
    await h.register("a")
    jobs = [await h.submit(tiny(f"t{i}")) for i in range(4)]
    gate = h.agents.launch_gate["a"] = asyncio.Event()
    rnd = asyncio.create_task(h.round())
    while h.agents.in_flight < 4:
        await asyncio.sleep(0)
    assert not rnd.done() and [h.state(j) for j in jobs] == ["STARTING"] * 4  # stored before any Launch
    gate.set()
    await rnd
    assert h.agents.most_in_flight == 4 and sorted(c.job_id for c in h.agents.launches()) == sorted(jobs)
    for j in jobs:
        assert await run_to_running(h, j) == 1
