"""Which jobs the /jobs page lists, and in which order (docs/dashboard.md, "Pages").

The jobs not finished first: running (and starting, migrating), then pending, the newest first in
each; then the finished ones, the newest first; MAX_ROWS in all. One tenant that submits hundreds
of jobs therefore cannot push the running jobs, or a job submitted after its flood, off the page, as
it could when the page was the listing's first page (the oldest jobs first).

The jobs not finished are read whole, as the engine reads them every round. The finished ones can
be many (they stay until retention removes them), and the store pages jobs oldest first only
(`jobs_page(states, tenant, after, limit)`: at most `limit` after the key `after`). `newest` finds
the newest ones in bounded reads (at most MAX_READS, of at most room + 1 records each, and about
MAX_RECORDS records in all; a handful in practice): it widens a window back from now (1 minute,
4, 16, ...) until more than the room is in it, then narrows between the last two windows. The
answer is every finished job submitted after a cut-off, at least half the room (to the
millisecond: a burst of jobs of one instant that straddles the cut-off fills the room from it, in
no particular order). Out of reads (no test's pattern of submission times gets there), it is the
jobs after the narrowest cut-off found, and the room filled with jobs from just before it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tessera.controller.store import TERMINAL, JobRecord
from tessera.v1 import common_pb2

MAX_ROWS = 500  # as ListJobs' default page
MAX_READS = 40  # store reads for the finished jobs, each of at most room + 1 records,
MAX_RECORDS = 8000  # and at most about this many records read in all
FIRST_WINDOW_S = 60.0
RESOLUTION_S = 0.001
MIN_SEARCH = 50
PAST_IDS = "\U0010ffff"  # sorts after every job id (JOB_ID_RE): (t, PAST_IDS) is past every job of time t
ALL_STATES = frozenset(common_pb2.JobState.values()) - {common_pb2.JOB_STATE_UNSPECIFIED}

Fetch = Callable[[tuple[float, str] | None, int], list[JobRecord]]
Page = Callable[[list[int], str, tuple[float, str] | None, int], list[JobRecord]]


@dataclass(frozen=True)
class Listed:
    jobs: list[JobRecord]  # in the order shown
    cut: bool  # more jobs match than are shown
    matching: int  # how many match: exact when not cut, else a lower bound


def _key(r: JobRecord) -> tuple[float, str]:
    return (r.submit_time, r.id)


class _Search:
    """Two windows of the records, each after a key: `good` holds every record after `good_key`
    (at most the room); `bad` the oldest room + 1 after `bad_key` (more than the room follow it)."""

    def __init__(self, fetch: Fetch, room: int, first: list[JobRecord], max_reads: int) -> None:
        self.fetch, self.room, self.max_reads = fetch, room, max_reads
        self.good: list[JobRecord] = []
        self.good_key: tuple[float, str] = (math.inf, "")
        self.bad, self.bad_key = first, (-math.inf, "")
        self.reads, self.read = 1, len(first)

    def going(self) -> bool:
        """Not found yet (the good window holds under half the room, and the bad one's records end
        before it), and reads left."""
        return (self.reads < self.max_reads and self.read < MAX_RECORDS
                and len(self.good) < self.room / 2 and _key(self.bad[-1]) < self.good_key)

    def probe(self, key: tuple[float, str]) -> bool:
        """Read the records after `key`; whether more than the room follow it."""
        recs = self.fetch(key, self.room + 1)
        self.reads, self.read = self.reads + 1, self.read + len(recs)
        if len(recs) > self.room:
            self.bad, self.bad_key = recs, key
            return True
        self.good, self.good_key = recs, key
        return False

    def answer(self) -> Listed:
        s, room = self, self.room
        older = [r for r in s.bad if _key(r) <= s.good_key]  # bad's records not in good's window
        if _key(s.bad[-1]) >= s.good_key:  # bad reaches good's window: `older` is all there is between
            shown = s.good + older[len(older) - max(0, room - len(s.good)):]  # them: take their newest
        elif len(s.good) < room / 2:  # out of reads, or a burst of one instant straddles the cut-off:
            shown = s.good + older[:room - len(s.good)]  # fill the room with what came before
        else:
            shown = s.good
        return Listed(sorted(shown, key=_key, reverse=True), True,
                      max(len(s.bad), len(s.good) + len(older), len(shown) + 1))


def newest(fetch: Fetch, room: int, now: float, max_reads: int = MAX_READS) -> Listed:
    """The newest `room` or so records `fetch` reads (oldest first, `fetch(after, n)`: at most `n`
    after the key `after`), newest first."""
    if room < MIN_SEARCH:  # a small room is found as a part of a larger one: fewer reads
        found = newest(fetch, MIN_SEARCH, now, max_reads)
        return Listed(found.jobs[:room], found.cut or len(found.jobs) > room, found.matching)
    first = fetch(None, room + 1)
    if len(first) <= room:
        return Listed(sorted(first, key=_key, reverse=True), False, len(first))
    s = _Search(fetch, room, first, max_reads)
    # Widen: windows 1, 4, 16, ... minutes back from now, until one holds more than the room.
    age = FIRST_WINDOW_S
    while s.going() and s.bad is first and now - age >= first[0].submit_time:
        s.probe((now - age, ""))
        age *= 4
    # Narrow: halve the span between the two windows' cut-offs (in proportion while they are far
    # apart: jobs thin out with age). After a good window with too few, read on from just past the
    # bad window's records: when what follows them fits, the two hold every record after the bad
    # one's key, and the answer is exact.
    walk, burst = False, -math.inf
    while s.going():
        # Any cut-off from the bad window's key up to its oldest record leaves the same records.
        lo, hi = s.bad[0].submit_time, min(s.good_key[0], max(now, s.bad[-1].submit_time + 1))
        if hi - lo <= RESOLUTION_S:
            break  # a burst of one instant straddles the cut-off: the answer fills the room from it
        if walk:
            walk = False
            s.probe(_key(s.bad[-1]))
        elif s.bad[-1].submit_time == lo != burst:  # more than the room at one instant: what follows it?
            burst = lo
            walk = not s.probe((lo, PAST_IDS))
        else:
            a_lo, a_hi = now - lo, now - hi
            walk = not s.probe((now - math.sqrt(a_lo * a_hi) if 0 < 2 * a_hi < a_lo else (lo + hi) / 2, ""))
    return s.answer()


def _open_order(r: JobRecord) -> int:
    return 1 if r.state == common_pb2.JOB_STATE_PENDING else 0


def select(jobs: Callable[[list[int], str], list[JobRecord]], page: Page, states: Iterable[int], tenant: str,
           now: float, rows: int | None = None) -> Listed:
    """The /jobs list of the jobs in `states` (none: every state) of `tenant` ("": every tenant).
    `jobs(states, tenant)`: all of them (EngineView.jobs); `page(states, tenant, after, limit)`:
    a page, oldest first (EngineView.jobs_page)."""
    rows = MAX_ROWS if rows is None else rows
    wanted = set(states) or set(ALL_STATES)
    open_states, done_states = sorted(wanted - TERMINAL), sorted(wanted & TERMINAL)
    unfinished = sorted(jobs(open_states, tenant), key=_key, reverse=True) if open_states else []
    unfinished.sort(key=_open_order)  # stable: the newest first within running and within pending
    shown = unfinished[:rows]
    cut, matching = len(unfinished) > rows, len(unfinished)
    if done_states:
        room = rows - len(shown)
        if room:
            done = newest(lambda after, n: page(done_states, tenant, after, n), room, now)
            shown += done.jobs
            cut, matching = cut or done.cut, matching + done.matching
        elif page(done_states, tenant, None, 1):
            cut, matching = True, matching + 1
    return Listed(shown, cut, matching)
