from tessera.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Job(_message.Message):
    __slots__ = ("id", "spec", "state", "reason", "attempt", "plan", "placement", "progress", "submit_time", "start_time", "end_time", "restarts", "events", "cell", "launch_failures", "next_launch_time", "predicted_seconds", "predicted_cost", "allocation", "forecast", "spec_elided")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    CELL_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FAILURES_FIELD_NUMBER: _ClassVar[int]
    NEXT_LAUNCH_TIME_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_COST_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    FORECAST_FIELD_NUMBER: _ClassVar[int]
    SPEC_ELIDED_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: _common_pb2.JobSpec
    state: _common_pb2.JobState
    reason: str
    attempt: int
    plan: _common_pb2.Plan
    placement: _common_pb2.Placement
    progress: _common_pb2.Progress
    submit_time: float
    start_time: float
    end_time: float
    restarts: int
    events: _containers.RepeatedCompositeFieldContainer[_common_pb2.JobEvent]
    cell: str
    launch_failures: int
    next_launch_time: float
    predicted_seconds: float
    predicted_cost: float
    allocation: str
    forecast: Forecast
    spec_elided: bool
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[_common_pb2.JobSpec, _Mapping]] = ..., state: _Optional[_Union[_common_pb2.JobState, str]] = ..., reason: _Optional[str] = ..., attempt: _Optional[int] = ..., plan: _Optional[_Union[_common_pb2.Plan, _Mapping]] = ..., placement: _Optional[_Union[_common_pb2.Placement, _Mapping]] = ..., progress: _Optional[_Union[_common_pb2.Progress, _Mapping]] = ..., submit_time: _Optional[float] = ..., start_time: _Optional[float] = ..., end_time: _Optional[float] = ..., restarts: _Optional[int] = ..., events: _Optional[_Iterable[_Union[_common_pb2.JobEvent, _Mapping]]] = ..., cell: _Optional[str] = ..., launch_failures: _Optional[int] = ..., next_launch_time: _Optional[float] = ..., predicted_seconds: _Optional[float] = ..., predicted_cost: _Optional[float] = ..., allocation: _Optional[str] = ..., forecast: _Optional[_Union[Forecast, _Mapping]] = ..., spec_elided: _Optional[bool] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("id", "address", "state", "reason", "inventory", "last_heartbeat", "busy_gpus", "launch_failures", "unhealthy_until", "agent_version", "agent_commit", "agent_unconfirmed", "busy_cpus", "busy_host_memory_bytes", "hidden_gpus", "gpu_isolation", "gpu_isolation_note")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    BUSY_GPUS_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FAILURES_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_UNTIL_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    AGENT_COMMIT_FIELD_NUMBER: _ClassVar[int]
    AGENT_UNCONFIRMED_FIELD_NUMBER: _ClassVar[int]
    BUSY_CPUS_FIELD_NUMBER: _ClassVar[int]
    BUSY_HOST_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_ISOLATION_FIELD_NUMBER: _ClassVar[int]
    GPU_ISOLATION_NOTE_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    state: _common_pb2.NodeState
    reason: str
    inventory: _common_pb2.NodeInventory
    last_heartbeat: float
    busy_gpus: _containers.RepeatedScalarFieldContainer[int]
    launch_failures: int
    unhealthy_until: float
    agent_version: str
    agent_commit: str
    agent_unconfirmed: str
    busy_cpus: int
    busy_host_memory_bytes: int
    hidden_gpus: _containers.RepeatedScalarFieldContainer[int]
    gpu_isolation: _common_pb2.GpuIsolation
    gpu_isolation_note: str
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.NodeState, str]] = ..., reason: _Optional[str] = ..., inventory: _Optional[_Union[_common_pb2.NodeInventory, _Mapping]] = ..., last_heartbeat: _Optional[float] = ..., busy_gpus: _Optional[_Iterable[int]] = ..., launch_failures: _Optional[int] = ..., unhealthy_until: _Optional[float] = ..., agent_version: _Optional[str] = ..., agent_commit: _Optional[str] = ..., agent_unconfirmed: _Optional[str] = ..., busy_cpus: _Optional[int] = ..., busy_host_memory_bytes: _Optional[int] = ..., hidden_gpus: _Optional[_Iterable[int]] = ..., gpu_isolation: _Optional[_Union[_common_pb2.GpuIsolation, str]] = ..., gpu_isolation_note: _Optional[str] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("request_id", "spec")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    spec: _common_pb2.JobSpec
    def __init__(self, request_id: _Optional[str] = ..., spec: _Optional[_Union[_common_pb2.JobSpec, _Mapping]] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job", "created")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    job: Job
    created: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id", "with_events")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WITH_EVENTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    with_events: bool
    def __init__(self, job_id: _Optional[str] = ..., with_events: _Optional[bool] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("states", "tenant", "limit", "continue_token")
    STATES_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[_common_pb2.JobState]
    tenant: str
    limit: int
    continue_token: str
    def __init__(self, states: _Optional[_Iterable[_Union[_common_pb2.JobState, str]]] = ..., tenant: _Optional[str] = ..., limit: _Optional[int] = ..., continue_token: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "continue_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    continue_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., continue_token: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("request_id", "job_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    job_id: str
    def __init__(self, request_id: _Optional[str] = ..., job_id: _Optional[str] = ...) -> None: ...

class WatchJobEventsRequest(_message.Message):
    __slots__ = ("job_id", "after_seq")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    after_seq: int
    def __init__(self, job_id: _Optional[str] = ..., after_seq: _Optional[int] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("request_id", "node_id", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    node_id: str
    reason: str
    def __init__(self, request_id: _Optional[str] = ..., node_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class UndrainNodeRequest(_message.Message):
    __slots__ = ("request_id", "node_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    node_id: str
    def __init__(self, request_id: _Optional[str] = ..., node_id: _Optional[str] = ...) -> None: ...

class GetJobLogsRequest(_message.Message):
    __slots__ = ("job_id", "rank", "attempt", "tail_bytes")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TAIL_BYTES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    attempt: int
    tail_bytes: int
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., attempt: _Optional[int] = ..., tail_bytes: _Optional[int] = ...) -> None: ...

class GetJobLogsResponse(_message.Message):
    __slots__ = ("node_id", "path", "data")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    path: str
    data: bytes
    def __init__(self, node_id: _Optional[str] = ..., path: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class RemoveNodeRequest(_message.Message):
    __slots__ = ("request_id", "node_id", "force")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    node_id: str
    force: bool
    def __init__(self, request_id: _Optional[str] = ..., node_id: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class RemoveNodeResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: bool
    def __init__(self, removed: _Optional[bool] = ...) -> None: ...

class WhoAmIRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WhoAmIResponse(_message.Message):
    __slots__ = ("principal", "tenant", "role")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    principal: str
    tenant: str
    role: str
    def __init__(self, principal: _Optional[str] = ..., tenant: _Optional[str] = ..., role: _Optional[str] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class JobUpdate(_message.Message):
    __slots__ = ("job", "events", "removed", "batch_end")
    JOB_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    BATCH_END_FIELD_NUMBER: _ClassVar[int]
    job: Job
    events: _containers.RepeatedCompositeFieldContainer[_common_pb2.JobEvent]
    removed: bool
    batch_end: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., events: _Optional[_Iterable[_Union[_common_pb2.JobEvent, _Mapping]]] = ..., removed: _Optional[bool] = ..., batch_end: _Optional[bool] = ...) -> None: ...

class WatchJobsRequest(_message.Message):
    __slots__ = ("states", "tenant")
    STATES_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[_common_pb2.JobState]
    tenant: str
    def __init__(self, states: _Optional[_Iterable[_Union[_common_pb2.JobState, str]]] = ..., tenant: _Optional[str] = ...) -> None: ...

class StreamJobLogsRequest(_message.Message):
    __slots__ = ("job_id", "rank", "all_ranks", "attempt", "tail_lines", "follow")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ALL_RANKS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TAIL_LINES_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    all_ranks: bool
    attempt: int
    tail_lines: int
    follow: bool
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., all_ranks: _Optional[bool] = ..., attempt: _Optional[int] = ..., tail_lines: _Optional[int] = ..., follow: _Optional[bool] = ...) -> None: ...

class LogLines(_message.Message):
    __slots__ = ("rank", "attempt", "node_id", "lines", "cut", "path")
    RANK_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    CUT_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    rank: int
    attempt: int
    node_id: str
    lines: _containers.RepeatedScalarFieldContainer[bytes]
    cut: bool
    path: str
    def __init__(self, rank: _Optional[int] = ..., attempt: _Optional[int] = ..., node_id: _Optional[str] = ..., lines: _Optional[_Iterable[bytes]] = ..., cut: _Optional[bool] = ..., path: _Optional[str] = ...) -> None: ...

class Forecast(_message.Message):
    __slots__ = ("start_time", "end_time", "start_low", "start_high", "end_low", "end_high", "note", "made_at")
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    START_LOW_FIELD_NUMBER: _ClassVar[int]
    START_HIGH_FIELD_NUMBER: _ClassVar[int]
    END_LOW_FIELD_NUMBER: _ClassVar[int]
    END_HIGH_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    MADE_AT_FIELD_NUMBER: _ClassVar[int]
    start_time: float
    end_time: float
    start_low: float
    start_high: float
    end_low: float
    end_high: float
    note: str
    made_at: float
    def __init__(self, start_time: _Optional[float] = ..., end_time: _Optional[float] = ..., start_low: _Optional[float] = ..., start_high: _Optional[float] = ..., end_low: _Optional[float] = ..., end_high: _Optional[float] = ..., note: _Optional[str] = ..., made_at: _Optional[float] = ...) -> None: ...

class ListTenantsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TypeGpus(_message.Message):
    __slots__ = ("gpu_type", "gpus")
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    gpu_type: str
    gpus: int
    def __init__(self, gpu_type: _Optional[str] = ..., gpus: _Optional[int] = ...) -> None: ...

class Tenant(_message.Message):
    __slots__ = ("name", "quota", "guaranteed_in_use", "borrowed", "jobs_running", "jobs_pending", "max_unended_jobs", "no_preempt_until", "no_preempt_reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    GUARANTEED_IN_USE_FIELD_NUMBER: _ClassVar[int]
    BORROWED_FIELD_NUMBER: _ClassVar[int]
    JOBS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    JOBS_PENDING_FIELD_NUMBER: _ClassVar[int]
    MAX_UNENDED_JOBS_FIELD_NUMBER: _ClassVar[int]
    NO_PREEMPT_UNTIL_FIELD_NUMBER: _ClassVar[int]
    NO_PREEMPT_REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    quota: _containers.RepeatedCompositeFieldContainer[TypeGpus]
    guaranteed_in_use: _containers.RepeatedCompositeFieldContainer[TypeGpus]
    borrowed: _containers.RepeatedCompositeFieldContainer[TypeGpus]
    jobs_running: int
    jobs_pending: int
    max_unended_jobs: int
    no_preempt_until: float
    no_preempt_reason: str
    def __init__(self, name: _Optional[str] = ..., quota: _Optional[_Iterable[_Union[TypeGpus, _Mapping]]] = ..., guaranteed_in_use: _Optional[_Iterable[_Union[TypeGpus, _Mapping]]] = ..., borrowed: _Optional[_Iterable[_Union[TypeGpus, _Mapping]]] = ..., jobs_running: _Optional[int] = ..., jobs_pending: _Optional[int] = ..., max_unended_jobs: _Optional[int] = ..., no_preempt_until: _Optional[float] = ..., no_preempt_reason: _Optional[str] = ...) -> None: ...

class ListTenantsResponse(_message.Message):
    __slots__ = ("tenants", "file", "loaded_at", "warnings")
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    LOADED_AT_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    tenants: _containers.RepeatedCompositeFieldContainer[Tenant]
    file: str
    loaded_at: float
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tenants: _Optional[_Iterable[_Union[Tenant, _Mapping]]] = ..., file: _Optional[str] = ..., loaded_at: _Optional[float] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...
