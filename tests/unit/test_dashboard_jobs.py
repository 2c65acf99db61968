"""The /jobs page's list (controller/dashboard/joblist.py): the jobs not finished first, then the
newest finished, cut at MAX_ROWS with a note. It was the listing's first page, oldest first: one
tenant's hundreds of jobs hid everyone's newest from the admin's /jobs and /jobs?state=pending."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from tessera.controller import listing
from tessera.controller.dashboard import joblist
from tessera.controller.store import JobRecord
from tessera.v1 import common_pb2 as P
from tests.unit.test_dashboard import cluster, get
from tests.unit.test_engine import tiny


def listed_ids(body: bytes) -> list[str]:
    """The job ids of the page's table, in its order."""
    table = body.decode().partition('<table class="jobs">')[2]
    return re.findall(r'<a class="job" href="/jobs/([^"]+)">', table)


async def test_the_newest_jobs_and_the_running_ones_are_listed_first(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(joblist, "MAX_ROWS", 6)
    monkeypatch.setattr(listing, "DEFAULT_PAGE", 6)  # what the page was: the listing's first page
    h, d, ids = await cluster(tmp_path)  # team-a's job running, team-b's pending
    bulk = []
    for i in range(12):  # team-b floods the queue
        spec = tiny(f"bulk-{i}", gpus=64)
        spec.tenant = "team-b"
        bulk.append(await h.submit(spec))
    spec = tiny("alices-newest", gpus=64)
    spec.tenant = "team-a"
    newest = await h.submit(spec)
    done = await h.submit(tiny("cancelled-one", gpus=64))
    await h.engine.cancel(done)

    page = await d.handle(get("/jobs", token="admin-token"))
    assert page.status == 200
    # Running first, then pending newest first; the finished one does not fit the 6 rows.
    assert listed_ids(page.body) == [ids["a"], newest, *bulk[::-1][:4]]
    assert b'id="cut"' in page.body and b"Showing 6 of at least 16 jobs" in page.body
    assert b"tessctl get jobs" in page.body

    pending = await d.handle(get("/jobs?state=pending", token="admin-token"))
    assert listed_ids(pending.body) == [newest, *bulk[::-1][:5]]
    finished = await d.handle(get("/jobs?state=cancelled,succeeded", token="admin-token"))
    assert listed_ids(finished.body) == [done] and b'id="cut"' not in finished.body
    # A tenant's filter keeps to its jobs, and the state links keep the tenant.
    mine = await d.handle(get("/jobs?tenant=team-a", token="admin-token"))
    assert listed_ids(mine.body) == [ids["a"], newest] and b'id="cut"' not in mine.body
    assert b'href="/jobs?state=pending&amp;tenant=team-a"' in mine.body
    # A user sees its own tenant's only, whatever the flood.
    alice = await d.handle(get("/jobs", token="alice-token"))
    assert listed_ids(alice.body) == [ids["a"], newest]
    assert (await d.handle(get("/jobs?tenant=team-b", token="alice-token"))).status == 403
    # The JSON API is the listing's, unchanged: oldest first, pages with a continue token.
    api = await d.handle(get("/api/jobs?limit=3", token="admin-token"))
    assert b'"continue_token"' in api.body and ids["a"].encode() in api.body


def records(times: list[float]) -> list[JobRecord]:
    out = []
    for i, t in enumerate(sorted(times)):
        out.append(JobRecord(id=f"j-{i:06d}", request_id=f"r{i}", spec=P.JobSpec(name=f"n{i}"),
                             state=P.JOB_STATE_SUCCEEDED, reason="", submit_time=t))
    return out


class Store:
    """A store's page of finished jobs, oldest first, counting the reads and records read."""

    def __init__(self, recs: list[JobRecord]) -> None:
        self.recs = sorted(recs, key=lambda r: (r.submit_time, r.id))
        self.reads = 0
        self.read = 0

    def fetch(self, after: tuple[float, str] | None, n: int) -> list[JobRecord]:
        self.reads += 1
        out = [r for r in self.recs if after is None or (r.submit_time, r.id) > after][:n]
        self.read += len(out)
        return out


NOW = 10_000_000.0
DAY = 86400.0
RNG = random.Random(1)
SHAPES = {
    "few": [NOW - i * 3600 for i in range(30)],
    "uniform over a week": [NOW - RNG.uniform(0, 7 * DAY) for _ in range(5000)],
    "all in the last second": [NOW - RNG.uniform(0, 1) for _ in range(2000)],
    "one burst an hour ago": [NOW - 3600.0] * 1500,
    "a burst and a trickle": [NOW - 7200.0] * 1500 + [NOW - i * 60 for i in range(20)],
    "over years": [NOW - RNG.expovariate(1 / (400 * DAY)) for _ in range(3000)],
    "bursts every hour": [NOW - 3600.0 * (i // 120) for i in range(120 * 48)],
    "newer than now (a clock stepped back)": [NOW + 5.0] * 10 + [NOW - i for i in range(1000)],
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("room", [1, 7, 100, 500])
def test_newest_finds_the_newest_finished_jobs_in_a_few_bounded_reads(shape: str, room: int) -> None:
    store = Store(records(SHAPES[shape]))
    got = joblist.newest(store.fetch, room, NOW)
    keys = [(r.submit_time, r.id) for r in got.jobs]
    assert keys == sorted(keys, reverse=True) and len(set(keys)) == len(keys)  # newest first, none twice
    assert store.reads <= joblist.MAX_READS and store.read <= joblist.MAX_RECORDS + max(room, joblist.MIN_SEARCH) + 1
    everything = sorted(((r.submit_time, r.id) for r in store.recs), reverse=True)
    if len(everything) <= room:
        assert keys == everything and not got.cut and got.matching == len(everything)
        return
    assert got.cut and got.matching > len(keys) and len(keys) <= room
    assert len(keys) >= room / 2  # at least half the room, however the jobs are spread
    # The newest, to the millisecond: every job submitted after the oldest one shown is shown (a
    # burst of one instant fills the rest of the room in no particular order).
    oldest = keys[-1][0]
    assert {k for k in everything if k[0] > oldest + joblist.RESOLUTION_S} <= set(keys)


def test_the_unfinished_come_first_and_the_finished_fill_the_rest() -> None:
    def rec(i: int, state: int, t: float) -> JobRecord:
        return JobRecord(id=f"j-{i}", request_id=f"r{i}", spec=P.JobSpec(), state=state, reason="", submit_time=t)

    recs = [rec(0, P.JOB_STATE_RUNNING, 10.0), rec(1, P.JOB_STATE_PENDING, 20.0), rec(2, P.JOB_STATE_SUCCEEDED, 30.0),
            rec(3, P.JOB_STATE_STARTING, 40.0), rec(4, P.JOB_STATE_FAILED, 50.0), rec(5, P.JOB_STATE_PENDING, 60.0)]

    def jobs(states: list[int], tenant: str) -> list[JobRecord]:
        return [r for r in recs if r.state in states]

    def page(states: list[int], tenant: str, after: tuple[float, str] | None, n: int) -> list[JobRecord]:
        return Store([r for r in recs if r.state in states]).fetch(after, n)

    got = joblist.select(jobs, page, [], "", 100.0, rows=10)
    assert [r.id for r in got.jobs] == ["j-3", "j-0", "j-5", "j-1", "j-4", "j-2"] and not got.cut
    cut = joblist.select(jobs, page, [], "", 100.0, rows=4)
    assert [r.id for r in cut.jobs] == ["j-3", "j-0", "j-5", "j-1"] and cut.cut and cut.matching == 5
    done = joblist.select(jobs, page, [P.JOB_STATE_FAILED], "", 100.0, rows=4)
    assert [r.id for r in done.jobs] == ["j-4"] and not done.cut
