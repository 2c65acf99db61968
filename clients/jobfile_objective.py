"""Job files' `objective:` and `slo:` (docs/job-file.md, docs/cost-objective.md), read by the shared
rules of tessera.common.objective."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.common.errors import InvalidArgument
from tessera.common.objective import slo_from_mapping
from tessera.v1 import common_pb2

OBJECTIVES = {"default": common_pb2.OBJECTIVE_UNSPECIFIED, "cost": common_pb2.OBJECTIVE_COST}


def objective_fields(data: Mapping[str, Any], spec: common_pb2.JobSpec) -> None:
    """Set JobSpec.objective and JobSpec.slo from the file's keys; InvalidArgument naming the key.
    Whether they go together is tessera.common.objective.objective_errors' check (with the bounds)."""
    value = data.get("objective")
    if value is not None:
        if not isinstance(value, str) or value not in OBJECTIVES:
            raise InvalidArgument("objective", f"must be one of {', '.join(OBJECTIVES)}, got {value!r}")
        spec.objective = OBJECTIVES[value]
    if data.get("slo") is not None:
        spec.slo.CopyFrom(slo_from_mapping(data["slo"]))
