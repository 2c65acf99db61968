"""A Unix time as tessctl and the controller's messages show it: YYYY-MM-DDTHH:MM:SSZ, in UTC."""

from __future__ import annotations

import datetime as dt


def utc_text(t: float) -> str | None:
    """`t` as 2026-11-27T06:00:00Z; None where it cannot be (past year 9999, or beyond the
    platform's time_t: a stored deadline of 1e308 once broke `describe job`)."""
    try:
        return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return None
