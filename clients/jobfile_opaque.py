"""The job-file keys of opaque jobs (docs/opaque-jobs.md): `cell`, `workdir`, `max_runtime`.

Kept beside tessera.clients.jobfile, which calls these two functions; the errors are its JobFileError
(passed in, so this module does not import the parser back).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from tessera.common import gpus as catalog
from tessera.common import jobspec
from tessera.common.durations import DurationError, parse_duration
from tessera.v1 import common_pb2

# "8 x A100-80GB", "8xA100", "2 × H100": a count and one GPU type.
_CELL = re.compile(r"^\s*(\d+)\s*[x×*]\s*(\S+)\s*$", re.IGNORECASE)

Err = Callable[[str, str], Exception]


def cell_hint(data: Mapping[str, Any], error: Err) -> common_pb2.ResourceHint:
    """`cell: "8 x A100-80GB"`: gpus + gpu_types in one key (exactly those GPUs for an opaque job; for
    a job with a model, a hint as `gpus` is)."""
    if "gpus" in data or "gpu_types" in data:
        raise error("cell", "give either cell or gpus/gpu_types, not both")
    value = data["cell"]
    m = _CELL.match(value) if isinstance(value, str) else None
    if m is None:
        raise error("cell", f"must read 'COUNT x GPU-TYPE', e.g. '8 x A100-80GB', got {value!r}")
    count = int(m.group(1))
    if not 1 <= count <= jobspec.MAX_GPUS_HINT:
        raise error("cell", f"the GPU count must be between 1 and {jobspec.MAX_GPUS_HINT}, got {count}")
    try:
        gpu = catalog.lookup(m.group(2)).name
    except catalog.UnknownGpuError as exc:
        raise error("cell", str(exc)) from None
    return common_pb2.ResourceHint(gpus=count, gpu_types=[gpu])


def run_fields(data: Mapping[str, Any], spec: common_pb2.JobSpec, error: Err) -> None:
    """`workdir: /abs/path` and `max_runtime: 10m` (or seconds)."""
    wd = data.get("workdir")
    if wd is not None:
        if not isinstance(wd, str) or not wd.startswith("/"):
            raise error("workdir", f"must be an absolute path that exists on the nodes, got {wd!r}")
        spec.workdir = wd
    limit = data.get("max_runtime")
    if limit is not None:
        try:
            seconds = parse_duration(limit)
        except DurationError as exc:
            raise error("max_runtime", str(exc)) from None
        spec.max_runtime_seconds = max(1, round(seconds))
