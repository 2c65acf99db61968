"""What one node says reaches other nodes and the users only clipped and escaped, and a node's GPU
set is the one it reports now.

A node's error text used to travel whole: the controller put a failed Launch's details into the
Stop it sent the job's other nodes, whose agents put it into their workers' reasons, and the
controller then refused every heartbeat of those honest nodes (a reason over 4,096 characters).
And a heartbeat's inventory was checked but never used: a GPU that fell off the bus stayed in the
rounds, and foreign memory was the one seen at registration."""

from __future__ import annotations

import grpc

from tessera.common.nodespec import MAX_TEXT, report_text, status_errors
from tessera.v1 import common_pb2 as P
from tests.fake_agent_calls import inventory
from tests.unit.test_engine import Harness, tiny


async def test_a_nodes_long_launch_error_reaches_other_nodes_and_the_job_clipped() -> None:
    h = Harness(policy="frenzy", nodes=("a", "b"))
    await h.register("a", "b")
    jid = await h.submit(tiny(gpus=8))  # one rank set per node
    h.agents.fail_launch["b"] = grpc.StatusCode.INVALID_ARGUMENT
    h.agents.fail_details = "X" * 5000 + "\0"
    await h.round()
    stops = [c for c in h.agents.stops() if c.job_id == jid]
    assert stops, "the launch that failed on b stops the attempt's other ranks"
    for c in stops:
        assert len(c.detail) < 1000 and "\0" not in c.detail and "[...]" in c.detail, c.detail[:80]
    reason = h.job(jid).reason
    assert "launch on b failed: INVALID_ARGUMENT: XXX" in reason and len(reason) < 1000


def test_report_text_escapes_what_a_status_may_not_hold() -> None:
    assert report_text("oops\0") == "oops\\x00"
    assert report_text("a\ud800b") == "a\\ud800b"
    assert report_text("héllo, exit code 3") == "héllo, exit code 3"
    long = report_text("x" * 5000)
    assert len(long) == MAX_TEXT and long.endswith("x [...]")
    assert report_text("abcdef", 3) == "abc"
    from tessera.v1 import agent_pb2
    status = agent_pb2.NodeStatus(node_id="n1", address="127.0.0.1:1", inventory=inventory("A10-24GB", 1, 24))
    status.workers.add(job_id="j", attempt=1, rank=0, state=P.WORKER_STATE_EXITED,
                       reason=report_text("r" * 9000 + "\0"), log_path=report_text("/x\0"))
    assert not [e for e in status_errors(status, "status") if ".workers[" in e[0]]


async def test_a_heartbeat_with_another_gpu_set_asks_the_node_to_register_again() -> None:
    h = Harness(policy="crius", nodes=("a",))
    await h.register("a")
    node = h.agents.nodes["a"]
    del node.inventory.gpus[3]  # GPU 3 fell off the bus
    assert not await h.engine.heartbeat(h.agents.status("a"), h.engine.epoch)
    await h.register("a")
    snap, _ = h.engine.snapshot()
    assert [g.index for n in snap.nodes for g in n.gpus] == [0, 1, 2]
    assert [g.index for g in h.store.get_node("a").inventory.gpus] == [0, 1, 2]


async def test_foreign_memory_reported_in_heartbeats_reaches_the_rounds() -> None:
    h = Harness(policy="crius", nodes=("a",))
    await h.register("a")
    h.agents.nodes["a"].inventory.gpus[1].foreign_used_bytes = 7 << 30
    await h.heartbeat("a")  # the same GPUs: no new registration
    snap, _ = h.engine.snapshot()
    assert {g.index: g.foreign_used_bytes for n in snap.nodes for g in n.gpus} == {0: 0, 1: 7 << 30, 2: 0, 3: 0}
