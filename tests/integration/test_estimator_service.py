"""The Estimator gRPC service on loopback: a real asyncio server (tessera.common.rpc, 127.0.0.1:0) over
tessera.estimator.service.handlers; its answers equal the library's, bad input is INVALID_ARGUMENT naming the field,
the performance model is fitted and refitted online, and a slow call does not block the loop.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from tessera.common import rpc
from tessera.common.identity import CONTROLLER, ESTIMATOR
from tessera.common.localcluster import tls_config
from tessera.estimator import perf_model as pm
from tessera.estimator.cells import CellEstimator, CellModel, ClusterSpec, GpuPool
from tessera.estimator.convert import model_dims
from tessera.estimator.memory import estimate_memory
from tessera.estimator.models import REGISTERED, ModelDims
from tessera.estimator.plans import ExecutionPlan
from tessera.estimator.service.handlers import Estimator
from tessera.estimator.service.main import authorize
from tessera.estimator.service.perfmsg import params_of, run_config
from tessera.estimator.service.server import EstimatorService
from tessera.estimator.service.state import EstimatorState, StateError
from tessera.estimator.stage_placer import StagePlacer
from tessera.v1 import common_pb2 as c
from tessera.v1 import estimator_pb2 as pb
from tessera.v1 import estimator_pb2_grpc


@dataclass
class Server:
    stub: estimator_pb2_grpc.EstimatorStub
    service: EstimatorService
    port: int = 0


async def _serve(estimator: Estimator) -> AsyncIterator[Server]:
    service = EstimatorService(estimator)
    server, port = rpc.aio_server("127.0.0.1:0", [(estimator_pb2_grpc.add_EstimatorServicer_to_server, service)],
                                  [rpc.Authorize(authorize)], name="estimator", tls=tls_config(ESTIMATOR))
    await server.start()
    channel = rpc.aio_channel(f"127.0.0.1:{port}", tls=tls_config(CONTROLLER), peer=ESTIMATOR)
    try:
        yield Server(estimator_pb2_grpc.EstimatorStub(channel), service, port)
    finally:
        await channel.close()
        await rpc.stop_server(server, grace=0)


@pytest.fixture
async def srv() -> AsyncIterator[Server]:
    async for s in _serve(Estimator()):
        yield s


GPT = c.ModelSpec(name="gpt2-small")
SMALL = c.ModelSpec(hidden_size=128, num_layers=4, num_heads=4, vocab_size=512, seq_length=64)
LLAMA_LIKE = c.ModelSpec(hidden_size=256, num_layers=4, num_heads=8, vocab_size=1000, seq_length=128, gated=True,
                         ffn_hidden=688, num_kv_heads=4, untied_embeddings=True)
MOE = c.ModelSpec(hidden_size=256, num_layers=4, num_heads=8, vocab_size=1000, seq_length=128,
                  family=c.MODEL_FAMILY_MOE, num_experts=8, top_k=2)


# -- memory -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "plan", "lib_plan", "mode"), [
    (GPT, c.ExecutionPlan(dp=2, micro_batch=4, sharding=c.SHARDING_ZERO2), ExecutionPlan(dp=2, micro_batch=4,
                                                                                          grad_accum=2,
                                                                                          sharding="zero2"),
     pb.MEMORY_MODE_FORMULA),
    (SMALL, c.ExecutionPlan(tp=2, pp=2, micro_batch=2, checkpointing=c.CHECKPOINTING_SELECTIVE,
                            sequence_parallel=True, flash_attention=False),
     ExecutionPlan(tp=2, pp=2, micro_batch=2, grad_accum=8, checkpointing="selective", sequence_parallel=True,
                   flash_attention=False), pb.MEMORY_MODE_UNSPECIFIED),
    (LLAMA_LIKE, c.ExecutionPlan(dp=4, micro_batch=1, precision=c.PRECISION_BF16, sharding=c.SHARDING_FSDP),
     ExecutionPlan(dp=4, micro_batch=1, grad_accum=4, precision="bf16", sharding="fsdp"), pb.MEMORY_MODE_FORMULA),
    (MOE, c.ExecutionPlan(dp=4, ep=4, micro_batch=2, offload=c.OFFLOAD_OPTIMIZER, sharding=c.SHARDING_ZERO1),
     ExecutionPlan(dp=4, ep=4, micro_batch=2, grad_accum=2, offload="optimizer", sharding="zero1"),
     pb.MEMORY_MODE_FORMULA),
    (GPT, c.ExecutionPlan(tp=4, micro_batch=2), ExecutionPlan(tp=4, micro_batch=2, grad_accum=8), pb.MEMORY_MODE_MARP),
])
async def test_memory_equals_the_library(srv: Server, spec: c.ModelSpec, plan: c.ExecutionPlan,
                                         lib_plan: ExecutionPlan, mode: int) -> None:
    req = pb.EstimateMemoryRequest(model=spec, plan=plan, gpu="a100-80gb", mode=mode, global_batch_size=16)
    resp = await srv.stub.EstimateMemory(req)
    dims = model_dims(spec)
    lib = estimate_memory(dims, lib_plan, mode={2: "marp"}.get(mode, "formula"), gpu="A100-80GB")
    m = resp.memory
    got = (m.parameters, m.gradients, m.optimizer, m.activations, m.other, m.total, m.capacity, m.fits, m.source,
           m.stage, m.cpu_bytes, list(m.notes), m.reserved, list(m.warnings))
    want = (lib.parameters, lib.gradients, lib.optimizer, lib.activations, lib.other, lib.total, lib.capacity_bytes,
            lib.fits, lib.source, lib.stage, lib.cpu_bytes, list(lib.notes), lib.reserved, list(lib.warnings))
    assert got == want
    assert resp.gpu == "A100-80GB" and resp.num_gpus == lib_plan.num_gpus
    assert resp.model_signature == dims.signature
    again = await srv.stub.EstimateMemory(req)  # the cached answer is the same answer
    assert again == resp


async def test_memory_registered_moe_and_no_gpu(srv: Server) -> None:
    resp = await srv.stub.EstimateMemory(pb.EstimateMemoryRequest(
        model=c.ModelSpec(name="moe-1.3b"), plan=c.ExecutionPlan(dp=8, ep=8, micro_batch=1, grad_accum=4)))
    lib = estimate_memory(REGISTERED["moe-1.3b"], ExecutionPlan(dp=8, ep=8, grad_accum=4))
    assert resp.memory.total == lib.total
    assert not resp.memory.HasField("fits") and resp.memory.capacity == 0 and resp.gpu == ""


# -- Cells ------------------------------------------------------------------------------------------

CLUSTER = pb.ClusterSpec(pools=[
    pb.GpuPool(gpu="A100-40GB", num_gpus=16, gpus_per_node=4, price_per_hour=1.5, currency="USD"),
    pb.GpuPool(gpu="V100", num_gpus=16, gpus_per_node=8),
    pb.GpuPool(gpu="a40", num_gpus=8, gpus_per_node=2, intra_link=pb.INTRA_LINK_PCIE),
    pb.GpuPool(gpu="A10-24GB", num_gpus=8, gpus_per_node=2, nic_gbps=3.125),
])
LIB_CLUSTER = ClusterSpec.from_mapping({"pools": [
    {"gpu": "A100-40GB", "num_gpus": 16, "gpus_per_node": 4, "price_per_hour": 1.5, "currency": "USD"},
    {"gpu": "V100", "num_gpus": 16, "gpus_per_node": 8},
    {"gpu": "a40", "num_gpus": 8, "gpus_per_node": 2, "intra_link": "pcie"},
    {"gpu": "A10-24GB", "num_gpus": 8, "gpus_per_node": 2, "nic_gbps": 3.125},
]})


async def test_cells_equal_the_library(srv: Server) -> None:
    req = pb.GetCellsRequest(model=c.ModelSpec(name="gpt2-medium"), global_batch_size=64, cluster=CLUSTER)
    resp = await srv.stub.GetCells(req)
    model = CellModel.from_dims(REGISTERED["gpt2-medium"], 64, flash_attention=True)
    lib = CellEstimator().cells(model, LIB_CLUSTER)
    assert resp.model_signature == model.signature
    assert len(resp.cells) == len(lib) > 20
    assert {x.gpu_type for x in resp.cells} == {"A100-40GB", "V100-32GB", "A40-48GB", "A10-24GB"}
    assert any(w.fits for w in lib)  # else the checks under `if want.fits` below would check nothing
    for got, want in zip(resp.cells, lib, strict=True):
        assert (got.gpu_type, got.num_gpus, got.num_stages, got.nodes, got.gpus_per_node, got.fits, got.reason) == (
            want.gpu_type, want.num_gpus, want.num_stages, want.nodes, want.gpus_per_node, want.fits, want.reason)
        assert got.HasField("cost_per_hour") == (want.cost_per_hour is not None) == (got.gpu_type == "A100-40GB")
        if want.cost_per_hour is not None:
            assert (got.cost_per_hour.value, got.cost_per_hour.source, got.currency) == (
                want.cost_per_hour.value, "cluster", "USD")
        if want.cost_per_iteration is not None:
            assert got.cost_per_iteration.value == want.cost_per_iteration.value
        if want.fits:
            assert want.iter_time is not None and want.memory_per_gpu is not None and want.plan is not None
            assert got.iter_time_seconds.value == want.iter_time.value
            assert got.iter_time_seconds.source == want.iter_time.source and got.iter_time_seconds.source
            assert got.memory_per_gpu_bytes.value == want.memory_per_gpu.value
            assert got.memory_per_gpu_bytes.source == want.memory_per_gpu.source
            assert got.plan.description == want.plan.describe()
            assert [(s.dp, s.tp) for s in got.plan.stages] == [(s.dp, s.tp) for s in want.plan.stages]
            assert [(s.compute_seconds, s.intra_comm_seconds, s.inter_comm_seconds, s.sync_seconds, s.memory_bytes)
                    for s in got.plan.stages] == [(x.compute, x.intra_comm, x.inter_comm, x.sync, x.memory_bytes)
                                                  for x in want.stage_costs]
            assert {b.name: b.seconds for b in got.breakdown} == dict(want.breakdown)
            assert got.breakdown and all(b.source == want.iter_time.source for b in got.breakdown)
    best = await srv.stub.GetCells(pb.GetCellsRequest(model=req.model, global_batch_size=64, cluster=CLUSTER,
                                                      best_only=True))
    want_best = CellEstimator().best_cells(model, LIB_CLUSTER)
    assert [(x.gpu_type, x.num_gpus, x.num_stages) for x in best.cells] == [
        (x.gpu_type, x.num_gpus, x.num_stages) for x in want_best]
    assert await srv.stub.GetCells(req) == resp  # cached


async def test_wide_resnet_cells_equal_the_library_and_its_memory_is_refused(srv: Server) -> None:
    req = pb.GetCellsRequest(model=c.ModelSpec(name="wide-resnet-500m"), global_batch_size=256, cluster=CLUSTER,
                             best_only=True)
    resp = await srv.stub.GetCells(req)
    model = CellModel.from_dims(REGISTERED["wide-resnet-500m"], 256)
    want = CellEstimator().best_cells(model, LIB_CLUSTER)
    assert model.family == "wresnet" and resp.model_signature == model.signature
    assert [(x.gpu_type, x.num_gpus, x.num_stages, x.iter_time_seconds.value) for x in resp.cells] == [
        (x.gpu_type, x.num_gpus, x.num_stages, x.iter_time.value) for x in want if x.iter_time]
    assert resp.cells and not any(x.HasField("execution_plan") for x in resp.cells)  # no worker plan
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await srv.stub.EstimateMemory(pb.EstimateMemoryRequest(model=req.model, plan=c.ExecutionPlan(),
                                                               global_batch_size=256))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith("model.family: the memory estimate covers transformers")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await srv.stub.GetCells(pb.GetCellsRequest(model=req.model, global_batch_size=256, cluster=CLUSTER,
                                                   precision=c.PRECISION_MIXED))
    assert (err.value.details() or "").startswith("precision: a wide_resnet model has one recipe")


async def test_stage_placement_equals_the_library(srv: Server) -> None:
    a6000 = pb.GpuPool(gpu="A6000", num_gpus=8, gpus_per_node=4, intra_link=pb.INTRA_LINK_PCIE, nic_gbps=0.3125)
    a4000 = pb.GpuPool(gpu="A4000", num_gpus=8, gpus_per_node=4, nic_gbps=0.3125)
    req = pb.PlaceStagesRequest(model=c.ModelSpec(name="gpt2-medium"), global_batch_size=32,
                                stages=[a4000, a6000, a6000], dp=2, exhaustive=True)
    resp = await srv.stub.PlaceStages(req)
    pools = [GpuPool("A4000", 8, 4, nic_gbps=0.3125), GpuPool("A6000", 8, 4, "pcie", nic_gbps=0.3125)]
    placer = StagePlacer(CellModel.from_dims(REGISTERED["gpt2-medium"], 32, flash_attention=True), [pools[0], pools[1], pools[1]], 2)
    for got, want in ((resp.placement, placer.place()), (resp.optimum, placer.exhaustive())):
        assert got.description == want.describe() and got.iter_time_seconds.value == want.iter_time
        assert got.fits == want.fits and got.memory_per_gpu_bytes == want.memory_per_gpu
        assert [(s.gpu_type, s.layers, s.stage.compute_seconds) for s in got.stages] == [
            (s.pool.gpu, s.layers, c.compute) for s, c in zip(want.stages, want.stage_costs, strict=True)]
        assert got.iter_time_seconds.source.startswith("formula:")
    assert resp.optimum.iter_time_seconds.value <= resp.placement.iter_time_seconds.value
    assert not (await srv.stub.PlaceStages(pb.PlaceStagesRequest(
        model=req.model, global_batch_size=32, stages=[a4000, a6000], dp=2))).HasField("optimum")


async def test_cells_that_do_not_fit_say_why(srv: Server) -> None:
    req = pb.GetCellsRequest(model=c.ModelSpec(name="llama2-13b"), global_batch_size=8, cluster=pb.ClusterSpec(
        pools=[pb.GpuPool(gpu="A10", num_gpus=4, gpus_per_node=2)]), options=pb.CellOptions(max_gpus=2))
    resp = await srv.stub.GetCells(req)
    assert resp.cells and not any(x.fits for x in resp.cells)
    assert all(x.reason.startswith("memory: needs ") for x in resp.cells)
    assert not any(x.HasField("iter_time_seconds") for x in resp.cells)
    # The least a plan needs, as the reason says it (to its 0.1 GB) and more than an A10 holds.
    for x in resp.cells:
        need = x.memory_needed_per_gpu_bytes
        assert need.source == "formula:cells-memory" and not x.HasField("memory_per_gpu_bytes")
        assert 24e9 < need.value and f"needs {need.value / 1e9:.1f} GB per GPU" in x.reason


# -- bad input --------------------------------------------------------------------------------------

PLAN2 = c.ExecutionPlan(dp=2)


@pytest.mark.parametrize(("method", "request_", "field"), [
    ("EstimateMemory", pb.EstimateMemoryRequest(model=c.ModelSpec(hidden_size=0, num_layers=2, num_heads=2,
                                                                  vocab_size=10, seq_length=8)), "model.hidden_size"),
    ("EstimateMemory", pb.EstimateMemoryRequest(model=c.ModelSpec(hidden_size=64, num_layers=-2, num_heads=2,
                                                                  vocab_size=10, seq_length=8)), "model.num_layers"),
    ("EstimateMemory", pb.EstimateMemoryRequest(model=c.ModelSpec(hidden_size=100, num_layers=2, num_heads=3,
                                                                  vocab_size=10, seq_length=8)), "model.num_heads"),
    ("EstimateMemory", pb.EstimateMemoryRequest(model=GPT, plan=PLAN2, num_gpus=4), "num_gpus"),
    ("EstimateMemory", pb.EstimateMemoryRequest(model=GPT, plan=PLAN2, gpu="Z9000"), "gpu"),
    ("EstimateMemory", pb.EstimateMemoryRequest(model=GPT, plan=c.ExecutionPlan(tp=5)), "plan.tp"),
    ("EstimateMemory", pb.EstimateMemoryRequest(model=GPT, plan=c.ExecutionPlan(dp=-1)), "plan.dp"),
    ("EstimateMemory", pb.EstimateMemoryRequest(model=GPT, plan=c.ExecutionPlan(dp=2, grad_accum=3),
                                                global_batch_size=16), "plan"),
    ("EstimateMemory", pb.EstimateMemoryRequest(model=c.ModelSpec(name="gpt9")), "model.name"),
    ("EstimateMemory", pb.EstimateMemoryRequest(model=c.ModelSpec(hidden_size=64, num_layers=2, num_heads=2,
                                                                  vocab_size=10, seq_length=8,
                                                                  family=c.MODEL_FAMILY_MOE)), "model.num_experts"),
    ("GetCells", pb.GetCellsRequest(model=GPT, global_batch_size=8, cluster=pb.ClusterSpec(
        pools=[pb.GpuPool(gpu="A100", num_gpus=4, gpus_per_node=4), pb.GpuPool(gpu="B300", num_gpus=4,
                                                                             gpus_per_node=4)])),
     "cluster.pools[1].gpu"),
    ("GetCells", pb.GetCellsRequest(model=GPT, global_batch_size=8, cluster=pb.ClusterSpec(
        pools=[pb.GpuPool(gpu="A100", num_gpus=0, gpus_per_node=4)])), "cluster.pools[0].num_gpus"),
    ("GetCells", pb.GetCellsRequest(model=GPT, global_batch_size=8, cluster=pb.ClusterSpec(
        pools=[pb.GpuPool(gpu="A100", num_gpus=4, gpus_per_node=4, price_per_hour=-2)])),
     "cluster.pools[0].price_per_hour"),
    ("GetCells", pb.GetCellsRequest(model=GPT, global_batch_size=8, cluster=pb.ClusterSpec(
        pools=[pb.GpuPool(gpu="A100", num_gpus=4, gpus_per_node=4, price_per_hour=2, currency="dollars")])),
     "cluster.pools[0].currency"),
    ("GetCells", pb.GetCellsRequest(model=GPT, cluster=CLUSTER), "global_batch_size"),
    ("GetCells", pb.GetCellsRequest(model=c.ModelSpec(hidden_size=96, num_layers=2, num_heads=5, vocab_size=10,
                                                      seq_length=8), global_batch_size=8, cluster=CLUSTER),
     "model.num_heads"),
    ("GetCells", pb.GetCellsRequest(model=GPT, global_batch_size=8), "cluster.pools"),
    ("PlaceStages", pb.PlaceStagesRequest(model=GPT, global_batch_size=8), "stages"),
    ("PlaceStages", pb.PlaceStagesRequest(model=GPT, global_batch_size=8, stages=[pb.GpuPool(
        gpu="A100", num_gpus=4, gpus_per_node=4), pb.GpuPool(gpu="Q1", num_gpus=4, gpus_per_node=4)]), "stages[1].gpu"),
    ("PlaceStages", pb.PlaceStagesRequest(model=GPT, global_batch_size=64, dp=4, stages=[pb.GpuPool(
        gpu="A100", num_gpus=2, gpus_per_node=2)]), "stages[0]"),
    ("PlaceStages", pb.PlaceStagesRequest(model=GPT, global_batch_size=8, dp=4, stages=[pb.GpuPool(
        gpu="A100", num_gpus=4, gpus_per_node=4)]), "dp"),
    ("PlaceStages", pb.PlaceStagesRequest(model=c.ModelSpec(name="wide-resnet-500m"), global_batch_size=64,
                                          stages=[pb.GpuPool(gpu="A100", num_gpus=1, gpus_per_node=1)]),
     "model.family"),
    ("PlaceStages", pb.PlaceStagesRequest(model=c.ModelSpec(name="gpt2-xl"), global_batch_size=64, exhaustive=True,
                                          stages=[pb.GpuPool(gpu=g, num_gpus=1, gpus_per_node=1)
                                                  for g in ("A100", "A40", "A10", "V100", "A30", "L4")]),
     "exhaustive"),
    ("FitPerformance", pb.FitPerformanceRequest(), "samples"),
    ("ReportStepTimes", pb.ReportStepTimesRequest(), "config.workload.params"),
    # Hostile input an audit sent (2026-11-27): a NaN bandwidth looped a worker thread forever (NaN !=
    # NaN in the Cell search), a batch of 1e16 ran a divisor search for 45 s under the configuration's
    # lock, 10^7 data-parallel ranks held 1.85 GB.
    ("GetCells", pb.GetCellsRequest(model=GPT, global_batch_size=8, cluster=pb.ClusterSpec(pools=[pb.GpuPool(
        gpu="H100", num_gpus=16, gpus_per_node=8, intra_link=pb.INTRA_LINK_PCIE, pcie_gbps=math.nan)])),
     "cluster.pools[0].pcie_gbps"),
    ("GetCells", pb.GetCellsRequest(model=GPT, global_batch_size=8, cluster=pb.ClusterSpec(pools=[pb.GpuPool(
        gpu="H100", num_gpus=16, gpus_per_node=8, nic_gbps=math.inf)])), "cluster.pools[0].nic_gbps"),
    ("GetCells", pb.GetCellsRequest(model=GPT, global_batch_size=8, cluster=pb.ClusterSpec(pools=[pb.GpuPool(
        gpu="H100", num_gpus=2**31 - 1, gpus_per_node=2**30)])), "cluster.pools[0].gpus_per_node"),
    ("GetCells", pb.GetCellsRequest(model=GPT, global_batch_size=10**16, cluster=CLUSTER), "global_batch_size"),
    ("EstimateMemory", pb.EstimateMemoryRequest(model=GPT, plan=c.ExecutionPlan(dp=10**7)), "plan.dp"),
    ("EstimateMemory", pb.EstimateMemoryRequest(model=GPT, plan=c.ExecutionPlan(dp=2**16, tp=2**16)), "plan"),
    ("GetCells", pb.GetCellsRequest(model=GPT, global_batch_size=8, cluster=pb.ClusterSpec(pools=[pb.GpuPool(
        gpu="A100", num_gpus=4, gpus_per_node=4)] * 65)), "cluster.pools"),
    # And another (the same day): 6 MB of stage counts a request grew the service to 1.7 GB in 40
    # requests (the options are part of its caches' keys); max_gpus had no upper bound.
    ("GetCells", pb.GetCellsRequest(model=GPT, global_batch_size=8, cluster=CLUSTER,
                                    options=pb.CellOptions(stage_counts=range(1, 66))), "options.stage_counts"),
    ("GetCells", pb.GetCellsRequest(model=GPT, global_batch_size=8, cluster=CLUSTER,
                                    options=pb.CellOptions(stage_counts=[2, 2_000_000])), "options.stage_counts[1]"),
    ("GetCells", pb.GetCellsRequest(model=GPT, global_batch_size=8, cluster=CLUSTER,
                                    options=pb.CellOptions(max_gpus=1025)), "options.max_gpus"),
    ("EstimateMemory", pb.EstimateMemoryRequest(model=GPT, plan=c.ExecutionPlan(lora_rank=2**31 - 1)),
     "plan.lora_rank"),  # a 316 TB "estimate"; job files stop at 65,536
    ("FitPerformance", pb.FitPerformanceRequest(request_id="r" * 2000), "request_id"),
    ("ReportStepTimes", pb.ReportStepTimesRequest(job_id="j" * 2000), "job_id"),
])
async def test_bad_input_is_invalid_argument_naming_the_field(srv: Server, method: str, request_: object,
                                                              field: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await getattr(srv.stub, method)(request_)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(f"{field}: "), err.value.details()


async def test_a_total_past_int64_is_saturated_not_internal(srv: Server) -> None:
    """The largest MoE model a job file admits needs about 1.2e19 bytes per GPU: the answer holds
    the int64 maximum (it does not fit anything), where the service used to fail with INTERNAL."""
    huge = c.ModelSpec(hidden_size=65536, num_layers=1024, num_heads=1024, vocab_size=4_000_000,
                       seq_length=1_048_576, family=c.MODEL_FAMILY_MOE, num_experts=4096, top_k=4096, moe_every=1,
                       ffn_hidden=1_048_576)
    got = await srv.stub.EstimateMemory(pb.EstimateMemoryRequest(model=huge, gpu="H100"))
    assert got.memory.total == 2**63 - 1 and not got.memory.fits


def _count(method: str, code: str) -> float:
    return REGISTRY.get_sample_value("tessera_estimator_requests_total", {"method": method, "code": code}) or 0.0


async def test_a_bug_is_internal_without_its_text_and_every_outcome_is_counted(
    srv: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = {code: _count("GetCells", code) for code in ("INTERNAL", "INVALID_ARGUMENT", "OK")}

    def bug(request: object) -> None:
        raise ZeroDivisionError("secret internals")

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await srv.stub.GetCells(pb.GetCellsRequest(model=GPT))  # no batch size: refused by the library
    assert (err.value.code(), err.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT, "global_batch_size: required, must be 1..1,048,576 (a job file's bound), got 0")
    monkeypatch.setattr(srv.service.estimator, "get_cells", bug)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await srv.stub.GetCells(pb.GetCellsRequest(model=GPT))
    assert (err.value.code(), err.value.details()) == (
        grpc.StatusCode.INTERNAL, "GetCells failed; see the estimator log")
    after = {code: _count("GetCells", code) for code in before}
    assert {k: after[k] - before[k] for k in before} == {"INTERNAL": 1, "INVALID_ARGUMENT": 1, "OK": 0}


# -- performance model ------------------------------------------------------------------------------

WORKLOAD = pb.PerfWorkload(name="gpt-1.3b", params=1.3e9, layers=24, hidden=2048, seq=1024, global_batch=64,
                           fwd_ref_time=0.06)
TRUTH = replace(pm.DEFAULT_PARAMS, k_bwd=2.3, k_sync=3.0, k_opt=8e-11, k_const=0.03)
PROFILE = [  # (dp, tp, pp, ga, zero, gpus per node)
    (1, 1, 1, 1, pb.ZERO_KIND_NONE, [1]), (2, 1, 1, 1, pb.ZERO_KIND_NONE, [2]), (4, 1, 1, 2, pb.ZERO_KIND_NONE, [4]),
    (8, 1, 1, 1, pb.ZERO_KIND_ZERO_DP, [8]), (4, 2, 1, 1, pb.ZERO_KIND_NONE, [8]),
    (2, 2, 2, 1, pb.ZERO_KIND_NONE, [4, 4]), (16, 1, 1, 1, pb.ZERO_KIND_NONE, [8, 8]),
]


def _config(dp: int, tp: int, pp: int, ga: int, zero: int, per_node: list[int]) -> pb.PerfRunConfig:
    return pb.PerfRunConfig(workload=WORKLOAD, plan=pb.PerfPlan(dp=dp, tp=tp, pp=pp, ga_steps=ga, zero=zero,  # type: ignore[arg-type]
                                                                micro_batches=4 if pp > 1 else 1),
                            gpus_per_node=per_node)


def _truth(cfg: pb.PerfRunConfig) -> float:
    return pm.predict(TRUTH, run_config(cfg))


async def test_fit_then_online_refit_moves_predictions_toward_reported_times(srv: Server) -> None:
    samples = [pb.PerfSample(config=_config(*row), iter_time=_truth(_config(*row)), time=i)
               for i, row in enumerate(PROFILE)]
    fit = await srv.stub.FitPerformance(pb.FitPerformanceRequest(request_id="fit-1", gpu_type="a800",
                                                                 samples=samples))
    assert fit.model_key == "gpt-1.3b" and fit.gpu_type == "A800-80GB" and fit.num_samples == len(PROFILE)
    assert fit.rmsle < 0.02 and fit.mode == pb.PERF_MODE_TESSERA and fit.source.startswith("fitted")
    again = await srv.stub.FitPerformance(pb.FitPerformanceRequest(request_id="fit-1", gpu_type="a800"))
    assert again == fit  # the request id returns the first answer (no samples needed)

    job = _config(8, 1, 1, 1, pb.ZERO_KIND_NONE, [4, 4])  # a placement the profile did not have
    fitted_pred = pm.predict(params_of(fit.params), run_config(job))
    measured = 1.5 * fitted_pred  # the job runs slower than predicted (e.g. a congested fabric)
    steps = [pb.StepTime(seconds=measured * (1 + 0.01 * (i % 3)), iteration=i + 1) for i in range(5)]
    r1 = await srv.stub.ReportStepTimes(pb.ReportStepTimesRequest(job_id="j-1", gpu_type="A800-80GB", config=job,
                                                                  steps=steps))
    assert r1.predicted_before_seconds == pytest.approx(fitted_pred, rel=1e-9)
    assert r1.samples_used == 5 and r1.source.endswith("refit")
    assert abs(r1.predicted_seconds - r1.measured_seconds) < abs(r1.predicted_before_seconds - r1.measured_seconds)
    # the same iterations again count once; new ones move the prediction further
    dup = await srv.stub.ReportStepTimes(pb.ReportStepTimesRequest(job_id="j-1", gpu_type="A800-80GB", config=job,
                                                                   steps=steps[:2]))
    assert dup.samples_used == 5
    more = [pb.StepTime(seconds=measured, iteration=i) for i in range(6, 12)]
    r2 = await srv.stub.ReportStepTimes(pb.ReportStepTimesRequest(job_id="j-1", gpu_type="A800-80GB", config=job,
                                                                  steps=more))
    assert r2.predicted_before_seconds == pytest.approx(dup.predicted_seconds, rel=1e-9)
    assert abs(r2.predicted_seconds - measured) <= abs(r1.predicted_seconds - measured) + 1e-12
    assert abs(r2.predicted_seconds - measured) / measured < 0.25


async def test_report_without_a_fit_starts_from_the_prior_and_marks_the_cell_measured(srv: Server) -> None:
    cells_req = pb.GetCellsRequest(model=SMALL, global_batch_size=16, cluster=pb.ClusterSpec(
        pools=[pb.GpuPool(gpu="A100-80GB", num_gpus=4, gpus_per_node=4)]))
    before = {(x.num_gpus, x.num_stages): x for x in (await srv.stub.GetCells(cells_req)).cells}
    assert before[(4, 1)].iter_time_seconds.source.startswith("formula")
    job = _config(4, 1, 1, 1, pb.ZERO_KIND_NONE, [4])
    r = await srv.stub.ReportStepTimes(pb.ReportStepTimesRequest(
        job_id="j-2", model_key="small", gpu_type="A100", config=job, steps=[pb.StepTime(seconds=0.5, time=1.0)],
        model=SMALL, global_batch_size=16))
    assert r.measured_seconds == 0.5 and r.samples_used == 1
    after = {(x.num_gpus, x.num_stages): x for x in (await srv.stub.GetCells(cells_req)).cells}
    assert after[(4, 1)].iter_time_seconds.value == 0.5
    assert after[(4, 1)].iter_time_seconds.source == "measured"
    assert after[(2, 1)] == before[(2, 1)]
    health = await srv.stub.Health(pb.HealthRequest())
    assert health.status == "SERVING" and health.fitted_models == 1 and health.cell_cache_entries > 0



async def test_a_refused_step_keeps_nothing_of_its_request(srv: Server) -> None:
    job = _config(4, 1, 1, 1, pb.ZERO_KIND_NONE, [4])

    def report(*steps: pb.StepTime) -> pb.ReportStepTimesRequest:
        return pb.ReportStepTimesRequest(job_id="j-nan", model_key="small", gpu_type="A100", config=job, steps=steps)

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await srv.stub.ReportStepTimes(report(pb.StepTime(seconds=0.5, iteration=1),
                                              pb.StepTime(seconds=0.5, iteration=2, time=math.nan)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "steps[1].time: must be a finite number >= 0 (0 = unknown), got nan"
    ok = await srv.stub.ReportStepTimes(report(pb.StepTime(seconds=0.25, iteration=3)))
    assert ok.samples_used == 1 and ok.measured_seconds == 0.25  # the refused steps were not kept


# -- the loop stays responsive ----------------------------------------------------------------------


async def _call(stub: estimator_pb2_grpc.EstimatorStub, req: pb.EstimateMemoryRequest) -> pb.EstimateMemoryResponse:
    resp: pb.EstimateMemoryResponse = await stub.EstimateMemory(req)
    return resp


class _Blocking(Estimator):
    """EstimateMemory blocks its worker thread until released."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def estimate_memory(self, req: pb.EstimateMemoryRequest) -> pb.EstimateMemoryResponse:
        self.entered.set()
        assert self.release.wait(30)
        return super().estimate_memory(req)


async def test_a_slow_call_runs_in_a_thread_and_the_loop_keeps_answering() -> None:
    est = _Blocking()
    async for s in _serve(est):
        slow = asyncio.create_task(_call(s.stub, pb.EstimateMemoryRequest(model=GPT)))
        assert await asyncio.to_thread(est.entered.wait, 30)
        health = await asyncio.wait_for(s.stub.Health(pb.HealthRequest()), 5)  # answered while the call runs
        cells = await asyncio.wait_for(s.stub.GetCells(pb.GetCellsRequest(
            model=SMALL, global_batch_size=16, cluster=pb.ClusterSpec(
                pools=[pb.GpuPool(gpu="A40", num_gpus=2, gpus_per_node=2)]))), 10)
        assert health.status == "SERVING" and cells.cells and not slow.done()
        est.release.set()
        assert (await slow).memory.total == estimate_memory(ModelDims(768, 12, 12, 50257, 1024), ExecutionPlan()).total


class _BlockingCells(Estimator):
    """GetCells blocks its worker thread until released."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = 0
        self.release = threading.Event()

    def get_cells(self, req: pb.GetCellsRequest, controller: bool = True) -> pb.GetCellsResponse:
        self.inside += 1
        assert self.release.wait(30)
        return super().get_cells(req, controller)


async def test_heavy_calls_of_other_callers_are_bounded_and_leave_the_controller_its_threads() -> None:
    """A node's certificate may query. Its GetCells calls run on a lane of their own: past
    HEAVY_THREADS running and HEAVY_QUEUE waiting they are RESOURCE_EXHAUSTED at once, while the
    controller's heavy calls and everyone's light ones are still answered. Before, six abandoned
    heavy calls held every thread of the service."""
    from tessera.common.identity import node
    from tessera.estimator.service.server import HEAVY_QUEUE, HEAVY_THREADS

    est = _BlockingCells()
    req = pb.GetCellsRequest(model=SMALL, global_batch_size=16, cluster=pb.ClusterSpec(
        pools=[pb.GpuPool(gpu="A40", num_gpus=2, gpus_per_node=2)]))
    async for s in _serve(est):
        other = rpc.aio_channel(f"127.0.0.1:{s.port}", tls=tls_config(node("n1")), peer=ESTIMATOR)
        try:
            stub = estimator_pb2_grpc.EstimatorStub(other)
            held = [asyncio.ensure_future(stub.GetCells(req)) for _ in range(HEAVY_THREADS + HEAVY_QUEUE)]
            while est.inside < HEAVY_THREADS:
                await asyncio.sleep(0.01)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await asyncio.wait_for(stub.GetCells(req), 10)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            light = await asyncio.wait_for(stub.EstimateMemory(pb.EstimateMemoryRequest(model=GPT)), 10)
            assert light.memory.total > 0
            mine = asyncio.ensure_future(s.stub.GetCells(req))  # the controller's lane
            while est.inside < HEAVY_THREADS + 1:
                await asyncio.sleep(0.01)
            est.release.set()
            assert (await mine).cells
            assert all(got.cells for got in await asyncio.gather(*held))
        finally:
            est.release.set()
            await other.close()


async def test_traced_mode_through_the_service(srv: Server) -> None:
    pytest.importorskip("torch")
    tiny = c.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256, seq_length=32)
    req = pb.EstimateMemoryRequest(model=tiny, plan=c.ExecutionPlan(dp=2, micro_batch=2, sharding=c.SHARDING_ZERO1),
                                   gpu="a10", mode=pb.MEMORY_MODE_TRACED, global_batch_size=8)
    resp = await srv.stub.EstimateMemory(req)
    from tessera.estimator.torch.traced import traced_memory

    lib = traced_memory(ModelDims(64, 2, 4, 256, 32), ExecutionPlan(dp=2, micro_batch=2, grad_accum=2, sharding="zero1"),
                        gpu="A10-24GB")
    m = resp.memory
    assert m.source == "traced" == lib.source and m.capacity == lib.capacity_bytes == 24 * 10**9
    assert (m.parameters, m.gradients, m.optimizer, m.activations, m.total) == (
        lib.parameters, lib.gradients, lib.optimizer, lib.activations, lib.total)
    assert await srv.stub.EstimateMemory(req) == resp  # cached: the notes (with the trace's wall time) too


# -- what is learned survives a restart ---------------------------------------------------------------


async def test_fitted_models_and_measured_cells_survive_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "estimator.db"
    samples = [pb.PerfSample(config=_config(*row), iter_time=_truth(_config(*row)), time=i)
               for i, row in enumerate(PROFILE)]
    job = _config(8, 1, 1, 1, pb.ZERO_KIND_NONE, [4, 4])
    cells_req = pb.GetCellsRequest(model=SMALL, global_batch_size=16, cluster=pb.ClusterSpec(
        pools=[pb.GpuPool(gpu="A100-80GB", num_gpus=4, gpus_per_node=4)]))
    state = EstimatorState(db)
    async for first in _serve(Estimator(state=state)):
        await first.stub.FitPerformance(pb.FitPerformanceRequest(gpu_type="a800", samples=samples))
        r = await first.stub.ReportStepTimes(pb.ReportStepTimesRequest(
            job_id="j-1", gpu_type="A800-80GB", config=job, steps=[pb.StepTime(seconds=2.0, iteration=1)]))
        await first.stub.ReportStepTimes(pb.ReportStepTimesRequest(
            job_id="j-2", model_key="small", gpu_type="A100", config=_config(4, 1, 1, 1, pb.ZERO_KIND_NONE, [4]),
            steps=[pb.StepTime(seconds=0.5, iteration=1)], model=SMALL, global_batch_size=16))
    state.close()  # as at shutdown; a crash loses nothing either (each write is committed)

    state = EstimatorState(db)
    async for second in _serve(Estimator(state=state)):
        assert (await second.stub.Health(pb.HealthRequest())).fitted_models == 2
        # The refitted model is back: the next report starts from it, not from the first fit.
        again = await second.stub.ReportStepTimes(pb.ReportStepTimesRequest(
            job_id="j-3", gpu_type="A800-80GB", config=job, steps=[pb.StepTime(seconds=2.0, iteration=1)]))
        assert again.predicted_before_seconds == pytest.approx(r.predicted_seconds, rel=1e-9)
        cells = {(x.num_gpus, x.num_stages): x for x in (await second.stub.GetCells(cells_req)).cells}
        assert (cells[(4, 1)].iter_time_seconds.value, cells[(4, 1)].iter_time_seconds.source) == (0.5, "measured")
    state.close()


def test_state_file_that_cannot_be_read_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "estimator.db"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StateError, match="estimator.db"):
        EstimatorState(bad).load()
