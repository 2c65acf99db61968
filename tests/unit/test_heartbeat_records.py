"""A node's reported workers, folded in per job (controller/registry.by_job, to_look_at), and who may
raise a relaunch's attempt number (engine._start_attempt). Live audits: a status carrying 4,096
worker records (the bound) held the controller's loop 4 to 6 s, since every job touched scanned every
record, and every other node's agents fenced; the exited records an agent keeps for an hour were each
read back from the store at every heartbeat; and a node that never ran a job, reporting a worker of
it, pushed its attempt number up by 10,000 at each relaunch."""

from __future__ import annotations

import dataclasses

import pytest

from tessera.controller.registry import Workers, by_job, to_look_at
from tessera.v1 import agent_pb2
from tessera.v1 import common_pb2 as P
from tests.unit.test_engine import Harness, run_to_running, tiny

RUN, EXITED = P.WORKER_STATE_RUNNING, P.WORKER_STATE_EXITED


def w(job: str, attempt: int, rank: int = 0, state: int = EXITED) -> agent_pb2.WorkerStatus:
    return agent_pb2.WorkerStatus(job_id=job, attempt=attempt, rank=rank, state=state)  # type: ignore[arg-type]


def workers(*ws: agent_pb2.WorkerStatus) -> Workers:
    out: Workers = {}
    for x in ws:
        out.setdefault((x.job_id, x.attempt), []).append(x)
    return out


def test_by_job_groups_each_jobs_attempts() -> None:
    got = by_job(workers(w("j", 1), w("j", 1, 1), w("j", 2, 0, RUN), w("k", 3)))
    assert {j: [(a, [x.rank for x in ws]) for a, ws in v] for j, v in got.items()} == {
        "j": [(1, [0, 1]), (2, [0])], "k": [(3, [0])]}


def test_only_jobs_whose_report_changed_or_still_runs_or_is_watched_are_looked_at() -> None:
    before = workers(w("done", 1), w("now-exited", 1, 0, RUN), w("running", 2, 0, RUN), w("moving", 1), w("gone", 1))
    after = workers(w("done", 1), w("now-exited", 1), w("running", 2, 0, RUN), w("moving", 1), w("new", 1))
    assert to_look_at(before, by_job(after), {"moving"}) == {"now-exited", "running", "moving", "new", "gone"}
    # The first status after a Register (nothing before it): every job.
    assert to_look_at({}, by_job(after), ()) == {"done", "now-exited", "running", "moving", "new"}


async def test_a_node_that_never_ran_the_job_cannot_raise_its_attempt_number() -> None:
    h = Harness(nodes=("a", "b", "c", "d"))  # 4 x A10-24GB each
    await h.register("a", "b", "c", "d")
    job = await h.submit(tiny(gpus=4))
    await h.round()
    fillers = [await h.submit(tiny(f"filler-{i}", gpus=4)) for i in range(2)]
    await h.round()
    on = {h.nodes_of(j)[0]: j for j in (job, *fillers)}
    await h.heartbeat(*on)
    free = ({"a", "b", "c", "d"} - set(on)).pop()
    home, forger = h.nodes_of(job)[0], h.nodes_of(fillers[0])[0]
    # The forger reports an exited worker of a job it never ran, at attempt 50,000.
    h.agents.nodes[forger].workers[(job, 50_000, 0)] = w(job, 50_000)
    await h.heartbeat(forger)
    await h.engine.drain(home, "maintenance")
    await h.heartbeat(home)  # its checkpoint taken: pending again
    assert h.state(job) == "PENDING"
    await h.round()
    assert h.nodes_of(job) == [free]
    # Before: 10,002 (any node's reported workers counted, up to 10,000 above the stored attempt).
    assert h.job(job).attempt == 2


async def test_the_last_placements_node_still_counts() -> None:
    """A later attempt still running where the job last ran (state restored from an older copy) is
    never reused: the relaunch goes above it."""
    h = Harness(nodes=("a", "b"))
    await h.register("a", "b")
    job = await h.submit(tiny(gpus=4))
    await h.round()
    home = h.nodes_of(job)[0]
    await run_to_running(h, job)
    h.agents.nodes[home].workers[(job, 7, 0)] = w(job, 7)
    await h.engine.drain(home, "maintenance")
    await h.heartbeat(home)
    await h.round()
    assert h.nodes_of(job) != [home] and h.job(job).attempt == 8


@pytest.mark.parametrize(("old_b", "key_bytes"), [(True, 0), (False, 32)])
async def test_an_attempt_over_an_old_agent_is_launched_without_a_key(old_b: bool, key_bytes: int) -> None:
    """A rollout: node b's agent predates sealed rendezvous (no "rendezvous-key" feature): the
    attempt over both nodes gets no key, where it failed its rendezvous on every retry."""
    h = Harness(nodes=("a", "b"))
    h.engine.cfg = dataclasses.replace(h.engine.cfg, rendezvous_key=bytes(32))
    if old_b:
        h.agents.nodes["b"].features = []
    await h.register("a", "b")
    both = await h.submit(tiny("both", gpus=8))  # 4 + 4: one attempt over both nodes
    await h.round()
    keys = {node: len(req.rendezvous_key) for (jid, _, node), req in h.agents.started.items() if jid == both}
    assert keys == {"a": key_bytes, "b": key_bytes}
