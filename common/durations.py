"""Durations as people write them: "90s", "10m", "1h30m", "2d", or a plain number of seconds.

One parser for job files (`max_runtime: 10m`) and tessctl (`wait --timeout 10m`), and the short
form the controller writes back in reasons ("max_runtime 10m exceeded").
"""

from __future__ import annotations

import math
import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
MAX_SECONDS = 10**8  # a bit over three years: beyond it a limit means "none"


class DurationError(ValueError):
    """Not a duration; the message says what is accepted."""


def parse_duration(text: str | float) -> float:
    """Seconds of `text`: a number (seconds) or parts like "1h30m", "10m", "45s", "2d"; > 0."""
    if isinstance(text, bool):
        raise DurationError(f"not a duration: {text!r}")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        s = text.strip().lower().replace(" ", "")
        try:
            seconds = float(s)
        except ValueError:
            pos, seconds = 0, 0.0
            for m in _PART.finditer(s):
                if m.start() != pos:
                    break
                seconds += float(m.group(1)) * _UNITS[m.group(2)]
                pos = m.end()
            if pos != len(s) or not s:
                raise DurationError(f"not a duration: {text!r} (e.g. 90s, 10m, 1h30m, 2d or seconds)") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise DurationError(f"must be a positive duration, got {text!r}")
    if seconds > MAX_SECONDS:
        raise DurationError(f"longer than {MAX_SECONDS:,} seconds: {text!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """The short form: 600 -> "10m", 5400 -> "1h30m", 45 -> "45s", 90061 -> "1d1h1m1s"."""
    rest = round(seconds)
    if rest <= 0:
        return "0s"
    out = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        n, rest = divmod(rest, size)
        if n:
            out.append(f"{n}{unit}")
    return "".join(out)
