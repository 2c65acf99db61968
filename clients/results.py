"""Typed results of the SDK: job and node states as enums by name, jobs, nodes, events and versions
as frozen dataclasses, times as aware `datetime`s in UTC.

The asyncio client (tessera.clients.aio) returns these; the blocking `Client` returns the protobuf
messages (its callers read their fields), which these convert: `JobInfo.from_proto(client.get(id))`,
`JobState.of(job.state)`. Each dataclass keeps its message as `.proto` for fields not lifted here.

    >>> JobState.of(3)
    <JobState.RUNNING: 'RUNNING'>
    >>> JobState.RUNNING == "RUNNING", JobState("FAILED").terminal
    (True, True)
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass, field

from tessera.v1 import common_pb2, controller_pb2, info_pb2


class JobState(enum.StrEnum):
    """A job's state by name; a str, so `info.state == "RUNNING"` holds."""

    UNKNOWN = "UNKNOWN"
    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    MIGRATING = "MIGRATING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @classmethod
    def of(cls, value: int) -> JobState:
        """The state of a JobState enum value (UNKNOWN for 0, or one this client does not know)."""
        try:
            return cls(common_pb2.JobState.Name(value).removeprefix("JOB_STATE_"))
        except ValueError:
            return cls.UNKNOWN

    @property
    def number(self) -> int:
        """The proto enum value (0 for UNKNOWN)."""
        return 0 if self is JobState.UNKNOWN else int(common_pb2.JobState.Value("JOB_STATE_" + self.value))

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class NodeState(enum.StrEnum):
    UNKNOWN = "UNKNOWN"
    READY = "READY"
    DRAINING = "DRAINING"
    DRAINED = "DRAINED"
    UNREACHABLE = "UNREACHABLE"
    DOWN = "DOWN"

    @classmethod
    def of(cls, value: int) -> NodeState:
        try:
            return cls(common_pb2.NodeState.Name(value).removeprefix("NODE_STATE_"))
        except ValueError:
            return cls.UNKNOWN


def when(t: float) -> dt.datetime | None:
    """Seconds since the epoch as an aware datetime in UTC; None for 0 (unset) or out of range."""
    if not t > 0:
        return None
    try:
        return dt.datetime.fromtimestamp(t, dt.UTC)
    except (OverflowError, OSError, ValueError):
        return None


@dataclass(frozen=True)
class Progress:
    iteration: int
    loss: float
    samples_per_second: float
    step_time_seconds: float
    peak_memory_bytes: int
    checkpoint_iteration: int  # -1: none
    time: dt.datetime | None

    @classmethod
    def from_proto(cls, p: common_pb2.Progress) -> Progress:
        return cls(p.iteration, p.loss, p.samples_per_second, p.step_time_seconds, p.peak_memory_bytes,
                   p.checkpoint_iteration, when(p.time))


@dataclass(frozen=True)
class JobEvent:
    seq: int
    job_id: str
    time: dt.datetime | None
    kind: str  # SUBMITTED, PLACED, STARTED, PROGRESS, REQUEUED, ...
    message: str

    @classmethod
    def from_proto(cls, e: common_pb2.JobEvent) -> JobEvent:
        return cls(e.seq, e.job_id, when(e.time), e.kind, e.message)


@dataclass(frozen=True)
class JobInfo:
    id: str
    name: str
    tenant: str
    state: JobState
    reason: str
    attempt: int
    restarts: int
    iterations: int  # asked for; progress.iteration is how far it got
    cell: str
    gpus: int  # GPUs of the current or last placement
    nodes: tuple[str, ...]
    progress: Progress | None
    submitted: dt.datetime | None
    started: dt.datetime | None
    ended: dt.datetime | None
    events: tuple[JobEvent, ...] = ()
    proto: controller_pb2.Job = field(default_factory=controller_pb2.Job, repr=False, compare=False)

    @property
    def done(self) -> bool:
        return self.state.terminal

    @classmethod
    def from_proto(cls, j: controller_pb2.Job) -> JobInfo:
        slices = j.placement.slices
        return cls(
            id=j.id, name=j.spec.name, tenant=j.spec.tenant, state=JobState.of(j.state), reason=j.reason,
            attempt=j.attempt, restarts=j.restarts, iterations=j.spec.iterations, cell=j.cell,
            gpus=sum(len(s.gpu_indices) for s in slices), nodes=tuple(dict.fromkeys(s.node_id for s in slices)),
            progress=Progress.from_proto(j.progress) if j.HasField("progress") else None,
            submitted=when(j.submit_time), started=when(j.start_time), ended=when(j.end_time),
            events=tuple(JobEvent.from_proto(e) for e in j.events), proto=j,
        )


@dataclass(frozen=True)
class GpuInfo:
    index: int
    model: str
    memory_bytes: int
    busy: bool


@dataclass(frozen=True)
class NodeInfo:
    id: str
    address: str
    state: NodeState
    reason: str
    hostname: str
    gpus: tuple[GpuInfo, ...]
    last_heartbeat: dt.datetime | None
    agent_version: str = ""  # "" until the node's agent reported
    proto: controller_pb2.Node = field(default_factory=controller_pb2.Node, repr=False, compare=False)

    @property
    def free_gpus(self) -> int:
        return sum(1 for g in self.gpus if not g.busy)

    @classmethod
    def from_proto(cls, n: controller_pb2.Node) -> NodeInfo:
        busy = set(n.busy_gpus)
        gpus = tuple(GpuInfo(g.index, g.model, g.memory_bytes, g.index in busy) for g in n.inventory.gpus)
        return cls(n.id, n.address, NodeState.of(n.state), n.reason, n.inventory.hostname, gpus,
                   when(n.last_heartbeat), n.agent_version, n)


@dataclass(frozen=True)
class Identity:
    """Who the controller takes the caller for (WhoAmI)."""

    principal: str
    tenant: str
    role: str

    @classmethod
    def from_proto(cls, w: controller_pb2.WhoAmIResponse) -> Identity:
        return cls(w.principal, w.tenant, w.role)


@dataclass(frozen=True)
class VersionInfo:
    component: str
    version: str
    git_commit: str  # "" when unknown
    python_version: str
    grpc_version: str
    protobuf_version: str
    started: dt.datetime | None

    @classmethod
    def from_proto(cls, v: info_pb2.VersionInfo) -> VersionInfo:
        return cls(v.component, v.version, v.git_commit, v.python_version, v.grpc_version, v.protobuf_version,
                   when(v.start_time))


@dataclass(frozen=True)
class LogChunk:
    """The tail of one rank's log, read through its node's agent."""

    node_id: str
    path: str
    data: bytes
