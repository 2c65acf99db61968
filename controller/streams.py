"""At most so many open streams per caller (WatchJob, WatchJobs, WatchJobEvents, StreamJobLogs).

A stream costs the controller for as long as it is open: a WatchJobs wakes at every change and
rescans its tenant's jobs, a followed log polls the agents. Nothing bounded how many one caller
held: an audit's user opened 60 idle WatchJobs over 3,000 jobs and the controller's event loop,
which also serves the agents' heartbeats, ran at 98% (another tenant's WhoAmI 11.7 -> 332 ms).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tessera.common.errors import ResourceExhausted
from tessera.common.tokens import Principal

STREAMS_PER_CALLER = 32


class StreamSlots:
    """Open streams per principal (a token's name; unauthenticated callers share one)."""

    def __init__(self, per_caller: int = STREAMS_PER_CALLER) -> None:
        self.per_caller = per_caller
        self.open: dict[str, int] = {}

    @contextlib.contextmanager
    def hold(self, who: Principal, method: str) -> Iterator[None]:
        n = self.open.get(who.name, 0)
        if n >= self.per_caller:
            raise ResourceExhausted(f"{method}: {who.name} holds {n} open streams (watches, log follows), the most "
                                    "one caller may; close one and retry")
        self.open[who.name] = n + 1
        try:
            yield
        finally:
            left = self.open[who.name] - 1
            if left:
                self.open[who.name] = left
            else:
                del self.open[who.name]
