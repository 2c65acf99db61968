"""Change counts of what the job watches show (controller/watching.py), so a watch that wakes with
nothing new to it costs O(1), not a rescan of its tenant's jobs.

What a job's message shows (convert.job_pb of its record and its live progress, texts redacted by
the jobs that exist) changes when its record is written, when a new progress report comes in, and
when jobs leave the store (a text that names one then reads "(another tenant's)"). Every such change
takes the next count of `Changes`; the job, its tenant, or every job (a removal) remember the count
of their latest change. A watch remembers the counts it last looked at and looks again only when
they moved.

The engine writes jobs only through `CountedStore` (Engine.store, LiveView.store), which counts each
job write, failed ones too (a write that raised may still have landed); the live progress counts in
LiveView.set_progress. A write past it (the raw store) would not be seen by a watch until the job's
next counted change: the retention sweep is given Engine.store for that reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tessera.controller.store import EventRecord, JobRecord, NodeRecord, Store


class Changes:
    """The count of changes, and the count of the latest change of each job, tenant, and of every job
    at once. Each value only grows."""

    def __init__(self) -> None:
        self.count = 0
        self._jobs: dict[str, int] = {}
        self._tenants: dict[str, int] = {}
        self._tenant_of: dict[str, str] = {}
        self._all = 0  # the latest change of every job's message: jobs left the store

    def job(self, job_id: str, tenant: str) -> None:
        """The job's message may have changed."""
        self.count += 1
        self._jobs[job_id] = self._tenants[tenant] = self.count
        self._tenant_of[job_id] = tenant

    def removed(self, job_ids: Iterable[str]) -> None:
        """Jobs left the store: they leave the lists, and texts that name them read otherwise."""
        self.count += 1
        self._all = self.count
        for job_id in job_ids:
            self._jobs.pop(job_id, None)
            self._tenant_of.pop(job_id, None)

    def tenant_of(self, job_id: str) -> str | None:
        """The tenant of a job counted before (None: not known here)."""
        return self._tenant_of.get(job_id)

    def of_tenant(self, tenant: str) -> int:
        """The count of the latest change of a job of `tenant` ("": of any job)."""
        return max(self._tenants.get(tenant, 0), self._all) if tenant else self.count

    def of_job(self, job_id: str) -> int:
        """The count of the latest change of the job's message."""
        return max(self._jobs.get(job_id, 0), self._all)


class CountedStore:
    """A Store whose job writes count in `changes` (a write that raised counts too); reads and node
    writes pass through."""

    def __init__(self, inner: Store, changes: Changes) -> None:
        self.inner, self.changes = inner, changes

    # ---------------------------------------------------------------- job writes, counted

    def create_job(self, job: JobRecord, event: tuple[str, str]) -> tuple[JobRecord, bool]:
        try:
            return self.inner.create_job(job, event)
        finally:
            self.changes.job(job.id, job.spec.tenant)

    def save_job(self, job: JobRecord, time: float, events: Sequence[tuple[str, str]] = ()) -> list[EventRecord]:
        try:
            return self.inner.save_job(job, time, events)
        finally:
            self.changes.job(job.id, job.spec.tenant)

    def save_current(self, job: JobRecord, time: float, events: Sequence[tuple[str, str]] = ()) -> list[EventRecord]:
        try:
            return self.inner.save_current(job, time, events)
        finally:
            self.changes.job(job.id, job.spec.tenant)

    def save_jobs(self, updates: Sequence[tuple[JobRecord, Sequence[tuple[str, str]]]], time: float) -> None:
        try:
            self.inner.save_jobs(updates, time)
        finally:
            for job, _ in updates:
                self.changes.job(job.id, job.spec.tenant)

    def delete_finished_jobs(self, ended_before: float, limit: int) -> list[str]:
        gone: list[str] = []
        try:
            gone = self.inner.delete_finished_jobs(ended_before, limit)
            return gone
        finally:
            self.changes.removed(gone)

    # ---------------------------------------------------------------- the rest, as the store does it

    def next_epoch(self) -> int:
        return self.inner.next_epoch()

    def get_meta(self, key: str) -> str | None:
        return self.inner.get_meta(key)

    def put_meta(self, key: str, value: str) -> None:
        self.inner.put_meta(key, value)

    def get_job(self, job_id: str) -> JobRecord | None:
        return self.inner.get_job(job_id)

    def list_jobs(self, states: Iterable[int] = (), tenant: str = "") -> list[JobRecord]:
        return self.inner.list_jobs(states, tenant)

    def count_jobs(self, states: Iterable[int] = (), tenant: str = "") -> int:
        return self.inner.count_jobs(states, tenant)

    def count_jobs_by_tenant(self, states: Iterable[int] = ()) -> dict[str, int]:
        return self.inner.count_jobs_by_tenant(states)

    def has_request(self, request_id: str) -> bool:
        return self.inner.has_request(request_id)

    def list_jobs_page(self, states: Iterable[int] = (), tenant: str = "", after: tuple[float, str] | None = None,
                       limit: int = 500) -> list[JobRecord]:
        return self.inner.list_jobs_page(states, tenant, after, limit)

    def events(self, job_id: str, after_seq: int = 0) -> list[EventRecord]:
        return self.inner.events(job_id, after_seq)

    def put_node(self, node: NodeRecord) -> None:
        self.inner.put_node(node)

    def get_node(self, node_id: str) -> NodeRecord | None:
        return self.inner.get_node(node_id)

    def list_nodes(self) -> list[NodeRecord]:
        return self.inner.list_nodes()

    def remove_node(self, node_id: str, request_id: str, time: float) -> bool:
        return self.inner.remove_node(node_id, request_id, time)

    def close(self) -> None:
        self.inner.close()
