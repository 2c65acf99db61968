"""Tenants in the engine without processes (docs/tenants.md, "Live"): the round's snapshot carries
the tenants file's quotas, the jobs' tenants, classes and promises and the nodes' CPUs; a
guaranteed job within quota preempts a best-effort job (checkpoint, STOPPED, requeued), and the
preempted job starts again when the guaranteed one ends; one that can halve is shrunk instead. The engine harness of test_engine.py
(fake agents, fake clock) checks its invariants after every step."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from tessera.controller.core.snapshot import Priority, Promise, TenantQuota
from tessera.controller.engine import EngineConfig
from tessera.v1 import common_pb2 as P
from tests.unit.test_engine import Harness, run_to_running, tiny


def harness(tmp_path: Path, policy: str = "fcfs", quota: int = 4) -> Harness:
    path = tmp_path / "tenants.yaml"
    path.write_text(f"tenants:\n  team-a:\n    quota: {{A10: {quota}}}\n  team-b: {{}}\n")
    h = Harness(policy=policy, nodes=("a", "b"))
    h.cfg = EngineConfig(policy=policy, tenants_file=str(path))
    h.engine = h._engine()
    for n in ("a", "b"):  # 4 x A10 each, and a host declared with 32 CPUs
        h.agents.nodes[n].inventory.cpu_count = 32
    return h


def guaranteed(name: str, gpus: int, cpus: int = 0, iterations: int = 40) -> P.JobSpec:
    s = tiny(name, iterations=iterations, gpus=gpus)
    s.tenant, s.priority = "team-a", P.PRIORITY_GUARANTEED
    s.guarantee.CopyFrom(P.Guarantee(num_gpus=gpus, num_cpus=cpus, gpu_type="A10-24GB"))
    return s


def best_effort(name: str, gpus: int, iterations: int = 40) -> P.JobSpec:
    s = tiny(name, iterations=iterations, gpus=gpus)
    s.tenant = "team-b"
    return s


async def two_fillers(h: Harness) -> list[str]:
    """Nodes a and b cut to one GPU each, each running one of team-b's best-effort jobs."""
    for n in ("a", "b"):
        del h.agents.nodes[n].inventory.gpus[1:]
    await h.register("a", "b")
    fillers = [await h.submit(best_effort(f"filler-{i}", 1)) for i in (1, 2)]
    await h.round()
    for be in fillers:
        await run_to_running(h, be)
    return fillers


async def test_snapshot_carries_tenants_promises_and_host_cpus(tmp_path: Path) -> None:
    h = harness(tmp_path)
    await h.register("a", "b")
    g = await h.submit(guaranteed("g", 2, cpus=12))
    await h.round()
    assert h.state(g) == "STARTING"
    snap, _ = h.engine.snapshot()
    assert snap.tenants == (TenantQuota("team-a", (("A10-24GB", 4),)), TenantQuota("team-b"))
    (r,) = snap.running
    assert (r.job.tenant, r.job.priority, r.job.promise) == ("team-a", Priority.GUARANTEED,
                                                             Promise(2, 12, "", "A10-24GB"))
    node = next(n for n in snap.nodes if n.id == h.nodes_of(g)[0])
    assert (node.cpus, node.busy_cpus) == (32, 12)


async def test_guaranteed_job_preempts_best_effort_then_it_resumes(tmp_path: Path) -> None:
    h = harness(tmp_path)
    for n in ("a", "b"):  # one GPU each: a one-GPU job cannot be halved, only preempted
        del h.agents.nodes[n].inventory.gpus[1:]
    await h.register("a", "b")
    be1 = await h.submit(best_effort("filler-1", 1))
    be2 = await h.submit(best_effort("filler-2", 1))
    await h.round()
    for be in (be1, be2):
        assert h.state(be) == "STARTING"
        await run_to_running(h, be)
        h.agents.report(be, 1, iteration=20)
    await h.heartbeat("a", "b")

    g = await h.submit(guaranteed("g", 1))
    await h.round()  # one filler is preempted, checkpoint first
    (be,) = [b for b in (be1, be2) if h.state(b) == "MIGRATING"]
    preempted = h.store.events(be)[-1].message
    assert f"preempted: guaranteed job {g} of tenant team-a reclaims 1 x A10-24GB" in preempted
    assert h.state(g) == "PENDING"  # its GPUs are still the filler's until it has stopped
    await h.heartbeat("a", "b")  # the filler's workers have exited: requeued
    assert h.state(be) == "PENDING" and "STOPPED" in h.kinds(be)
    await h.round()
    assert h.state(g) == "STARTING" and h.state(be) == "PENDING"
    assert "admitted within quota" in h.job(g).reason
    await run_to_running(h, g)
    await h.round()
    assert h.state(be) == "PENDING" and h.job(be).reason  # waits, with its reason, while g runs

    h.agents.report(g, 1, iteration=40)
    h.agents.exit(g, 1)
    await h.heartbeat(*h.nodes_of(g))
    assert h.state(g) == "SUCCEEDED"
    await h.round()
    assert h.state(be) == "STARTING" and h.job(be).attempt == 2
    assert h.job(be).progress is not None and h.job(be).progress.iteration == 20  # type: ignore[union-attr]


async def test_guaranteed_job_shrinks_a_best_effort_job_that_can_halve(tmp_path: Path) -> None:
    h = harness(tmp_path)
    await h.register("a", "b")
    be = await h.submit(best_effort("filler", 8))
    await h.round()
    await run_to_running(h, be)
    g = await h.submit(guaranteed("g", 4))
    await h.round()
    assert h.state(be) == "MIGRATING"
    moving = h.store.events(be)[-1].message
    # The quota charge is the promise's minRes (controller/core/admission.py): here fewer GPUs than the
    # 4 promised are as fast, so the reclaim names that charge while the shrink halves the job.
    assert re.match(r"scale-down 8 x A10-24GB, 1 stage -> 4 x A10-24GB, 1 stage: shrunk: guaranteed job "
                    rf"{g} of tenant team-a reclaims [1-4] x A10-24GB of its quota", moving), moving
    await h.heartbeat("a", "b")  # stopped with its checkpoint: relaunched on the half it keeps
    assert h.state(be) == "STARTING" and h.job(be).attempt == 2 and len(h.nodes_of(be)) == 1
    await h.round()
    assert h.state(g) == "STARTING" and h.nodes_of(g) != h.nodes_of(be)


async def test_a_promise_over_the_cluster_waits_saying_what_exists(tmp_path: Path) -> None:
    """A quota over the cluster is accepted (nodes may join); a promise within it but over what is
    registered waits, and its reason says what the cluster has."""
    h = harness(tmp_path, quota=16)
    await h.register("a", "b")
    g = await h.submit(guaranteed("big", 12))
    await h.round()
    assert h.state(g) == "PENDING"
    assert "its promise needs 12 x A10-24GB and the cluster has 8 registered: it waits until nodes join" \
        in h.job(g).reason
    assert h.engine.tenants.warnings({"A10-24GB": 8})[0].startswith("quotas of A10-24GB sum to 16 GPUs")


async def test_with_min_run_a_guaranteed_job_waits_for_young_best_effort_work_across_a_restart(tmp_path: Path) -> None:
    """--min-run (controller/core/minrun.py): the preemption waits until the best-effort jobs have
    run that long since their placement (stored, so a restarted controller holds it too), says so,
    and asks for a round at its end."""
    h = harness(tmp_path)
    h.cfg = dataclasses.replace(h.cfg, min_run_s=600.0)
    h.engine = h._engine()
    for n in ("a", "b"):
        del h.agents.nodes[n].inventory.gpus[1:]
    await h.register("a", "b")
    fillers = [await h.submit(best_effort(f"filler-{i}", 1)) for i in (1, 2)]
    await h.round()
    placed = h.clock.now
    for be in fillers:
        await run_to_running(h, be)
        assert h.job(be).placement.placed_at == placed  # type: ignore[union-attr]
    g = await h.submit(guaranteed("g", 1))
    await h.restart()  # the placements' times come from the store
    await h.register("a", "b")
    await h.round()
    assert [h.state(be) for be in fillers] == ["RUNNING", "RUNNING"] and h.state(g) == "PENDING"
    assert f"may not be preempted yet: {', '.join(sorted(fillers))} (2 x A10-24GB)" in h.job(g).reason
    assert placed + 600 in h.engine._live.wakes

    h.clock.advance(placed + 600 - h.clock.now)
    await h.round()
    assert sorted(h.state(be) for be in fillers) == ["MIGRATING", "RUNNING"]


@pytest.mark.parametrize("policy", ["fcfs", "crius", "morphling", "sia"])
async def test_one_victim_per_guaranteed_job_while_the_first_checkpoints(tmp_path: Path, policy: str) -> None:
    """A live audit: the round after a preemption, 0.2 s later, saw the victim's GPU still held (it
    was checkpointing) and preempted a second best-effort job for the same guaranteed one. The GPUs
    being freed (NodeView.releasing) are now the guaranteed job's: it waits for them, and the other
    best-effort job keeps running."""
    h = harness(tmp_path, policy)
    fillers = await two_fillers(h)
    g = await h.submit(guaranteed("g", 1))
    await h.round()
    (victim,) = [b for b in fillers if h.state(b) == "MIGRATING"]
    (other,) = [b for b in fillers if b != victim]
    assert h.state(g) == "PENDING"
    assert f"{policy}: {policy}:" not in h.store.events(victim)[-1].message  # said once (a live audit)
    assert h.job(g).reason == f"waiting for {victim} to checkpoint and stop: it starts on their GPUs once they are free"
    h.engine._kick.clear()
    for _ in range(3):  # rounds before the victim has stopped: nobody else is preempted
        await h.round()
        assert h.state(other) == "RUNNING" and h.state(victim) == "MIGRATING" and h.state(g) == "PENDING"
    assert not h.engine.round_requested  # the wait asks for no round: the victim's exit does
    await h.heartbeat("a", "b")  # the victim's workers have exited: requeued, its GPU free
    assert h.state(victim) == "PENDING"
    await h.round()
    assert h.state(g) == "STARTING" and h.nodes_of(g) == h.nodes_of(victim) and h.state(other) == "RUNNING"


async def test_the_wait_for_a_victim_is_one_event_however_many_rounds(tmp_path: Path) -> None:
    h = harness(tmp_path)
    await two_fillers(h)
    g = await h.submit(guaranteed("g", 1))
    for _ in range(4):
        await h.round()
    waits = [e for e in h.store.events(g) if e.kind == "PENDING" and "to checkpoint and stop" in e.message]
    assert len(waits) == 1
