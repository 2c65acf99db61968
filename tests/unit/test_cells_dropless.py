"""Dropless MoE (Mixtral-style, capacity_factor 0) in the Cells, and a job the Cells cannot estimate
waiting with the cause (a live audit: such a job waited on "fits nowhere" with no cause given)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tessera.controller import cell_estimates
from tessera.controller.cell_estimates import CellEstimates, job_cell_model, recipe_refusal
from tessera.controller.core.snapshot import JobView
from tessera.estimator.cell_recipe import recipe_cell_model
from tessera.estimator.cells import CellEstimator, CellInputError, CellModel, GpuPool
from tessera.estimator.memory import estimate_memory
from tessera.estimator.models import ModelDims, registered
from tessera.v1 import common_pb2 as P
from tests.unit.test_engine import Harness

TINY = ModelDims(128, 2, 4, 512, 64, "tinymoe", family="moe", gated=True, num_kv_heads=2, num_experts=4, top_k=2,
                 moe_every=1, capacity_factor=0.0)


def test_a_dropless_moe_is_estimated_as_balanced_routing_by_index() -> None:
    m = CellModel.from_dims(TINY, 16)  # was: CellInputError "capacity_factor: must be a positive number, got 0.0"
    assert m.capacity_factor == 1.0 and m.expert_group_size == 1
    # the same model as a capacity-1.0 one routed by index: the same costs, the same signature
    balanced = CellModel.from_dims(replace(TINY, capacity_factor=1.0), 16, expert_group_size=1)
    assert m.signature == balanced.signature
    # a capacity the job sets is kept, with GShard's groups
    kept = CellModel.from_dims(replace(TINY, capacity_factor=1.25), 16)
    assert kept.capacity_factor == 1.25 and kept.expert_group_size == 2048


def test_mixtral_has_cells_and_their_memory_is_not_below_the_formula() -> None:
    dims = registered("mixtral-8x7b")
    assert dims is not None and dims.capacity_factor == 0
    model = recipe_cell_model(dims, 64, flash_attention=True).model
    est = CellEstimator()
    fitting = [c for c in est.cells(model, [GpuPool("A100-80GB", 32, 8)]) if c.fits]
    assert fitting
    checked = 0
    for c in fitting:
        if c.execution_plan is None:
            continue
        f = estimate_memory(dims, c.execution_plan)
        assert c.memory_per_gpu is not None
        assert c.memory_per_gpu.value >= f.reserved + f.other, (c.plan, c.memory_per_gpu.value, f.reserved + f.other)
        checked += 1
    assert checked >= 3


def test_a_cell_whose_experts_do_not_shard_over_its_dp_ranks_has_no_plan() -> None:
    # the Cells hold 1/dp of the experts per rank; 8 experts over 16 DP ranks is no ep of a plan, and
    # the plan with ep 1 (all experts on every rank) needs far more than the Cell counted
    dims = registered("mixtral-8x7b")
    assert dims is not None
    model = recipe_cell_model(replace(dims, capacity_factor=1.0), 64, flash_attention=True).model
    c = CellEstimator().cell(model, GpuPool("A100-80GB", 32, 8), 16, 1)
    assert c.fits and c.plan is not None and c.plan.stages[0].dp == 16
    assert c.execution_plan is None
    ok = CellEstimator().cell(model, GpuPool("A100-80GB", 32, 8), 32, 4)
    assert ok.execution_plan is not None and ok.execution_plan.ep == ok.execution_plan.dp


def test_the_controller_gives_a_dropless_job_cells() -> None:
    job = JobView("j", 0.0, TINY, 16)
    assert job_cell_model(job) is not None and recipe_refusal(job) == ""
    est = CellEstimates({"A40-48GB": (2, 2, False)})
    assert est.gpu_counts(job, "A40-48GB")


def test_a_model_the_cells_refuse_is_named_in_the_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> object:
        raise CellInputError("capacity_factor", "must be a positive number, got 0.0")

    monkeypatch.setattr(cell_estimates, "recipe_cell_model", refuse)
    job = JobView("j", 0.0, TINY, 16)
    assert job_cell_model(job) is None
    assert recipe_refusal(job) == "model.capacity_factor: must be a positive number, got 0.0"  # was ""


async def test_a_dropless_moe_job_starts() -> None:
    h = Harness(policy="crius", nodes=("a",))
    await h.register("a")
    spec = P.JobSpec(name="tinymoe", global_batch_size=16, iterations=10, checkpoint_every=5, model=P.ModelSpec(
        family=P.MODEL_FAMILY_MOE, gated=True, dropless=True, num_experts=4, top_k=2, moe_every=1, hidden_size=128,
        num_layers=2, num_heads=4, num_kv_heads=2, vocab_size=512, seq_length=64))
    jid = await h.submit(spec)
    await h.round()
    assert h.state(jid) == "STARTING", h.job(jid).reason  # was PENDING: "fits nowhere", no cause
