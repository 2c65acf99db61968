"""The engine's in-memory state, and `EngineView`: the read-only queries over it and the store that
the gRPC service, the metrics and the engine itself use.

In memory (lost on a controller restart, rebuilt from registrations and heartbeats): the live node
table, the latest progress of each active job, the clocks of active attempts and the migrations
under way. Everything durable is in the store.

Change notification: the watches (controller/watching.py) wait in `wait_changed` and look again
only when the change counts they last saw moved (controller/changes.py). A stored job change wakes
them at once (`notify`); a heartbeat's new progress only counts (`set_progress`), and the next
liveness pass (at most 1 s later) wakes them once for all the reports since (`flush`), so a burst of
heartbeats costs one wake-up and a pass with nothing new costs none.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tessera.controller.changes import Changes, CountedStore
from tessera.controller.core.backoff import healthy
from tessera.controller.core.snapshot import Decision, Slice
from tessera.controller.errors import JobNotFound, NodeNotFound
from tessera.controller.registry import LiveNode, running_gpus
from tessera.controller.registry import node_state as derive_node_state
from tessera.controller.snapshots import busy_gpus, jobs_on, releasing_gpus
from tessera.controller.store import ACTIVE, EventRecord, JobRecord, NodeRecord, Store
from tessera.v1 import common_pb2

P = common_pb2


@dataclass
class AttemptClock:
    """Launch and last-progress times of an active attempt (monotonic seconds)."""

    attempt: int
    launched: float
    progress_at: float | None = None
    # Set on the attempt a migration started: when the stop was requested.
    migration_started: float | None = None


@dataclass(frozen=True)
class Move:
    """A round's migration of a running job, kept until its old attempt has stopped."""

    decision: Decision
    requested: float  # monotonic


@dataclass
class LiveState:
    nodes: dict[str, LiveNode] = field(default_factory=dict)
    # The store's node records, cached (the engine is their only writer).
    records: dict[str, NodeRecord] = field(default_factory=dict)
    # Latest rank-0 progress of each active job (the record holds it once the job ends).
    progress: dict[str, common_pb2.Progress] = field(default_factory=dict)
    clocks: dict[str, AttemptClock] = field(default_factory=dict)
    moves: dict[str, Move] = field(default_factory=dict)
    # Wall times at which a job's launch backoff or a node's unhealthy period ends: a round is due
    # then (rounds otherwise run only every --round-interval or on an arrival).
    wakes: set[float] = field(default_factory=set)
    # Nodes active jobs are placed on that have no record here: when each was first seen missing (mono).
    unknown_since: dict[str, float] = field(default_factory=dict)

    def wake_at(self, t: float) -> None:
        if t > 0:
            self.wakes.add(t)

    def due(self, now: float) -> bool:
        """Whether a wake time has passed (each one answers True once)."""
        passed = {t for t in self.wakes if t <= now}
        self.wakes -= passed
        return bool(passed)


@dataclass(frozen=True)
class NodeInfo:
    id: str
    address: str
    inventory: common_pb2.NodeInventory
    state: int
    reason: str
    registered: bool
    last_heartbeat_wall: float  # 0 = none since the controller started
    heartbeat_age_s: float
    launch_failures: int = 0
    unhealthy_until: float = 0.0  # wall time; in the past = healthy
    agent_version: str = ""  # from the agent's last status ("" before it reported one)
    agent_commit: str = ""
    gpu_isolation: common_pb2.GpuIsolation.ValueType = common_pb2.GPU_ISOLATION_UNSPECIFIED  # its last status
    gpu_isolation_note: str = ""


class EngineView(Protocol):
    """What the controller knows, read-only."""

    @property
    def epoch(self) -> int: ...

    def get(self, job_id: str) -> JobRecord:
        """The job as stored; JobNotFound if there is none."""
        ...

    def tenant_of(self, job_id: str) -> str | None:
        """The job's tenant; None if there is no such job."""
        ...

    def jobs(self, states: Iterable[int] = (), tenant: str = "") -> list[JobRecord]: ...

    def count_jobs(self, states: Iterable[int] = (), tenant: str = "") -> int:
        """len(jobs(states, tenant)) without reading a record (Store.count_jobs)."""
        ...

    def count_jobs_by_tenant(self, states: Iterable[int] = ()) -> dict[str, int]:
        """count_jobs of each tenant that has such jobs, by the tenant as stored (Store's)."""
        ...

    def has_request(self, key: str) -> bool:
        """Whether a stored job was submitted under `key` (transitions.request_key)."""
        ...

    def jobs_page(self, states: Iterable[int], tenant: str, after: tuple[float, str] | None,
                  limit: int) -> list[JobRecord]:
        """Store.list_jobs_page: at most `limit` jobs after the key `after`."""
        ...

    def events(self, job_id: str, after_seq: int = 0) -> list[EventRecord]: ...

    def progress(self, job_id: str) -> common_pb2.Progress | None:
        """The latest progress report of an active job (None: see the record's)."""
        ...

    def node_ids(self) -> list[str]: ...

    def node(self, node_id: str) -> NodeInfo:
        """A known node with its state; NodeNotFound if there is none."""
        ...

    def agent_address(self, node_id: str) -> str | None:
        """Where the node's agent serves, while it is registered with this controller."""
        ...

    def busy_gpus(self, exclude: str = "") -> dict[str, set[int]]: ...

    def generation(self, tenant: str = "") -> int:
        """The count of the latest change of what the job messages (convert.job_pb) of `tenant`
        show ("": of any job): it moves whenever one may have changed, or a job left the store."""
        ...

    def job_generation(self, job_id: str) -> int:
        """As `generation`, for the job's message alone (and jobs leaving the store)."""
        ...

    async def wait_changed(self, timeout: float, since: int | None = None) -> None:
        """Return when a job or node changed, or after `timeout` seconds; at once when `generation()`
        is no longer `since` (a change came while the caller was not waiting)."""
        ...


class LiveView:
    """`EngineView` over the store and the engine's `LiveState`; also the engine's own queries."""

    def __init__(self, store: Store, live: LiveState, epoch: int, mono: Callable[[], float],
                 wall: Callable[[], float] = time.time) -> None:
        self._store, self._live, self._epoch, self._mono, self._wall = store, live, epoch, mono, wall
        self.changes = Changes()
        # What the engine writes through: every job write counts (controller/changes.py).
        self.store: Store = CountedStore(store, self.changes)
        self._wake = asyncio.Event()  # set, and replaced, by each notify
        self._notified = 0  # the change count at the last notify

    @property
    def epoch(self) -> int:
        return self._epoch

    def get(self, job_id: str) -> JobRecord:
        job = self._store.get_job(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job

    def tenant_of(self, job_id: str) -> str | None:
        job = self._store.get_job(job_id)
        return None if job is None else job.spec.tenant

    def jobs(self, states: Iterable[int] = (), tenant: str = "") -> list[JobRecord]:
        return self._store.list_jobs(states, tenant)

    def count_jobs(self, states: Iterable[int] = (), tenant: str = "") -> int:
        return self._store.count_jobs(states, tenant)

    def count_jobs_by_tenant(self, states: Iterable[int] = ()) -> dict[str, int]:
        return self._store.count_jobs_by_tenant(states)

    def has_request(self, key: str) -> bool:
        return self._store.has_request(key)

    def jobs_page(self, states: Iterable[int], tenant: str, after: tuple[float, str] | None,
                  limit: int) -> list[JobRecord]:
        return self._store.list_jobs_page(states, tenant, after, limit)

    def events(self, job_id: str, after_seq: int = 0) -> list[EventRecord]:
        return self._store.events(job_id, after_seq)

    def progress(self, job_id: str) -> common_pb2.Progress | None:
        return self._live.progress.get(job_id)

    def set_progress(self, job_id: str, progress: common_pb2.Progress) -> None:
        """An active job's latest report; a new one counts as a change of the job (woken by `flush`)."""
        if self._live.progress.get(job_id) == progress:
            return
        self._live.progress[job_id] = progress
        tenant = self.changes.tenant_of(job_id) or self.tenant_of(job_id)
        if tenant is not None:
            self.changes.job(job_id, tenant)

    def generation(self, tenant: str = "") -> int:
        return self.changes.of_tenant(tenant)

    def job_generation(self, job_id: str) -> int:
        return self.changes.of_job(job_id)

    def node_ids(self) -> list[str]:
        return sorted(self._live.records)

    def node(self, node_id: str) -> NodeInfo:
        rec = self._live.records.get(node_id)
        if rec is None:
            raise NodeNotFound(node_id)
        live = self._live.nodes.get(node_id)
        state, reason = self.node_state(node_id)
        if state == P.NODE_STATE_READY and not healthy(rec.unhealthy_until, self._wall()):
            reason = (f"unhealthy: {rec.launch_failures} consecutive launches failed; no placements for "
                      f"{rec.unhealthy_until - self._wall():.0f}s")
        return NodeInfo(rec.id, rec.address, rec.inventory, state, reason, live.registered if live else False,
                        live.last_seen_wall if live else 0.0, self._mono() - live.last_seen if live else 0.0,
                        rec.launch_failures, rec.unhealthy_until, live.status.agent_version if live else "",
                        live.status.agent_commit if live else "",
                        live.status.gpu_isolation if live else common_pb2.GPU_ISOLATION_UNSPECIFIED,
                        live.status.gpu_isolation_note if live else "")

    def agent_address(self, node_id: str) -> str | None:
        live = self._live.nodes.get(node_id)
        return live.address if live is not None and live.registered else None

    def node_state(self, node_id: str) -> tuple[int, str]:
        """Admin state over liveness: DRAINING/DRAINED win while the node is alive."""
        rec = self._live.records.get(node_id)
        live = self._live.nodes.get(node_id)

        def holds_work() -> bool:
            return bool(self.jobs_on(node_id)) or bool(live and running_gpus(live))

        return derive_node_state(rec.drained if rec else False, rec.drain_reason if rec else "", live,
                                 self._mono(), holds_work)

    def jobs_on(self, node_id: str) -> list[JobRecord]:
        return jobs_on(self._store.list_jobs(states=ACTIVE), node_id)

    def move_targets(self) -> dict[str, tuple[Slice, ...]]:
        """The placements the migrations under way relaunch on, by job."""
        return {job_id: m.decision.slices for job_id, m in self._live.moves.items()}

    def busy_gpus(self, exclude: str = "") -> dict[str, set[int]]:
        return busy_gpus(self._live.nodes, self._store.list_jobs(states=ACTIVE), self.move_targets(), exclude)

    def releasing_gpus(self, active: Iterable[JobRecord] | None = None) -> dict[str, set[int]]:
        """GPUs of jobs checkpointing to stop; `active`: the active jobs when already read."""
        jobs = self._store.list_jobs(states=ACTIVE) if active is None else active
        return releasing_gpus(jobs, self.move_targets())

    def target_free(self, job_id: str, slices: Sequence[Slice], now: float) -> bool:
        """Whether `slices` are on READY, healthy nodes, held by no job but `job_id`."""
        busy = self.busy_gpus(exclude=job_id)
        for s in slices:
            if self.node_state(s.node_id)[0] != P.NODE_STATE_READY or busy.get(s.node_id, set()) & set(s.gpu_indices):
                return False
            if not healthy(self._live.records[s.node_id].unhealthy_until, now):
                return False
        return True

    def unheard(self) -> list[str]:
        """The nodes of the store that have not registered since this controller started."""
        return sorted(n for n, live in self._live.nodes.items() if not live.registered)

    def stopping_on(self, job_id: str, slices: Sequence[Slice]) -> list[str]:
        """The jobs checkpointing to stop on `slices`' GPUs when those are all that hold them (the
        job waits for them to exit: `Engine._place`), else [] (another holds one)."""
        busy, releasing = self.busy_gpus(exclude=job_id), self.releasing_gpus()
        want = {(s.node_id, i) for s in slices for i in s.gpu_indices}
        held = {g for g in want if g[1] in busy.get(g[0], set())}
        if not held or any(g[1] not in releasing.get(g[0], set()) for g in held):
            return []
        return sorted(j.id for j in self._store.list_jobs(states=[P.JOB_STATE_MIGRATING]) if j.placement
                      and any((s.node_id, i) in held for s in j.placement.slices for i in s.gpu_indices))

    async def notify(self) -> None:
        """Wake every `wait_changed` now."""
        self._notified = self.changes.count
        self._wake.set()
        self._wake = asyncio.Event()

    async def flush(self) -> None:
        """Wake the waiters if a change counted since the last `notify` (a heartbeat's progress)."""
        if self.changes.count != self._notified:
            await self.notify()

    async def wait_changed(self, timeout: float, since: int | None = None) -> None:
        if since is not None and self.changes.count != since:
            return
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except TimeoutError:
            pass
