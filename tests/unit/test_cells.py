"""Crius Cells: pipeline latency, the 2^Ns assembled plans, memory-infeasible plans, bad input."""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import sys

import pytest

from tessera.common.gpus import lookup
from tessera.estimator.catalog import Price, price
from tessera.estimator.cells import (
    CellConfig,
    CellEstimator,
    CellInputError,
    CellModel,
    ClusterSpec,
    GpuPool,
    Sourced,
    StageCost,
    StagePlan,
    best_plan,
    enumerate_plans,
    iteration_time,
    job_cells,
    model_operators,
    pipeline_latency,
)
from tessera.estimator.compute import DEFAULT_PRIOR, EfficiencyPrior, stage_compute_time
from tessera.estimator.partition import Operator
from tests.shared_data import require_shared_data

GPT = CellModel("gpt", hidden_size=1024, num_layers=8, num_heads=16, vocab_size=32000, seq_length=1024,
                global_batch=64, name="gpt-350m-ish")
MOE = CellModel("moe", hidden_size=768, num_layers=8, num_heads=16, vocab_size=32000, seq_length=1024,
                global_batch=256, ffn_mult=8, num_experts=16, top_k=2, expert_group_size=2048)
A100 = GpuPool("A100-40GB", num_gpus=16, gpus_per_node=4, intra_link="nvlink", nic_gbps=12.5)
A40 = GpuPool("A40-48GB", num_gpus=8, gpus_per_node=2, intra_link="pcie", nic_gbps=12.5)


def cost(i: int, busy: float, comm: float, sync: float = 0.0, fits: bool = True, tp: int = 1) -> StageCost:
    return StageCost(StagePlan(i, i + 1, 2 // tp, tp), busy, 0.0, comm, sync, 1.0, fits, "formula:t", "formula:t")


def test_pipeline_latency_golden() -> None:
    # Sec. 5.1: (T1+T2+T3+T4) + (B-1) * (T_slowest - Tcomm_slowest)
    assert pipeline_latency([1.0, 2.0, 3.0, 2.0], [0.0, 0.5, 0.5, 0.5], 4) == pytest.approx(8.0 + 3 * 2.5)
    assert pipeline_latency([2.0], [0.0], 1) == 2.0
    stages = [cost(0, 1.0, 0.0, sync=0.3), cost(1, 2.0, 0.5, sync=0.1)]
    assert iteration_time(stages, 8) == pytest.approx(3.5 + 7 * 2.0 + 0.3)
    with pytest.raises(CellInputError, match="^num_microbatches:"):
        pipeline_latency([1.0], [0.0], 0)
    with pytest.raises(CellInputError, match="^latencies:"):
        pipeline_latency([1.0, 2.0], [0.0], 2)


def test_two_to_the_ns_plans_enumerated() -> None:
    opts = [[cost(i, 1.0 + i, 0.1), cost(i, 0.8 + i, 0.3, tp=2)] for i in range(3)]
    plans = enumerate_plans(opts, 12)
    assert len(plans) == 2**3
    assert len({p.plan for p in plans}) == 8
    best = best_plan(opts, 12)
    assert best is not None
    assert best.iter_time == pytest.approx(min(p.iter_time for p in plans))


def test_exact_best_plan_matches_enumeration_on_random_cells() -> None:
    rng = random.Random(7)
    for _ in range(200):
        ns = rng.randint(1, 5)
        opts = [[cost(i, rng.uniform(0.1, 2), rng.uniform(0, 0.5), rng.uniform(0, 1), rng.random() > 0.15, tp)
                 for tp in (1, 2)] for i in range(ns)]
        b = rng.randint(1, 16)
        plans = enumerate_plans(opts, b)
        best = best_plan(opts, b)
        if not plans:
            assert best is None
            continue
        assert best is not None
        assert best.iter_time == pytest.approx(min(p.iter_time for p in plans))


def test_memory_infeasible_plans_dropped() -> None:
    opts = [[cost(0, 1.0, 0.0), cost(0, 0.1, 0.0, fits=False, tp=2)], [cost(1, 1.0, 0.0), cost(1, 0.5, 0.0, tp=2)]]
    plans = enumerate_plans(opts, 4)
    assert len(plans) == 2 and all(p.plan.stages[0].tp == 1 for p in plans)
    best = best_plan(opts, 4)
    assert best is not None and best.plan.stages[0].tp == 1 and best.plan.stages[1].tp == 2
    assert best_plan([[cost(0, 1.0, 0.0, fits=False)]], 4) is None


def test_cell_end_to_end_with_sources_and_cache() -> None:
    est = CellEstimator()
    c = est.cell(GPT, A100, 8, 2)
    assert c.fits and c.plan is not None and c.iter_time is not None and c.memory_per_gpu is not None
    assert c.num_stages == 2 and c.stage_gpus == (4, 4) and c.nodes == 2 and c.gpus_per_node == 4
    # B in 2, 4, 8 (the divisors of 64 from Ns to 4 x Ns), each with 3 x 3 layouts (dp4, dp2xtp2, tp4)
    assert c.plans_assembled == 3 * 9 and 1 <= c.plans_feasible <= 27
    assert c.plan.num_gpus == 8 and c.plan.num_microbatches in (2, 4, 8)
    assert c.iter_time.source.startswith("formula:") and "prior:" in c.iter_time.source
    assert c.memory_per_gpu.source.startswith("formula:")
    assert 0 < c.memory_per_gpu.value < 40e9
    b = dict(c.breakdown)
    assert b["total"] == c.iter_time.value and b["compute"] > 0
    assert est.cell(GPT, A100, 8, 2) is c and est.hits == 1
    # stages of one GPU have a single option: one plan per micro-batch count tried
    assert est.cell(GPT, A100, 2, 2).plans_assembled == 3


def test_more_gpus_faster_and_cross_node_tp_is_avoided() -> None:
    est = CellEstimator()
    t1 = est.cell(GPT, A100, 1, 1).iter_time
    t4 = est.cell(GPT, A100, 4, 1).iter_time
    assert t1 is not None and t4 is not None and t4.value < t1.value
    c = est.cell(GPT, A100, 8, 1)
    assert c.plan is not None and c.plan.stages[0].tp != 8  # TP over the network loses to DP


def test_moe_expert_parallel_cell() -> None:
    ops = model_operators(MOE)
    assert sum(o.expert_params > 0 for o in ops) == MOE.num_layers // 2
    c = CellEstimator().cell(MOE, A40, 4, 1)
    assert c.fits and c.iter_time is not None and c.iter_time.value > 0


def test_memory_infeasible_cell_reports_reason() -> None:
    huge = CellModel("gpt", 8192, 48, 64, 51200, 2048, global_batch=8)
    c = CellEstimator().cell(huge, A40, 2, 1)
    assert not c.fits and c.reason.startswith("memory:") and c.iter_time is None


def test_measured_overrides_and_invalidate() -> None:
    est = CellEstimator()
    est.cell(GPT, A100, 4, 1)
    est.record_measured(GPT.signature, "A100-40GB", 4, 1, 1.25)
    c = est.cell(GPT, A100, 4, 1)
    assert c.iter_time is not None and c.iter_time.value == 1.25 and c.iter_time.source == "measured"
    est.invalidate(GPT.signature)
    assert est.cell(GPT, A100, 2, 1).fits


def test_job_cells_over_a_cluster() -> None:
    cluster = ClusterSpec.from_mapping({"pools": [
        {"gpu": "A100-40GB", "nodes": 2, "gpus_per_node": 4, "intra_link": "nvlink"},
        {"gpu": "A40", "num_gpus": 4, "gpus_per_node": 2, "intra_link": "pcie", "nic_gbps": 25}]})
    cells = job_cells(GPT, cluster)
    # A100: n in 1,2,4,8 with stages 1..n (powers of two): 1+2+3+4; A40: n in 1,2,4: 1+2+3
    assert len(cells) == 16
    assert {c.gpu_type for c in cells} == {"A100-40GB", "A40-48GB"}
    assert any(c.fits for c in cells) and all(c.iter_time is not None for c in cells if c.fits)
    best = CellEstimator(CellConfig()).best_cells(GPT, cluster)
    assert len(best) == 7


def test_cells_carry_their_stage_times_and_they_give_the_iteration_time() -> None:
    cells = [c for c in job_cells(GPT, ClusterSpec((A100,))) if c.fits]
    assert cells and all(c.plan is not None and len(c.stage_costs) == c.num_stages for c in cells)
    for c in cells:
        assert c.plan is not None and c.iter_time is not None
        assert [(x.plan.dp, x.plan.tp) for x in c.stage_costs] == [(s.dp, s.tp) for s in c.plan.stages]
        assert iteration_time(c.stage_costs, c.plan.num_microbatches) == pytest.approx(c.iter_time.value)
        assert c.memory_per_gpu is not None and max(x.memory_bytes for x in c.stage_costs) == c.memory_per_gpu.value


def test_cells_carry_the_cost_of_their_gpus() -> None:
    cluster = ClusterSpec.from_mapping({"pools": [
        {"gpu": "A30", "num_gpus": 4, "gpus_per_node": 4},  # the catalog's price: Espresso Table I
        {"gpu": "A100-40GB", "num_gpus": 4, "gpus_per_node": 4, "price_per_hour": 1.5, "currency": "USD"},
        {"gpu": "A40", "num_gpus": 2, "gpus_per_node": 2}]})  # no known price
    cells = {(c.gpu_type, c.num_gpus, c.num_stages): c for c in job_cells(GPT, cluster)}
    a30 = cells[("A30-24GB", 4, 1)]
    assert a30.cost_per_hour == Sourced(16.0, "catalog:Espresso Table I (JuChi Cloud rental, matpool.com)")
    assert a30.currency == "CNY" and a30.fits and a30.iter_time is not None and a30.cost_per_iteration is not None
    assert a30.cost_per_iteration.value == pytest.approx(16.0 * a30.iter_time.value / 3600)
    a100 = cells[("A100-40GB", 2, 2)]
    assert (a100.cost_per_hour, a100.currency) == (Sourced(3.0, "cluster"), "USD")
    a40 = [c for c in cells.values() if c.gpu_type == "A40-48GB"]
    assert a40 and all(c.cost_per_hour is None and c.cost_per_iteration is None and c.currency == ""
                       for c in a40)


def test_catalog_prices_are_the_espresso_artifacts() -> None:
    assert (price("A6000"), price("a100")) == (Price(6.0, "CNY", price("A30").source), None)  # type: ignore[union-attr]
    cfg = require_shared_data("espresso/gpu_config.json")
    names = {"a30-pcie-24gb": "A30", "a6000-pcie4-48gb": "A6000", "a4000-pcie4-16gb": "A4000",
             "3090-pcie4-24gb": "RTX3090"}
    for key, row in json.loads(cfg.read_text()).items():
        assert price(names[key]).per_hour == row["cost"]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"price_per_hour": -1.0}, "price_per_hour: must be a number 0..1,000,000 per GPU-hour"),
     ({"price_per_hour": 1e308}, "price_per_hour: must be a number 0..1,000,000 per GPU-hour"),
     ({"price_per_hour": math.nan}, "price_per_hour: must be a number 0..1,000,000 per GPU-hour"),
     ({"price_per_hour": 1.0, "currency": "usd"}, "currency: must be an ISO 4217 code"),
     ({"currency": "USD"}, "currency: given without price_per_hour")],
)
def test_bad_prices_name_the_field(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(CellInputError, match=f"^{re.escape(message)}"):
        GpuPool("A100", 8, 8, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"hidden_size": 0}, "hidden_size"), ({"num_heads": 7}, "num_heads"), ({"family": "rnn"}, "family"),
     ({"global_batch": -1}, "global_batch"), ({"family": "moe", "num_experts": 0}, "num_experts")],
)
def test_bad_model_names_the_field(kwargs: dict[str, object], field: str) -> None:
    base: dict[str, object] = {"family": "gpt", "hidden_size": 1024, "num_layers": 4, "num_heads": 16,
                               "vocab_size": 1000, "seq_length": 128, "global_batch": 8}
    with pytest.raises(CellInputError, match=f"^{field}:"):
        CellModel(**{**base, **kwargs})  # type: ignore[arg-type]


def test_bad_plans_and_gpus_name_the_field() -> None:
    est = CellEstimator()
    with pytest.raises(CellInputError, match="^gpu:"):
        GpuPool("Z9000", 8, 8)
    with pytest.raises(CellInputError, match="^intra_link:"):
        GpuPool("A10", 8, 2, intra_link="nvlink")
    with pytest.raises(CellInputError, match="^nodes:"):
        est.cell(GPT, A100, 8, 1, nodes=3, gpus_per_node=2)  # 3 x 2 != 8
    with pytest.raises(CellInputError, match="^gpus_per_node:"):
        est.cell(GPT, A100, 8, 1, nodes=1, gpus_per_node=8)
    with pytest.raises(CellInputError, match="^num_gpus:"):
        est.cell(GPT, A100, 32, 1)
    with pytest.raises(CellInputError, match=r"^options\[0\]:"):
        est.stage_costs(GPT, A100, 4, 1, options=[[(2, 1)]])  # 2 x 1 != 4
    with pytest.raises(CellInputError, match="^num_stages:"):
        est.stage_costs(GPT, A100, 2, 4)
    with pytest.raises(CellInputError, match="^gpu:"):
        est.record_measured(GPT.signature, "Z9000", 1, 1, 1.0)
    assert not est.cell(GPT, A100, 4, 16).fits  # more stages than operators: an unfit Cell, with reason
    assert est.cell(GPT, A100, 4, 16).reason.startswith("num_stages:")


def test_compute_prior_golden() -> None:
    gpu = lookup("A100-40GB")
    op = Operator("x", flops=312e12, traffic_bytes=1555e9 / 2, traffic_sharded_bytes=1555e9 / 2)
    prior = EfficiencyPrior(matmul_efficiency=0.5, traffic_multiplier=2.0)
    # one sample: 312 TFLOP at 50% of 312 TFLOP/s = 2 s; 2 x 1555 GB at 1555 GB/s = 2 s
    assert stage_compute_time([op], gpu, 1, 1, 1, prior).seconds == pytest.approx(4.0)
    # DP 2 halves the samples per GPU; TP 2 halves the FLOPs and the sharded bytes only
    assert stage_compute_time([op], gpu, 2, 1, 1, prior).seconds == pytest.approx(2.0)
    assert stage_compute_time([op], gpu, 1, 2, 1, prior).seconds == pytest.approx(1.0 + 1.5)
    assert stage_compute_time([op], gpu, 1, 1, 1, prior).source.startswith("formula:prior")
    assert DEFAULT_PRIOR.source.startswith("prior:")
    with pytest.raises(ValueError, match="^dp:"):
        stage_compute_time([op], gpu, 0, 1, 1)
    with pytest.raises(ValueError, match="^matmul_efficiency:"):
        EfficiencyPrior(matmul_efficiency=1.5)


def test_model_flops_match_alpa_formula() -> None:
    # Alpa / Megatron: 96 B s L h^2 (1 + s / 6h) with recomputation, + 6 B s h V for the logits
    m = CellModel("bert", 2048, 24, 32, 51200, 1024, global_batch=1)
    total = sum(o.flops for o in model_operators(m))
    h, s, L, V = 2048, 1024, 24, 51200
    assert total == pytest.approx(96 * s * L * h * h * (1 + s / (6 * h)) + 6 * s * h * V)


def test_plan_describe_and_options() -> None:
    c = CellEstimator().cell(GPT, A100, 4, 2)
    assert c.plan is not None and c.plan.describe().startswith("pp2[")


def test_no_torch_at_import() -> None:
    # the torch layer's profilers load torch when they run, not at import
    code = ("import sys; import tessera.estimator.cells, tessera.estimator.tuning, tessera.estimator.comm, tessera.estimator.compute, "
            "tessera.estimator.partition, tessera.estimator.stage_placer, tessera.estimator.torch.comm_profile, "
            "tessera.estimator.torch.stage_profiler; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_from_shared_model_dims_and_execution_plan() -> None:
    from tessera.estimator.memory import estimate_memory
    from tessera.estimator.models import registered

    moe = registered("moe-690m")
    llama = registered("llama2-7b")
    bert = registered("bert-large")
    assert moe is not None and llama is not None and bert is not None
    m = CellModel.from_dims(moe, 256, precision="mixed-adafactor")
    assert (m.family, m.ffn_mult, m.num_experts, m.top_k) == ("moe", 8, 16, 2)
    assert m.state_bytes_per_param == 10  # 2 + 4 + 4
    assert CellModel.from_dims(bert, 8).family == "bert"
    assert CellModel.from_dims(llama, 8).ffn_mult == pytest.approx(11008 * 1.5 / 4096)  # SwiGLU: 3 matrices
    with pytest.raises(CellInputError, match="^precision:"):
        CellModel.from_dims(bert, 8, precision="fp8")

    g = CellModel.from_dims(registered("gpt2-medium"), 64)  # type: ignore[arg-type]
    c = CellEstimator().cell(g, A100, 4, 1)
    ep = c.execution_plan
    assert ep is not None and (ep.dp * ep.tp, ep.pp) == (4, 1)
    assert ep.global_batch == 64 and ep.grad_accum == c.plan.num_microbatches  # type: ignore[union-attr]
    # the Cell's quick feasibility figure is conservative against tessera.estimator.memory's fuller formula
    # for the same plan (it keeps 12 bytes per fp32 logit for the loss), within a factor of 1.7 (the
    # plan is one micro-batch of 16 sequences per GPU, where the logits weigh most)
    mem = estimate_memory(registered("gpt2-medium"), ep, gpu="A100-40GB")  # type: ignore[arg-type]
    assert c.memory_per_gpu is not None
    assert mem.total <= c.memory_per_gpu.value <= 1.7 * mem.total
