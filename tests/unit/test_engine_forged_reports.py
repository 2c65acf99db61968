"""A node speaks for its own workers only, and a job's reports teach only plausible times.

A node's certificate lets it report the workers it runs; a report of another node's rank, of a rank
the attempt does not have, or of a job placed elsewhere is not the job's. A job's workers run the
user's code, so the step times they report are learned only within PLAUSIBLE_FACTOR of the Cell's
estimate (its measured time is shared by every job of the model)."""

from __future__ import annotations

from tessera.controller.learning import PLAUSIBLE_FACTOR
from tessera.v1 import agent_pb2
from tessera.v1 import common_pb2 as P
from tests.unit.test_engine import Harness, run_to_running, tiny


def forge(h: Harness, node: str, job_id: str, attempt: int, rank: int, **kw: object) -> None:
    h.agents.nodes[node].workers[(job_id, attempt, rank)] = agent_pb2.WorkerStatus(
        job_id=job_id, attempt=attempt, rank=rank, **kw)  # type: ignore[arg-type]


async def test_a_node_cannot_end_or_fail_ranks_it_does_not_run() -> None:
    h = Harness(policy="frenzy", nodes=("a", "b"))
    await h.register("a", "b")
    jid = await h.submit(tiny(gpus=8))
    await h.round()
    attempt = await run_to_running(h, jid)
    assert sorted(h.nodes_of(jid)) == ["a", "b"]
    first = h.nodes_of(jid)[0]
    other = h.nodes_of(jid)[1]
    for rank in range(4):  # the first node's ranks, said by the other node to have ended well
        forge(h, other, jid, attempt, rank, state=P.WORKER_STATE_EXITED, exit_code=0)
    forge(h, other, jid, attempt, 9999, state=P.WORKER_STATE_EXITED, exit_code=1)  # no such rank
    await h.heartbeat(other)
    assert h.state(jid) == "RUNNING"
    h.agents.report(jid, attempt, iteration=40)
    h.agents.exit(jid, attempt, 0)  # every real rank ends well, each on its own node
    h.agents.nodes[other].workers.pop((jid, attempt, 9999))
    await h.heartbeat(first, other)
    assert h.state(jid) == "SUCCEEDED"


async def test_a_node_cannot_report_progress_of_a_job_placed_elsewhere() -> None:
    h = Harness(policy="crius", nodes=("a", "b"))
    await h.register("a", "b")
    jid = await h.submit(tiny())
    await h.round()
    attempt = await run_to_running(h, jid)
    (node,) = set(h.nodes_of(jid))
    other = "b" if node == "a" else "a"
    forge(h, other, jid, attempt, 0, state=P.WORKER_STATE_RUNNING,
          progress=P.Progress(iteration=10**15, step_time_seconds=1e-6, checkpoint_iteration=-1))
    await h.heartbeat(other)
    assert h.engine._live.progress.get(jid) is None or h.engine._live.progress[jid].iteration < 10**15
    h.agents.report(jid, attempt, iteration=3)
    await h.heartbeat(node)
    assert h.engine._live.progress[jid].iteration == 3


async def test_an_implausible_step_time_is_not_learned() -> None:
    h = Harness(policy="crius", nodes=("a",), learn="all")
    await h.register("a")
    jid = await h.submit(tiny())
    await h.round()
    attempt = await run_to_running(h, jid)
    for it in range(1, 7):  # 3 warm-up steps, then 3 samples: the first lesson
        h.agents.report(jid, attempt, iteration=it, step_s=1e-300)
        await h.heartbeat("a")
    (event,) = [e.message for e in h.store.events(jid) if e.kind == "MEASURED"]
    assert f"over {PLAUSIBLE_FACTOR:g}x off its estimate" in event and "not learned" in event, event
    assert h.engine.learner.measured == {}
    assert h.state(jid) == "RUNNING"
