"""What an admin's `ListTenants` (`tessctl get tenants`) reads of the store, over real gRPC on
loopback with the controller's servicer, auth interceptor and tokens, on an engine over SQLite (fake
agents): every tenant's active jobs, and no pending job, which the store counts per tenant
(Store.count_jobs_by_tenant) instead. The rows are the ones computed from all the jobs, as before:
reading 2,000 pending jobs took 2.2 s, the controller's event loop (heartbeats too) stalled.

The tenants: team-a (in the file) runs jobs and has jobs pending, team-b (in the file) runs one,
team-r (outside the file) runs one, team-z (outside the file) has pending jobs only and still
gets its row, default (in the file) has none."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tessera.controller.store import ACTIVE, JobRecord, SqliteStore
from tessera.controller.tenants import tenant_rows
from tessera.v1 import common_pb2 as P
from tests.integration.test_tenants_reads import Reads, engine_over, job, tenants_api
from tests.unit.test_engine import Harness

WAITING = 25  # team-z's pending jobs, large specs


class StateReads(Reads):
    """`Reads`, also counting the records handed out by state, and the per-tenant counts asked."""

    def __init__(self, inner: SqliteStore) -> None:
        super().__init__(inner)
        self.states: Counter[int] = Counter()
        self.counted: list[frozenset[int]] = []

    def _read(self, recs: list[JobRecord]) -> list[JobRecord]:
        self.states.update(r.state for r in recs)
        return super()._read(recs)

    def count_jobs_by_tenant(self, states: tuple[int, ...] = ()) -> dict[str, int]:
        self.counted.append(frozenset(states))
        return self.inner.count_jobs_by_tenant(states)


async def cluster(tmp_path: Path) -> tuple[Harness, StateReads]:
    """2 nodes of 4 x A10: team-a runs a guaranteed job (2 GPUs) and a best-effort one (4: 2
    borrowed), team-b and team-r a best-effort one each (1); then team-a has 2 jobs pending and
    team-z WAITING, all too large to place."""
    store = StateReads(SqliteStore(tmp_path / "state.db"))
    h = engine_over(tmp_path, store)
    await h.register("a", "b")
    runs = [await h.submit(job("g", "team-a", 2, guaranteed=True)), await h.submit(job("be-a", "team-a", 4)),
            await h.submit(job("be-b", "team-b", 1)), await h.submit(job("be-r", "team-r", 1))]
    await h.round()
    assert [h.state(j) for j in runs] == ["STARTING"] * 4
    for i in range(2):
        await h.submit(job(f"wait-a{i}", "team-a", 64))
    for i in range(WAITING):
        s = job(f"z{i}", "team-z", 64)
        s.env["BLOB"] = "x" * 20_000
        await h.submit(s)
    await h.round()  # nothing more fits: the waiting jobs stay PENDING
    assert [h.state(j) for j in h.submitted[4:]] == ["PENDING"] * (2 + WAITING)
    return h, store


async def test_an_admins_get_tenants_reads_no_pending_job_and_its_rows_are_as_before(tmp_path: Path) -> None:
    h, store = await cluster(tmp_path)
    async with tenants_api(h, tmp_path) as tenants:
        everything = store.inner.list_jobs((P.JOB_STATE_PENDING, *ACTIVE))  # uncounted
        before = tenant_rows(h.engine.tenants.config, everything, "", h.engine.cfg.max_unended_jobs)
        store.records.clear()
        store.states.clear()
        admin = await tenants("admin")

        assert list(admin.tenants) == before
        rows = {t.name: (t.jobs_running, t.jobs_pending) for t in admin.tenants}
        assert rows == {"default": (0, 0), "team-a": (2, 2), "team-b": (1, 0), "team-r": (1, 0),
                        "team-z": (0, WAITING)}
        assert store.states[P.JOB_STATE_PENDING] == 0, "no pending record read"
        assert store.records == {"team-a": 2, "team-b": 1, "team-r": 1}, "the active jobs, nothing of team-z"
        assert store.counted == [frozenset({P.JOB_STATE_PENDING})]
        store.inner.close()


def test_pending_counts_of_the_empty_tenant_are_defaults_as_its_jobs_are() -> None:
    """A job stored with no tenant is the tenant "default"'s row; its count too."""
    def rec(i: int, tenant: str) -> JobRecord:
        spec = P.JobSpec(name=f"j{i}", tenant=tenant)
        return JobRecord(f"j{i}", f"r{i}", spec, P.JOB_STATE_PENDING, "", float(i))

    jobs = [rec(0, ""), rec(1, ""), rec(2, "default"), rec(3, "team-z")]
    counted = tenant_rows(None, [], pending={"": 2, "default": 1, "team-z": 1})
    assert counted == tenant_rows(None, jobs)
    assert [(t.name, t.jobs_pending) for t in counted] == [("default", 3), ("team-z", 1)]
