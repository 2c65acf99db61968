"""Prometheus metrics of the controller (no job ids as labels: they are unbounded)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

from tessera.v1 import common_pb2

if TYPE_CHECKING:
    from tessera.controller.view import EngineView

JOBS_SUBMITTED = Counter("tessera_jobs_submitted_total", "Jobs accepted by SubmitJob")
JOBS_FINISHED = Counter("tessera_jobs_finished_total", "Jobs that reached a final state", ["outcome"])
REQUEUES = Counter("tessera_job_requeues_total", "Attempts requeued (node lost, migration, retry)")
MIGRATIONS = Counter("tessera_migrations_total", "Running jobs moved to a new Cell or placement")
MIGRATION_SECONDS = Histogram("tessera_migration_seconds", "Stop request to first progress of the new attempt",
                              buckets=(1, 2, 5, 10, 20, 40, 80, 160, 320))
ROUND_SECONDS = Histogram("tessera_round_seconds", "Wall time of one scheduling round",
                          buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30))
STEP_REPORTS = Counter("tessera_step_time_reports_total",
                       "Live step-time reports forwarded to the estimator service", ["outcome"])
MEASURED_CELLS = Counter("tessera_measured_cell_updates_total",
                         "Cell iteration times replaced by a running job's measured median")
JOBS = Gauge("tessera_jobs", "Jobs by state", ["state"])
QUEUE = Gauge("tessera_queue_length", "Jobs PENDING")
NODES = Gauge("tessera_nodes", "Nodes by state", ["state"])
HEARTBEAT_AGE = Gauge("tessera_heartbeat_age_max_seconds", "Oldest heartbeat among READY nodes")


def update_jobs(view: EngineView) -> None:
    counts = {s: 0 for s in common_pb2.JobState.values() if s}
    for j in view.jobs():
        counts[j.state] = counts.get(j.state, 0) + 1
    for s, n in counts.items():
        JOBS.labels(common_pb2.JobState.Name(s)[10:].lower()).set(n)
    QUEUE.set(counts.get(common_pb2.JOB_STATE_PENDING, 0))


def update_nodes(view: EngineView) -> None:
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
