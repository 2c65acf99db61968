"""Store.count_jobs_by_tenant (an admin's ListTenants counts every tenant's pending jobs with it) on
every backend: SQLite on disk, memory, and etcd (a real `etcd` process, tests/etcd_server.py, as in
tests/unit/test_store_contract.py). It is count_jobs of each tenant that has such jobs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tessera.controller.store import TERMINAL, JobRecord, SqliteStore, Store
from tessera.v1 import common_pb2 as P
from tests.etcd_server import etcd_endpoint
from tests.unit.test_store_contract import store

__all__ = ["etcd_endpoint", "store"]  # fixtures: the module-scoped etcd, and each store over it, SQLite, memory

UNENDED = (P.JOB_STATE_PENDING, P.JOB_STATE_STARTING, P.JOB_STATE_RUNNING, P.JOB_STATE_MIGRATING)


def _stored(store: Store, i: int, tenant: str, state: int) -> None:
    spec = P.JobSpec(name=f"job{i}", tenant=tenant, model=P.ModelSpec(name="gpt2-small"), global_batch_size=8,
                     iterations=10)
    rec = JobRecord(id=f"j-{i}", request_id=f"r-{i}", spec=spec, state=P.JOB_STATE_PENDING, reason="new",
                    submit_time=float(i))
    store.create_job(rec, ("SUBMITTED", ""))
    if state != P.JOB_STATE_PENDING:
        store.save_job(rec.with_(state=state, attempt=1, end_time=float(i) if state in TERMINAL else 0.0), float(i))


def _fill(store: Store) -> None:
    """Tenants with pending jobs only, running only, both, ended only, and the empty tenant."""
    layout = [("team-z", P.JOB_STATE_PENDING)] * 3 + [("team-r", P.JOB_STATE_RUNNING)] * 2 + [
        ("team-a", P.JOB_STATE_PENDING), ("team-a", P.JOB_STATE_STARTING), ("team-a", P.JOB_STATE_MIGRATING),
        ("team-a", P.JOB_STATE_SUCCEEDED), ("gone", P.JOB_STATE_CANCELLED), ("gone", P.JOB_STATE_FAILED),
        ("", P.JOB_STATE_PENDING)]
    for i, (tenant, state) in enumerate(layout):
        _stored(store, i, tenant, state)


def test_counts_per_tenant_are_count_jobs_of_each_tenant(store: Store) -> None:
    _fill(store)
    assert store.count_jobs_by_tenant((P.JOB_STATE_PENDING,)) == {"team-z": 3, "team-a": 1, "": 1}
    assert store.count_jobs_by_tenant(UNENDED) == {"team-z": 3, "team-r": 2, "team-a": 3, "": 1}
    assert store.count_jobs_by_tenant(sorted(TERMINAL)) == {"team-a": 1, "gone": 2}
    assert store.count_jobs_by_tenant((P.JOB_STATE_RUNNING, P.JOB_STATE_CANCELLED)) == {"team-r": 2, "gone": 1}
    assert store.count_jobs_by_tenant() == {"team-z": 3, "team-r": 2, "team-a": 4, "gone": 2, "": 1}
    for states in ((P.JOB_STATE_PENDING,), UNENDED, tuple(TERMINAL), ()):
        by_tenant = store.count_jobs_by_tenant(states)
        assert by_tenant == Counter(j.spec.tenant for j in store.list_jobs(states)), states
        assert all(by_tenant.get(t, 0) == store.count_jobs(states, t) for t in ("team-z", "team-r", "team-a", "gone"))


def test_counts_follow_writes(store: Store) -> None:
    """A job that starts leaves the pending count; one that is deleted leaves every count."""
    assert store.count_jobs_by_tenant((P.JOB_STATE_PENDING,)) == {}
    _fill(store)
    z0 = store.get_job("j-0")
    assert z0 is not None
    store.save_job(z0.with_(state=P.JOB_STATE_STARTING, attempt=1), 50.0)
    assert store.count_jobs_by_tenant((P.JOB_STATE_PENDING,)) == {"team-z": 2, "team-a": 1, "": 1}
    assert sorted(store.delete_finished_jobs(ended_before=100.0, limit=10)) == ["j-10", "j-8", "j-9"]
    assert store.count_jobs_by_tenant(sorted(TERMINAL)) == {}


def test_sqlite_counts_from_the_index_alone(tmp_path: Path) -> None:
    """Every step of the SQLite query searches `jobs_tenant_state` (or another covering index): no
    job row is read, however many pending jobs there are."""
    store = SqliteStore(tmp_path / "state.db")
    try:
        _fill(store)
        sql: list[str] = []
        store._db.set_trace_callback(sql.append)
        assert store.count_jobs_by_tenant((P.JOB_STATE_PENDING,))["team-z"] == 3
        store._db.set_trace_callback(None)
        (query,) = sql
        plan = [row[3] for row in store._db.execute("EXPLAIN QUERY PLAN " + query)]
        on_jobs = [step for step in plan if " jobs " in f"{step} "]
        assert on_jobs and all("COVERING INDEX" in step for step in on_jobs), plan
        assert any("jobs_tenant_state (tenant=? AND state=?)" in step for step in on_jobs), plan
    finally:
        store.close()
