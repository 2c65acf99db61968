"""The plan time's per-generation constants (estimator/time_constants.py) and the attention the live
controller's Cells assume (controller/cell_estimates.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tessera.common.gpus import lookup
from tessera.controller.cell_estimates import CellEstimates, measured_key
from tessera.controller.core.snapshot import Cell, JobView
from tessera.estimator.cells import CellConfig, CellModel
from tessera.estimator.compute import DEFAULT_PRIOR, EfficiencyPrior, stage_compute_time
from tessera.estimator.models import ModelDims
from tessera.estimator.partition import Operator
from tessera.estimator.plan_time import estimate_plan_time
from tessera.estimator.plans import ExecutionPlan
from tessera.estimator.time_constants import (
    PLAN_TIME_CONSTANTS,
    GenerationConstants,
    PlanTimeConstants,
    generation,
    plan_prior,
)

LLAMA = ModelDims(4096, 8, 32, 128256, 4096, "llama3-8b-8l", ffn_hidden=14336, gated=True, num_kv_heads=8,
                  tied_embeddings=False)
PLAN = ExecutionPlan(dp=8, micro_batch=2, sharding="fsdp", precision="amp", checkpointing="op")


@pytest.mark.parametrize("gpu, gen", [("H100-80GB", "hopper"), ("H200-141GB", "hopper"), ("A100-80GB", "ampere"),
                                      ("A800-80GB", "ampere"), ("A10-24GB", "ampere"), ("V100-32GB", None),
                                      ("L4-24GB", None)])
def test_generation_of_catalog_parts(gpu: str, gen: str | None) -> None:
    assert generation(lookup(gpu)) == gen


def test_plan_prior_takes_the_generation_constants_and_keeps_the_rest() -> None:
    c = PlanTimeConstants((("hopper", GenerationConstants(0.4, 0.2, 1.5)),), compile_traffic_factor=0.3, source="t")
    h = plan_prior(lookup("H100-80GB"), DEFAULT_PRIOR, c)
    assert (h.matmul_efficiency, h.flash_utilization, h.fp8_speedup, h.compile_traffic_factor) == (0.4, 0.2, 1.5, 0.3)
    assert h.traffic_multiplier == DEFAULT_PRIOR.traffic_multiplier and "t" in h.source
    v = plan_prior(lookup("V100-32GB"), DEFAULT_PRIOR, c)  # no fitted generation: the base efficiencies
    assert v.matmul_efficiency == DEFAULT_PRIOR.matmul_efficiency and v.compile_traffic_factor == 0.3


def test_estimate_uses_the_fitted_constants_unless_given_a_config() -> None:
    fitted = estimate_plan_time(LLAMA, PLAN, "H100-80GB")
    prior = estimate_plan_time(LLAMA, PLAN, "H100-80GB", config=CellConfig())
    assert "fit:torchtitan" in fitted.source and "fit:torchtitan" not in prior.source
    hop = PLAN_TIME_CONSTANTS.for_generation("hopper")
    assert hop is not None
    # a lower matmul efficiency than the Crius prior: the fitted H100 time is the longer one
    assert (fitted.breakdown["compute"] > prior.breakdown["compute"]) == (
        hop.matmul_efficiency < DEFAULT_PRIOR.matmul_efficiency)


def test_a_gpu_type_outside_the_catalog_is_timed_with_its_own_figures() -> None:
    slow = replace(lookup("H100-80GB"), bandwidth_gbps=2400)  # Meta's Grand Teton part
    fast = estimate_plan_time(LLAMA, PLAN, "H100-80GB")
    t = estimate_plan_time(LLAMA, PLAN, slow)
    assert t.breakdown["compute"] > fast.breakdown["compute"]


def test_fp8_speedup_and_flash_utilization_by_hand() -> None:
    gpu = lookup("H100-80GB")
    op = Operator("x", flops=3e12, linear_flops=2e12)
    p = EfficiencyPrior(matmul_efficiency=0.5, traffic_multiplier=0.0, flash_utilization=0.25, fp8_speedup=1.6)
    peak = gpu.tflops_fp16 * 1e12
    t = stage_compute_time([op], gpu, 1, 1, 1, p, float8=True, flash=True).seconds
    assert t == pytest.approx(2e12 / 1.6 / (peak * 0.5) + 1e12 / (peak * 0.25))
    with pytest.raises(ValueError, match="flash_utilization"):
        EfficiencyPrior(flash_utilization=1.5)
    with pytest.raises(ValueError, match="fp8_speedup"):
        EfficiencyPrior(fp8_speedup=-1)


def test_live_cells_assume_flash_attention_and_the_simulator_may_not() -> None:
    job = JobView("j", 0.0, LLAMA, 16)
    pools = {"H100-80GB": (8, 8, True)}
    live, alpa = CellEstimates(pools), CellEstimates(pools, flash_attention=False)
    (a,) = [c for c in live.cells(job, "H100-80GB", 8, 1) if c.cell.stages == 1]
    (b,) = [c for c in alpa.cells(job, "H100-80GB", 8, 1) if c.cell.stages == 1]
    assert a.plan is not None and b.plan is not None
    assert a.plan.execution is not None and a.plan.execution.flash_attention
    assert b.plan.execution is not None and not b.plan.execution.flash_attention
    # causal flash attention skips half the scores and never writes them: a shorter iteration
    assert a.iteration_s < b.iteration_s
    ka, kb = measured_key(job, Cell("H100-80GB", 8, 1)), measured_key(job, Cell("H100-80GB", 8, 1), False)
    assert ka is not None and kb is not None and ka != kb
    m = CellModel.from_dims(LLAMA, 16, flash_attention=True)
    assert (m.kv_heads, m.causal, m.flash_attention) == (8, True, True)
