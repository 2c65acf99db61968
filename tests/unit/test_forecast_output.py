"""How tessctl shows forecasts (clients/output_forecast.py): describe's line and the wide columns."""

from __future__ import annotations

import datetime as dt

from tessera.clients import output
from tessera.clients.output_forecast import forecast_columns, forecast_text
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2 as C


def at(hh: int, mm: int, day: int = 26) -> float:
    return dt.datetime(2026, 11, day, hh, mm, tzinfo=dt.UTC).timestamp()


NOW = at(10, 0)


def pending(**f: float | str) -> C.Job:
    return C.Job(id="j1", state=P.JOB_STATE_PENDING, forecast=C.Forecast(**f))  # type: ignore[arg-type]


def test_pending_job_with_band() -> None:
    job = pending(start_time=at(10, 42), start_low=at(10, 38), start_high=at(10, 50), end_time=at(12, 10),
                  end_low=at(11, 55), end_high=at(12, 30))
    assert forecast_text(job, NOW) == "starts ~10:42 (10:38-10:50), ends ~12:10 (11:55-12:30) UTC"
    assert forecast_columns(job, NOW) == ["10:42", "12:10"]
    assert "Forecast:" in output.describe_job(job, NOW)


def test_running_job_shows_its_end_only_and_dates_on_another_day() -> None:
    job = C.Job(id="j2", state=P.JOB_STATE_RUNNING,
                forecast=C.Forecast(start_time=at(9, 0), end_time=at(3, 5, day=27), end_low=at(3, 5, day=27),
                                    end_high=at(3, 5, day=27)))
    assert forecast_text(job, NOW) == "ends ~11-27 03:05 UTC"
    assert forecast_columns(job, NOW) == ["-", "11-27 03:05"]


def test_notes_and_no_forecast() -> None:
    job = pending(start_time=at(10, 5), note="no forecast: opaque job without progress")
    assert forecast_text(job, NOW) == "starts ~10:05 UTC; no forecast: opaque job without progress"
    none = C.Job(id="j3", state=P.JOB_STATE_PENDING)
    assert forecast_text(none, NOW) == "" and forecast_columns(none, NOW) == ["-", "-"]
    assert "Forecast:" not in output.describe_job(none, NOW)


def test_json_times_are_rfc3339() -> None:
    job = pending(start_time=at(10, 42), start_low=at(10, 38), made_at=at(10, 0))
    d = output.to_dict(job)
    assert d["forecast"]["start_time"] == "2026-11-26T10:42:00Z"
    assert d["forecast"]["start_low"] == "2026-11-26T10:38:00Z" and d["forecast"]["made_at"] == "2026-11-26T10:00:00Z"


def test_an_end_already_past_says_the_job_outran_its_forecast() -> None:
    # A live audit read "Forecast: ends ~00:50" at 00:51 for a running job slower than its estimate.
    job = C.Job(id="j4", state=P.JOB_STATE_RUNNING,
                forecast=C.Forecast(end_time=at(9, 50), made_at=at(9, 45)))
    assert forecast_text(job, NOW) == "ends ~09:50 UTC, overdue (forecast made at 09:45)"
    assert forecast_text(C.Job(id="j5", state=P.JOB_STATE_RUNNING, forecast=C.Forecast(end_time=at(9, 50))),
                         NOW) == "ends ~09:50 UTC, overdue"
