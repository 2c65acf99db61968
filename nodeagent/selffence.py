"""The agent's side of self-fencing: renew the fence file on every acknowledged Register/Heartbeat.

Deadline = the time.monotonic() at which the acknowledged call was *sent* + fence_seconds (the
RegisterResponse's `fence_seconds`; lease_seconds / 2 when the controller leaves it at 0). Counting
from the send, not the answer, keeps the bound honest: the controller renewed the lease at some point
after the send, so the agent's deadline never ends later than the controller's view of it.

The keepers (tessera.nodeagent.keeper) enforce the deadline on their own; this object only writes it
(tessera.nodeagent.keeperfiles), tells the supervisor whether it has passed (a Launch while fenced is
refused: its keeper would stop the worker at once), and logs the expiry once per lapse so that a
running agent whose controller is unreachable says why its workers are stopping.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from tessera.nodeagent import keeperfiles

log = structlog.get_logger("tessera.nodeagent.selffence")

MAX_FENCE_SECONDS = 3600.0


def fence_seconds(fence: float, lease: float) -> float:
    """The fence to apply from a RegisterResponse; 0 when the controller gave neither value."""
    if math.isfinite(fence) and fence > 0:
        return min(fence, MAX_FENCE_SECONDS)
    if math.isfinite(lease) and lease > 0:
        return min(lease / 2, MAX_FENCE_SECONDS)
    return 0.0


class SelfFence:
    def __init__(self, work_dir: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = work_dir / keeperfiles.FENCE_FILE
        self._clock = clock
        self.deadline: float | None = None
        self.renewed: float | None = None
        self._lapse_logged = False
        got = keeperfiles.read_fence(self.path)
        if got is not None and got[1] > clock():
            # Written before this boot: the monotonic clock restarted, the numbers mean nothing.
            try:
                os.unlink(self.path)
            except OSError:
                pass
            got = None
        if got is not None:
            # A previous agent's renewal still binds the keepers it left running.
            self.deadline, self.renewed = got

    def renew(self, sent: float, seconds: float) -> None:
        """A call sent at monotonic `sent` was acknowledged; `seconds` from fence_seconds()."""
        if seconds <= 0:
            return
        if self.renewed is not None and sent < self.renewed:
            return  # an older call answered late: never move the deadline back
        try:
            self.deadline = keeperfiles.write_fence(self.path, sent, seconds)
        except OSError as exc:
            log.error("cannot write the fence file; workers will be fenced", path=str(self.path), error=str(exc))
            return
        self.renewed = sent
        if self._lapse_logged:
            log.info("lease renewed after the fence expired; fenced workers stay stopped")
        self._lapse_logged = False

    def expired(self, now: float | None = None) -> bool:
        now = self._clock() if now is None else now
        return self.deadline is not None and now >= self.deadline

    def check(self) -> bool:
        """Log the expiry once per lapse; True only the first time a lapse is seen."""
        if self._lapse_logged or not self.expired():
            return False
        self._lapse_logged = True
        assert self.renewed is not None
        log.error(
            "fence expired: no lease renewal; keepers are stopping the workers",
            seconds_since_renewal=round(self._clock() - self.renewed, 1),
        )
        return True

    def seconds_since_renewal(self) -> float | None:
        return None if self.renewed is None else self._clock() - self.renewed
