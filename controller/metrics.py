"""Prometheus metrics of the controller (no job ids as labels: they are unbounded).

docs/observability.md lists them; deploy/grafana/tessera.json charts them (a test checks that every
query of the board names a metric defined here or in tessera.common.hooks). `tessera_build_info`
is tessera.common.hooks's, shared by the three daemons.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

from tessera.v1 import common_pb2

if TYPE_CHECKING:
    from tessera.controller.store import JobRecord
    from tessera.controller.view import EngineView

JOBS_SUBMITTED = Counter("tessera_jobs_submitted_total", "Jobs accepted by SubmitJob")
JOBS_FINISHED = Counter("tessera_jobs_finished_total", "Jobs that reached a final state", ["outcome"])
REQUEUES = Counter("tessera_job_requeues_total", "Attempts requeued (node lost, drain, preemption, retry, failed launch)")
MIGRATIONS = Counter("tessera_migrations_total", "Running jobs a round moved to a new Cell or placement "
                     "(stopped, then relaunched on its target); a drain's or a preemption's stop is a requeue")
MIGRATION_SECONDS = Histogram("tessera_migration_seconds", "Stop request to first progress of the new attempt",
                              buckets=(1, 2, 5, 10, 20, 40, 80, 160, 320))
ROUND_SECONDS = Histogram("tessera_round_seconds", "Wall time of one scheduling round",
                          buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30))
FORECAST_SECONDS = Histogram("tessera_forecast_seconds", "Wall time of one forecast (three replays) after a round",
                             buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120))
STEP_REPORTS = Counter("tessera_step_time_reports_total",
                       "Live step-time reports forwarded to the estimator service", ["outcome"])
MEASURED_CELLS = Counter("tessera_measured_cell_updates_total",
                         "Cell iteration times replaced by a running job's measured median")
JOBS = Gauge("tessera_jobs", "Jobs by state", ["state"])
QUEUE = Gauge("tessera_queue_length", "Jobs PENDING")
NODES = Gauge("tessera_nodes", "Nodes by state", ["state"])
HEARTBEAT_AGE = Gauge("tessera_heartbeat_age_max_seconds", "Oldest heartbeat among READY nodes")
# What operators of a heterogeneous cluster look at first (docs/observability.md).
GPU_STATES = ("allocated", "free", "unavailable")
GPUS = Gauge("tessera_gpus", "GPUs by type (catalog model) and state: allocated (held by an attempt), free "
             "(on a READY, healthy node, not held), unavailable (not held, on a node that is not READY or is "
             "unhealthy)", ["type", "state"])
QUEUE_WAIT = Histogram("tessera_queue_wait_seconds", "Submission to the start of a job's first attempt",
                       buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 24 * 3600,
                                3 * 24 * 3600))
TENANT_GPU_SECONDS = Counter("tessera_tenant_gpu_seconds_total",
                             "GPU-seconds held by active attempts (starting, running, migrating), per tenant",
                             ["tenant"])


def update_jobs(view: EngineView) -> None:
    counts = {s: 0 for s in common_pb2.JobState.values() if s}
    for j in view.jobs():
        if j.state in counts:  # a state this build has no name for (a record written by another) is not counted
            counts[j.state] += 1
    for s, n in counts.items():
        JOBS.labels(common_pb2.JobState.Name(s)[10:].lower()).set(n)
    QUEUE.set(counts.get(common_pb2.JOB_STATE_PENDING, 0))


def update_nodes(view: EngineView, now: float) -> None:
    """Nodes by state, the oldest heartbeat, and GPUs by type x state; `now` the wall time."""
    counts = {s: 0 for s in common_pb2.NodeState.values() if s}
    oldest = 0.0
    for node_id in view.node_ids():
        node = view.node(node_id)
        counts[node.state] = counts.get(node.state, 0) + 1
        if node.state == common_pb2.NODE_STATE_READY:
            oldest = max(oldest, node.heartbeat_age_s)
    for s, n in counts.items():
        NODES.labels(common_pb2.NodeState.Name(s)[11:].lower()).set(n)
    HEARTBEAT_AGE.set(oldest)
    _set_gpus(gpu_states(view, now))


def gpu_states(view: EngineView, now: float) -> Tally[tuple[str, str]]:
    """GPUs by (type, state), GPU_STATES' meanings; `now` the wall time. The dashboard's capacity
    history samples the same tally as `tessera_gpus`."""
    gpus: Tally[tuple[str, str]] = Tally()
    busy = view.busy_gpus()
    for node_id in view.node_ids():
        node = view.node(node_id)
        usable = node.state == common_pb2.NODE_STATE_READY and node.unhealthy_until <= now
        held = busy.get(node_id, set())
        for g in node.inventory.gpus:
            state = "allocated" if g.index in held else "free" if usable else "unavailable"
            gpus[(g.model or "unknown", state)] += 1
    return gpus


_gpu_types: set[str] = set()


def _set_gpus(gpus: Tally[tuple[str, str]]) -> None:
    """Every state of every type the known nodes have (a node down or unreachable still counts its
    GPUs `unavailable`); the series of a type no known node has any more are removed, not left at
    their last value. Keeping every type ever seen let a node that re-registered with new model
    names each time grow `/metrics` and this call's time without bound."""
    types = {t for t, _ in gpus}
    for t in _gpu_types - types:
        for state in GPU_STATES:
            GPUS.remove(t, state)
    _gpu_types.clear()
    _gpu_types.update(types)
    for t in sorted(types):
        for state in GPU_STATES:
            GPUS.labels(t, state).set(gpus.get((t, state), 0))


def job_started(job: JobRecord, now: float) -> None:
    """An attempt of `job` (as it was before the start) is starting at wall time `now`: its first
    one observes the queue wait (later ones are restarts and migrations, not queueing)."""
    if job.attempt == 0 and job.submit_time > 0:
        QUEUE_WAIT.observe(max(0.0, now - job.submit_time))


class GpuSeconds:
    """Accrues `tessera_tenant_gpu_seconds_total`: each tick adds, per tenant, the GPUs its active
    attempts hold times the (monotonic) seconds since the previous tick."""

    def __init__(self) -> None:
        self._last: float | None = None

    def tick(self, jobs: Iterable[JobRecord], mono: float) -> None:
        last, self._last = self._last, mono
        if last is None or mono <= last:
            return
        held: Tally[str] = Tally()
        for j in jobs:
            held[j.spec.tenant or "default"] += sum(len(s.gpu_indices) for s in j.placement.slices) \
                if j.placement else 0
        for tenant, n in held.items():
            if n:
                TENANT_GPU_SECONDS.labels(tenant).inc(n * (mono - last))
