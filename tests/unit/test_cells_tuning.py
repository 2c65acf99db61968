"""Cell-guided tuning (Crius, arXiv 2024: Sec. 5.2; docs/reference/papers.md) and one-device compute
profiling."""

from __future__ import annotations

import pytest

from tessera.estimator.cells import CellEstimator, CellInputError, CellModel, CellPlan, GpuPool
from tessera.estimator.compute import profile_stage_compute
from tessera.estimator.partition import LayerShape, Operator
from tessera.estimator.torch.stage_profiler import StageProfiler
from tessera.estimator.tuning import favours, pruned_stage_space, stage_space, tune_cell

GPT = CellModel("gpt", hidden_size=1024, num_layers=8, num_heads=16, vocab_size=32000, seq_length=1024,
                global_batch=64)
A100 = GpuPool("A100-40GB", num_gpus=16, gpus_per_node=8 // 2, intra_link="nvlink")


def test_stage_space_and_pruning_golden() -> None:
    assert stage_space(8) == ((8, 1), (4, 2), (2, 4), (1, 8))
    # Figure 11: DP favoured keeps DP-only .. half-hybrid, TP favoured half-hybrid .. TP-only
    assert pruned_stage_space(16, "dp") == ((16, 1), (8, 2), (4, 4))
    assert pruned_stage_space(16, "tp") == ((4, 4), (2, 8), (1, 16))
    assert pruned_stage_space(8, "dp") == ((8, 1), (4, 2))
    assert pruned_stage_space(8, "tp") == ((2, 4), (1, 8))
    assert pruned_stage_space(2, "dp") == ((2, 1),)
    assert pruned_stage_space(1, "tp") == ((1, 1),)
    with pytest.raises(CellInputError, match="^gpus:"):
        stage_space(6)
    with pytest.raises(CellInputError, match="^favour:"):
        pruned_stage_space(4, "pp")


def test_tuning_never_worse_than_the_estimate_and_prunes() -> None:
    est = CellEstimator()
    cell = est.cell(GPT, A100, 16, 2)
    assert cell.fits and cell.plan is not None and cell.iter_time is not None
    r = tune_cell(est, GPT, A100, 16, 2)
    assert r is not None
    assert r.iter_time <= cell.iter_time.value + 1e-12
    assert r.full_space == 4 * 4 and r.pruned_space == 2 * 2 == r.evaluated  # 8 GPUs per stage
    assert r.estimate_plan == cell.plan
    assert r.plan.num_gpus == 16 and r.source.startswith("formula:")
    fav = favours(cell.plan)
    assert len(fav) == len(r.plan.stages) == 2
    for s, f in zip(r.plan.stages, fav, strict=True):
        assert (s.dp, s.tp) in pruned_stage_space(s.gpus, f)


def test_tuning_with_a_measure_function() -> None:
    est = CellEstimator()
    seen: list[CellPlan] = []

    def measure(plan: CellPlan) -> float:
        seen.append(plan)
        return 1.0 + sum(s.tp for s in plan.stages) / 100  # pretends less TP is faster

    r = tune_cell(est, GPT, A100, 16, 2, measure=measure)
    assert r is not None and r.source == "measured"
    assert r.evaluated == len(seen) == r.pruned_space
    assert r.iter_time == min(measure(p) for p in seen[: r.evaluated])
    # a budget smaller than the pruned space: stage-by-stage descent from the estimate's plan
    seen.clear()
    r2 = tune_cell(est, GPT, A100, 16, 2, measure=measure, max_evaluations=4)
    assert r2 is not None and r2.evaluated <= 4


def test_tuning_of_an_unfit_cell_is_none() -> None:
    huge = CellModel("gpt", 8192, 48, 64, 51200, 2048, global_batch=8)
    assert tune_cell(CellEstimator(), huge, GpuPool("A10", 2, 2), 2, 1) is None


def test_profile_stage_compute_on_cpu() -> None:
    shape = LayerShape("transformer", hidden=64, heads=4, ffn=256, seq=32, recompute=True)
    moe = LayerShape("moe", hidden=64, heads=4, ffn=128, seq=32, experts=4, top_k=2)
    ops = [Operator("l0", 1.0, shape=shape), Operator("l1", 1.0, shape=shape), Operator("m", 1.0, shape=moe),
           Operator("head", 1.0, shape=LayerShape("head", 64, seq=32, vocab=100)),
           Operator("emb", 0.0, shape=LayerShape("embedding", 64, seq=32, vocab=100))]
    prof = StageProfiler(device="cpu", repeats=1, warmup=0)
    r = profile_stage_compute(ops, dp=1, tp=2, micro_batch=2, profiler=prof)
    assert r.seconds > 0 and r.source == "profiled:torch:cpu"
    assert len(prof._cache) == 4  # the two identical layers were timed once
    with pytest.raises(ValueError, match=r"^ops\[x\]\.shape:"):
        profile_stage_compute([Operator("x", 1.0)], 1, 1, 1, prof)


def test_cell_with_profiler_uses_profiled_source() -> None:
    tiny = CellModel("gpt", 64, 2, 4, 100, 32, global_batch=4)
    est = CellEstimator(profiler=StageProfiler(device="cpu", repeats=1, warmup=0))
    c = est.cell(tiny, A100, 2, 1)
    assert c.fits and c.iter_time is not None and "profiled:torch:cpu" in c.iter_time.source
