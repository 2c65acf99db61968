"""A node speaks for its own workers only, and a job's reports teach only plausible times.

A node's certificate lets it report the workers it runs; a report of another node's rank, of a rank
the attempt does not have, or of a job placed elsewhere is not the job's. A job's workers run the
user's code, so the step times they report are learned only within PLAUSIBLE_FACTOR of the Cell's
estimate, and steer the estimates of their tenant's jobs only."""

from __future__ import annotations

from dataclasses import replace

from tessera.controller.core.policy import CellEstimate
from tessera.controller.core.snapshot import JobView
from tessera.controller.core.step_times import PLAUSIBLE_FACTOR
from tessera.controller.snapshots import job_view
from tessera.v1 import agent_pb2
from tessera.v1 import common_pb2 as P
from tests.unit.test_engine import Harness, reported_steps, run_to_running, tiny


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
    h, jid = await reported_steps(1e-300)
    (event,) = [e.message for e in h.store.events(jid) if e.kind == "MEASURED"]
    assert f"over {PLAUSIBLE_FACTOR:g}x off its estimate" in event and "not learned" in event, event
    assert h.engine.learner.measured == {}
    assert h.state(jid) == "RUNNING"


async def test_a_tenants_step_times_steer_only_its_own_jobs_estimates() -> None:
    """Within PLAUSIBLE_FACTOR a report is learned, but for its tenant's jobs only: another tenant's
    job of the same model keeps the estimate (its workers run other people's code)."""
    h, jid = await reported_steps(0.25)
    assert list(h.engine.learner.measured.values()) == [0.25]
    plan = h.job(jid).plan
    assert plan is not None
    gpus, stages = plan.dp * plan.tp * plan.pp, plan.pp
    node = h.store.get_node("a")
    assert node is not None
    gpu_type = node.inventory.gpus[0].model
    estimates = h.engine.learner.estimates(h.store.list_nodes())
    mine = job_view(h.job(jid), None)
    theirs = replace(mine, id="other", tenant="someone-else")
    assert mine.tenant == "default" and mine.key != theirs.key

    def cell(view: JobView) -> CellEstimate:
        (c,) = [c for c in estimates.cells(view, gpu_type, gpus, 1) if c.cell.stages == stages]
        return c

    assert (cell(mine).iteration_s, cell(mine).source) == (0.25, "measured")
    assert cell(theirs).source != "measured" and cell(theirs).iteration_s != 0.25
