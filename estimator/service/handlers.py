"""The estimator's API as plain functions over tessera.v1 messages.

`Estimator` answers the requests of the `tessera.v1.Estimator` service (protos/tessera/v1/
estimator.proto) by calling the library: tessera.estimator.memory.estimate_memory, tessera.estimator.cells
(CellEstimator), tessera.estimator.perf_model (fit, refit, predict). The gRPC servicer (estimator/service/server.py)
and `tessctl estimate` without `--estimator` both call it, so both answer the same.

No grpc and no asyncio here, and no torch: a traced-mode request runs in a child process under a
budget (estimator/service/traced_child.py). Bad input raises the library's errors (PlanInputError, CellInputError, PerfModelInputError), each an
InvalidArgument (tessera.common.errors) whose `field` is a request path; the server's interceptor
answers them as INVALID_ARGUMENT "field: reason".

Caches (thread-safe, bounded LRU): memory answers by (model signature, plan, GPU type, mode); Cell
answers by the whole request, over one CellEstimator per Cell configuration (which caches stage
costs and Cells by model signature, plan and GPU type); fitted performance models by (model key,
GPU type); FitPerformance answers by request id. With an `EstimatorState` (estimator/service/state.py), the
fitted models and measured Cells are also written to disk as they are learned and read back at start.
"""

from __future__ import annotations

import importlib.util
import math
import statistics
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import replace
from importlib import metadata
from typing import Generic, TypeVar

from tessera.common.errors import ResourceExhausted
from tessera.common.gpus import UnknownGpuError, lookup
from tessera.common.jobspec import MAX_GLOBAL_BATCH, MODEL_DIMS
from tessera.estimator import perf_model as pm
from tessera.estimator.cell_recipe import JobRecipe, RecipeCells, recipe_cell_model
from tessera.estimator.cells import (
    Cell,
    CellConfig,
    CellEstimator,
    CellInputError,
    CellModel,
    CellsTooSlow,
    ClusterSpec,
    GpuPool,
    StageCost,
    check_recipe_cell,
)
from tessera.estimator.convert import PRECISION, execution_plan, model_dims, plan_message
from tessera.estimator.memory import estimate_memory
from tessera.estimator.plans import PlanInputError
from tessera.estimator.service.learned import MAX_FITTED, MAX_MEASURED, FittedModel, Learned
from tessera.estimator.service.memory_message import i64, memory_message
from tessera.estimator.service.perfmsg import (
    PERF_MODE_VALUE,
    config_key,
    environment,
    in_field,
    params_message,
    perf_mode,
    prefixed,
    run_config,
    sample,
)
from tessera.estimator.service.state import EstimatorState
from tessera.estimator.service.time_handler import estimate_time
from tessera.estimator.service.traced_child import (  # TracedUnavailable: an error of this API
    TRACED_BUDGET_S,
    TracedJob,
    TracedRunner,
    TracedUnavailable,  # noqa: F401
)
from tessera.estimator.stage_placer import HeteroPlan, StagePlacer
from tessera.v1 import estimator_pb2 as pb

MODES: dict[int, str] = {pb.MEMORY_MODE_UNSPECIFIED: "formula", pb.MEMORY_MODE_FORMULA: "formula",
                         pb.MEMORY_MODE_MARP: "marp", pb.MEMORY_MODE_TRACED: "traced",
                         pb.MEMORY_MODE_TRACED_TORCHTITAN: "traced:torchtitan",
                         pb.MEMORY_MODE_TRACED_TRANSFORMERS: "traced:transformers"}
LINKS = {pb.INTRA_LINK_UNSPECIFIED: "", pb.INTRA_LINK_NVLINK: "nvlink", pb.INTRA_LINK_PCIE: "pcie"}
CELL_PRECISION = "mixed"  # CellModel's default recipe
LIVE_WINDOW = 64  # step times kept per (job, model, plan, GPU type) for the online refit
MAX_SERVICE_PLANS = 200_000  # PlaceStages(exhaustive): plans scored by one call
MAX_POOLS = 64  # GPU pools of one request: more than the catalog's types, with room for node sizes
# A Cell's GPUs, and its pipeline stage counts: a request's options are part of the answer cache's
# key and of the CellEstimator's, so unbounded lists (6 MB of stage counts a request) grew the
# service by 80 MB a request, to 1.7 GB in 40 requests.
MAX_CELL_GPUS = 1_024
# Seconds of Cell computation one GetCells of a caller other than the controller may take: within
# the bounds above, the largest model on 8 pools took 57 s. The Cells computed stay cached, so the
# same request asked again goes on from there.
OTHER_CALLER_CELLS_S = 10.0
MAX_STAGE_COUNTS = 64
MAX_MICROBATCHES_PER_STAGE = 1_024  # the paper's is 4; more only lengthens every Cell's search
MAX_LAYERS = dict(MODEL_DIMS)["num_layers"]  # a job model's bound: a stage holds a layer at least
MAX_ANSWER_BYTES = 16 * 1024 * 1024  # gRPC's message limit here (tessera.common.rpc.MAX_MESSAGE_BYTES)
MAX_CACHED_ANSWER_BYTES = 1024 * 1024  # larger answers are computed again rather than kept
# A GetCells request larger than this is answered but not kept: its bytes are the cache's key.
MAX_CACHED_REQUEST_BYTES = 64 * 1024
MAX_FIT_SAMPLES = 4096  # per FitPerformance; Morphling's profiles have a few dozen per model
MAX_MODEL_KEY = 1024  # the controller sends its estimate key: signature, recipe and tenant
MEASURED_SOURCE_NOTE = "estimate (the Cell's time is measured)"


def canonical_gpu(name: str, field: str) -> str:
    """The catalog name of a GPU name or alias; PlanInputError on `field` when unknown."""
    try:
        return lookup(name).name
    except UnknownGpuError as exc:
        raise PlanInputError(field, str(exc)) from None


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Lru(Generic[K, V]):
    """A small thread-safe LRU map."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._d: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: K) -> V | None:
        with self._lock:
            v = self._d.get(key)
            if v is None:
                self.misses += 1
                return None
            self.hits += 1
            self._d.move_to_end(key)
            return v

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._d[key] = value
            self._d.move_to_end(key)
            while len(self._d) > self.size:
                self._d.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._d.clear()

    def __len__(self) -> int:
        return len(self._d)


# -- Cells ------------------------------------------------------------------------------------------


def cluster_spec(c: pb.ClusterSpec, field: str = "cluster") -> ClusterSpec:
    """The library's ClusterSpec; errors name ``cluster.pools[i].FIELD``."""
    if not c.pools:
        raise PlanInputError(f"{field}.pools", "a cluster needs at least one GPU pool")
    if len(c.pools) > MAX_POOLS:
        raise PlanInputError(f"{field}.pools", f"at most {MAX_POOLS} pools, got {len(c.pools):,}")
    return ClusterSpec(tuple(gpu_pool(p, f"{field}.pools[{i}]") for i, p in enumerate(c.pools)))


def gpu_pool(p: pb.GpuPool, where: str) -> GpuPool:
    """The library's GpuPool; errors name ``WHERE.FIELD``."""
    if p.intra_link not in LINKS:
        raise PlanInputError(f"{where}.intra_link", f"unknown value {p.intra_link}")
    if not p.gpu:
        raise PlanInputError(f"{where}.gpu", "required, a catalog GPU name such as A100-80GB")
    try:
        return GpuPool(p.gpu, p.num_gpus, p.gpus_per_node, LINKS[p.intra_link], p.nic_gbps or 12.5,
                       p.pcie_gbps or 32.0,
                       price_per_hour=p.price_per_hour if p.HasField("price_per_hour") else None,
                       currency=p.currency)
    except (CellInputError, UnknownGpuError) as exc:
        raise prefixed(where, exc) from None


def cluster_message(spec: ClusterSpec) -> pb.ClusterSpec:
    link = {"nvlink": pb.INTRA_LINK_NVLINK, "pcie": pb.INTRA_LINK_PCIE}
    return pb.ClusterSpec(pools=[
        pb.GpuPool(gpu=p.gpu, num_gpus=p.num_gpus, gpus_per_node=p.gpus_per_node,
                   intra_link=link[p.intra_link],
                   nic_gbps=p.nic_gbps, pcie_gbps=p.pcie_gbps, price_per_hour=p.price_per_hour,
                   currency=p.currency)
        for p in spec.pools])


def cell_config(o: pb.CellOptions) -> CellConfig:
    if not 0 <= o.max_gpus <= MAX_CELL_GPUS:
        raise PlanInputError("options.max_gpus", f"must be 1..{MAX_CELL_GPUS:,} (0 = 64), got {o.max_gpus:,}")
    if not 0 <= o.microbatches_per_stage <= MAX_MICROBATCHES_PER_STAGE:
        raise PlanInputError("options.microbatches_per_stage", (f"must be 1..{MAX_MICROBATCHES_PER_STAGE:,} (0 = 4), "
                                                                 f"got {o.microbatches_per_stage:,}"))
    if len(o.stage_counts) > MAX_STAGE_COUNTS:
        raise PlanInputError("options.stage_counts", f"at most {MAX_STAGE_COUNTS} values, got {len(o.stage_counts):,}")
    for i, s in enumerate(o.stage_counts):
        if not 1 <= s <= MAX_LAYERS:
            raise PlanInputError(f"options.stage_counts[{i}]", f"must be 1..{MAX_LAYERS:,} (a stage holds a layer "
                                                               f"at least), got {s:,}")
    if o.num_microbatches < 0:
        raise PlanInputError("options.num_microbatches", f"must be >= 1 (0 = chosen per Cell), got {o.num_microbatches}")
    base = CellConfig()
    return replace(base, max_gpus=o.max_gpus or base.max_gpus,
                   microbatches_per_stage=o.microbatches_per_stage or base.microbatches_per_stage,
                   stage_counts=tuple(sorted(set(o.stage_counts))) or None, num_microbatches=o.num_microbatches,
                   fsdp_stages=o.fsdp if o.HasField("fsdp") else base.fsdp_stages)


def cell_model(req: pb.GetCellsRequest) -> CellModel:
    return recipe_cells(req).model


def recipe_cells(req: pb.GetCellsRequest) -> RecipeCells:
    """The request's CellModel: the model, its batch, the Cells' own precision (req.precision, unset =
    mixed) and recomputation (options.recompute), with the job's recipe on top (req.recipe: the fields
    it sets win; estimator/cell_recipe.py), and what the Cells estimate of that recipe only in part."""
    dims = model_dims(req.model)
    if not 1 <= req.global_batch_size <= MAX_GLOBAL_BATCH:
        raise PlanInputError("global_batch_size", f"required, must be 1..{MAX_GLOBAL_BATCH:,} (a job file's bound), "
                                                  f"got {req.global_batch_size}")
    if req.precision and req.precision not in PRECISION:
        raise PlanInputError("precision", f"unknown value {req.precision}")
    if req.precision and not dims.is_transformer:
        raise PlanInputError("precision", f"a {dims.family_word} model has one recipe (float32, SGD with momentum); "
                                          "leave precision unset")
    recompute = req.options.recompute if req.options.HasField("recompute") else True
    recipe = None
    if req.HasField("recipe") and req.recipe.ListFields():
        recipe = JobRecipe(execution_plan(req.recipe), frozenset(d.name for d, _ in req.recipe.ListFields()))
    try:
        # Flash attention unless the recipe says otherwise: what the jobs Tessera launches run, and what
        # the live controller's Cells assume (controller/cell_estimates.py JOB_FLASH_ATTENTION).
        return recipe_cell_model(dims, int(req.global_batch_size), recipe,
                                 precision=PRECISION.get(req.precision, CELL_PRECISION), recompute=recompute,
                                 flash_attention=True)
    except CellInputError as exc:
        raise prefixed("model", exc) from None


def stage_message(sc: StageCost) -> pb.CellStage:
    """One stage's operators, layout, times and memory per GPU."""
    return pb.CellStage(first_operator=sc.plan.start, end_operator=sc.plan.end, dp=sc.plan.dp, tp=sc.plan.tp,
                        sharding=sc.plan.sharding, compute_seconds=sc.compute, intra_comm_seconds=sc.intra_comm,
                        inter_comm_seconds=sc.inter_comm, sync_seconds=sc.sync, memory_bytes=sc.memory_bytes)


def placement_message(p: HeteroPlan) -> pb.StagePlacement:
    srcs = sorted({c.compute_source for c in p.stage_costs} | {c.comm_source for c in p.stage_costs})
    source = "+".join(x for x in srcs if x != "formula:none")
    return pb.StagePlacement(
        stages=[pb.PlacedStage(gpu_type=s.pool.gpu, layers=s.layers, stage=stage_message(c), fits=c.fits)
                for s, c in zip(p.stages, p.stage_costs, strict=True)],
        iter_time_seconds=pb.SourcedValue(value=p.iter_time, source=source), memory_per_gpu_bytes=p.memory_per_gpu,
        fits=p.fits, num_microbatches=p.num_microbatches, description=p.describe())


def cell_message(c: Cell) -> pb.Cell:
    """A Cell as a message; every estimated number carries its source."""
    msg = pb.Cell(gpu_type=c.gpu_type, num_gpus=c.num_gpus, num_stages=c.num_stages, nodes=c.nodes,
                  gpus_per_node=c.gpus_per_node, fits=c.fits, reason=c.reason, plans_assembled=i64(c.plans_assembled),
                  plans_feasible=i64(c.plans_feasible), stage_gpus=list(c.stage_gpus))
    if c.plan is not None:
        msg.plan.CopyFrom(pb.CellPlan(
            stages=[stage_message(sc) for sc in c.stage_costs],
            num_microbatches=c.plan.num_microbatches, description=c.plan.describe()))
    if c.execution_plan is not None:
        msg.execution_plan.CopyFrom(plan_message(c.execution_plan))
    if c.iter_time is not None:
        msg.iter_time_seconds.CopyFrom(pb.SourcedValue(value=c.iter_time.value, source=c.iter_time.source))
    if c.memory_per_gpu is not None:
        msg.memory_per_gpu_bytes.CopyFrom(pb.SourcedValue(value=c.memory_per_gpu.value, source=c.memory_per_gpu.source))
    elif c.memory_needed_per_gpu > 0:
        msg.memory_needed_per_gpu_bytes.CopyFrom(pb.SourcedValue(value=c.memory_needed_per_gpu, source="formula:cells-memory"))
    for name, v in (("cost_per_hour", c.cost_per_hour), ("cost_per_iteration", c.cost_per_iteration)):
        if v is not None:
            getattr(msg, name).CopyFrom(pb.SourcedValue(value=v.value, source=v.source))
    msg.currency = c.currency
    est_source = c.iter_time.source if c.iter_time is not None else ""
    if est_source == "measured":
        est_source = MEASURED_SOURCE_NOTE
    for name, seconds in c.breakdown:
        msg.breakdown.append(pb.TimeComponent(name=name, seconds=seconds, source=est_source))
    return msg


# -- performance model ------------------------------------------------------------------------------


def _bounded_id(value: str, field: str) -> None:
    if len(value) > MAX_MODEL_KEY:  # ids and keys are kept as cache keys (model keys on disk too)
        raise PlanInputError(field, f"at most {MAX_MODEL_KEY} characters, got {len(value):,}")


def _model_key(key: str, named: str) -> str:
    if not key:
        raise PlanInputError("model_key", f"required when {named} has no name")
    _bounded_id(key, "model_key")
    return key


# -- the API ----------------------------------------------------------------------------------------


class Estimator:
    """State behind the Estimator API: caches, Cell estimators, fitted performance models.

    Thread-safe: the service calls it from worker threads. Cell computations are serialised per
    Cell configuration (the controller's apart from other callers') and traced-mode runs are
    serialised, each in a child process killed past `traced_budget_s` seconds (traced_child.py);
    formula and MARP estimates run in parallel.
    """

    def __init__(self, memory_cache_size: int = 4096, cells_cache_size: int = 256, max_cell_configs: int = 16,
                 max_live_windows: int = 4096, state: EstimatorState | None = None,
                 max_fitted: int = MAX_FITTED, max_measured: int = MAX_MEASURED,
                 traced_budget_s: float = TRACED_BUDGET_S, traced_spare: bool = False) -> None:
        self._memory: _Lru[tuple[str, str, str, str], pb.MemoryBreakdown] = _Lru(memory_cache_size)
        self._cells: _Lru[bytes, pb.GetCellsResponse] = _Lru(cells_cache_size)
        # By (the controller's?, configuration): the controller's calls never wait on an estimator's
        # lock that another caller's computation holds (one GetCells within the bounds ran a minute).
        self._cell_estimators: OrderedDict[tuple[bool, CellConfig], tuple[CellEstimator, threading.Lock]] = \
            OrderedDict()
        self._max_cell_configs = max_cell_configs
        self._live: OrderedDict[tuple[Hashable, ...], OrderedDict[str, tuple[float, float]]] = OrderedDict()
        self._seq = 0
        self._max_live = max_live_windows
        self._fits: _Lru[str, pb.FitPerformanceResponse] = _Lru(1024)
        self._lock = threading.Lock()
        self._traced = TracedRunner(traced_budget_s, spare=traced_spare)  # the service keeps a spare
        # What was learned before a restart (fitted models, measured Cells) comes back from `state`.
        self._learned = Learned(state, max_fitted, max_measured)

    # -- EstimateMemory ---------------------------------------------------------------------------

    def estimate_memory(self, req: pb.EstimateMemoryRequest,
                        cancel: threading.Event | None = None) -> pb.EstimateMemoryResponse:
        """Peak bytes per GPU of req.plan for req.model (tessera.estimator.memory.estimate_memory);
        `cancel` set: a traced estimate's child is killed (the caller gave up)."""
        dims = model_dims(req.model)
        dims.require_transformer("the memory estimate")
        plan = execution_plan(req.plan, int(req.global_batch_size))
        if req.num_gpus < 0:
            raise PlanInputError("num_gpus", f"must be >= 1 (0 = dp*tp*pp), got {req.num_gpus}")
        plan.check(num_gpus=req.num_gpus or None, model=dims)
        if req.mode not in MODES:
            raise PlanInputError("mode", f"unknown value {req.mode}")
        mode = MODES[req.mode]
        gpu = canonical_gpu(req.gpu, "gpu") if req.gpu else ""
        key = (dims.signature, plan.key, gpu, mode)
        mem = self._memory.get(key)
        if mem is None:
            if mode.startswith("traced"):
                est = self._traced.run(TracedJob(dims, plan, mode.partition(":")[2], gpu or None), mode, cancel)
            else:
                est = estimate_memory(dims, plan, mode=mode, gpu=gpu or None)
            mem = memory_message(est)  # a figure past int64 saturated and said (memory_message.py)
            self._memory.put(key, mem)
        return pb.EstimateMemoryResponse(memory=mem, plan=plan_message(plan), gpu=gpu, model_signature=dims.signature,
                                         num_gpus=plan.num_gpus)

    # -- EstimateTime -----------------------------------------------------------------------------

    def estimate_time(self, req: pb.EstimateTimeRequest) -> pb.EstimateTimeResponse:
        """Seconds per iteration of req.plan and its memory (estimator/service/time_handler.py)."""
        return estimate_time(req, self.estimate_memory)

    # -- GetCells ---------------------------------------------------------------------------------

    def get_cells(self, req: pb.GetCellsRequest, controller: bool = True) -> pb.GetCellsResponse:
        """All Cells of a job on the cluster's GPU types (or the best per type and count); `controller`:
        the caller is the controller (its Cell computations are kept apart from other callers')."""
        # The key is what the answer depends on: fields this service does not know are dropped (15 MB
        # of an unknown field per call made 256 cached keys of 15 MB each, 2 GB after 120 calls).
        known = pb.GetCellsRequest()
        known.CopyFrom(req)
        known.DiscardUnknownFields()
        key = known.SerializeToString(deterministic=True)
        hit = self._cells.get(key)
        if hit is not None:
            return hit
        got = recipe_cells(req)
        model = got.model
        cluster = cluster_spec(req.cluster)
        config = cell_config(req.options)
        est, lock = self._cell_estimator(config, controller)
        deadline = None if controller else time.monotonic() + OTHER_CALLER_CELLS_S
        with lock:  # computed and kept under the lock a measurement takes to update this estimator
            try:
                cells = est.best_cells(model, cluster, deadline) if req.best_only else \
                    est.cells(model, cluster, deadline)
            except CellsTooSlow as exc:
                raise ResourceExhausted(
                    f"these Cells take over {OTHER_CALLER_CELLS_S:g} s of the service, a bound on callers other than "
                    f"the controller; {exc.done} were computed and kept: ask again to go on, or ask for fewer "
                    f"pools or a smaller options.max_gpus") from None
            resp = pb.GetCellsResponse(model_signature=model.signature, cells=[cell_message(c) for c in cells],
                                       warnings=got.warnings)
            size = resp.ByteSize()
            if size > MAX_ANSWER_BYTES:  # gRPC would refuse to send it, after it was cached
                raise PlanInputError("cluster", f"the answer would be {size:,} bytes, over the {MAX_ANSWER_BYTES:,} "
                                                "a message carries: ask for fewer pools or best_only")
            if size <= MAX_CACHED_ANSWER_BYTES and len(key) <= MAX_CACHED_REQUEST_BYTES:
                self._cells.put(key, resp)
        return resp

    def place_stages(self, req: pb.PlaceStagesRequest) -> pb.PlaceStagesResponse:
        """Espresso's stage placement over the request's mixed stages (and the optimum if asked)."""
        got = recipe_cells(pb.GetCellsRequest(model=req.model, global_batch_size=req.global_batch_size,
                                              precision=req.precision, recipe=req.recipe))
        model = got.model
        if not req.stages:
            raise PlanInputError("stages", "the allocation needs at least one stage (one GpuPool per stage)")
        if len(req.stages) > model.num_layers:  # before the per-stage checks: 1,000,000 stages took 10 s
            raise PlanInputError("stages", f"{len(req.stages)} stages for {model.num_layers} layers")
        pools = [gpu_pool(p, f"stages[{i}]") for i, p in enumerate(req.stages)]
        for pool in pools:  # what the recipe cannot run on (Float8 without FP8 tensor cores, ...)
            try:
                check_recipe_cell(model, pool.gpu_type, len(pools))
            except CellInputError as exc:
                raise PlanInputError(exc.field, exc.reason) from None
        if req.dp < 0 or req.num_microbatches < 0:
            raise PlanInputError("dp" if req.dp < 0 else "num_microbatches", "must be >= 0 (0 = the default)")
        try:
            placer = StagePlacer(model, pools, req.dp or 1, req.num_microbatches or None, overlap_sync=req.overlap_sync)
            # First: a search too large is refused at once. At about 56 us a plan, the library's
            # default of 2,000,000 plans is near two minutes of a service thread; here 200,000.
            optimum = placer.exhaustive(MAX_SERVICE_PLANS) if req.exhaustive else None
            resp = pb.PlaceStagesResponse(model_signature=model.signature, placement=placement_message(placer.place()),
                                          warnings=got.warnings)
            if optimum is not None:
                resp.optimum.CopyFrom(placement_message(optimum))
        except CellInputError as exc:  # the placer's pools are the request's stages
            field = {"family": "model.family"}.get(exc.field, exc.field.replace("pools", "stages"))
            raise PlanInputError(field, exc.reason) from None
        return resp

    def _cell_estimator(self, config: CellConfig, controller: bool) -> tuple[CellEstimator, threading.Lock]:
        with self._lock:
            hit = self._cell_estimators.get((controller, config))
            if hit is not None:
                self._cell_estimators.move_to_end((controller, config))
                return hit
            est = CellEstimator(config)
            for (sig, gpu, n, s), seconds in self._learned.measured():
                est.record_measured(sig, gpu, n, s, seconds)
            entry = (est, threading.Lock())
            self._cell_estimators[(controller, config)] = entry
            while len(self._cell_estimators) > self._max_cell_configs:
                self._cell_estimators.popitem(last=False)
            return entry

    # -- FitPerformance ---------------------------------------------------------------------------

    def fit_performance(self, req: pb.FitPerformanceRequest) -> pb.FitPerformanceResponse:
        """Fit Morphling's model to req.samples (perf_model.fit) and keep it under (model key, GPU
        type). The same request id returns the first answer."""
        _bounded_id(req.request_id, "request_id")
        if req.request_id:
            seen = self._fits.get(req.request_id)
            if seen is not None:
                return seen
        if not req.samples:
            raise PlanInputError("samples", "needs at least one sample")
        if len(req.samples) > MAX_FIT_SAMPLES:  # the fit's cost grows with them (20,000: 80 s of CPU)
            raise PlanInputError("samples", f"at most {MAX_FIT_SAMPLES:,} samples, got {len(req.samples):,}")
        samples = [in_field(f"samples[{i}]", sample, s) for i, s in enumerate(req.samples)]
        mode = perf_mode(req.mode)
        env = in_field("env", environment, req.env)
        gpu = canonical_gpu(req.gpu_type, "gpu_type") if req.gpu_type else ""
        key = _model_key(req.model_key or samples[0].config.workload.name, "the samples' workload")
        params = pm.fit(samples, mode, env)
        err = pm.rmsle(params, samples, mode, env)
        with self._lock:
            self._learned.put_fitted((key, gpu), FittedModel(params, mode, env, tuple(samples)))
        resp = pb.FitPerformanceResponse(model_key=key, gpu_type=gpu, mode=PERF_MODE_VALUE[mode],
                                         params=params_message(params), rmsle=err, num_samples=len(samples),
                                         source=f"fitted:{mode}:rmsle")
        if req.request_id:
            self._fits.put(req.request_id, resp)
        return resp

    def fitted(self, model_key: str, gpu_type: str = "") -> FittedModel | None:
        with self._lock:
            return self._learned.fitted((model_key, gpu_type))

    # -- ReportStepTimes --------------------------------------------------------------------------

    def report_step_times(self, req: pb.ReportStepTimesRequest) -> pb.ReportStepTimesResponse:
        """Online refit (perf_model.refit) of the model kept under (model key, GPU type) from a
        running job's step times; returns the prediction for the job's configuration before and
        after. Without a fitted model the refit starts from the prior (DEFAULT_PARAMS)."""
        _bounded_id(req.job_id, "job_id")
        cfg = in_field("config", run_config, req.config)
        if not req.steps:
            raise PlanInputError("steps", "needs at least one step time")
        for i, st in enumerate(req.steps):  # all checked before any is kept
            if not (math.isfinite(st.seconds) and st.seconds > 0):
                raise PlanInputError(f"steps[{i}].seconds", f"must be a finite number > 0, got {st.seconds!r}")
            if not (math.isfinite(st.time) and st.time >= 0):
                raise PlanInputError(f"steps[{i}].time", f"must be a finite number >= 0 (0 = unknown), got {st.time!r}")
        gpu = canonical_gpu(req.gpu_type, "gpu_type") if req.gpu_type else ""
        key = _model_key(req.model_key or cfg.workload.name, "the workload")
        cell_sig = None
        if req.HasField("model"):
            if not gpu:
                raise PlanInputError("gpu_type", "required with model (the Cell's GPU type)")
            cell_sig = cell_model(pb.GetCellsRequest(model=req.model, global_batch_size=req.global_batch_size,
                                                     recipe=req.recipe)).signature
        with self._lock:
            fitted = self._learned.fitted((key, gpu))
            mode = perf_mode(req.mode) if req.mode else (fitted.mode if fitted else "tessera")
            params = fitted.params if fitted else pm.DEFAULT_PARAMS
            if mode == "tessera" and params.k_host == 0:
                params = replace(params, k_host=pm.DEFAULT_PARAMS.k_host)
            env = in_field("env", environment, req.env) if req.HasField("env") else (fitted.env if fitted else pm.DEFAULT_ENV)
            base = fitted.samples if fitted else ()
            wkey = (req.job_id or key, key, gpu, config_key(cfg))
            window = self._live.setdefault(wkey, OrderedDict())
            self._live.move_to_end(wkey)
            for st in req.steps:
                self._seq += 1
                window[f"i{st.iteration}" if st.iteration else f"s{self._seq}"] = (st.seconds, st.time or self._seq)
            while len(window) > LIVE_WINDOW:
                window.popitem(last=False)
            while len(self._live) > self._max_live:
                self._live.popitem(last=False)
            steps = list(window.values())
        live = [pm.Sample(cfg, s, time=t) for s, t in steps]
        before = pm.predict(params, cfg, mode, env)
        new = pm.refit(params, live, mode, env, base_samples=base)
        after = pm.predict(new, cfg, mode, env)
        measured = statistics.median(s for s, _ in steps)
        mkey = (cell_sig, gpu, cfg.plan.gpus, cfg.plan.pp) if cell_sig is not None else None
        dropped: list[tuple[str, str, int, int]] = []
        with self._lock:
            self._learned.put_fitted((key, gpu), FittedModel(new, mode, env, base))
            estimators = list(self._cell_estimators.items())
            if mkey is not None:  # estimators made from now on start with it
                dropped = self._learned.put_measured(mkey, measured)
        if mkey is not None:
            # Outside self._lock (a Cell computation may hold an estimator's lock for a while, and
            # Health takes self._lock on the event loop); each estimator under its own lock.
            for (controller, config), (est, lock) in estimators:
                # Another caller's estimator busy with a computation is dropped rather than waited
                # for: the next call builds it again with everything learned.
                if not lock.acquire(blocking=controller):
                    with self._lock:
                        if self._cell_estimators.get((controller, config), (None,))[0] is est:
                            del self._cell_estimators[(controller, config)]
                    continue
                try:
                    est.record_measured(*mkey, measured)
                    for d in dropped:
                        est.forget_measured(*d)
                finally:
                    lock.release()
            self._cells.clear()
        return pb.ReportStepTimesResponse(params=params_message(new), predicted_before_seconds=before,
                                          predicted_seconds=after, measured_seconds=measured,
                                          samples_used=len(live), source=f"fitted:{mode}:refit")

    # -- Health -----------------------------------------------------------------------------------

    def close(self) -> None:
        self._traced.close()

    def health(self) -> pb.HealthResponse:
        with self._lock:
            cells = sum(e.misses for e, _ in self._cell_estimators.values())
            fitted = self._learned.num_fitted()
        return pb.HealthResponse(status="SERVING", version=version(), memory_cache_entries=len(self._memory),
                                 cell_cache_entries=cells, fitted_models=fitted,
                                 traced_available=importlib.util.find_spec("torch") is not None)


def version() -> str:
    try:
        return metadata.version("tessera")
    except metadata.PackageNotFoundError:
        return "unknown"
