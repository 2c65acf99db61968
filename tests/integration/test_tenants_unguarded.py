"""A quota cut under a running guaranteed job (docs/tenants.md, "tessctl get tenants"): the job runs
as best-effort from the next round, and `get tenants` says so, to an admin and to the job's own
tenant (not to another). Before, a live audit's `get tenants` showed QUOTA 1 beside GUARANTEED 2
with no warning. Real gRPC on loopback with the controller's servicer, on an engine over SQLite
(fake agents)."""

from __future__ import annotations

from pathlib import Path

from tessera.controller.store import SqliteStore
from tests.integration.test_tenants_reads import Reads, engine_over, job, tenants_api

CUT = "tenants:\n  default: {}\n  team-a:\n    quota: {A10: 1}\n  team-b: {}\n"


async def test_get_tenants_warns_of_a_guaranteed_job_its_quota_no_longer_covers(tmp_path: Path) -> None:
    store = Reads(SqliteStore(tmp_path / "state.db"))
    h = engine_over(tmp_path, store)  # team-a: 4 x A10-24GB
    await h.register("a", "b")
    g = await h.submit(job("g", "team-a", 2, guaranteed=True))
    await h.round()
    assert h.state(g) == "STARTING"
    async with tenants_api(h, tmp_path) as tenants:
        assert list((await tenants("alice")).warnings) == []
        (tmp_path / "tenants.yaml").write_text(CUT)
        h.engine.tenants.request_reload()  # as SIGHUP: whatever the file's stamp
        await h.round()  # the round that no longer admits it
        said = (f"tenant team-a's quota (1 x A10-24GB) no longer covers its running guaranteed job {g} (promised "
                "2 x A10-24GB): it runs as best-effort, and may be preempted, until the quota covers it again")
        assert said in (await tenants("alice")).warnings
        assert said in (await tenants("admin")).warnings
        assert list((await tenants("bob")).warnings) == []  # not its job
    store.inner.close()


async def test_a_running_guaranteed_job_its_quota_no_longer_covers_says_so_in_its_reason(tmp_path: Path) -> None:
    # describe job read "training" while get tenants warned of it (the engine stored no reason for a
    # job the round keeps); once the quota covers it again, the note goes.
    store = Reads(SqliteStore(tmp_path / "state.db"))
    h = engine_over(tmp_path, store)
    await h.register("a", "b")
    g = await h.submit(job("g", "team-a", 2, guaranteed=True))
    await h.round()
    await h.heartbeat(*h.nodes_of(g))
    assert (h.state(g), h.job(g).reason) == ("RUNNING", "training")
    before = (tmp_path / "tenants.yaml").read_text()
    (tmp_path / "tenants.yaml").write_text(CUT)
    h.engine.tenants.request_reload()
    await h.round()
    assert h.job(g).reason.startswith("training; running as best-effort: tenant team-a's quota (1 x A10-24GB) "
                                      "no longer covers its promise"), h.job(g).reason
    (tmp_path / "tenants.yaml").write_text(before)
    h.engine.tenants.request_reload()
    await h.round()
    assert (h.state(g), h.job(g).reason) == ("RUNNING", "training")
    store.inner.close()
