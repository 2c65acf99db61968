"""A job's recipe in GetCells, through the real Estimator service on loopback and through `tessctl
estimate cells` in process: Llama 3.1 8B with LoRA (rank 16) fits and gets Cells on four 24 GB GPUs,
where the same job without LoRA fits none; a recipe field the Cells cannot express is
INVALID_ARGUMENT naming it; what they express in part comes back as a warning."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from tessera.clients import tessctl
from tessera.estimator.cell_recipe import JobRecipe, recipe_cell_model
from tessera.estimator.cells import CellEstimator, ClusterSpec, GpuPool
from tessera.estimator.models import registered
from tessera.estimator.plans import ExecutionPlan
from tessera.estimator.service.handlers import Estimator
from tessera.v1 import common_pb2 as c
from tessera.v1 import estimator_pb2 as pb
from tests.integration.test_estimator_service import Server, _serve

L4X4 = pb.ClusterSpec(pools=[pb.GpuPool(gpu="L4-24GB", num_gpus=4, gpus_per_node=4)])
LLAMA = c.ModelSpec(name="llama3.1-8b")


@pytest.fixture
async def srv() -> AsyncIterator[Server]:
    async for s in _serve(Estimator()):
        yield s


def _cells(recipe: c.ExecutionPlan | None = None) -> pb.GetCellsRequest:
    return pb.GetCellsRequest(model=LLAMA, global_batch_size=8, cluster=L4X4, recipe=recipe)


async def test_lora_gets_cells_on_24gb_gpus_where_the_full_fine_tune_fits_none(srv: Server) -> None:
    full = await srv.stub.GetCells(_cells())
    lora = await srv.stub.GetCells(_cells(c.ExecutionPlan(lora_rank=16)))
    assert full.cells and not any(x.fits for x in full.cells)
    assert all("memory" in x.reason for x in full.cells if x.num_stages == 1)
    fitting = [x for x in lora.cells if x.fits]
    assert fitting and all(x.memory_per_gpu_bytes.value <= 24e9 for x in fitting)
    assert "lora16" in lora.model_signature and "lora" not in full.model_signature
    assert not lora.warnings
    # the service's answer is the library's: the recipe map, then the Cell estimator
    dims = registered("llama3.1-8b")
    assert dims is not None
    model = recipe_cell_model(dims, 8, JobRecipe(ExecutionPlan(lora_rank=16), frozenset({"lora_rank"})), flash_attention=True).model
    want = CellEstimator().cells(model, ClusterSpec((GpuPool("L4-24GB", 4, 4),)))
    assert [(x.num_gpus, x.num_stages, x.fits) for x in lora.cells] == [(x.num_gpus, x.num_stages, x.fits) for x in want]
    assert [x.iter_time_seconds.value for x in fitting] == [x.iter_time.value for x in want if x.iter_time]


async def test_a_recipe_field_the_cells_cannot_express_is_invalid_argument(srv: Server) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await srv.stub.GetCells(_cells(c.ExecutionPlan(lora_rank=16, sharding=c.SHARDING_ZERO2)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "plan.sharding" in (err.value.details() or "")
    warned = await srv.stub.GetCells(_cells(c.ExecutionPlan(lora_rank=16, loss=c.LOSS_CHUNKED)))
    assert [w.split(":")[0] for w in warned.warnings] == ["plan.loss"]
    stages = await srv.stub.PlaceStages(pb.PlaceStagesRequest(
        model=LLAMA, global_batch_size=8, stages=[pb.GpuPool(gpu="L4-24GB", num_gpus=2, gpus_per_node=2)] * 2,
        recipe=c.ExecutionPlan(lora_rank=16, loss=c.LOSS_CHUNKED)))
    assert "lora16" in stages.model_signature and list(stages.warnings) == list(warned.warnings)


def test_tessctl_estimate_cells_sends_the_job_file_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "l4.yaml"
    cluster.write_text("pools:\n  - {gpu: L4-24GB, nodes: 1, gpus_per_node: 4}\n")
    fits = {}
    for name, plan in (("full", ""), ("lora", "plan: {lora_rank: 16, loss: chunked}\n")):
        job = tmp_path / f"{name}.yaml"
        job.write_text(f"name: {name}\nmodel: llama3.1-8b\nglobal_batch_size: 8\niterations: 10\n{plan}")
        assert tessctl.main(["estimate", "cells", "-f", str(job), "--cluster", str(cluster), "-o", "json"]) == 0
        captured = capsys.readouterr()
        fits[name] = sum(x.get("fits", False) for x in json.loads(captured.out)["cells"])
        if name == "lora":
            assert "tessctl: warning: plan.loss: chunked" in captured.err
        else:
            assert captured.err == ""
    assert fits["full"] == 0 and fits["lora"] > 0


async def test_a_measured_step_time_belongs_to_the_cell_of_the_job_recipe(srv: Server) -> None:
    from tests.integration.test_estimator_service import SMALL, _config

    recipe = c.ExecutionPlan(lora_rank=8)
    cluster = pb.ClusterSpec(pools=[pb.GpuPool(gpu="A100-80GB", num_gpus=4, gpus_per_node=4)])
    lora = pb.GetCellsRequest(model=SMALL, global_batch_size=16, cluster=cluster, recipe=recipe)
    full = pb.GetCellsRequest(model=SMALL, global_batch_size=16, cluster=cluster)
    await srv.stub.ReportStepTimes(pb.ReportStepTimesRequest(
        job_id="j-lora", model_key="small", gpu_type="A100", config=_config(4, 1, 1, 1, pb.ZERO_KIND_NONE, [4]),
        steps=[pb.StepTime(seconds=0.5, time=1.0)], model=SMALL, global_batch_size=16, recipe=recipe))
    by_cell = {(x.num_gpus, x.num_stages): x for x in (await srv.stub.GetCells(lora)).cells}
    assert by_cell[(4, 1)].iter_time_seconds.source == "measured"
    assert all(x.iter_time_seconds.source != "measured" for x in (await srv.stub.GetCells(full)).cells)


async def test_stages_refuse_float8_on_gpus_without_fp8(srv: Server) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await srv.stub.PlaceStages(pb.PlaceStagesRequest(
            model=LLAMA, global_batch_size=8, stages=[pb.GpuPool(gpu="A100-80GB", num_gpus=1, gpus_per_node=1)] * 2,
            recipe=c.ExecutionPlan(float8=c.FLOAT8_LINEAR)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith("plan.float8: A100-80GB has no FP8")
