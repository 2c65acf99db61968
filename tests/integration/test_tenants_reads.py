"""What `ListTenants` (`tessctl get tenants`) reads of the store, over real gRPC on loopback with
the controller's servicer, auth interceptor and tokens, on an engine over SQLite (fake agents):
a user's call reads no other tenant's job record, and of its own only the active jobs (the GPUs
they hold); its pending jobs are counted by the store's index. Every answer is the one computed
from all the jobs, as before: another tenant's thousands of large pending jobs used to be read
(specs and all) at every user's call, 2.2 s each, stalling the event loop.

The callers are localcluster's: admin (tenant default), alice (team-a), bob (team-b)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from tessera.clients.sdk import Client
from tessera.controller.engine import EngineConfig
from tessera.controller.store import ACTIVE, JobRecord, SqliteStore
from tessera.controller.tenants import tenant_rows
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2
from tests.engine_api import serve_engine
from tests.unit.test_engine import Harness, tiny

ListTenants = controller_pb2.ListTenantsResponse
TENANTS = "tenants:\n  default: {}\n  team-a:\n    quota: {A10: 4}\n  team-b: {}\n"
CROWD = 60  # team-b's pending jobs, large specs


class Reads:
    """The store, counting the job records it hands out, per tenant."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.records: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _read(self, recs: list[JobRecord]) -> list[JobRecord]:
        self.records.update(r.spec.tenant for r in recs)
        return recs

    def get_job(self, job_id: str) -> JobRecord | None:
        rec = self.inner.get_job(job_id)
        return rec if rec is None else self._read([rec])[0]

    def list_jobs(self, states: Iterable[int] = (), tenant: str = "") -> list[JobRecord]:
        return self._read(self.inner.list_jobs(states, tenant))

    def list_jobs_page(self, *args: Any, **kw: Any) -> list[JobRecord]:
        return self._read(self.inner.list_jobs_page(*args, **kw))


R = TypeVar("R", bound=Reads)


def job(name: str, tenant: str, gpus: int, guaranteed: bool = False) -> P.JobSpec:
    s = tiny(name, gpus=gpus)
    s.tenant = tenant
    if guaranteed:
        s.priority = P.PRIORITY_GUARANTEED
        s.guarantee.CopyFrom(P.Guarantee(num_gpus=gpus, gpu_type="A10-24GB"))
    return s


def engine_over(tmp_path: Path, store: R) -> Harness:
    """An fcfs engine over `store` (a wrapper of SQLite in tmp_path) with TENANTS, nodes a and b."""
    (tmp_path / "tenants.yaml").write_text(TENANTS)
    h = Harness(policy="fcfs")
    h.store = h.agents.store = store  # type: ignore[assignment]
    h.cfg = EngineConfig(policy="fcfs", tenants_file=str(tmp_path / "tenants.yaml"))
    h.engine = h._engine()
    return h


async def cluster(tmp_path: Path) -> tuple[Harness, Reads]:
    """2 nodes of 4 x A10: team-a runs a guaranteed job (2 GPUs) and a best-effort one (4: 2
    borrowed), team-b a best-effort one (1) and has CROWD large jobs pending, team-a 2 pending."""
    store = Reads(SqliteStore(tmp_path / "state.db"))
    h = engine_over(tmp_path, store)
    await h.register("a", "b")
    runs = [await h.submit(job("g", "team-a", 2, guaranteed=True)), await h.submit(job("be-a", "team-a", 4)),
            await h.submit(job("be-b", "team-b", 1))]
    await h.round()
    assert [h.state(j) for j in runs] == ["STARTING"] * 3
    for i in range(2):
        await h.submit(job(f"wait-a{i}", "team-a", 64))  # too large to place: PENDING
    for i in range(CROWD):
        s = job(f"crowd{i}", "team-b", 64)
        s.env["BLOB"] = "x" * 20_000
        rec, _ = await h.engine.submit(s, f"crowd-{i}")
        h.submitted.append(rec.id)
    return h, store


@contextlib.asynccontextmanager
async def tenants_api(h: Harness, tmp_path: Path) -> AsyncIterator[Callable[[str], Awaitable[ListTenants]]]:
    """The engine's Controller API over real gRPC on loopback (TLS, tokens of local_tokens): yields
    `tenants(who)`, ListTenants as that user, answered by the server on this loop meanwhile."""
    async with serve_engine(h.engine, tmp_path) as (address, tokens):
        async def tenants(who: str) -> ListTenants:
            def call() -> ListTenants:
                with Client(address, token=tokens[who], timeout=30) as c:
                    return c.tenants()

            return await asyncio.to_thread(call)

        yield tenants


async def test_a_users_get_tenants_reads_only_its_own_active_jobs(tmp_path: Path) -> None:
    h, store = await cluster(tmp_path)
    async with tenants_api(h, tmp_path) as ask:
        async def tenants(who: str) -> tuple[ListTenants, Counter[str]]:
            store.records.clear()
            return await ask(who), Counter(store.records)

        config = h.engine.tenants.config
        everything = store.inner.list_jobs((P.JOB_STATE_PENDING, *ACTIVE))  # uncounted
        cap = h.engine.cfg.max_unended_jobs

        def expected(only: str) -> list[controller_pb2.Tenant]:  # the rows as computed from every job
            return tenant_rows(config, everything, only, cap)

        alice, read = await tenants("alice")
        assert list(alice.tenants) == expected("team-a")
        assert read == {"team-a": 2}, "alice's two active jobs, no pending job, nothing of team-b"
        (row,) = alice.tenants
        assert (row.name, row.jobs_running, row.jobs_pending) == ("team-a", 2, 2)
        assert [(g.gpu_type, g.gpus) for g in row.guaranteed_in_use] == [("A10-24GB", 2)]
        assert [(g.gpu_type, g.gpus) for g in row.borrowed] == [("A10-24GB", 2)]

        bob, read = await tenants("bob")
        assert list(bob.tenants) == expected("team-b") and read == {"team-b": 1}
        assert (bob.tenants[0].jobs_running, bob.tenants[0].jobs_pending) == (1, CROWD)

        admin, _ = await tenants("admin")  # every tenant, as before
        assert list(admin.tenants) == expected("") and [t.name for t in admin.tenants] == ["default", "team-a",
                                                                                             "team-b"]
        assert list(alice.tenants) == [t for t in admin.tenants if t.name == "team-a"]
        assert list(bob.tenants) == [t for t in admin.tenants if t.name == "team-b"]
    store.inner.close()
