from tessera.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MemoryMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMORY_MODE_UNSPECIFIED: _ClassVar[MemoryMode]
    MEMORY_MODE_FORMULA: _ClassVar[MemoryMode]
    MEMORY_MODE_MARP: _ClassVar[MemoryMode]
    MEMORY_MODE_TRACED: _ClassVar[MemoryMode]
    MEMORY_MODE_TRACED_TORCHTITAN: _ClassVar[MemoryMode]
    MEMORY_MODE_TRACED_TRANSFORMERS: _ClassVar[MemoryMode]

class IntraLink(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INTRA_LINK_UNSPECIFIED: _ClassVar[IntraLink]
    INTRA_LINK_NVLINK: _ClassVar[IntraLink]
    INTRA_LINK_PCIE: _ClassVar[IntraLink]

class PerfMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PERF_MODE_UNSPECIFIED: _ClassVar[PerfMode]
    PERF_MODE_MORPHLING: _ClassVar[PerfMode]
    PERF_MODE_TESSERA: _ClassVar[PerfMode]

class ZeroKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ZERO_KIND_UNSPECIFIED: _ClassVar[ZeroKind]
    ZERO_KIND_NONE: _ClassVar[ZeroKind]
    ZERO_KIND_ZERO_DP: _ClassVar[ZeroKind]
    ZERO_KIND_OFFLOAD: _ClassVar[ZeroKind]
MEMORY_MODE_UNSPECIFIED: MemoryMode
MEMORY_MODE_FORMULA: MemoryMode
MEMORY_MODE_MARP: MemoryMode
MEMORY_MODE_TRACED: MemoryMode
MEMORY_MODE_TRACED_TORCHTITAN: MemoryMode
MEMORY_MODE_TRACED_TRANSFORMERS: MemoryMode
INTRA_LINK_UNSPECIFIED: IntraLink
INTRA_LINK_NVLINK: IntraLink
INTRA_LINK_PCIE: IntraLink
PERF_MODE_UNSPECIFIED: PerfMode
PERF_MODE_MORPHLING: PerfMode
PERF_MODE_TESSERA: PerfMode
ZERO_KIND_UNSPECIFIED: ZeroKind
ZERO_KIND_NONE: ZeroKind
ZERO_KIND_ZERO_DP: ZeroKind
ZERO_KIND_OFFLOAD: ZeroKind

class EstimateMemoryRequest(_message.Message):
    __slots__ = ("model", "plan", "gpu", "mode", "num_gpus", "global_batch_size")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    model: _common_pb2.ModelSpec
    plan: _common_pb2.ExecutionPlan
    gpu: str
    mode: MemoryMode
    num_gpus: int
    global_batch_size: int
    def __init__(self, model: _Optional[_Union[_common_pb2.ModelSpec, _Mapping]] = ..., plan: _Optional[_Union[_common_pb2.ExecutionPlan, _Mapping]] = ..., gpu: _Optional[str] = ..., mode: _Optional[_Union[MemoryMode, str]] = ..., num_gpus: _Optional[int] = ..., global_batch_size: _Optional[int] = ...) -> None: ...

class MemoryBreakdown(_message.Message):
    __slots__ = ("parameters", "gradients", "optimizer", "activations", "other", "total", "capacity", "fits", "source", "stage", "cpu_bytes", "notes", "warnings", "reserved")
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    ACTIVATIONS_FIELD_NUMBER: _ClassVar[int]
    OTHER_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    FITS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    CPU_BYTES_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    RESERVED_FIELD_NUMBER: _ClassVar[int]
    parameters: int
    gradients: int
    optimizer: int
    activations: int
    other: int
    total: int
    capacity: int
    fits: bool
    source: str
    stage: int
    cpu_bytes: int
    notes: _containers.RepeatedScalarFieldContainer[str]
    warnings: _containers.RepeatedScalarFieldContainer[str]
    reserved: int
    def __init__(self, parameters: _Optional[int] = ..., gradients: _Optional[int] = ..., optimizer: _Optional[int] = ..., activations: _Optional[int] = ..., other: _Optional[int] = ..., total: _Optional[int] = ..., capacity: _Optional[int] = ..., fits: _Optional[bool] = ..., source: _Optional[str] = ..., stage: _Optional[int] = ..., cpu_bytes: _Optional[int] = ..., notes: _Optional[_Iterable[str]] = ..., warnings: _Optional[_Iterable[str]] = ..., reserved: _Optional[int] = ...) -> None: ...

class EstimateMemoryResponse(_message.Message):
    __slots__ = ("memory", "plan", "gpu", "model_signature", "num_gpus")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    MODEL_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    memory: MemoryBreakdown
    plan: _common_pb2.ExecutionPlan
    gpu: str
    model_signature: str
    num_gpus: int
    def __init__(self, memory: _Optional[_Union[MemoryBreakdown, _Mapping]] = ..., plan: _Optional[_Union[_common_pb2.ExecutionPlan, _Mapping]] = ..., gpu: _Optional[str] = ..., model_signature: _Optional[str] = ..., num_gpus: _Optional[int] = ...) -> None: ...

class GpuPool(_message.Message):
    __slots__ = ("gpu", "num_gpus", "gpus_per_node", "intra_link", "nic_gbps", "pcie_gbps", "price_per_hour", "currency")
    GPU_FIELD_NUMBER: _ClassVar[int]
    NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    INTRA_LINK_FIELD_NUMBER: _ClassVar[int]
    NIC_GBPS_FIELD_NUMBER: _ClassVar[int]
    PCIE_GBPS_FIELD_NUMBER: _ClassVar[int]
    PRICE_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    CURRENCY_FIELD_NUMBER: _ClassVar[int]
    gpu: str
    num_gpus: int
    gpus_per_node: int
    intra_link: IntraLink
    nic_gbps: float
    pcie_gbps: float
    price_per_hour: float
    currency: str
    def __init__(self, gpu: _Optional[str] = ..., num_gpus: _Optional[int] = ..., gpus_per_node: _Optional[int] = ..., intra_link: _Optional[_Union[IntraLink, str]] = ..., nic_gbps: _Optional[float] = ..., pcie_gbps: _Optional[float] = ..., price_per_hour: _Optional[float] = ..., currency: _Optional[str] = ...) -> None: ...

class ClusterSpec(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[GpuPool]
    def __init__(self, pools: _Optional[_Iterable[_Union[GpuPool, _Mapping]]] = ...) -> None: ...

class CellOptions(_message.Message):
    __slots__ = ("max_gpus", "stage_counts", "recompute", "microbatches_per_stage", "num_microbatches", "fsdp")
    MAX_GPUS_FIELD_NUMBER: _ClassVar[int]
    STAGE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTE_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_PER_STAGE_FIELD_NUMBER: _ClassVar[int]
    NUM_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    FSDP_FIELD_NUMBER: _ClassVar[int]
    max_gpus: int
    stage_counts: _containers.RepeatedScalarFieldContainer[int]
    recompute: bool
    microbatches_per_stage: int
    num_microbatches: int
    fsdp: bool
    def __init__(self, max_gpus: _Optional[int] = ..., stage_counts: _Optional[_Iterable[int]] = ..., recompute: _Optional[bool] = ..., microbatches_per_stage: _Optional[int] = ..., num_microbatches: _Optional[int] = ..., fsdp: _Optional[bool] = ...) -> None: ...

class GetCellsRequest(_message.Message):
    __slots__ = ("model", "global_batch_size", "cluster", "precision", "options", "best_only", "recipe")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    BEST_ONLY_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    model: _common_pb2.ModelSpec
    global_batch_size: int
    cluster: ClusterSpec
    precision: _common_pb2.Precision
    options: CellOptions
    best_only: bool
    recipe: _common_pb2.ExecutionPlan
    def __init__(self, model: _Optional[_Union[_common_pb2.ModelSpec, _Mapping]] = ..., global_batch_size: _Optional[int] = ..., cluster: _Optional[_Union[ClusterSpec, _Mapping]] = ..., precision: _Optional[_Union[_common_pb2.Precision, str]] = ..., options: _Optional[_Union[CellOptions, _Mapping]] = ..., best_only: _Optional[bool] = ..., recipe: _Optional[_Union[_common_pb2.ExecutionPlan, _Mapping]] = ...) -> None: ...

class SourcedValue(_message.Message):
    __slots__ = ("value", "source")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    value: float
    source: str
    def __init__(self, value: _Optional[float] = ..., source: _Optional[str] = ...) -> None: ...

class CellStage(_message.Message):
    __slots__ = ("first_operator", "end_operator", "dp", "tp", "compute_seconds", "intra_comm_seconds", "inter_comm_seconds", "sync_seconds", "memory_bytes", "sharding")
    FIRST_OPERATOR_FIELD_NUMBER: _ClassVar[int]
    END_OPERATOR_FIELD_NUMBER: _ClassVar[int]
    DP_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INTRA_COMM_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INTER_COMM_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SYNC_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHARDING_FIELD_NUMBER: _ClassVar[int]
    first_operator: int
    end_operator: int
    dp: int
    tp: int
    compute_seconds: float
    intra_comm_seconds: float
    inter_comm_seconds: float
    sync_seconds: float
    memory_bytes: float
    sharding: str
    def __init__(self, first_operator: _Optional[int] = ..., end_operator: _Optional[int] = ..., dp: _Optional[int] = ..., tp: _Optional[int] = ..., compute_seconds: _Optional[float] = ..., intra_comm_seconds: _Optional[float] = ..., inter_comm_seconds: _Optional[float] = ..., sync_seconds: _Optional[float] = ..., memory_bytes: _Optional[float] = ..., sharding: _Optional[str] = ...) -> None: ...

class CellPlan(_message.Message):
    __slots__ = ("stages", "num_microbatches", "description")
    STAGES_FIELD_NUMBER: _ClassVar[int]
    NUM_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    stages: _containers.RepeatedCompositeFieldContainer[CellStage]
    num_microbatches: int
    description: str
    def __init__(self, stages: _Optional[_Iterable[_Union[CellStage, _Mapping]]] = ..., num_microbatches: _Optional[int] = ..., description: _Optional[str] = ...) -> None: ...

class TimeComponent(_message.Message):
    __slots__ = ("name", "seconds", "source")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    seconds: float
    source: str
    def __init__(self, name: _Optional[str] = ..., seconds: _Optional[float] = ..., source: _Optional[str] = ...) -> None: ...

class Cell(_message.Message):
    __slots__ = ("gpu_type", "num_gpus", "num_stages", "nodes", "gpus_per_node", "fits", "reason", "plan", "execution_plan", "iter_time_seconds", "memory_per_gpu_bytes", "breakdown", "plans_assembled", "plans_feasible", "stage_gpus", "cost_per_hour", "cost_per_iteration", "currency", "memory_needed_per_gpu_bytes")
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    NUM_STAGES_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    FITS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_PLAN_FIELD_NUMBER: _ClassVar[int]
    ITER_TIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PER_GPU_BYTES_FIELD_NUMBER: _ClassVar[int]
    BREAKDOWN_FIELD_NUMBER: _ClassVar[int]
    PLANS_ASSEMBLED_FIELD_NUMBER: _ClassVar[int]
    PLANS_FEASIBLE_FIELD_NUMBER: _ClassVar[int]
    STAGE_GPUS_FIELD_NUMBER: _ClassVar[int]
    COST_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    COST_PER_ITERATION_FIELD_NUMBER: _ClassVar[int]
    CURRENCY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_NEEDED_PER_GPU_BYTES_FIELD_NUMBER: _ClassVar[int]
    gpu_type: str
    num_gpus: int
    num_stages: int
    nodes: int
    gpus_per_node: int
    fits: bool
    reason: str
    plan: CellPlan
    execution_plan: _common_pb2.ExecutionPlan
    iter_time_seconds: SourcedValue
    memory_per_gpu_bytes: SourcedValue
    breakdown: _containers.RepeatedCompositeFieldContainer[TimeComponent]
    plans_assembled: int
    plans_feasible: int
    stage_gpus: _containers.RepeatedScalarFieldContainer[int]
    cost_per_hour: SourcedValue
    cost_per_iteration: SourcedValue
    currency: str
    memory_needed_per_gpu_bytes: SourcedValue
    def __init__(self, gpu_type: _Optional[str] = ..., num_gpus: _Optional[int] = ..., num_stages: _Optional[int] = ..., nodes: _Optional[int] = ..., gpus_per_node: _Optional[int] = ..., fits: _Optional[bool] = ..., reason: _Optional[str] = ..., plan: _Optional[_Union[CellPlan, _Mapping]] = ..., execution_plan: _Optional[_Union[_common_pb2.ExecutionPlan, _Mapping]] = ..., iter_time_seconds: _Optional[_Union[SourcedValue, _Mapping]] = ..., memory_per_gpu_bytes: _Optional[_Union[SourcedValue, _Mapping]] = ..., breakdown: _Optional[_Iterable[_Union[TimeComponent, _Mapping]]] = ..., plans_assembled: _Optional[int] = ..., plans_feasible: _Optional[int] = ..., stage_gpus: _Optional[_Iterable[int]] = ..., cost_per_hour: _Optional[_Union[SourcedValue, _Mapping]] = ..., cost_per_iteration: _Optional[_Union[SourcedValue, _Mapping]] = ..., currency: _Optional[str] = ..., memory_needed_per_gpu_bytes: _Optional[_Union[SourcedValue, _Mapping]] = ...) -> None: ...

class GetCellsResponse(_message.Message):
    __slots__ = ("model_signature", "cells", "warnings")
    MODEL_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    CELLS_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    model_signature: str
    cells: _containers.RepeatedCompositeFieldContainer[Cell]
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model_signature: _Optional[str] = ..., cells: _Optional[_Iterable[_Union[Cell, _Mapping]]] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class PlaceStagesRequest(_message.Message):
    __slots__ = ("model", "global_batch_size", "precision", "stages", "dp", "num_microbatches", "exhaustive", "overlap_sync", "recipe")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    DP_FIELD_NUMBER: _ClassVar[int]
    NUM_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTIVE_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_SYNC_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    model: _common_pb2.ModelSpec
    global_batch_size: int
    precision: _common_pb2.Precision
    stages: _containers.RepeatedCompositeFieldContainer[GpuPool]
    dp: int
    num_microbatches: int
    exhaustive: bool
    overlap_sync: bool
    recipe: _common_pb2.ExecutionPlan
    def __init__(self, model: _Optional[_Union[_common_pb2.ModelSpec, _Mapping]] = ..., global_batch_size: _Optional[int] = ..., precision: _Optional[_Union[_common_pb2.Precision, str]] = ..., stages: _Optional[_Iterable[_Union[GpuPool, _Mapping]]] = ..., dp: _Optional[int] = ..., num_microbatches: _Optional[int] = ..., exhaustive: _Optional[bool] = ..., overlap_sync: _Optional[bool] = ..., recipe: _Optional[_Union[_common_pb2.ExecutionPlan, _Mapping]] = ...) -> None: ...

class PlacedStage(_message.Message):
    __slots__ = ("gpu_type", "layers", "stage", "fits")
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    FITS_FIELD_NUMBER: _ClassVar[int]
    gpu_type: str
    layers: int
    stage: CellStage
    fits: bool
    def __init__(self, gpu_type: _Optional[str] = ..., layers: _Optional[int] = ..., stage: _Optional[_Union[CellStage, _Mapping]] = ..., fits: _Optional[bool] = ...) -> None: ...

class StagePlacement(_message.Message):
    __slots__ = ("stages", "iter_time_seconds", "memory_per_gpu_bytes", "fits", "num_microbatches", "description")
    STAGES_FIELD_NUMBER: _ClassVar[int]
    ITER_TIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PER_GPU_BYTES_FIELD_NUMBER: _ClassVar[int]
    FITS_FIELD_NUMBER: _ClassVar[int]
    NUM_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    stages: _containers.RepeatedCompositeFieldContainer[PlacedStage]
    iter_time_seconds: SourcedValue
    memory_per_gpu_bytes: float
    fits: bool
    num_microbatches: int
    description: str
    def __init__(self, stages: _Optional[_Iterable[_Union[PlacedStage, _Mapping]]] = ..., iter_time_seconds: _Optional[_Union[SourcedValue, _Mapping]] = ..., memory_per_gpu_bytes: _Optional[float] = ..., fits: _Optional[bool] = ..., num_microbatches: _Optional[int] = ..., description: _Optional[str] = ...) -> None: ...

class PlaceStagesResponse(_message.Message):
    __slots__ = ("model_signature", "placement", "optimum", "warnings")
    MODEL_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    OPTIMUM_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    model_signature: str
    placement: StagePlacement
    optimum: StagePlacement
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model_signature: _Optional[str] = ..., placement: _Optional[_Union[StagePlacement, _Mapping]] = ..., optimum: _Optional[_Union[StagePlacement, _Mapping]] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class PerfWorkload(_message.Message):
    __slots__ = ("name", "params", "layers", "hidden", "seq", "global_batch", "fwd_ref_time", "fwd_ref_batch", "fwd_exponent")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    FWD_REF_TIME_FIELD_NUMBER: _ClassVar[int]
    FWD_REF_BATCH_FIELD_NUMBER: _ClassVar[int]
    FWD_EXPONENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    params: float
    layers: int
    hidden: int
    seq: int
    global_batch: int
    fwd_ref_time: float
    fwd_ref_batch: float
    fwd_exponent: float
    def __init__(self, name: _Optional[str] = ..., params: _Optional[float] = ..., layers: _Optional[int] = ..., hidden: _Optional[int] = ..., seq: _Optional[int] = ..., global_batch: _Optional[int] = ..., fwd_ref_time: _Optional[float] = ..., fwd_ref_batch: _Optional[float] = ..., fwd_exponent: _Optional[float] = ...) -> None: ...

class PerfPlan(_message.Message):
    __slots__ = ("dp", "tp", "pp", "zero", "ga_steps", "checkpointing", "micro_batches")
    DP_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    PP_FIELD_NUMBER: _ClassVar[int]
    ZERO_FIELD_NUMBER: _ClassVar[int]
    GA_STEPS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTING_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCHES_FIELD_NUMBER: _ClassVar[int]
    dp: int
    tp: int
    pp: int
    zero: ZeroKind
    ga_steps: int
    checkpointing: bool
    micro_batches: int
    def __init__(self, dp: _Optional[int] = ..., tp: _Optional[int] = ..., pp: _Optional[int] = ..., zero: _Optional[_Union[ZeroKind, str]] = ..., ga_steps: _Optional[int] = ..., checkpointing: _Optional[bool] = ..., micro_batches: _Optional[int] = ...) -> None: ...

class PerfRunConfig(_message.Message):
    __slots__ = ("workload", "plan", "gpus_per_node", "cpus", "fwd_time")
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    FWD_TIME_FIELD_NUMBER: _ClassVar[int]
    workload: PerfWorkload
    plan: PerfPlan
    gpus_per_node: _containers.RepeatedScalarFieldContainer[int]
    cpus: int
    fwd_time: float
    def __init__(self, workload: _Optional[_Union[PerfWorkload, _Mapping]] = ..., plan: _Optional[_Union[PerfPlan, _Mapping]] = ..., gpus_per_node: _Optional[_Iterable[int]] = ..., cpus: _Optional[int] = ..., fwd_time: _Optional[float] = ...) -> None: ...

class PerfSample(_message.Message):
    __slots__ = ("config", "iter_time", "t_cc", "t_oo", "time")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    ITER_TIME_FIELD_NUMBER: _ClassVar[int]
    T_CC_FIELD_NUMBER: _ClassVar[int]
    T_OO_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    config: PerfRunConfig
    iter_time: float
    t_cc: float
    t_oo: float
    time: float
    def __init__(self, config: _Optional[_Union[PerfRunConfig, _Mapping]] = ..., iter_time: _Optional[float] = ..., t_cc: _Optional[float] = ..., t_oo: _Optional[float] = ..., time: _Optional[float] = ...) -> None: ...

class PerfEnvironment(_message.Message):
    __slots__ = ("intra_node_bw", "inter_node_bw", "gpus_per_nic", "pcie_bw", "net_efficiency")
    INTRA_NODE_BW_FIELD_NUMBER: _ClassVar[int]
    INTER_NODE_BW_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_NIC_FIELD_NUMBER: _ClassVar[int]
    PCIE_BW_FIELD_NUMBER: _ClassVar[int]
    NET_EFFICIENCY_FIELD_NUMBER: _ClassVar[int]
    intra_node_bw: float
    inter_node_bw: float
    gpus_per_nic: int
    pcie_bw: float
    net_efficiency: float
    def __init__(self, intra_node_bw: _Optional[float] = ..., inter_node_bw: _Optional[float] = ..., gpus_per_nic: _Optional[int] = ..., pcie_bw: _Optional[float] = ..., net_efficiency: _Optional[float] = ...) -> None: ...

class PerfParams(_message.Message):
    __slots__ = ("k_bwd", "k_sync", "k_opt", "k_os_offload", "k_const", "k_off", "k_swap", "k_host")
    K_BWD_FIELD_NUMBER: _ClassVar[int]
    K_SYNC_FIELD_NUMBER: _ClassVar[int]
    K_OPT_FIELD_NUMBER: _ClassVar[int]
    K_OS_OFFLOAD_FIELD_NUMBER: _ClassVar[int]
    K_CONST_FIELD_NUMBER: _ClassVar[int]
    K_OFF_FIELD_NUMBER: _ClassVar[int]
    K_SWAP_FIELD_NUMBER: _ClassVar[int]
    K_HOST_FIELD_NUMBER: _ClassVar[int]
    k_bwd: float
    k_sync: float
    k_opt: float
    k_os_offload: float
    k_const: float
    k_off: float
    k_swap: float
    k_host: float
    def __init__(self, k_bwd: _Optional[float] = ..., k_sync: _Optional[float] = ..., k_opt: _Optional[float] = ..., k_os_offload: _Optional[float] = ..., k_const: _Optional[float] = ..., k_off: _Optional[float] = ..., k_swap: _Optional[float] = ..., k_host: _Optional[float] = ...) -> None: ...

class FitPerformanceRequest(_message.Message):
    __slots__ = ("request_id", "model_key", "gpu_type", "mode", "samples", "env")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_KEY_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model_key: str
    gpu_type: str
    mode: PerfMode
    samples: _containers.RepeatedCompositeFieldContainer[PerfSample]
    env: PerfEnvironment
    def __init__(self, request_id: _Optional[str] = ..., model_key: _Optional[str] = ..., gpu_type: _Optional[str] = ..., mode: _Optional[_Union[PerfMode, str]] = ..., samples: _Optional[_Iterable[_Union[PerfSample, _Mapping]]] = ..., env: _Optional[_Union[PerfEnvironment, _Mapping]] = ...) -> None: ...

class FitPerformanceResponse(_message.Message):
    __slots__ = ("model_key", "gpu_type", "mode", "params", "rmsle", "num_samples", "source")
    MODEL_KEY_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    RMSLE_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    model_key: str
    gpu_type: str
    mode: PerfMode
    params: PerfParams
    rmsle: float
    num_samples: int
    source: str
    def __init__(self, model_key: _Optional[str] = ..., gpu_type: _Optional[str] = ..., mode: _Optional[_Union[PerfMode, str]] = ..., params: _Optional[_Union[PerfParams, _Mapping]] = ..., rmsle: _Optional[float] = ..., num_samples: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...

class StepTime(_message.Message):
    __slots__ = ("seconds", "time", "iteration")
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    seconds: float
    time: float
    iteration: int
    def __init__(self, seconds: _Optional[float] = ..., time: _Optional[float] = ..., iteration: _Optional[int] = ...) -> None: ...

class ReportStepTimesRequest(_message.Message):
    __slots__ = ("job_id", "model_key", "gpu_type", "mode", "config", "steps", "env", "model", "global_batch_size", "recipe")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_KEY_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    model_key: str
    gpu_type: str
    mode: PerfMode
    config: PerfRunConfig
    steps: _containers.RepeatedCompositeFieldContainer[StepTime]
    env: PerfEnvironment
    model: _common_pb2.ModelSpec
    global_batch_size: int
    recipe: _common_pb2.ExecutionPlan
    def __init__(self, job_id: _Optional[str] = ..., model_key: _Optional[str] = ..., gpu_type: _Optional[str] = ..., mode: _Optional[_Union[PerfMode, str]] = ..., config: _Optional[_Union[PerfRunConfig, _Mapping]] = ..., steps: _Optional[_Iterable[_Union[StepTime, _Mapping]]] = ..., env: _Optional[_Union[PerfEnvironment, _Mapping]] = ..., model: _Optional[_Union[_common_pb2.ModelSpec, _Mapping]] = ..., global_batch_size: _Optional[int] = ..., recipe: _Optional[_Union[_common_pb2.ExecutionPlan, _Mapping]] = ...) -> None: ...

class ReportStepTimesResponse(_message.Message):
    __slots__ = ("params", "predicted_before_seconds", "predicted_seconds", "measured_seconds", "samples_used", "source")
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_BEFORE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEASURED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_USED_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    params: PerfParams
    predicted_before_seconds: float
    predicted_seconds: float
    measured_seconds: float
    samples_used: int
    source: str
    def __init__(self, params: _Optional[_Union[PerfParams, _Mapping]] = ..., predicted_before_seconds: _Optional[float] = ..., predicted_seconds: _Optional[float] = ..., measured_seconds: _Optional[float] = ..., samples_used: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("status", "version", "memory_cache_entries", "cell_cache_entries", "fitted_models", "traced_available")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_CACHE_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    CELL_CACHE_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    FITTED_MODELS_FIELD_NUMBER: _ClassVar[int]
    TRACED_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    status: str
    version: str
    memory_cache_entries: int
    cell_cache_entries: int
    fitted_models: int
    traced_available: bool
    def __init__(self, status: _Optional[str] = ..., version: _Optional[str] = ..., memory_cache_entries: _Optional[int] = ..., cell_cache_entries: _Optional[int] = ..., fitted_models: _Optional[int] = ..., traced_available: _Optional[bool] = ...) -> None: ...

class EstimateTimeRequest(_message.Message):
    __slots__ = ("model", "plan", "gpu", "gpus_per_node", "num_gpus", "global_batch_size")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    model: _common_pb2.ModelSpec
    plan: _common_pb2.ExecutionPlan
    gpu: str
    gpus_per_node: int
    num_gpus: int
    global_batch_size: int
    def __init__(self, model: _Optional[_Union[_common_pb2.ModelSpec, _Mapping]] = ..., plan: _Optional[_Union[_common_pb2.ExecutionPlan, _Mapping]] = ..., gpu: _Optional[str] = ..., gpus_per_node: _Optional[int] = ..., num_gpus: _Optional[int] = ..., global_batch_size: _Optional[int] = ...) -> None: ...

class EstimateTimeResponse(_message.Message):
    __slots__ = ("iter_time_seconds", "breakdown", "source", "tokens_per_second", "memory", "plan", "gpu", "model_signature", "num_gpus", "gpus_per_node")
    ITER_TIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BREAKDOWN_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    MODEL_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    iter_time_seconds: float
    breakdown: _containers.RepeatedCompositeFieldContainer[TimeComponent]
    source: str
    tokens_per_second: float
    memory: MemoryBreakdown
    plan: _common_pb2.ExecutionPlan
    gpu: str
    model_signature: str
    num_gpus: int
    gpus_per_node: int
    def __init__(self, iter_time_seconds: _Optional[float] = ..., breakdown: _Optional[_Iterable[_Union[TimeComponent, _Mapping]]] = ..., source: _Optional[str] = ..., tokens_per_second: _Optional[float] = ..., memory: _Optional[_Union[MemoryBreakdown, _Mapping]] = ..., plan: _Optional[_Union[_common_pb2.ExecutionPlan, _Mapping]] = ..., gpu: _Optional[str] = ..., model_signature: _Optional[str] = ..., num_gpus: _Optional[int] = ..., gpus_per_node: _Optional[int] = ...) -> None: ...
