"""The dashboard's data: the same messages the gRPC listing answers (convert.job_pb, listing.list_page,
node_listing.list_nodes), as JSON for /api/ and as inputs of the pages; and a Job's forecast
(controller.proto Job field 23), read defensively: a Job without one shows none.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from tessera.controller.dashboard.history import CapacityHistory, ProgressPoint
from tessera.v1 import controller_pb2

FORECAST_NUMBERS = range(23, 27)


@dataclass(frozen=True)
class Forecast:
    """Wall times (0 = not forecast): expected start and end, and the band around them; `note`: the
    controller's word on it (why there is none, ...)."""

    start: float = 0.0
    end: float = 0.0
    start_low: float = 0.0
    start_high: float = 0.0
    end_low: float = 0.0
    end_high: float = 0.0
    note: str = ""

    @property
    def known(self) -> bool:
        return self.start > 0 or self.end > 0


def forecast_fields() -> list[str]:
    """The names of the Job's forecast fields in this build (none before they were added)."""
    return [f.name for f in controller_pb2.Job.DESCRIPTOR.fields
            if f.number in FORECAST_NUMBERS and "forecast" in f.name]


def _time(value: object) -> float:
    t = float(value) if isinstance(value, int | float) else 0.0
    return t if math.isfinite(t) and t > 0 else 0.0


def forecast_of(job: controller_pb2.Job) -> Forecast:
    """The forecast a Job carries (its `forecast` message: start_time, end_time, start_low/high,
    end_low/high, note); none when it has none, or this build's Job has no such field."""
    if "forecast" not in forecast_fields() or not job.HasField("forecast"):
        return Forecast()
    fc = job.forecast
    return Forecast(start=_time(fc.start_time), end=_time(fc.end_time), start_low=_time(fc.start_low),
                    start_high=_time(fc.start_high), end_low=_time(fc.end_low), end_high=_time(fc.end_high),
                    note=str(fc.note))


def message_json(msg: Message) -> dict[str, Any]:
    """A message as the API's JSON (proto field names, enums by name, as `tessctl -o json`)."""
    return MessageToDict(msg, preserving_proto_field_name=True)


def dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()


def capacity_json(history: CapacityHistory) -> dict[str, Any]:
    return {"types": history.types(),
            "samples": [{"time": s.time, "round": s.round, "gpus": {t: dict(v) for t, v in s.gpus.items()}}
                        for s in history.samples]}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None  # a NaN loss is reported as null: JSON has no NaN


def progress_json(points: list[ProgressPoint]) -> list[dict[str, float | None]]:
    return [{"time": _finite(p.time), "iteration": p.iteration, "loss": _finite(p.loss),
             "samples_per_second": _finite(p.samples_per_second), "step_time_seconds": _finite(p.step_time_seconds)}
            for p in points]
