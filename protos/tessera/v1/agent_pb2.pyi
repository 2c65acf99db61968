from tessera.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerStatus(_message.Message):
    __slots__ = ("job_id", "attempt", "rank", "state", "pid", "exit_code", "progress", "log_path", "reason", "gpu_indices", "stop_requested")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    LOG_PATH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    STOP_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    rank: int
    state: _common_pb2.WorkerState
    pid: int
    exit_code: int
    progress: _common_pb2.Progress
    log_path: str
    reason: str
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    stop_requested: bool
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., rank: _Optional[int] = ..., state: _Optional[_Union[_common_pb2.WorkerState, str]] = ..., pid: _Optional[int] = ..., exit_code: _Optional[int] = ..., progress: _Optional[_Union[_common_pb2.Progress, _Mapping]] = ..., log_path: _Optional[str] = ..., reason: _Optional[str] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., stop_requested: _Optional[bool] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node_id", "address", "inventory", "workers", "draining", "agent_version", "agent_commit", "attempt_marks", "gpu_isolation", "gpu_isolation_note", "features")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    AGENT_COMMIT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_MARKS_FIELD_NUMBER: _ClassVar[int]
    GPU_ISOLATION_FIELD_NUMBER: _ClassVar[int]
    GPU_ISOLATION_NOTE_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    inventory: _common_pb2.NodeInventory
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    draining: bool
    agent_version: str
    agent_commit: str
    attempt_marks: _containers.RepeatedCompositeFieldContainer[AttemptMark]
    gpu_isolation: _common_pb2.GpuIsolation
    gpu_isolation_note: str
    features: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., inventory: _Optional[_Union[_common_pb2.NodeInventory, _Mapping]] = ..., workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., draining: _Optional[bool] = ..., agent_version: _Optional[str] = ..., agent_commit: _Optional[str] = ..., attempt_marks: _Optional[_Iterable[_Union[AttemptMark, _Mapping]]] = ..., gpu_isolation: _Optional[_Union[_common_pb2.GpuIsolation, str]] = ..., gpu_isolation_note: _Optional[str] = ..., features: _Optional[_Iterable[str]] = ...) -> None: ...

class AttemptMark(_message.Message):
    __slots__ = ("job_id", "attempt")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("request_id", "status")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    status: NodeStatus
    def __init__(self, request_id: _Optional[str] = ..., status: _Optional[_Union[NodeStatus, _Mapping]] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("controller_epoch", "lease_seconds", "heartbeat_interval_seconds", "fence_seconds", "fence_grace_seconds")
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FENCE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FENCE_GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    controller_epoch: int
    lease_seconds: float
    heartbeat_interval_seconds: float
    fence_seconds: float
    fence_grace_seconds: float
    def __init__(self, controller_epoch: _Optional[int] = ..., lease_seconds: _Optional[float] = ..., heartbeat_interval_seconds: _Optional[float] = ..., fence_seconds: _Optional[float] = ..., fence_grace_seconds: _Optional[float] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("status", "controller_epoch")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    status: NodeStatus
    controller_epoch: int
    def __init__(self, status: _Optional[_Union[NodeStatus, _Mapping]] = ..., controller_epoch: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("reregister", "controller_epoch")
    REREGISTER_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    reregister: bool
    controller_epoch: int
    def __init__(self, reregister: _Optional[bool] = ..., controller_epoch: _Optional[int] = ...) -> None: ...

class LaunchRequest(_message.Message):
    __slots__ = ("request_id", "controller_epoch", "job_id", "attempt", "world_size", "ranks", "rendezvous", "plan", "argv", "env", "checkpoint_dir", "iterations", "global_batch_size", "model", "checkpoint_every", "tenant", "workdir", "rendezvous_key")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EVERY_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_KEY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    controller_epoch: int
    job_id: str
    attempt: int
    world_size: int
    ranks: _containers.RepeatedCompositeFieldContainer[RankAssignment]
    rendezvous: str
    plan: _common_pb2.Plan
    argv: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    checkpoint_dir: str
    iterations: int
    global_batch_size: int
    model: _common_pb2.ModelSpec
    checkpoint_every: int
    tenant: str
    workdir: str
    rendezvous_key: bytes
    def __init__(self, request_id: _Optional[str] = ..., controller_epoch: _Optional[int] = ..., job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., world_size: _Optional[int] = ..., ranks: _Optional[_Iterable[_Union[RankAssignment, _Mapping]]] = ..., rendezvous: _Optional[str] = ..., plan: _Optional[_Union[_common_pb2.Plan, _Mapping]] = ..., argv: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., checkpoint_dir: _Optional[str] = ..., iterations: _Optional[int] = ..., global_batch_size: _Optional[int] = ..., model: _Optional[_Union[_common_pb2.ModelSpec, _Mapping]] = ..., checkpoint_every: _Optional[int] = ..., tenant: _Optional[str] = ..., workdir: _Optional[str] = ..., rendezvous_key: _Optional[bytes] = ...) -> None: ...

class RankAssignment(_message.Message):
    __slots__ = ("rank", "local_rank", "gpu_indices")
    RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    rank: int
    local_rank: int
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, rank: _Optional[int] = ..., local_rank: _Optional[int] = ..., gpu_indices: _Optional[_Iterable[int]] = ...) -> None: ...

class LaunchResponse(_message.Message):
    __slots__ = ("started", "workers")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    started: bool
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    def __init__(self, started: _Optional[bool] = ..., workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ...) -> None: ...

class StopRequest(_message.Message):
    __slots__ = ("request_id", "controller_epoch", "job_id", "attempt", "grace_seconds", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    controller_epoch: int
    job_id: str
    attempt: int
    grace_seconds: float
    reason: str
    def __init__(self, request_id: _Optional[str] = ..., controller_epoch: _Optional[int] = ..., job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., grace_seconds: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class StopResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("request_id", "controller_epoch", "drain")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    controller_epoch: int
    drain: bool
    def __init__(self, request_id: _Optional[str] = ..., controller_epoch: _Optional[int] = ..., drain: _Optional[bool] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("draining",)
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    draining: bool
    def __init__(self, draining: _Optional[bool] = ...) -> None: ...

class ReadLogRequest(_message.Message):
    __slots__ = ("controller_epoch", "job_id", "attempt", "rank", "tail_bytes", "from_offset", "offset")
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    TAIL_BYTES_FIELD_NUMBER: _ClassVar[int]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    controller_epoch: int
    job_id: str
    attempt: int
    rank: int
    tail_bytes: int
    from_offset: bool
    offset: int
    def __init__(self, controller_epoch: _Optional[int] = ..., job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., rank: _Optional[int] = ..., tail_bytes: _Optional[int] = ..., from_offset: _Optional[bool] = ..., offset: _Optional[int] = ...) -> None: ...

class ReadLogResponse(_message.Message):
    __slots__ = ("path", "data", "offset", "size")
    PATH_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    path: str
    data: bytes
    offset: int
    size: int
    def __init__(self, path: _Optional[str] = ..., data: _Optional[bytes] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class ReportProgressRequest(_message.Message):
    __slots__ = ("job_id", "attempt", "rank", "progress")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    rank: int
    progress: _common_pb2.Progress
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., rank: _Optional[int] = ..., progress: _Optional[_Union[_common_pb2.Progress, _Mapping]] = ...) -> None: ...

class ReportProgressResponse(_message.Message):
    __slots__ = ("checkpoint_requested", "stop_requested")
    CHECKPOINT_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    STOP_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    checkpoint_requested: bool
    stop_requested: bool
    def __init__(self, checkpoint_requested: _Optional[bool] = ..., stop_requested: _Optional[bool] = ...) -> None: ...
