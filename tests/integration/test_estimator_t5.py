"""Encoder-decoder Cells end to end: `tessctl estimate cells -f` on a t5-base job file answers Cells (in
process), and the real Estimator service's GetCells answers the library's Cells for the same job."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tessera.clients import tessctl
from tessera.estimator.cell_recipe import recipe_cell_model
from tessera.estimator.cells import CellEstimator, ClusterSpec, GpuPool
from tessera.estimator.models import registered
from tessera.estimator.service.handlers import Estimator
from tessera.v1 import common_pb2 as c
from tessera.v1 import estimator_pb2 as pb
from tests.integration.test_estimator_service import Server, _serve


@pytest.fixture
async def srv() -> AsyncIterator[Server]:
    async for s in _serve(Estimator()):
        yield s


def test_tessctl_estimate_cells_answers_t5_base(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "a100.yaml"
    cluster.write_text("pools:\n  - {gpu: A100-80GB, nodes: 1, gpus_per_node: 4}\n")
    job = tmp_path / "t5.yaml"
    job.write_text("name: t5\nmodel: t5-base\nglobal_batch_size: 32\niterations: 10\n")
    assert tessctl.main(["estimate", "cells", "-f", str(job), "--cluster", str(cluster), "-o", "json"]) == 0
    out = capsys.readouterr()
    got = json.loads(out.out)
    assert out.err == ""
    cells = got["cells"]
    # 1, 2 and 4 GPUs; 1 stage up to one per GPU: the encoder/decoder boundary falls where the split says
    assert sorted((x["num_gpus"], x["num_stages"]) for x in cells) == [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4)]
    assert all(x["fits"] for x in cells)
    assert "-dl12-t114-" in got["model_signature"]


async def test_get_cells_of_t5_base_is_the_library_answer(srv: Server) -> None:
    cluster = pb.ClusterSpec(pools=[pb.GpuPool(gpu="A100-80GB", num_gpus=4, gpus_per_node=4)])
    got = await srv.stub.GetCells(pb.GetCellsRequest(model=c.ModelSpec(name="t5-base"), global_batch_size=32,
                                                     cluster=cluster))
    dims = registered("t5-base")
    assert dims is not None
    model = recipe_cell_model(dims, 32, None, flash_attention=True).model
    want = CellEstimator().cells(model, ClusterSpec((GpuPool("A100-80GB", 4, 4),)))
    assert got.model_signature == model.signature
    assert [(x.num_gpus, x.num_stages, x.fits) for x in got.cells] == [(x.num_gpus, x.num_stages, x.fits) for x in want]
    assert [x.iter_time_seconds.value for x in got.cells] == [x.iter_time.value for x in want if x.iter_time]
