"""Named crash points: `crash_point("round.planned")` SIGKILLs this process when the environment
variable TESSERA_CRASH_AT names that point, so the chaos tests (tests/chaos) can kill -9 the
controller at an exact step instead of racing a signal against it.

TESSERA_CRASH_AT is `name` (the first hit) or `name:N` (the N-th hit, counted from 1). It is read
once, at import; with it unset a call is one dict lookup and nothing else. The process logs a
`crash_point` line first (stderr, flushed), so a test can tell a planned death from a bug.

Every point is listed in POINTS (and in docs/chaos.md); naming an unknown point raises, so a renamed
point cannot silently stop crashing its test.
"""

from __future__ import annotations

import os
import signal
import sys

ENV = "TESSERA_CRASH_AT"

POINTS: dict[str, str] = {
    "round.planned": "a round's plan with starts, moves or stops is computed, nothing of it stored yet",
    "round.placed": "a start's attempt is stored as STARTING, its Launch not sent",
    "round.between_launches": "one start step of a round stored as STARTING, the next not taken, no Launch sent",
    "launch.answered": "an agent answered a Launch, before the engine handles (stores) its result",
    "migrate.checkpoint_requested": "a migration is stored as MIGRATING and the Stop (checkpoint) sent",
    "migrate.old_stopped": "the migrating attempt's workers are seen stopped, nothing stored yet",
    "migrate.before_launch": "the new attempt of a migration is stored as STARTING, its Launch not sent",
}


def _parse(raw: str) -> tuple[str, int] | None:
    raw = raw.strip()
    if not raw:
        return None
    name, _, nth = raw.partition(":")
    if name not in POINTS:
        raise ValueError(f"{ENV}={raw!r}: unknown crash point {name!r} (known: {', '.join(sorted(POINTS))})")
    try:
        n = int(nth) if nth else 1
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: the hit count after ':' must be an integer") from None
    if n < 1:
        raise ValueError(f"{ENV}={raw!r}: the hit count must be at least 1")
    return name, n


_armed = _parse(os.environ.get(ENV, ""))
_hits: dict[str, int] = {}


def crash_point(name: str) -> None:
    """SIGKILL this process if TESSERA_CRASH_AT names `name` and this is the hit it asks for."""
    if _armed is None:
        return
    if name not in POINTS:
        raise ValueError(f"unknown crash point {name!r}")
    if name != _armed[0]:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == _armed[1]:
        sys.stderr.write(f'{{"event": "crash_point", "point": "{name}", "hit": {_hits[name]}}}\n')
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def arm(raw: str) -> None:
    """Arm (or with "" disarm) the points as TESSERA_CRASH_AT would; for tests of this module."""
    global _armed
    _armed = _parse(raw)
    _hits.clear()
