"""At most so many open streams per caller: list watches and log streams (WatchJobs,
StreamJobLogs), and single-job watches (WatchJob, WatchJobEvents), counted apart.

A stream costs the controller for as long as it is open: a WatchJobs re-reads its tenant's jobs at
every change of one of them (controller/changes.py), a followed log polls the agents. Nothing
bounded how many one caller held: an audit's user opened 60 idle WatchJobs over 3,000 jobs and the
controller's event loop, which also serves the agents' heartbeats, ran at 98% (another tenant's
WhoAmI 11.7 -> 332 ms; then every liveness pass woke every watch to a rescan). A
single job's watch reads that job alone at a wake-up, and scripts wait on many jobs at once
(`tessctl wait` per job): its bound is larger.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tessera.common.errors import ResourceExhausted
from tessera.common.tokens import Principal

LIST_STREAMS = 16  # WatchJobs, StreamJobLogs
JOB_STREAMS = 256  # WatchJob, WatchJobEvents
# Each method's kind: the streams of one kind count against one bound.
KINDS = {"WatchJobs": "list watches and log streams", "StreamJobLogs": "list watches and log streams",
         "WatchJob": "job watches", "WatchJobEvents": "job watches"}
LIMITS = {"list watches and log streams": LIST_STREAMS, "job watches": JOB_STREAMS}


class StreamSlots:
    """Open streams per (principal, kind): a token's name (unauthenticated callers share one)."""

    def __init__(self, limits: dict[str, int] | None = None) -> None:
        self.limits = limits or LIMITS
        self.open: dict[tuple[str, str], int] = {}

    @contextlib.contextmanager
    def hold(self, who: Principal, method: str) -> Iterator[None]:
        kind = KINDS[method]
        limit = self.limits[kind]
        key = (who.name, kind)
        n = self.open.get(key, 0)
        if n >= limit:
            raise ResourceExhausted(f"{method}: {who.name} holds {n} open {kind}, the most one caller may; "
                                    "close one and retry")
        self.open[key] = n + 1
        try:
            yield
        finally:
            left = self.open[key] - 1
            if left:
                self.open[key] = left
            else:
                del self.open[key]
