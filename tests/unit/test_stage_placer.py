"""Espresso's stage placer over mixed GPU types: plans, Alg. 2 against the exhaustive optimum, bad input."""

from __future__ import annotations

import itertools

import pytest

from tessera.estimator.cells import (
    CellInputError,
    CellModel,
    GpuPool,
    iteration_time,
    model_operators,
    pipeline_latency,
)
from tessera.estimator.stage_placer import HeteroStage, StagePlacer

SMALL = CellModel("gpt", hidden_size=512, num_layers=8, num_heads=8, vocab_size=8000, seq_length=512,
                  global_batch=16, name="small")
# Large enough that an RTX A4000 (16 GB) holds only some of its layers.
BIG = CellModel("gpt", hidden_size=4096, num_layers=12, num_heads=32, vocab_size=32000, seq_length=2048,
                global_batch=16, name="big")
A100 = GpuPool("A100-40GB", 8, 4, nic_gbps=12.5)
A6000 = GpuPool("RTX-A6000-48GB", 8, 4, intra_link="pcie", nic_gbps=3.125)
A4000 = GpuPool("RTX-A4000-16GB", 8, 4, nic_gbps=3.125)


def test_a_plan_puts_the_embedding_first_the_head_last_and_sends_between_stages() -> None:
    sp = StagePlacer(SMALL, [A100, A4000, A4000], dp=2, num_microbatches=4)
    plan = sp.evaluate([HeteroStage(A4000, 2), HeteroStage(A100, 4), HeteroStage(A4000, 2)])
    ops = model_operators(SMALL)
    assert [(c.plan.start, c.plan.end) for c in plan.stage_costs] == [(0, 3), (3, 7), (7, len(ops))]
    assert plan.stage_costs[0].inter_comm == 0 and all(c.inter_comm > 0 for c in plan.stage_costs[1:])
    assert all((c.plan.dp, c.plan.tp) == (2, 1) for c in plan.stage_costs)
    assert plan.iter_time == iteration_time(plan.stage_costs, 4)
    assert plan.fits and plan.memory_per_gpu == max(c.memory_bytes for c in plan.stage_costs)
    # Each stage's GPUs, type and inclusive layers: "[A100-40GB:4]" read as four A100s (Espresso's
    # "[GPU type : #num]" counts GPUs), where the 4 counted layers.
    assert plan.describe() == ("[2 x RTX-A4000-16GB: layers 0-1, 2 x A100-40GB: layers 2-5, "
                               "2 x RTX-A4000-16GB: layers 6-7] dp2 mb4")
    # The front stage keeps more micro-batches in flight (1F1B): the same layers cost it more memory.
    front = sp.stage_cost(A100, 0, 1, 3)
    back = sp.stage_cost(A100, 1, 1, 3)
    assert front.memory_bytes > back.memory_bytes


def test_espresso_eq9_overlaps_each_sync_with_the_earlier_backward_passes() -> None:
    stages = [HeteroStage(A4000, 3), HeteroStage(A100, 5)]
    plain = StagePlacer(SMALL, [A100, A4000], dp=2, num_microbatches=4).evaluate(stages)
    eq9 = StagePlacer(SMALL, [A100, A4000], dp=2, num_microbatches=4, overlap_sync=True).evaluate(stages)
    c0, c1 = eq9.stage_costs
    pipe = pipeline_latency([c0.latency, c1.latency], [c0.inter_comm, c1.inter_comm], 4)
    backward0 = c0.compute * 3 / 4  # recomputation: backward is 3 of the 4 forward-equivalents
    assert eq9.iter_time == pytest.approx(pipe + max(c0.sync, c1.sync - backward0))
    assert plain.iter_time == pytest.approx(pipe + max(c0.sync, c1.sync)) and eq9.iter_time <= plain.iter_time


def test_placement_is_close_to_the_exhaustive_optimum_and_uses_the_allocation() -> None:
    for pools, overlap in (([A100, A6000, A4000], False), ([A4000, A4000, A100, A6000], False),
                           ([A100, A6000, A4000], True)):
        sp = StagePlacer(SMALL, pools, dp=1, overlap_sync=overlap)
        alg, opt = sp.place(), sp.exhaustive()
        assert sorted(s.pool.gpu for s in alg.stages) == sorted(p.gpu for p in pools)
        assert sum(s.layers for s in alg.stages) == SMALL.num_layers and all(s.layers >= 1 for s in alg.stages)
        assert alg.fits and opt.fits
        assert opt.iter_time <= alg.iter_time <= 1.15 * opt.iter_time
        # exhaustive = the best over every order of the best split for it
        orders = {tuple(p.gpu for p in o): list(o) for o in itertools.permutations(pools)}
        assert opt.iter_time == min(sp.best_split(o).iter_time for o in orders.values())


def test_memory_limits_what_a_small_gpu_takes() -> None:
    sp = StagePlacer(BIG, [A6000, A4000], dp=1, num_microbatches=8)
    for plan in (sp.place(), sp.exhaustive()):
        assert plan.fits
        small = next(s for s in plan.stages if s.pool.gpu == "RTX-A4000-16GB")
        assert small.layers < BIG.num_layers / 2  # the 48 GB card holds the larger part
    every_split_on_a4000_first = [sp.evaluate([HeteroStage(A4000, n), HeteroStage(A6000, 12 - n)]) for n in range(1, 12)]
    assert not all(p.fits for p in every_split_on_a4000_first)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"dp": 0}, "dp: must be >= 1"),
     ({"pools": []}, "pools: the allocation needs at least one stage"),
     ({"pools": [A100] * 9}, "pools: 9 stages for 8 layers"),
     ({"num_microbatches": 3}, "num_microbatches: must divide the global batch 16"),
     ({"dp": 8, "num_microbatches": 4}, "dp: 8 ranks for micro-batches of 4 samples"),
     ({"pools": [GpuPool("A100-40GB", 1, 1)], "dp": 2, "num_microbatches": 2}, "pools[0]: A100-40GB has 1 GPUs"),
     ({"pools": [GpuPool("A100-40GB", 4, 4)] * 3, "dp": 2}, "pools[0]: 3 stages x dp 2 of A100-40GB need 6 GPUs")],
)
def test_bad_input_names_the_field(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"model": SMALL, "pools": [A100, A4000], "dp": 1, **kwargs}
    with pytest.raises(CellInputError, match=f"^{message.replace('[', '.').replace(']', '.')}"):
        StagePlacer(**args)  # type: ignore[arg-type]


def test_bad_plans_and_searches_are_refused() -> None:
    sp = StagePlacer(SMALL, [A100, A4000], dp=1)
    with pytest.raises(CellInputError, match="^stages: layers must be >= 1 each and add up to 8"):
        sp.evaluate([HeteroStage(A100, 4), HeteroStage(A4000, 3)])
    with pytest.raises(CellInputError, match="^stages: the GPU types must be the allocation's"):
        sp.evaluate([HeteroStage(A100, 4), HeteroStage(A100, 4)])
    with pytest.raises(CellInputError, match="^exhaustive: 14 plans exceed max_plans 10"):
        sp.exhaustive(max_plans=10)
    wrn = CellModel.wide_resnet(depth=50, width_factor=2, filters=64, num_classes=1000, image_size=224,
                                global_batch=32)
    with pytest.raises(CellInputError, match="^family: stage placement covers transformer layers"):
        StagePlacer(wrn, [A100], dp=1)
