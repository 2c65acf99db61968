from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_PENDING: _ClassVar[JobState]
    JOB_STATE_STARTING: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_MIGRATING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATE_UNSPECIFIED: _ClassVar[NodeState]
    NODE_STATE_READY: _ClassVar[NodeState]
    NODE_STATE_DRAINING: _ClassVar[NodeState]
    NODE_STATE_DRAINED: _ClassVar[NodeState]
    NODE_STATE_UNREACHABLE: _ClassVar[NodeState]
    NODE_STATE_DOWN: _ClassVar[NodeState]

class InventorySource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INVENTORY_SOURCE_UNSPECIFIED: _ClassVar[InventorySource]
    INVENTORY_SOURCE_NVML: _ClassVar[InventorySource]
    INVENTORY_SOURCE_DECLARED: _ClassVar[InventorySource]

class GpuIsolation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GPU_ISOLATION_UNSPECIFIED: _ClassVar[GpuIsolation]
    GPU_ISOLATION_NONE: _ClassVar[GpuIsolation]
    GPU_ISOLATION_DETECTION: _ClassVar[GpuIsolation]
    GPU_ISOLATION_DEVICE_CGROUPS: _ClassVar[GpuIsolation]

class WorkerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_STATE_UNSPECIFIED: _ClassVar[WorkerState]
    WORKER_STATE_RUNNING: _ClassVar[WorkerState]
    WORKER_STATE_EXITED: _ClassVar[WorkerState]
    WORKER_STATE_STOPPING: _ClassVar[WorkerState]

class ModelFamily(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_FAMILY_UNSPECIFIED: _ClassVar[ModelFamily]
    MODEL_FAMILY_DECODER: _ClassVar[ModelFamily]
    MODEL_FAMILY_ENCODER: _ClassVar[ModelFamily]
    MODEL_FAMILY_MOE: _ClassVar[ModelFamily]
    MODEL_FAMILY_WIDE_RESNET: _ClassVar[ModelFamily]
    MODEL_FAMILY_ENCODER_DECODER: _ClassVar[ModelFamily]

class Sharding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SHARDING_UNSPECIFIED: _ClassVar[Sharding]
    SHARDING_NONE: _ClassVar[Sharding]
    SHARDING_ZERO1: _ClassVar[Sharding]
    SHARDING_ZERO2: _ClassVar[Sharding]
    SHARDING_ZERO3: _ClassVar[Sharding]
    SHARDING_FSDP: _ClassVar[Sharding]

class Offload(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OFFLOAD_UNSPECIFIED: _ClassVar[Offload]
    OFFLOAD_NONE: _ClassVar[Offload]
    OFFLOAD_OPTIMIZER: _ClassVar[Offload]
    OFFLOAD_OPTIMIZER_AND_PARAMS: _ClassVar[Offload]
    OFFLOAD_FROZEN: _ClassVar[Offload]

class Checkpointing(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKPOINTING_UNSPECIFIED: _ClassVar[Checkpointing]
    CHECKPOINTING_NONE: _ClassVar[Checkpointing]
    CHECKPOINTING_SELECTIVE: _ClassVar[Checkpointing]
    CHECKPOINTING_FULL: _ClassVar[Checkpointing]
    CHECKPOINTING_OP: _ClassVar[Checkpointing]

class Reshard(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESHARD_UNSPECIFIED: _ClassVar[Reshard]
    RESHARD_AUTO: _ClassVar[Reshard]
    RESHARD_ALWAYS: _ClassVar[Reshard]
    RESHARD_NEVER: _ClassVar[Reshard]

class Loss(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOSS_UNSPECIFIED: _ClassVar[Loss]
    LOSS_FUSED: _ClassVar[Loss]
    LOSS_FP32: _ClassVar[Loss]
    LOSS_CHUNKED: _ClassVar[Loss]

class Float8(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FLOAT8_UNSPECIFIED: _ClassVar[Float8]
    FLOAT8_NONE: _ClassVar[Float8]
    FLOAT8_LINEAR: _ClassVar[Float8]
    FLOAT8_LINEAR_ALLGATHER: _ClassVar[Float8]

class LoraTargets(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LORA_TARGETS_UNSPECIFIED: _ClassVar[LoraTargets]
    LORA_TARGETS_QV: _ClassVar[LoraTargets]
    LORA_TARGETS_ATTENTION: _ClassVar[LoraTargets]
    LORA_TARGETS_ALL_LINEAR: _ClassVar[LoraTargets]

class BaseQuant(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BASE_QUANT_UNSPECIFIED: _ClassVar[BaseQuant]
    BASE_QUANT_NONE: _ClassVar[BaseQuant]
    BASE_QUANT_NF4: _ClassVar[BaseQuant]
    BASE_QUANT_INT8: _ClassVar[BaseQuant]

class Precision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRECISION_UNSPECIFIED: _ClassVar[Precision]
    PRECISION_FP32: _ClassVar[Precision]
    PRECISION_AMP: _ClassVar[Precision]
    PRECISION_MIXED: _ClassVar[Precision]
    PRECISION_MEGATRON_BF16: _ClassVar[Precision]
    PRECISION_MEGATRON_FP16: _ClassVar[Precision]
    PRECISION_BF16: _ClassVar[Precision]
    PRECISION_MIXED_ADAFACTOR: _ClassVar[Precision]

class PipelineSchedule(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PIPELINE_SCHEDULE_UNSPECIFIED: _ClassVar[PipelineSchedule]
    PIPELINE_SCHEDULE_1F1B: _ClassVar[PipelineSchedule]
    PIPELINE_SCHEDULE_GPIPE: _ClassVar[PipelineSchedule]

class Objective(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OBJECTIVE_UNSPECIFIED: _ClassVar[Objective]
    OBJECTIVE_COST: _ClassVar[Objective]

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_UNSPECIFIED: _ClassVar[Priority]
    PRIORITY_BEST_EFFORT: _ClassVar[Priority]
    PRIORITY_GUARANTEED: _ClassVar[Priority]
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_PENDING: JobState
JOB_STATE_STARTING: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_MIGRATING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState
NODE_STATE_UNSPECIFIED: NodeState
NODE_STATE_READY: NodeState
NODE_STATE_DRAINING: NodeState
NODE_STATE_DRAINED: NodeState
NODE_STATE_UNREACHABLE: NodeState
NODE_STATE_DOWN: NodeState
INVENTORY_SOURCE_UNSPECIFIED: InventorySource
INVENTORY_SOURCE_NVML: InventorySource
INVENTORY_SOURCE_DECLARED: InventorySource
GPU_ISOLATION_UNSPECIFIED: GpuIsolation
GPU_ISOLATION_NONE: GpuIsolation
GPU_ISOLATION_DETECTION: GpuIsolation
GPU_ISOLATION_DEVICE_CGROUPS: GpuIsolation
WORKER_STATE_UNSPECIFIED: WorkerState
WORKER_STATE_RUNNING: WorkerState
WORKER_STATE_EXITED: WorkerState
WORKER_STATE_STOPPING: WorkerState
MODEL_FAMILY_UNSPECIFIED: ModelFamily
MODEL_FAMILY_DECODER: ModelFamily
MODEL_FAMILY_ENCODER: ModelFamily
MODEL_FAMILY_MOE: ModelFamily
MODEL_FAMILY_WIDE_RESNET: ModelFamily
MODEL_FAMILY_ENCODER_DECODER: ModelFamily
SHARDING_UNSPECIFIED: Sharding
SHARDING_NONE: Sharding
SHARDING_ZERO1: Sharding
SHARDING_ZERO2: Sharding
SHARDING_ZERO3: Sharding
SHARDING_FSDP: Sharding
OFFLOAD_UNSPECIFIED: Offload
OFFLOAD_NONE: Offload
OFFLOAD_OPTIMIZER: Offload
OFFLOAD_OPTIMIZER_AND_PARAMS: Offload
OFFLOAD_FROZEN: Offload
CHECKPOINTING_UNSPECIFIED: Checkpointing
CHECKPOINTING_NONE: Checkpointing
CHECKPOINTING_SELECTIVE: Checkpointing
CHECKPOINTING_FULL: Checkpointing
CHECKPOINTING_OP: Checkpointing
RESHARD_UNSPECIFIED: Reshard
RESHARD_AUTO: Reshard
RESHARD_ALWAYS: Reshard
RESHARD_NEVER: Reshard
LOSS_UNSPECIFIED: Loss
LOSS_FUSED: Loss
LOSS_FP32: Loss
LOSS_CHUNKED: Loss
FLOAT8_UNSPECIFIED: Float8
FLOAT8_NONE: Float8
FLOAT8_LINEAR: Float8
FLOAT8_LINEAR_ALLGATHER: Float8
LORA_TARGETS_UNSPECIFIED: LoraTargets
LORA_TARGETS_QV: LoraTargets
LORA_TARGETS_ATTENTION: LoraTargets
LORA_TARGETS_ALL_LINEAR: LoraTargets
BASE_QUANT_UNSPECIFIED: BaseQuant
BASE_QUANT_NONE: BaseQuant
BASE_QUANT_NF4: BaseQuant
BASE_QUANT_INT8: BaseQuant
PRECISION_UNSPECIFIED: Precision
PRECISION_FP32: Precision
PRECISION_AMP: Precision
PRECISION_MIXED: Precision
PRECISION_MEGATRON_BF16: Precision
PRECISION_MEGATRON_FP16: Precision
PRECISION_BF16: Precision
PRECISION_MIXED_ADAFACTOR: Precision
PIPELINE_SCHEDULE_UNSPECIFIED: PipelineSchedule
PIPELINE_SCHEDULE_1F1B: PipelineSchedule
PIPELINE_SCHEDULE_GPIPE: PipelineSchedule
OBJECTIVE_UNSPECIFIED: Objective
OBJECTIVE_COST: Objective
PRIORITY_UNSPECIFIED: Priority
PRIORITY_BEST_EFFORT: Priority
PRIORITY_GUARANTEED: Priority

class Gpu(_message.Message):
    __slots__ = ("index", "uuid", "model", "memory_bytes", "foreign_used_bytes", "nvlink_peers")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    FOREIGN_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    NVLINK_PEERS_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    model: str
    memory_bytes: int
    foreign_used_bytes: int
    nvlink_peers: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., model: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., foreign_used_bytes: _Optional[int] = ..., nvlink_peers: _Optional[_Iterable[int]] = ...) -> None: ...

class LeftOutGpu(_message.Message):
    __slots__ = ("index", "uuid", "model", "reason")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    model: str
    reason: str
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., model: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class NodeInventory(_message.Message):
    __slots__ = ("source", "gpus", "hostname", "cpu_count", "host_memory_bytes", "left_out")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    HOST_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    LEFT_OUT_FIELD_NUMBER: _ClassVar[int]
    source: InventorySource
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    hostname: str
    cpu_count: int
    host_memory_bytes: int
    left_out: _containers.RepeatedCompositeFieldContainer[LeftOutGpu]
    def __init__(self, source: _Optional[_Union[InventorySource, str]] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., hostname: _Optional[str] = ..., cpu_count: _Optional[int] = ..., host_memory_bytes: _Optional[int] = ..., left_out: _Optional[_Iterable[_Union[LeftOutGpu, _Mapping]]] = ...) -> None: ...

class ModelSpec(_message.Message):
    __slots__ = ("name", "hidden_size", "num_layers", "num_heads", "vocab_size", "seq_length", "family", "ffn_hidden", "gated", "num_kv_heads", "num_experts", "top_k", "moe_every", "capacity_factor", "untied_embeddings", "width_factor", "kv_channels", "qkv_bias", "num_decoder_layers", "decoder_seq_length", "sliding_window", "logit_softcap", "sandwich_norm", "dropless")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_HEADS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    SEQ_LENGTH_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    FFN_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    GATED_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MOE_EVERY_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FACTOR_FIELD_NUMBER: _ClassVar[int]
    UNTIED_EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FACTOR_FIELD_NUMBER: _ClassVar[int]
    KV_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    QKV_BIAS_FIELD_NUMBER: _ClassVar[int]
    NUM_DECODER_LAYERS_FIELD_NUMBER: _ClassVar[int]
    DECODER_SEQ_LENGTH_FIELD_NUMBER: _ClassVar[int]
    SLIDING_WINDOW_FIELD_NUMBER: _ClassVar[int]
    LOGIT_SOFTCAP_FIELD_NUMBER: _ClassVar[int]
    SANDWICH_NORM_FIELD_NUMBER: _ClassVar[int]
    DROPLESS_FIELD_NUMBER: _ClassVar[int]
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    vocab_size: int
    seq_length: int
    family: ModelFamily
    ffn_hidden: int
    gated: bool
    num_kv_heads: int
    num_experts: int
    top_k: int
    moe_every: int
    capacity_factor: float
    untied_embeddings: bool
    width_factor: int
    kv_channels: int
    qkv_bias: bool
    num_decoder_layers: int
    decoder_seq_length: int
    sliding_window: int
    logit_softcap: float
    sandwich_norm: bool
    dropless: bool
    def __init__(self, name: _Optional[str] = ..., hidden_size: _Optional[int] = ..., num_layers: _Optional[int] = ..., num_heads: _Optional[int] = ..., vocab_size: _Optional[int] = ..., seq_length: _Optional[int] = ..., family: _Optional[_Union[ModelFamily, str]] = ..., ffn_hidden: _Optional[int] = ..., gated: _Optional[bool] = ..., num_kv_heads: _Optional[int] = ..., num_experts: _Optional[int] = ..., top_k: _Optional[int] = ..., moe_every: _Optional[int] = ..., capacity_factor: _Optional[float] = ..., untied_embeddings: _Optional[bool] = ..., width_factor: _Optional[int] = ..., kv_channels: _Optional[int] = ..., qkv_bias: _Optional[bool] = ..., num_decoder_layers: _Optional[int] = ..., decoder_seq_length: _Optional[int] = ..., sliding_window: _Optional[int] = ..., logit_softcap: _Optional[float] = ..., sandwich_norm: _Optional[bool] = ..., dropless: _Optional[bool] = ...) -> None: ...

class ExecutionPlan(_message.Message):
    __slots__ = ("dp", "tp", "pp", "micro_batch", "grad_accum", "sharding", "offload", "checkpointing", "sequence_parallel", "flash_attention", "precision", "ep", "virtual_stages", "schedule", "cp", "checkpoint_every", "reshard_after_forward", "loss", "float8", "compile", "async_tp", "lora_rank", "lora_targets", "base_quant")
    DP_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    PP_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_FIELD_NUMBER: _ClassVar[int]
    GRAD_ACCUM_FIELD_NUMBER: _ClassVar[int]
    SHARDING_FIELD_NUMBER: _ClassVar[int]
    OFFLOAD_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTING_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    FLASH_ATTENTION_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    EP_FIELD_NUMBER: _ClassVar[int]
    VIRTUAL_STAGES_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    CP_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EVERY_FIELD_NUMBER: _ClassVar[int]
    RESHARD_AFTER_FORWARD_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    FLOAT8_FIELD_NUMBER: _ClassVar[int]
    COMPILE_FIELD_NUMBER: _ClassVar[int]
    ASYNC_TP_FIELD_NUMBER: _ClassVar[int]
    LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    LORA_TARGETS_FIELD_NUMBER: _ClassVar[int]
    BASE_QUANT_FIELD_NUMBER: _ClassVar[int]
    dp: int
    tp: int
    pp: int
    micro_batch: int
    grad_accum: int
    sharding: Sharding
    offload: Offload
    checkpointing: Checkpointing
    sequence_parallel: bool
    flash_attention: bool
    precision: Precision
    ep: int
    virtual_stages: int
    schedule: PipelineSchedule
    cp: int
    checkpoint_every: int
    reshard_after_forward: Reshard
    loss: Loss
    float8: Float8
    compile: bool
    async_tp: bool
    lora_rank: int
    lora_targets: LoraTargets
    base_quant: BaseQuant
    def __init__(self, dp: _Optional[int] = ..., tp: _Optional[int] = ..., pp: _Optional[int] = ..., micro_batch: _Optional[int] = ..., grad_accum: _Optional[int] = ..., sharding: _Optional[_Union[Sharding, str]] = ..., offload: _Optional[_Union[Offload, str]] = ..., checkpointing: _Optional[_Union[Checkpointing, str]] = ..., sequence_parallel: _Optional[bool] = ..., flash_attention: _Optional[bool] = ..., precision: _Optional[_Union[Precision, str]] = ..., ep: _Optional[int] = ..., virtual_stages: _Optional[int] = ..., schedule: _Optional[_Union[PipelineSchedule, str]] = ..., cp: _Optional[int] = ..., checkpoint_every: _Optional[int] = ..., reshard_after_forward: _Optional[_Union[Reshard, str]] = ..., loss: _Optional[_Union[Loss, str]] = ..., float8: _Optional[_Union[Float8, str]] = ..., compile: _Optional[bool] = ..., async_tp: _Optional[bool] = ..., lora_rank: _Optional[int] = ..., lora_targets: _Optional[_Union[LoraTargets, str]] = ..., base_quant: _Optional[_Union[BaseQuant, str]] = ...) -> None: ...

class ResourceHint(_message.Message):
    __slots__ = ("gpus", "gpu_types")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPES_FIELD_NUMBER: _ClassVar[int]
    gpus: int
    gpu_types: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, gpus: _Optional[int] = ..., gpu_types: _Optional[_Iterable[str]] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("name", "tenant", "model", "global_batch_size", "iterations", "hint", "entrypoint", "env", "checkpoint_every", "max_retries", "launcher", "progress_timeout_seconds", "plan", "objective", "slo", "workdir", "max_runtime_seconds", "priority", "guarantee")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    HINT_FIELD_NUMBER: _ClassVar[int]
    ENTRYPOINT_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EVERY_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    LAUNCHER_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    SLO_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    GUARANTEE_FIELD_NUMBER: _ClassVar[int]
    name: str
    tenant: str
    model: ModelSpec
    global_batch_size: int
    iterations: int
    hint: ResourceHint
    entrypoint: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    checkpoint_every: int
    max_retries: int
    launcher: Launcher
    progress_timeout_seconds: int
    plan: ExecutionPlan
    objective: Objective
    slo: Slo
    workdir: str
    max_runtime_seconds: int
    priority: Priority
    guarantee: Guarantee
    def __init__(self, name: _Optional[str] = ..., tenant: _Optional[str] = ..., model: _Optional[_Union[ModelSpec, _Mapping]] = ..., global_batch_size: _Optional[int] = ..., iterations: _Optional[int] = ..., hint: _Optional[_Union[ResourceHint, _Mapping]] = ..., entrypoint: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., checkpoint_every: _Optional[int] = ..., max_retries: _Optional[int] = ..., launcher: _Optional[_Union[Launcher, _Mapping]] = ..., progress_timeout_seconds: _Optional[int] = ..., plan: _Optional[_Union[ExecutionPlan, _Mapping]] = ..., objective: _Optional[_Union[Objective, str]] = ..., slo: _Optional[_Union[Slo, _Mapping]] = ..., workdir: _Optional[str] = ..., max_runtime_seconds: _Optional[int] = ..., priority: _Optional[_Union[Priority, str]] = ..., guarantee: _Optional[_Union[Guarantee, _Mapping]] = ...) -> None: ...

class Launcher(_message.Message):
    __slots__ = ("name", "argv", "per_node", "head_argv")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    PER_NODE_FIELD_NUMBER: _ClassVar[int]
    HEAD_ARGV_FIELD_NUMBER: _ClassVar[int]
    name: str
    argv: _containers.RepeatedScalarFieldContainer[str]
    per_node: bool
    head_argv: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., argv: _Optional[_Iterable[str]] = ..., per_node: _Optional[bool] = ..., head_argv: _Optional[_Iterable[str]] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("dp", "tp", "pp", "micro_batch", "grad_accum", "gpu_model", "memory_per_gpu_bytes", "memory_source", "options", "stages", "prediction")
    DP_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    PP_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_FIELD_NUMBER: _ClassVar[int]
    GRAD_ACCUM_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PER_GPU_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_FIELD_NUMBER: _ClassVar[int]
    dp: int
    tp: int
    pp: int
    micro_batch: int
    grad_accum: int
    gpu_model: str
    memory_per_gpu_bytes: int
    memory_source: str
    options: ExecutionPlan
    stages: _containers.RepeatedCompositeFieldContainer[PipelineStage]
    prediction: CostPrediction
    def __init__(self, dp: _Optional[int] = ..., tp: _Optional[int] = ..., pp: _Optional[int] = ..., micro_batch: _Optional[int] = ..., grad_accum: _Optional[int] = ..., gpu_model: _Optional[str] = ..., memory_per_gpu_bytes: _Optional[int] = ..., memory_source: _Optional[str] = ..., options: _Optional[_Union[ExecutionPlan, _Mapping]] = ..., stages: _Optional[_Iterable[_Union[PipelineStage, _Mapping]]] = ..., prediction: _Optional[_Union[CostPrediction, _Mapping]] = ...) -> None: ...

class NodeSlice(_message.Message):
    __slots__ = ("node_id", "gpu_indices")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node_id: _Optional[str] = ..., gpu_indices: _Optional[_Iterable[int]] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("slices", "rendezvous", "earlier", "placed_at", "opportunistic")
    SLICES_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_FIELD_NUMBER: _ClassVar[int]
    EARLIER_FIELD_NUMBER: _ClassVar[int]
    PLACED_AT_FIELD_NUMBER: _ClassVar[int]
    OPPORTUNISTIC_FIELD_NUMBER: _ClassVar[int]
    slices: _containers.RepeatedCompositeFieldContainer[NodeSlice]
    rendezvous: str
    earlier: _containers.RepeatedCompositeFieldContainer[EarlierPlacement]
    placed_at: float
    opportunistic: bool
    def __init__(self, slices: _Optional[_Iterable[_Union[NodeSlice, _Mapping]]] = ..., rendezvous: _Optional[str] = ..., earlier: _Optional[_Iterable[_Union[EarlierPlacement, _Mapping]]] = ..., placed_at: _Optional[float] = ..., opportunistic: _Optional[bool] = ...) -> None: ...

class EarlierPlacement(_message.Message):
    __slots__ = ("attempt", "slices", "world_size")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SLICES_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    slices: _containers.RepeatedCompositeFieldContainer[NodeSlice]
    world_size: int
    def __init__(self, attempt: _Optional[int] = ..., slices: _Optional[_Iterable[_Union[NodeSlice, _Mapping]]] = ..., world_size: _Optional[int] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("seq", "job_id", "time", "kind", "message")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    job_id: str
    time: float
    kind: str
    message: str
    def __init__(self, seq: _Optional[int] = ..., job_id: _Optional[str] = ..., time: _Optional[float] = ..., kind: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("iteration", "samples_per_second", "loss", "step_time_seconds", "peak_memory_bytes", "time", "checkpoint_iteration")
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ITERATION_FIELD_NUMBER: _ClassVar[int]
    iteration: int
    samples_per_second: float
    loss: float
    step_time_seconds: float
    peak_memory_bytes: int
    time: float
    checkpoint_iteration: int
    def __init__(self, iteration: _Optional[int] = ..., samples_per_second: _Optional[float] = ..., loss: _Optional[float] = ..., step_time_seconds: _Optional[float] = ..., peak_memory_bytes: _Optional[int] = ..., time: _Optional[float] = ..., checkpoint_iteration: _Optional[int] = ...) -> None: ...

class Slo(_message.Message):
    __slots__ = ("iterations_within_seconds", "deadline")
    ITERATIONS_WITHIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    iterations_within_seconds: float
    deadline: float
    def __init__(self, iterations_within_seconds: _Optional[float] = ..., deadline: _Optional[float] = ...) -> None: ...

class PipelineStage(_message.Message):
    __slots__ = ("gpu_model", "gpus", "layer_start", "layer_end")
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    gpu_model: str
    gpus: int
    layer_start: int
    layer_end: int
    def __init__(self, gpu_model: _Optional[str] = ..., gpus: _Optional[int] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ...) -> None: ...

class CostPrediction(_message.Message):
    __slots__ = ("iteration_seconds", "total_seconds", "cost", "allocation")
    ITERATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    iteration_seconds: float
    total_seconds: float
    cost: float
    allocation: str
    def __init__(self, iteration_seconds: _Optional[float] = ..., total_seconds: _Optional[float] = ..., cost: _Optional[float] = ..., allocation: _Optional[str] = ...) -> None: ...

class Guarantee(_message.Message):
    __slots__ = ("num_gpus", "num_cpus", "gpu_type", "plan")
    NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    NUM_CPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    num_gpus: int
    num_cpus: int
    gpu_type: str
    plan: str
    def __init__(self, num_gpus: _Optional[int] = ..., num_cpus: _Optional[int] = ..., gpu_type: _Optional[str] = ..., plan: _Optional[str] = ...) -> None: ...
