"""How much of the controller's event loop the dashboard's pages may take.

Pages and /api answers are rendered on the controller's event loop, where heartbeats, lease
renewals and every RPC also run. An audit's 16 connections of one user pulling /api/jobs?limit=1000
back to back raised ListNodes' latency from 1 ms to 721 ms. `LoopBudget` lets the renders take at
most `share` of any `window_s`; past it a request is answered 503 with Retry-After at once (a
browser's page refresh is a few renders every 10 s, far below it).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

SHARE = 0.25
WINDOW_S = 1.0


class LoopBudget:
    def __init__(self, share: float = SHARE, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.share, self.window_s, self.clock = share, window_s, clock
        self._spent: deque[tuple[float, float]] = deque()  # (end, seconds) of the recent renders
        self._total = 0.0

    def exhausted(self) -> bool:
        """Whether the renders of the last window took their share already."""
        horizon = self.clock() - self.window_s
        while self._spent and self._spent[0][0] < horizon:
            self._total -= self._spent.popleft()[1]
        return self._total >= self.share * self.window_s

    def spend(self, started: float) -> None:
        """A render that began at `started` (this clock) has ended."""
        now = self.clock()
        self._spent.append((now, now - started))
        self._total += now - started
