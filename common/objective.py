"""The cost objective's job fields (JobSpec.objective and JobSpec.slo) and the controller's GPU prices:
parsing and bounds shared by job files, SubmitJob and the controller's --prices (docs/cost-objective.md).

A duration is a number with a unit, `90m`, `6h`, `1.5d`, `45s` (or a bare number of seconds); a
deadline an RFC 3339 timestamp with its offset, `2026-11-27T06:00:00Z`. Prices are a YAML mapping
{GPU type: price per GPU-hour}, every type known to the GPU catalog, every price a positive number.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tessera.common.errors import FailedPrecondition, InvalidArgument
from tessera.common.gpus import UnknownGpuError, lookup
from tessera.common.utctime import utc_text
from tessera.common.yamlfile import InputFileError, parse_with_lines, read_yaml, require_name_keys
from tessera.v1 import common_pb2

# An SLO longer than ten years is a typo, not an SLO.
MAX_SLO_S = 10 * 365 * 86400.0
# The latest deadline accepted (2100-01-01T00:00:00Z): any real one is far earlier, and every
# platform's time_t and Python's datetime can show it (1e308 was stored and broke `describe job`).
MAX_DEADLINE = 4102444800.0
# A price per GPU-hour above this is a typo (the dearest cloud GPU is a few tens of dollars).
MAX_PRICE = 1e6
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*")

Errors = list[tuple[str, str]]


def parse_duration(value: object, field: str) -> float:
    """Seconds of `90m`, `6h`, `1.5d`, `45s` or a number of seconds; InvalidArgument(field) otherwise."""
    if isinstance(value, bool):
        raise InvalidArgument(field, f"must be a duration such as 90m or 6h, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.fullmatch(value)):
        seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    else:
        raise InvalidArgument(field, f"must be a duration such as 90m, 6h or 1.5d, got {value!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidArgument(field, f"must be > 0, got {value!r}")
    if seconds > MAX_SLO_S:
        raise InvalidArgument(field, f"must be at most 10 years, got {value!r}")
    return seconds


def parse_deadline(value: object, field: str) -> float:
    """Unix seconds of an RFC 3339 timestamp with an offset (`2026-11-27T06:00:00Z`); YAML may have
    read it as a datetime already."""
    if isinstance(value, dt.datetime):
        when = value
    elif isinstance(value, str):
        try:
            when = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise InvalidArgument(field, f"must be an RFC 3339 time such as 2026-11-27T06:00:00Z, got {value!r}") from None
    else:
        raise InvalidArgument(field, f"must be an RFC 3339 time such as 2026-11-27T06:00:00Z, got {value!r}")
    if when.tzinfo is None:
        raise InvalidArgument(field, f"needs its time zone (Z or +HH:MM), got {value!r}")
    return when.timestamp()


def slo_from_mapping(value: Any) -> common_pb2.Slo:
    """`slo: {iterations_within: 6h}` or `slo: {deadline: 2026-11-27T06:00:00Z}` (job files)."""
    if not isinstance(value, Mapping):
        raise InvalidArgument("slo", "must be a mapping: {iterations_within: 6h} or {deadline: RFC 3339 time}")
    unknown = [str(k) for k in value if k not in ("iterations_within", "deadline")]
    if unknown:
        raise InvalidArgument(f"slo.{unknown[0]}", "unknown field (known: iterations_within, deadline)")
    if len(value) != 1:
        raise InvalidArgument("slo", "give exactly one of iterations_within and deadline")
    if "iterations_within" in value:
        return common_pb2.Slo(iterations_within_seconds=parse_duration(value["iterations_within"],
                                                                       "slo.iterations_within"))
    return common_pb2.Slo(deadline=parse_deadline(value["deadline"], "slo.deadline"))


def objective_errors(spec: common_pb2.JobSpec) -> Errors:
    """JobSpec.objective and JobSpec.slo: a known objective; the cost objective with exactly one SLO
    bound > 0 and best-effort; an SLO only with the cost objective (no other objective reads it)."""
    errs: Errors = []
    if spec.objective not in common_pb2.Objective.values():
        errs.append(("objective", f"unknown value {spec.objective}"))
        return errs
    has_slo = spec.HasField("slo")
    within, deadline = spec.slo.iterations_within_seconds, spec.slo.deadline
    # One reason for every value out of the field's range, inf and nan too (was "must be > 0, got inf").
    for name, v, top, bounds in (
            ("slo.iterations_within_seconds", within, MAX_SLO_S,
             f"a finite number of seconds from 0 (none) to 10 years ({MAX_SLO_S:.0f})"),
            ("slo.deadline", deadline, MAX_DEADLINE,
             f"a Unix time from 0 (none) to 2100-01-01T00:00:00Z ({MAX_DEADLINE:.0f})")):
        if not (math.isfinite(v) and 0 <= v <= top):
            errs.append((name, f"must be {bounds}, got {v}"))
    if not all(math.isfinite(v) and v >= 0 for v in (within, deadline)):
        return errs  # the cost objective's checks below compare them with 0
    if spec.objective == common_pb2.OBJECTIVE_COST:
        if not has_slo or (within > 0) == (deadline > 0):
            errs.append(("slo", "the cost objective needs exactly one of iterations_within_seconds and deadline > 0"))
        elif within > 0 and spec.iterations <= 0:
            # Else it was accepted and waited without end, its reason saying it had no SLO.
            errs.append(("iterations", ("an SLO of iterations_within is the time for the job's iterations: "
                                        "give iterations > 0, or a deadline")))
        if spec.priority == common_pb2.PRIORITY_GUARANTEED:
            # The two promise different things: a guarantee holds quota for resources and a plan,
            # an SLO buys the cheapest plan of the GPUs free now (docs/cost-objective.md).
            errs.append(("priority", ("a job with the cost objective is best-effort (its SLO picks the cheapest "
                                      "plan of the free GPUs and holds no quota): drop priority: guaranteed, or "
                                      "the cost objective")))
    elif has_slo:
        errs.append(("slo", "only the cost objective reads an SLO: set objective to cost"))
    return errs


def slo_seconds(spec: common_pb2.JobSpec, done_iterations: float, now: float) -> float:
    """Seconds within which the job's remaining iterations must run (JobView.slo_s): a deadline's
    time left (-1 once passed), or `iterations_within`'s share of the iterations still to do (a job
    resumed at half its iterations has half the time); 0 = no SLO."""
    if not spec.HasField("slo"):
        return 0.0
    if spec.slo.deadline > 0:
        left = spec.slo.deadline - now
        return left if left > 0 else -1.0
    within = float(spec.slo.iterations_within_seconds)
    if within <= 0 or spec.iterations <= 0:
        return 0.0
    share = max(0.0, spec.iterations - done_iterations) / spec.iterations
    return within * share if share > 0 else within


class PricesError(InputFileError):
    """A --prices file that cannot be used: `field` is the GPU type (its key in the file) and why."""


def cost_text(cost: float) -> str:
    """A cost (price per GPU-hour x GPUs x hours, in the prices' currency) as every text prints it:
    to four decimals, where two read a cheap plan's 0.0037 as 0.00."""
    return f"{cost:,.4f}"


def parse_prices(doc: Any) -> dict[str, float]:
    """{canonical GPU type: price per GPU-hour} from the parsed YAML; PricesError naming the type."""
    if not isinstance(doc, Mapping) or not doc:
        raise PricesError("", "must be a non-empty mapping {GPU type: price per GPU-hour}, e.g. "
                              "{A100-80GB: 3.67, A10-24GB: 1.01}")
    out: dict[str, float] = {}
    for key, price in doc.items():
        if not isinstance(key, str):  # YAML reads `~:` as null, which str() made the GPU model 'None'
            raise PricesError("", f"a GPU type name must be a string, got {'null' if key is None else repr(key)}")
        field = key
        try:
            name = lookup(field).name
        except UnknownGpuError as exc:  # whole: the catalog's names it ends with are what users type
            raise PricesError(field, str(exc)) from None
        if isinstance(price, bool) or not isinstance(price, int | float) or not math.isfinite(price):
            raise PricesError(field, f"must be a number (price per GPU-hour), got {price!r}")
        if price <= 0:
            raise PricesError(field, f"must be > 0 (price per GPU-hour), got {price!r}")
        if price > MAX_PRICE:
            raise PricesError(field, f"must be at most {MAX_PRICE:g} per GPU-hour, got {price!r}")
        if name in out:
            raise PricesError(field, f"{name} is priced twice")
        out[name] = float(price)
    return dict(sorted(out.items()))


def load_prices(path: str | Path) -> dict[str, float]:
    """The --prices file; PricesError (`FILE line N: field TYPE: why`) on any problem."""
    doc = read_yaml(path, PricesError)
    require_name_keys(doc, str(path), PricesError)
    return parse_with_lines(doc, str(path), parse_prices)


def deadline_passed(spec: common_pb2.JobSpec, now: float) -> InvalidArgument | None:
    """SubmitJob: an SLO deadline already past when the job arrives is a mistake to say at once (it
    would wait for ever, no plan meeting it); None otherwise. A deadline that passes while the job
    waits leaves it pending with that reason (controller/core/cost_objective.py)."""
    d = spec.slo.deadline
    if not (spec.HasField("slo") and 0 < d <= now):
        return None
    return InvalidArgument("slo.deadline", f"{utc_text(d)} has passed (the controller's clock reads {utc_text(now)}): "
                                           "no plan can meet it")


def cost_precondition(spec: common_pb2.JobSpec, prices: Sequence[tuple[str, float]]) -> None:
    """SubmitJob: a job with the cost objective needs the controller's prices, and a price for every
    GPU type it restricts itself to; FailedPrecondition naming the flag (nothing is stored)."""
    if spec.objective != common_pb2.OBJECTIVE_COST:
        return
    if not prices:
        raise FailedPrecondition("objective: cost needs GPU prices, and this controller has none: start it with "
                                 "--prices FILE (docs/cost-objective.md)")
    priced = {t for t, _ in prices}
    missing = [t for t in spec.hint.gpu_types if lookup(t).name not in priced]
    if missing:
        raise FailedPrecondition(f"gpu_types: no price for {', '.join(missing)} in the controller's --prices file")
