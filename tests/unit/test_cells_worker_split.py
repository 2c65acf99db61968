"""A pipelined Cell's memory holds for the layer splits a worker runs (estimator/cell_worker.py), and
stands against tessera.estimator.memory by the margins docs/estimator-cells.md states ("Cell memory
against the formula")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.estimator.cell_recipe import JobRecipe, recipe_cell_model, recipe_on
from tessera.estimator.cell_worker import even_layer_ranges, worker_op_ranges
from tessera.estimator.cells import CellConfig, CellEstimator, CellModel, GpuPool, _stage_memory
from tessera.estimator.memory import estimate_memory
from tessera.estimator.models import registered
from tessera.estimator.plans import ExecutionPlan

FSDP = {"sharding": "fsdp", "checkpointing": "full", "precision": "amp", "loss": "fp32"}  # the audit's l70-fsdp
A100S = GpuPool("A100-80GB", 32, 8)


def _model(name: str, batch: int, recipe: Mapping[str, Any] | None) -> tuple[CellModel, JobRecipe | None]:
    dims = registered(name)
    assert dims is not None
    job = JobRecipe.of(ExecutionPlan(**recipe), given=list(recipe)) if recipe else None
    return recipe_cell_model(dims, batch, job, flash_attention=True).model, job


def test_the_even_splits_of_the_reference_trainer_and_the_formula() -> None:
    # the reference trainer (clients/trainer/reference/parallel.py): the remainder on the last stages
    from tessera.clients.trainer.reference.parallel import stage_layers

    assert even_layer_ranges(80, 32, remainder_first=False) == tuple(
        (r.start, r.stop) for r in (stage_layers(80, 32, s) for s in range(32)))
    # tessera.estimator.memory (memory_terms.stage_layers): on the first stages
    assert even_layer_ranges(80, 32, remainder_first=True)[:2] == ((0, 3), (3, 6))
    # operators: the embedding on stage 0, the head on the last; both splits where they differ
    ranges = worker_op_ranges(82, 80, 32)
    assert ranges[0] == ((0, 4), (0, 3)) and ranges[-1] == ((79, 82), (78, 82))
    assert worker_op_ranges(34, 32, 4) == (((0, 9),), ((9, 17),), ((17, 25),), ((25, 34),))
    assert worker_op_ranges(34, 32, 1) == () and worker_op_ranges(20, 50, 4) == ()  # one stage; a Wide-ResNet


def test_the_audited_70b_in_32_stages_does_not_fit_where_the_formula_says_it_does_not() -> None:
    # was: fits at 62.9 GB on its own split (2 layers + embedding on stage 0), 88.0 GB by the formula
    model, _ = _model("llama3.1-70b", 64, FSDP)
    c = CellEstimator().cell(model, A100S, 32, 32)
    assert not c.fits and c.memory_needed_per_gpu > 80e9 * 0.95


def test_every_pipelined_stage_holds_the_workers_layer_ranges() -> None:
    cfg = CellConfig()
    for name, batch in (("llama3.1-70b", 64), ("qwen2.5-7b", 32), ("gpt2-small", 64)):
        model, _ = _model(name, batch, FSDP)
        est = CellEstimator(cfg)
        ops = est.operators(model)
        for c in est.cells(model, [A100S]):
            if c.plan is None or c.num_stages == 1:
                continue
            ranges = worker_op_ranges(len(ops), model.num_layers, c.num_stages)
            samples = model.global_batch / c.plan.num_microbatches
            for i, sc in enumerate(c.stage_costs):
                dp, tp = sc.plan.dp, sc.plan.tp
                for a, z in ranges[i]:
                    need = _stage_memory(ops[a:z], dp, tp, samples / dp, i, c.num_stages, c.plan.num_microbatches,
                                         cfg, model)
                    assert sc.memory_bytes >= need * (1 - 1e-12), (name, c.plan.describe(), i, (a, z))


# The documented margins of Cell memory against the formula's reserved + other (its fit test) for the
# same plan and split, a fitting Cell with a plan: (recipe, pipelined) -> least ratio.
MARGINS = {("fsdp", False): 0.95, ("fsdp", True): 0.94, ("own", False): 0.95, ("own", True): 0.85}


def test_cell_memory_stands_against_the_formula_by_the_documented_margins() -> None:
    seen = dict.fromkeys(MARGINS, 0)
    for name, batch in (("llama3.1-8b", 64), ("qwen2.5-7b", 32), ("mistral-7b-v0.3", 32), ("llama3.1-70b", 64)):
        dims = registered(name)
        assert dims is not None
        for kind, recipe in (("fsdp", FSDP), ("own", None)):
            model, job = _model(name, batch, recipe)
            for c in CellEstimator().cells(model, [A100S]):
                if not c.fits or c.execution_plan is None or c.memory_per_gpu is None:
                    continue
                f = estimate_memory(dims, recipe_on(job, c.execution_plan))
                key = (kind, c.num_stages > 1)
                assert c.memory_per_gpu.value >= MARGINS[key] * (f.reserved + f.other), (
                    name, kind, c.plan and c.plan.describe(), c.memory_per_gpu.value, f.reserved + f.other)
                seen[key] += 1
    assert all(n >= 5 for n in seen.values()), seen
