"""`describe job`'s lines for the cost objective (docs/cost-objective.md): the SLO and what the
controller predicted for the allocation it chose."""

from __future__ import annotations

from tessera.common.objective import cost_text
from tessera.common.utctime import utc_text
from tessera.v1 import common_pb2, controller_pb2


def duration(seconds: float) -> str:
    """e.g. "1h 30m", "45.2s"."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    d, h = divmod(h, 24)
    parts = [f"{d}d" if d else "", f"{h}h" if h else "", f"{m}m" if m else "", f"{s}s" if s and not d and not h else ""]
    return " ".join(p for p in parts if p)


def slo_text(spec: common_pb2.JobSpec) -> str:
    if spec.slo.deadline > 0:
        # One stored before the controller bounded deadlines may not be shown as a date.
        return f"done by {utc_text(spec.slo.deadline) or f'unix time {spec.slo.deadline:g}'}"
    if spec.slo.iterations_within_seconds > 0:
        return f"iterations within {duration(spec.slo.iterations_within_seconds)}"
    return "<none>"


def objective_pairs(job: controller_pb2.Job) -> list[tuple[str, str]]:
    """(key, value) rows, empty unless the job asks for the cost objective."""
    if job.spec.objective != common_pb2.OBJECTIVE_COST:
        return []
    rows = [("Objective", "cost (cheapest allocation meeting the SLO)"), ("SLO", slo_text(job.spec))]
    if job.allocation:
        rows += [("Allocation", job.allocation),
                 ("Predicted time", duration(job.predicted_seconds) + (
                     f" ({job.predicted_seconds:,.0f}s)" if job.predicted_seconds >= 60 else "")),
                 ("Predicted cost", f"{cost_text(job.predicted_cost)} (at the controller's --prices)")]
    return rows
