"""How tessctl shows a job's forecast (docs/forecasts.md): `describe job`'s Forecast line and the
START~/END~ columns of `get jobs -o wide`. Times in UTC; the date only when not the day of `now`."""

from __future__ import annotations

import datetime as dt

from tessera.v1 import common_pb2, controller_pb2

NONE = "-"


def clock(t: float, now: float) -> str:
    """e.g. "10:42", or "11-27 10:42" on another day than `now` (UTC); "-" for a time no calendar
    shows (past year 9999, NaN)."""
    try:
        when = dt.datetime.fromtimestamp(t, dt.UTC)
    except (OverflowError, OSError, ValueError):
        return "-"
    same_day = when.date() == dt.datetime.fromtimestamp(now, dt.UTC).date()
    return when.strftime("%H:%M" if same_day else "%m-%d %H:%M")


def _span(t: float, low: float, high: float, now: float) -> str:
    text = f"~{clock(t, now)}"
    if low > 0 and high > 0 and (clock(low, now) != clock(t, now) or clock(high, now) != clock(t, now)):
        text += f" ({clock(low, now)}-{clock(high, now)})"
    return text


def forecast_text(job: controller_pb2.Job, now: float) -> str:
    """"starts ~10:42 (10:38-10:50), ends ~12:10 (11:55-12:30) UTC"; a running job: "ends ~..."; "" when
    the job has no forecast at all (ended, or none made yet)."""
    if not job.HasField("forecast"):
        return ""
    f = job.forecast
    parts = []
    if job.state == common_pb2.JOB_STATE_PENDING and f.start_time > 0:
        parts.append("starts " + _span(f.start_time, f.start_low, f.start_high, now))
    if f.end_time > 0:
        parts.append("ends " + _span(f.end_time, f.end_low, f.end_high, now))
    if parts:
        parts[-1] += " UTC"  # (tessctl wait and describe's times are UTC too)
    if f.end_time > 0 and f.end_time < now:  # the job outran its forecast: say so rather than show a past end as news
        parts.append(f"overdue (forecast made at {clock(f.made_at, now)})" if f.made_at > 0 else "overdue")
    text = ", ".join(parts)
    if f.note:
        text = f"{text}; {f.note}" if text else f.note
    return text


def forecast_pairs(job: controller_pb2.Job, now: float) -> list[tuple[str, str]]:
    text = forecast_text(job, now)
    return [("Forecast", text)] if text else []


def forecast_columns(job: controller_pb2.Job, now: float) -> list[str]:
    """START~ and END~ of `get jobs -o wide`."""
    if not job.HasField("forecast"):
        return [NONE, NONE]
    f = job.forecast
    start = clock(f.start_time, now) if f.start_time > 0 and job.state == common_pb2.JOB_STATE_PENDING else NONE
    return [start, clock(f.end_time, now) if f.end_time > 0 else NONE]
