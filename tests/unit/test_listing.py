"""ListJobs pages over a store holding specs from before the bounds (finding 5: two jobs with
10 MB of env made every later ListJobs exceed the 16 MiB message limit, for good)."""

from __future__ import annotations

import pytest

from tessera.common.errors import InvalidArgument
from tessera.controller import listing
from tessera.controller.store import JobRecord, MemoryStore
from tessera.v1 import common_pb2 as P

KEY = b"k" * 32


def _store(n: int, huge: set[int]) -> MemoryStore:
    store = MemoryStore()
    for i in range(n):
        spec = P.JobSpec(name=f"j{i}", tenant="t", model=P.ModelSpec(name="gpt2-small"), global_batch_size=8,
                         iterations=10)
        if i in huge:
            spec.env.update({f"V{k}": "x" * 4000 for k in range(2600)})  # about 10 MB
        store.create_job(JobRecord(f"j-{i:04d}", f"r-{i}", spec, P.JOB_STATE_PENDING, "", float(i)), ("S", ""))
    return store


def _pages(store: MemoryStore, limit: int = 0) -> list[list[str]]:
    out, token = [], ""
    while True:
        resp = listing.list_page(lambda after, n: store.list_jobs_page((), "", after, n), lambda _: None, KEY,
                                 [], "", limit, token)
        assert resp.ByteSize() < 16 * 2**20
        out.append([j.id for j in resp.jobs])
        token = resp.continue_token
        if not token:
            return out


def test_legacy_huge_specs_are_listed_elided() -> None:
    store = _store(5, huge={1, 3})
    pages = _pages(store)
    assert pages == [[f"j-{i:04d}" for i in range(5)]]
    resp = listing.list_page(lambda after, n: store.list_jobs_page((), "", after, n), lambda _: None, KEY,
                             [], "", 0, "")
    assert [j.spec_elided for j in resp.jobs] == [False, True, False, True, False]
    assert not resp.jobs[1].spec.env and resp.jobs[1].spec.name == "j1"
    assert len(store.get_job("j-0001").spec.env) == 2600  # the stored spec is kept whole  # type: ignore[union-attr]


def test_limits() -> None:
    store = _store(1203, huge=set())
    pages = _pages(store)
    assert [len(p) for p in pages] == [500, 500, 203]
    assert [len(p) for p in _pages(store, limit=5000)] == [1000, 203]
    flat = [i for p in pages for i in p]
    assert flat == sorted(flat) and len(set(flat)) == 1203
    with pytest.raises(InvalidArgument, match="limit"):
        listing.page_limit(-1)
