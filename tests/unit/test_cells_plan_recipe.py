"""A Cell's ExecutionPlan carries the job's recipe (estimator/cell_worker.py recipe_plan_fields): the
plan GetCells answers with is the one the Cell was estimated for (a live audit: a LoRA r16 job's Cells
answered lora_rank 0, loss fused, and the memory formula on that plan counted a full fine-tune)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.estimator.cell_recipe import QUANT_BYTES, JobRecipe, recipe_cell_model, recipe_on
from tessera.estimator.cell_worker import BASE_QUANT_OF_FROZEN_BYTES
from tessera.estimator.cells import Cell, CellEstimator, GpuPool
from tessera.estimator.memory import estimate_memory
from tessera.estimator.models import ModelDims, registered
from tessera.estimator.plans import ExecutionPlan

A100_NODE = GpuPool("A100-80GB", 8, 8)


def _cells(recipe: Mapping[str, Any], model: str = "llama3.1-8b", batch: int = 16,
           pool: GpuPool = A100_NODE) -> tuple[ModelDims, JobRecipe, list[Cell]]:
    dims = registered(model)
    assert dims is not None
    job = JobRecipe.of(ExecutionPlan(**recipe), given=list(recipe))
    m = recipe_cell_model(dims, batch, job, flash_attention=True).model
    return dims, job, [c for c in CellEstimator().cells(m, [pool]) if c.execution_plan is not None]


def test_a_lora_jobs_cells_answer_its_recipe_and_the_formula_counts_lora() -> None:
    dims, job, cells = _cells({"lora_rank": 16, "lora_targets": "all-linear", "precision": "bf16", "loss": "fp32"})
    assert cells
    for c in cells:
        ep = c.execution_plan
        assert ep is not None
        assert (ep.lora_rank, ep.lora_targets, ep.loss, ep.precision) == (16, "all-linear", "fp32", "bf16"), ep
        assert ep.checkpointing == "full" and ep.flash_attention  # the Cells' own choices, as estimated
        assert recipe_on(job, ep) == ep  # nothing of the recipe is left for the launch to add
    one = next(c for c in cells if c.num_gpus == 1)
    assert one.execution_plan is not None
    m = estimate_memory(dims, one.execution_plan)
    # LoRA's figures: adapters' gradients and AdamW states only (a full fine-tune: 16 GB of gradients)
    assert any("LoRA r=16" in n for n in m.notes)
    assert m.gradients < 1e9 and m.optimizer < 1e9
    assert m.total == estimate_memory(dims, recipe_on(job, one.execution_plan)).total


def test_the_recipe_fields_the_cells_hold_reach_the_plan() -> None:
    _, _, cells = _cells({"checkpointing": "op", "checkpoint_every": 2, "compile": True, "loss": "fp32"})
    assert cells
    for c in cells:
        ep = c.execution_plan
        assert ep is not None and (ep.checkpointing, ep.checkpoint_every, ep.compile, ep.loss) == ("op", 2, True, "fp32")
    _, _, cells = _cells({"sharding": "fsdp", "reshard_after_forward": "never", "float8": "linear+allgather"},
                         pool=GpuPool("H100-80GB", 8, 8))
    assert cells
    for c in cells:
        ep = c.execution_plan
        assert ep is not None and (ep.sharding, ep.reshard_after_forward, ep.float8) == ("fsdp", "never",
                                                                                         "linear+allgather")


def test_qlora_and_an_offloaded_base_are_told_by_their_frozen_bytes() -> None:
    assert BASE_QUANT_OF_FROZEN_BYTES == {b: q for q, b in QUANT_BYTES.items()}
    for recipe, want in (({"lora_rank": 8, "base_quant": "nf4"}, ("nf4", "none")),
                         ({"lora_rank": 8, "base_quant": "int8"}, ("int8", "none")),
                         ({"lora_rank": 8, "offload": "frozen"}, ("none", "frozen")),
                         ({"lora_rank": 8}, ("none", "none"))):
        _, _, cells = _cells(recipe)
        assert cells, recipe
        for c in cells:
            ep = c.execution_plan
            assert ep is not None and (ep.base_quant, ep.offload) == want, (recipe, ep)
