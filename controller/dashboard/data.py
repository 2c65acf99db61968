"""The dashboard's data: the same messages the gRPC listing answers (convert.job_pb, listing.list_page,
convert.node_pb), as JSON for /api/ and as inputs of the pages; and the forecast fields of a Job when
this build's proto has them (controller.proto Job fields 23-26), read by number and name so the
dashboard works with and without them.
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
    """The forecast a Job carries: a `forecast` message (start_time, end_time, start_low/high,
    end_low/high, note), or scalar fields named forecast_*; none when this build has neither."""
    fields = {f.name: f for f in controller_pb2.Job.DESCRIPTOR.fields if f.number in FORECAST_NUMBERS}
    msg = fields.get("forecast")
    if msg is not None and msg.type == msg.TYPE_MESSAGE:
        if not job.HasField("forecast"):
            return Forecast()
        fc = job.forecast
        return Forecast(*(_time(getattr(fc, n, 0.0)) for n in ("start_time", "end_time", "start_low", "start_high",
                                                                "end_low", "end_high")),
                        note=str(getattr(fc, "note", "")))
    got: dict[str, float] = {}
    for name in (n for n, f in fields.items() if f.type == f.TYPE_DOUBLE and "forecast" in n):
        value = _time(getattr(job, name, 0.0))
        if not value:
            continue
        # A band field that names neither start nor end bounds the end, the time users ask about.
        low, high = "low" in name or "early" in name, "high" in name or "late" in name
        target = "start" if "start" in name else "end"
        got[f"{target}_low" if low else f"{target}_high" if high else target] = value
    return Forecast(**got)


def message_json(msg: Message) -> dict[str, Any]:
    """A message as the API's JSON (proto field names, enums by name, as `tessctl -o json`)."""
    return MessageToDict(msg, preserving_proto_field_name=True)


def dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()


def capacity_json(history: CapacityHistory) -> dict[str, Any]:
    return {"types": history.types(),
            "samples": [{"time": s.time, "round": s.round, "gpus": {t: dict(v) for t, v in s.gpus.items()}}
                        for s in history.samples]}


def progress_json(points: list[ProgressPoint]) -> list[dict[str, float]]:
    return [{"time": p.time, "iteration": p.iteration, "loss": p.loss, "samples_per_second": p.samples_per_second,
             "step_time_seconds": p.step_time_seconds} for p in points]
