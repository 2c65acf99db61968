"""A rank that fails while another node of its job has missed heartbeats is not charged to the
program: the peer's workers may have been fenced, and the rank failed in a collective with them. A
live audit killed the agent of one stage of a two-node pipeline, and the surviving stage's exit 1
(`Connection closed by peer`) was judged first: ATTEMPT_FAILED, a retry spent (with `max_retries:
0`, the job failed). Now liveness decides (NODE_LOST, no retry spent), and a fenced rank
interrupts the attempt whatever its peers' codes."""

from __future__ import annotations

from tessera.controller.core.attempts import RankStatus, judge
from tessera.v1 import agent_pb2
from tessera.v1 import common_pb2 as P
from tests.unit.test_engine import LEASE, REQUEUE, Harness, run_to_running, tiny

GLOO = "RuntimeError: [gloo] Connection closed by peer"
FENCED = "fenced: no lease renewal for 10.0 s"


def test_a_fenced_rank_interrupts_the_attempt_whatever_the_other_ranks_codes() -> None:
    ranks = {0: RankStatus(0, False, 1, GLOO), 1: RankStatus(1, False, -15, FENCED)}
    v = judge(2, ranks, 100, False)
    assert (v.kind, v.rank) == ("interrupted", 1), v
    assert judge(2, {0: RankStatus(0, False, 1, GLOO), 1: RankStatus(1, True)}, 100, False).kind == "failed"


async def two_node_job(max_retries: int) -> tuple[Harness, str, int, str, str]:
    h = Harness(policy="frenzy", nodes=("a", "b"))
    await h.register("a", "b")
    jid = await h.submit(tiny(gpus=8, max_retries=max_retries))
    await h.round()
    attempt = await run_to_running(h, jid)
    first, other = h.nodes_of(jid)
    return h, jid, attempt, first, other


def fail_on(h: Harness, node: str, job_id: str, attempt: int) -> None:
    for (j, a, _), w in h.agents.nodes[node].workers.items():
        if (j, a) == (job_id, attempt):
            w.state, w.exit_code, w.reason = P.WORKER_STATE_EXITED, 1, GLOO


async def test_a_failure_beside_a_silent_node_waits_for_liveness_and_spends_no_retry() -> None:
    h, jid, attempt, first, _ = await two_node_job(max_retries=0)
    h.clock.advance(LEASE / 2 + 1)  # `other` misses its heartbeats; `first` beats on
    fail_on(h, first, jid, attempt)
    await h.heartbeat(first)
    assert h.state(jid) == "RUNNING" and "ATTEMPT_FAILED" not in h.kinds(jid)
    h.clock.advance(REQUEUE - LEASE / 2)
    await h.heartbeat(first)
    await h.engine.liveness_tick()
    h.check()
    assert h.state(jid) == "PENDING" and h.kinds(jid)[-1] == "NODE_LOST", h.kinds(jid)
    assert h.job(jid).retries == 0


async def test_a_failure_beside_live_nodes_is_the_programs() -> None:
    h, jid, attempt, first, _ = await two_node_job(max_retries=0)
    fail_on(h, first, jid, attempt)
    await h.heartbeat(first)
    assert h.state(jid) == "FAILED", h.kinds(jid)


async def test_the_silent_node_back_with_its_ranks_fenced_interrupts_the_attempt() -> None:
    h, jid, attempt, first, other = await two_node_job(max_retries=0)
    h.clock.advance(LEASE / 2 + 1)
    fail_on(h, first, jid, attempt)
    await h.heartbeat(first)
    assert h.state(jid) == "RUNNING"
    for (j, a, _), w in h.agents.nodes[other].workers.items():
        if (j, a) == (jid, attempt):
            w.CopyFrom(agent_pb2.WorkerStatus(job_id=j, attempt=a, rank=w.rank, state=P.WORKER_STATE_EXITED,
                                              exit_code=-15, reason=FENCED))
    await h.heartbeat(other)
    h.check()
    assert h.state(jid) == "PENDING" and h.kinds(jid)[-1] == "REQUEUED", h.kinds(jid)
    assert h.job(jid).retries == 0

