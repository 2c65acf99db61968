"""The churn guard in a real engine over SQLite (fake agents, fake clock; docs/tenants.md, "Churn
guard"): tenant team-a's best-effort job holds the whole cluster; team-b's guaranteed jobs preempt
it and are cancelled as soon as they run, three times; the fourth preempts nobody and waits saying
why, until the cool-off has passed. With --churn-limit 0 nothing holds it back."""

from __future__ import annotations

from pathlib import Path

from tessera.clients.output import rfc3339
from tessera.clients.tenants_output import tenants_json, tenants_table
from tessera.controller.core.churn import ChurnConfig
from tessera.controller.engine import EngineConfig
from tessera.controller.store import SqliteStore
from tessera.v1 import common_pb2 as P
from tests.integration.test_tenants_reads import tenants_api
from tests.unit.test_engine import Harness, run_to_running, tiny


def cluster(tmp_path: Path, churn: ChurnConfig) -> Harness:
    """One node with one A10: a one-GPU job cannot be halved, so a guaranteed job preempts it whole."""
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n  team-a: {}\n  team-b:\n    quota: {A10: 1}\n")
    h = Harness(policy="fcfs", nodes=("a",))
    del h.agents.nodes["a"].inventory.gpus[1:]
    store = SqliteStore(tmp_path / "state.db")
    h.store = h.agents.store = store  # type: ignore[assignment]
    h.cfg = EngineConfig(policy="fcfs", tenants_file=str(path), churn=churn)
    h.engine = h._engine()
    return h


def spec(name: str, tenant: str, guaranteed: bool = False) -> P.JobSpec:
    s = tiny(name, iterations=1000, gpus=1)
    s.tenant = tenant
    if guaranteed:
        s.priority = P.PRIORITY_GUARANTEED
        s.guarantee.CopyFrom(P.Guarantee(num_gpus=1, gpu_type="A10-24GB"))
    return s


async def preempt_and_cancel(h: Harness, be: str, i: int) -> None:
    """team-b's guaranteed job stops team-a's running job, starts on its GPU and is cancelled at once;
    team-a's job runs again."""
    g = await h.submit(spec(f"g{i}", "team-b", guaranteed=True))
    await h.round()
    assert h.state(be) == "MIGRATING", h.job(be).reason  # preempted: checkpoint first
    await h.heartbeat("a")  # its workers have exited: requeued
    assert h.state(be) == "PENDING"
    await h.round()
    assert h.state(g) == "STARTING"
    await run_to_running(h, g)
    h.clock.advance(30)
    await h.engine.cancel(g)
    await h.heartbeat("a")  # its workers have exited: its GPU is free
    await h.round()
    assert h.state(be) == "STARTING"
    await run_to_running(h, be)


async def started_be(h: Harness) -> str:
    await h.register("a")
    be = await h.submit(spec("filler", "team-a"))
    await h.round()
    await run_to_running(h, be)
    return be


async def test_a_tenant_that_keeps_preempting_and_cancelling_cools_off(tmp_path: Path) -> None:
    h = cluster(tmp_path, ChurnConfig(cooloff_s=300.0))  # a short cool-off the agent's heartbeats span
    be = await started_be(h)
    for i in range(3):
        await preempt_and_cancel(h, be, i)

    g = await h.submit(spec("g3", "team-b", guaranteed=True))
    await h.round()
    assert h.state(be) == "RUNNING" and h.state(g) == "PENDING"  # the old code stopped be here
    why = h.job(g).reason
    assert why.startswith("guaranteed, but tenant team-b may not preempt until 1970-01-01T00:2"), why
    assert ": 3 of its guaranteed jobs that preempted others were cancelled or failed within 10m of their start in the 1h up to " \
        "1970-01-01T00:" in why and "; meanwhile best-effort: " in why, why

    await h.round()
    assert h.state(be) == "RUNNING" and h.job(g).reason == why  # still cooling off
    async with tenants_api(h, tmp_path) as tenants:  # `tessctl get tenants` says so too
        shown = await tenants("admin")
    rows = {t.name: t for t in shown.tenants}
    until = h.engine.churn.ledger.cooling_off["team-b"].until
    assert (rows["team-b"].no_preempt_until, rows["team-a"].no_preempt_until) == (until, 0.0)
    assert why.startswith(rows["team-b"].no_preempt_reason) and "churn guard" in rows["team-b"].no_preempt_reason
    assert f"churn guard: {rows['team-b'].no_preempt_reason}" in tenants_table(shown).splitlines()
    as_json = {t["name"]: t for t in tenants_json(shown)["tenants"]}
    assert as_json["team-b"]["no_preempt_until"] == rfc3339(until) and as_json["team-a"].get("no_preempt_until") is None
    # Its end asks for a round (a heartbeat's liveness pass then kicks one), not a round interval later.
    assert h.engine.churn.ledger.cooling_off["team-b"].until in h.engine._live.wakes
    for _ in range(60):  # the cool-off passes, the node's heartbeats coming in
        h.clock.advance(5)
        await h.heartbeat("a")
    await h.round()
    assert h.state(be) == "MIGRATING"  # team-b's guaranteed job preempts again
    assert f"guaranteed job {g} of tenant team-b reclaims" in h.job(be).reason
    await h.heartbeat("a")
    await h.round()
    assert h.state(g) == "STARTING" and "churn guard" not in h.job(g).reason


async def test_a_limit_of_0_lets_every_guaranteed_job_preempt(tmp_path: Path) -> None:
    h = cluster(tmp_path, ChurnConfig(limit=0))
    be = await started_be(h)
    for i in range(4):
        await preempt_and_cancel(h, be, i)


async def test_a_look_at_the_snapshot_feeds_no_churn_ledger(tmp_path: Path) -> None:
    """Only a round observes the ledger: a look at `Engine.snapshot()` (tests and tools read it) once
    counted the cancels it saw and cooled a tenant off with no round run."""
    h = cluster(tmp_path, ChurnConfig(cooloff_s=300.0))
    be = await started_be(h)
    for i in range(2):
        await preempt_and_cancel(h, be, i)
    g = await h.submit(spec("g2", "team-b", guaranteed=True))
    await h.round()
    await h.heartbeat("a")
    await h.round()
    await run_to_running(h, g)
    await h.engine.cancel(g)  # the third churn event, not yet seen by a round
    h.engine.snapshot()
    h.engine.snapshot()
    assert h.engine.churn.ledger.cooling_off == {}
    await h.round()
    assert "team-b" in h.engine.churn.ledger.cooling_off


async def test_a_restart_keeps_the_cool_off(tmp_path: Path) -> None:
    """The ledger is stored with the jobs (Store.put_meta): before, a restart or a failover forgot
    it, and a churning tenant got three more preemptions each time."""
    h = cluster(tmp_path, ChurnConfig(cooloff_s=300.0))
    be = await started_be(h)
    for i in range(3):
        await preempt_and_cancel(h, be, i)
    cooling = h.engine.churn.ledger.cooling_off["team-b"]
    await h.restart()
    await h.register("a")
    assert h.engine.churn.ledger.cooling_off == {"team-b": cooling}
    g = await h.submit(spec("g3", "team-b", guaranteed=True))
    await h.round()
    assert h.state(be) == "RUNNING" and h.job(g).reason.startswith("guaranteed, but tenant team-b may not preempt")


async def test_an_unreadable_ledger_starts_afresh(tmp_path: Path) -> None:
    h = cluster(tmp_path, ChurnConfig())
    h.store.put_meta("churn", '{"events": {"team-b": ["soon"]}}')
    await h.restart()
    assert h.engine.churn.ledger.events == {} and h.engine.churn.ledger.cooling_off == {}
