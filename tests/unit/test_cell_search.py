"""The Cell search (estimator/cell_search.py, cell_fsdp.py): micro-batch count per Cell, hybrid
dp x tp stage layouts, FSDP stage options, the exact best plan."""

from __future__ import annotations

import random

import pytest

from tessera.estimator.cell_fsdp import exposed_fsdp_comm
from tessera.estimator.cell_search import divisors, exact_best, stage_layouts
from tessera.estimator.cells import (
    CellConfig,
    CellEstimator,
    CellModel,
    ClusterSpec,
    GpuPool,
    StageCost,
    StagePlan,
    _Placement,
    best_plan,
    enumerate_plans,
    execution_plan,
    iteration_time,
)
from tessera.estimator.models import ModelDims

# Llama-3-8B-like (Meta's config.json: hidden 4096, 32 layers, 32 heads, 8 KV heads, SwiGLU 14336,
# vocab 128256), 8k tokens: the job of issue 14.
LLAMA8B = ModelDims(4096, 32, 32, 128256, 8192, name="llama3-8b-like", ffn_hidden=14336, gated=True,
                    num_kv_heads=8, tied_embeddings=False)
H100_NODE = GpuPool("H100-80GB", 8, 8)
SMALL = CellModel("gpt", hidden_size=1024, num_layers=8, num_heads=16, vocab_size=32000, seq_length=1024,
                  global_batch=64)


def test_8b_at_batch_16_on_one_node_gets_plain_data_parallelism() -> None:
    # Before: B = 4 x Ns forced (4 with one stage: 4 samples per micro-batch, too few for dp8), so
    # the best Cell was pp2 x tp4 with 8 micro-batches although dp8 fits and is faster.
    model = CellModel.from_dims(LLAMA8B, 16)
    for cfg in (CellConfig(), CellConfig(fsdp_stages=False)):
        est = CellEstimator(cfg)
        best = {c.num_gpus: c for c in est.best_cells(model, ClusterSpec((H100_NODE,)))}[8]
        assert best.plan is not None and best.iter_time is not None and best.num_stages == 1
        assert (best.plan.stages[0].dp, best.plan.stages[0].tp) == (8, 1)
        assert 16 % (best.plan.num_microbatches * 8) == 0
        old = best_plan(est.stage_costs(model, H100_NODE, 8, 2, options=[[(1, 4)], [(1, 4)]], num_microbatches=8)[0], 8)
        assert old is not None and best.iter_time.value < 0.85 * old.iter_time
        ep = best.execution_plan
        assert ep is not None and (ep.dp, ep.tp, ep.pp, ep.global_batch) == (8, 1, 1, 16)


def test_one_stage_takes_the_smallest_micro_batch_count_that_fits() -> None:
    est = CellEstimator(CellConfig(fsdp_stages=False))
    c = est.cell(SMALL, GpuPool("A100-40GB", 8, 8), 4, 1)
    assert c.plan is not None and c.plan.num_microbatches == 1  # fits whole: no gradient accumulation
    # a GPU too small for 16 sequences per rank at once: gradient accumulation, just as much as needed
    big = CellModel("gpt", 2048, 16, 16, 50000, 2048, global_batch=64)
    c = est.cell(big, GpuPool("A10", 4, 4), 4, 1)
    assert c.fits and c.plan is not None and c.plan.num_microbatches > 1
    b = c.plan.num_microbatches
    smaller = [d for d in divisors(64) if d < b]
    lay = (c.plan.stages[0].dp, c.plan.stages[0].tp)
    for d in smaller:  # none of the smaller counts fits this layout
        rows = est.stage_costs(big, GpuPool("A10", 4, 4), 4, 1, options=[[lay]], num_microbatches=d)[0]
        assert not rows[0] or not rows[0][0].fits


def test_pipelines_try_every_divisor_from_ns_up_to_four_per_stage() -> None:
    est = CellEstimator()
    pool = GpuPool("A100-40GB", 16, 4)
    c = est.cell(SMALL, pool, 8, 2)
    assert c.plan is not None and c.iter_time is not None and c.plan.num_microbatches in (2, 4, 8)
    for b in (2, 4, 8):
        p = best_plan(est.stage_costs(SMALL, pool, 8, 2, num_microbatches=b)[0], b)
        assert p is None or c.iter_time.value <= p.iter_time * (1 + 1e-12)
    # a batch with no divisor from Ns to 4 x Ns (3 sequences, 4 stages): the divisors below Ns
    tiny = CellModel("gpt", 512, 8, 8, 1000, 128, global_batch=3)
    t = est.cell(tiny, pool, 4, 4)
    assert t.plan is not None and t.plan.num_microbatches in (1, 3)


def test_fixed_runtime_micro_batches_are_kept_and_cannot_split_too_far() -> None:
    model = CellModel.from_dims(LLAMA8B, 16)
    c = CellEstimator(CellConfig(num_microbatches=16)).cell(model, H100_NODE, 8, 1)
    # 16 micro-batches of one sequence: no room for 8 DP ranks, the runtime cannot run dp8
    assert c.plan is not None and c.plan.num_microbatches == 16 and c.plan.stages[0].dp == 1


def test_stage_layouts_are_every_factorisation_within_a_node() -> None:
    assert stage_layouts(1) == ((1, 1),)
    assert stage_layouts(8, 8, 32) == ((8, 1), (4, 2), (2, 4), (1, 8))
    assert stage_layouts(8, 4, 32) == ((8, 1), (4, 2), (2, 4))  # TP stays within a 4-GPU node
    assert stage_layouts(8, 8, 12) == ((8, 1), (4, 2), (2, 4))  # whole heads per TP rank
    assert stage_layouts(6, 8, 16) == ((6, 1), (3, 2))
    assert divisors(12) == (1, 2, 3, 4, 6, 12) and divisors(1) == (1,) and divisors(16) == (1, 2, 4, 8, 16)
    c = CellEstimator().cell(SMALL, GpuPool("A100-40GB", 16, 4), 16, 1)
    assert c.plan is not None and c.plan.stages[0].tp <= 4


def _cost(i: int, dp: int, tp: int, busy: float, comm: float, sync: float, fits: bool, sharding: str = "none") -> StageCost:
    return StageCost(StagePlan(i, i + 1, dp, tp, sharding), busy, 0.0, comm, sync, 1.0, fits, "f", "f")


def test_exact_best_matches_enumeration_with_many_options_per_stage() -> None:
    rng = random.Random(11)
    for _ in range(300):
        ns, b = rng.randint(1, 5), rng.randint(1, 24)
        opts = [[_cost(i, 8 // tp, tp, rng.uniform(0.05, 2), rng.uniform(0, 0.5), rng.uniform(0, 1),
                       rng.random() > 0.2, rng.choice(("none", "fsdp")))
                 for tp in rng.sample((1, 2, 4, 8), rng.randint(1, 4))] for i in range(ns)]
        plans = enumerate_plans(opts, b)
        best = exact_best(opts, b)
        if not plans:
            assert best is None
            continue
        assert best is not None and best.fits
        assert best.iter_time == pytest.approx(min(p.iter_time for p in plans), rel=1e-12)
        assert best.iter_time == pytest.approx(iteration_time(best.stages, b), rel=1e-12)


def test_fsdp_exposed_communication_rule() -> None:
    # first gather and last reduce-scatter exposed; the rest hides behind compute up to its length
    assert exposed_fsdp_comm([1.0, 1.0], [0.5, 0.5], compute=10.0) == 1.5
    assert exposed_fsdp_comm([1.0, 1.0], [0.5, 0.5], compute=2.0) == pytest.approx(1.5 + (5.0 - 1.5 - 2.0))
    assert exposed_fsdp_comm([], [], 1.0) == 0.0


def test_fsdp_variant_shards_the_state_and_trades_the_all_reduce() -> None:
    est = CellEstimator()
    pool = GpuPool("A100-40GB", 8, 8)
    model = CellModel("gpt", 2048, 4, 16, 32000, 1024, global_batch=8)
    base = est.stage_costs(model, pool, 8, 1, options=[[(8, 1)]], num_microbatches=1)[0][0][0]
    ops = est.operators(model)
    f = est._fsdp(base, model, pool, _Placement(1, 8))
    dense = sum(o.params - o.expert_params for o in ops)
    layer = max(o.params for o in ops)
    wg = 2.0 * model.dtype_bytes  # mixed: 2 B weights + 2 B gradients (ZeRO-1 already shards the optimizer)
    expected = base.memory_bytes - dense * wg * (1 - 1 / 8) + layer * (2 * 2 + 2)
    assert f.memory_bytes == pytest.approx(expected)
    assert f.plan.sharding == "fsdp" and (f.plan.dp, f.plan.tp) == (8, 1)
    assert f.compute == base.compute and f.intra_comm > base.intra_comm  # exposed gathers on the critical path
    assert f.sync < base.sync  # no gradient all-reduce left, the same optimizer shard


def test_fsdp_is_offered_where_plain_dp_does_not_fit_and_carried_into_the_plan() -> None:
    model = CellModel("gpt", 4096, 32, 32, 50000, 2048, global_batch=8, precision="mixed")
    pool = GpuPool("A100-40GB", 8, 8)
    plain = CellEstimator(CellConfig(fsdp_stages=False)).cell(model, pool, 8, 1)
    c = CellEstimator().cell(model, pool, 8, 1)
    assert c.fits and c.plan is not None and c.iter_time is not None
    s = c.plan.stages[0]
    assert s.sharding == "fsdp" and s.dp > 1
    assert not plain.fits or (plain.iter_time is not None and c.iter_time.value <= plain.iter_time.value)
    assert c.plan.describe().startswith("pp1[fsdp")
    ep = execution_plan(model, c.plan)
    assert ep is not None and ep.sharding == "fsdp" and ep.dp == s.dp and ep.reshards_after_forward
    # the unsharded twin of the chosen layout does not fit at the chosen micro-batch count
    twin = CellEstimator().stage_costs(model, pool, 8, 1, options=[[(s.dp, s.tp)]],
                                       num_microbatches=c.plan.num_microbatches)[0][0][0]
    assert not twin.fits
    # pipelines never get FSDP stages (FSDP2 under PP keeps weights and gradients unsharded)
    for n_st in (2, 4):
        p = CellEstimator().cell(model, pool, 8, n_st).plan
        assert p is None or all(x.sharding == "none" for x in p.stages)


def test_more_gpus_can_be_slower_when_the_batch_does_not_split() -> None:
    # Why the property test does not assert monotonicity in the GPU count: one sequence cannot be
    # split over two DP ranks, and TP or PP over PCIe costs more than it saves on a small model.
    m = CellModel("gpt", 256, 4, 4, 32000, 128, global_batch=1)
    pool = GpuPool("A100-40GB", 2, 2, intra_link="pcie")
    est = CellEstimator()
    one = est.cell(m, pool, 1, 1).iter_time
    two = [c.iter_time.value for c in (est.cell(m, pool, 2, 1), est.cell(m, pool, 2, 2)) if c.iter_time]
    assert one is not None and two and min(two) > one.value


def test_cell_options_and_stage_messages_carry_the_search() -> None:
    from tessera.estimator.convert import execution_plan as execution_plan_of
    from tessera.estimator.errors import PlanInputError
    from tessera.estimator.service.handlers import cell_config, cell_message
    from tessera.v1 import estimator_pb2 as pb

    assert cell_config(pb.CellOptions()) == CellConfig()
    cfg = cell_config(pb.CellOptions(num_microbatches=16, fsdp=False))
    assert (cfg.num_microbatches, cfg.fsdp_stages) == (16, False)
    with pytest.raises(PlanInputError, match="^options.num_microbatches:"):
        cell_config(pb.CellOptions(num_microbatches=-1))
    model = CellModel("gpt", 4096, 32, 32, 50000, 2048, global_batch=8)
    msg = cell_message(CellEstimator().cell(model, GpuPool("A100-40GB", 8, 8), 8, 1))
    assert msg.plan.stages[0].sharding == "fsdp" and execution_plan_of(msg.execution_plan).sharding == "fsdp"
    assert msg.plan.description.startswith("pp1[fsdp")
