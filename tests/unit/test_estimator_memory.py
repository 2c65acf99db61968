"""Memory per GPU: golden values for the formulas (Korthikanti Fig. 1, the ZeRO table, the recipes,
parameter counts of public models) and the errors of bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tessera.estimator import memory as mem
from tessera.estimator.memory import (
    estimate_memory,
    korthikanti_activation_bytes,
    marp_memory,
    num_params,
    zero_model_state_bytes,
)
from tessera.estimator.memory_terms import DEFAULT_OTHER_BYTES, GIB, RECIPES, rank_params
from tessera.estimator.models import REGISTERED, ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError

# Korthikanti et al. 2022 Fig. 1 (values as Calculon's validation.py lists them;
# docs/reference/estimation.md 1.1):
# (h, a, L, t, p, b, v) -> params+optimizer GiB (18 B/param of 12Lh^2/(tp)), activations GiB with
# TP only, with SP + selective recompute. s = 2048.
FIG1 = {
    "22B": ((6144, 64, 48, 8, 1, 4, 1), 45.56, 59.25, 9.56),
    "175B": ((12288, 96, 96, 8, 8, 1, 3), 45.56, 66.84, 12.35),
    "530B": ((20480, 128, 105, 8, 35, 1, 3), 31.64, 114.02, 23.08),
    "1T": ((25600, 160, 128, 8, 64, 1, 1), 32.96, 131.25, 26.56),
}


@pytest.mark.parametrize("name", sorted(FIG1))
def test_korthikanti_figure1(name: str) -> None:
    (h, a, layers, t, p, b, v), static_gib, tp_gib, sp_sel_gib = FIG1[name]
    assert round(18 * 12 * layers * h * h / (t * p) / GIB, 2) == static_gib
    assert RECIPES["megatron-bf16"].bytes_per_param == 18
    tp_only = korthikanti_activation_bytes(2048, b, h, a, layers, t=t, p=p, v=v)
    sp_sel = korthikanti_activation_bytes(2048, b, h, a, layers, t=t, p=p, v=v, sp=True, recompute="selective")
    assert round(tp_only / GIB, 2) == tp_gib
    assert round(sp_sel / GIB, 2) == sp_sel_gib


def test_korthikanti_table2_rows() -> None:
    s, b, h, a, t = 2048, 1, 4096, 32, 4
    sbh = s * b * h
    assert mem.korthikanti_layer_bytes(s, b, h, a) == sbh * (34 + 5 * a * s / h)
    assert mem.korthikanti_layer_bytes(s, b, h, a, t) == sbh * (10 + 24 / t + 5 * a * s / (h * t))
    assert mem.korthikanti_layer_bytes(s, b, h, a, t, sp=True) == sbh * (34 / t + 5 * a * s / (h * t))
    assert mem.korthikanti_layer_bytes(s, b, h, a, t, recompute="selective") == sbh * (10 + 24 / t)
    assert mem.korthikanti_layer_bytes(s, b, h, a, t, sp=True, recompute="selective") == sbh * 34 / t
    assert mem.korthikanti_layer_bytes(s, b, h, a, t, recompute="full") == 2 * sbh
    # fewer micro-batches than stages: m/p of the in-flight activations
    assert korthikanti_activation_bytes(s, b, h, a, 32, t=1, p=8, m=2) == \
        korthikanti_activation_bytes(s, b, h, a, 32, t=1, p=8) * 2 / 8


# The ZeRO paper's table for psi = 7.5B, recomputed in docs/reference/estimation.md 1.3 (GB).
ZERO_TABLE = {
    1: {1: 120, 4: 52.5, 16: 35.6, 64: 31.4, 256: 30.4, 1024: 30.1},
    2: {1: 120, 4: 41.2, 16: 21.6, 64: 16.6, 256: 15.4, 1024: 15.1},
    3: {1: 120, 4: 30.0, 16: 7.5, 64: 1.88, 256: 0.47, 1024: 0.12},
}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_table(stage: int) -> None:
    for nd, gb in ZERO_TABLE[stage].items():
        assert abs(zero_model_state_bytes(7.5e9, nd, stage) / 1e9 - gb) <= 0.051 * max(1, gb / 10) + 0.005


@pytest.mark.parametrize(("stage", "sharding"), [(0, "none"), (1, "zero1"), (2, "zero2"), (3, "zero3")])
def test_estimate_shards_model_state_as_the_zero_paper(stage: int, sharding: str) -> None:
    m = REGISTERED["gpt2-medium"]
    psi = num_params(m)
    for nd in (1, 4, 16):
        est = estimate_memory(m, ExecutionPlan(dp=nd, sharding=sharding, precision="mixed"))  # type: ignore[arg-type]
        state = est.parameters + est.gradients + est.optimizer
        assert abs(state - zero_model_state_bytes(psi, nd, stage)) <= 3


def test_recipes_bytes_per_param() -> None:
    assert {n: r.bytes_per_param for n, r in RECIPES.items()} == {
        "fp32": 16, "amp": 16, "mixed": 16, "megatron-bf16": 18, "megatron-fp16": 20, "bf16": 8,
        "mixed-adafactor": 10}
    assert RECIPES["megatron-fp16"].bytes_per_param == mem.STATIC_BYTES_PER_PARAM


def test_parameter_counts_of_public_models() -> None:
    # Hugging Face parameter counts: GPT2LMHeadModel, LlamaForCausalLM, BertForMaskedLM.
    assert num_params(REGISTERED["gpt2-small"]) == 124_439_808
    assert num_params(REGISTERED["llama2-7b"]) == 6_738_415_616
    assert num_params(REGISTERED["llama2-13b"]) == 13_015_864_320
    assert num_params(REGISTERED["bert-large"]) == 335_174_458
    assert num_params(REGISTERED["bert-base"]) == 109_514_298
    assert round(num_params(REGISTERED["moe-2.4b"]) / 1e9, 1) == 2.4


def test_state_is_bytes_per_param_times_params_on_the_rank() -> None:
    m = REGISTERED["llama2-7b"]
    est = estimate_memory(m, ExecutionPlan())
    assert est.parameters + est.gradients + est.optimizer == 18 * num_params(m)
    tp = estimate_memory(m, ExecutionPlan(tp=8, dp=1))
    dense, _, _ = rank_params(m, ExecutionPlan(tp=8), 0)
    assert tp.parameters == 2 * dense and tp.optimizer == 12 * dense
    # every layer and the embedding split 8 ways; norms replicated
    assert abs(dense - num_params(m) / 8) / (num_params(m) / 8) < 0.001


def test_structure_of_the_estimate() -> None:
    m = REGISTERED["gpt2-xl"]
    base = estimate_memory(m, ExecutionPlan(micro_batch=4))
    assert base.source == "formula" and base.total == base.tensor_bytes + base.other
    assert base.other == DEFAULT_OTHER_BYTES
    # gradient accumulation does not change the memory of a micro-batch (no pipeline)
    assert estimate_memory(m, ExecutionPlan(micro_batch=4, grad_accum=16)) == base
    # less activation memory: full < selective < none (plain attention); selective ~ flash
    plain = estimate_memory(m, ExecutionPlan(micro_batch=4, flash_attention=False))
    sel = estimate_memory(m, ExecutionPlan(micro_batch=4, flash_attention=False, checkpointing="selective"))
    full = estimate_memory(m, ExecutionPlan(micro_batch=4, checkpointing="full"))
    assert full.activations < sel.activations < plain.activations
    assert full.activations < base.activations < plain.activations
    assert abs(sel.activations - base.activations) < 0.01 * base.activations
    # ZeRO stages only ever lower the state; offload moves the optimizer to the host
    z = [estimate_memory(m, ExecutionPlan(dp=8, micro_batch=4, sharding=s)).total  # type: ignore[arg-type]
         for s in ("none", "zero1", "zero2", "zero3")]
    assert z == sorted(z, reverse=True)
    off = estimate_memory(m, ExecutionPlan(dp=8, micro_batch=4, sharding="zero2", offload="optimizer"))
    assert off.optimizer == 0 and off.gradients == 0 and off.cpu_bytes > 0
    # 1F1B: the first stage holds min(m, p) micro-batches; m = 1 holds one
    pp = estimate_memory(m, ExecutionPlan(pp=4, micro_batch=4, grad_accum=8))
    assert pp.stage == 0
    first8 = mem._stage_activations(m, ExecutionPlan(pp=4, micro_batch=4, grad_accum=8), 0)
    first1 = mem._stage_activations(m, ExecutionPlan(pp=4, micro_batch=4, grad_accum=1), 0)
    assert 3.5 * first1 < first8 < 4 * first1
    last8 = mem._stage_activations(m, ExecutionPlan(pp=4, micro_batch=4, grad_accum=8), 3)
    assert last8 < first8  # the last stage holds one micro-batch, plus the loss


def test_flash_attention_drops_the_quadratic_term() -> None:
    m = ModelDims(2048, 1, 16, 1000, 4096)
    x = mem._ActShape(4096, 2, 1, 1, False, "none")
    plain = mem.layer_stored_bytes(m, 0, x, 1)
    flash = mem.layer_stored_bytes(m, 0, mem._ActShape(4096, 2, 1, 1, True, "none"), 1)
    # Korthikanti's 5as^2b (+ our LayerNorm statistics) without flash; a 4asb logsumexp with it
    assert plain - flash == 5 * 16 * 4096 * 4096 - 4 * 16 * 4096


def test_marp_mode_is_frenzy_unchanged() -> None:
    m = REGISTERED["gpt2-small"]
    est = estimate_memory(m, ExecutionPlan(micro_batch=8, tp=2, dp=3), mode="marp")
    marp = marp_memory(m, 8, 2)
    assert est.source == "formula:marp"
    assert (est.parameters, est.activations) == (marp.static_bytes, marp.activation_bytes)


def test_capacity_and_fits_from_the_catalog() -> None:
    m = REGISTERED["llama2-7b"]
    est = estimate_memory(m, ExecutionPlan(tp=8, micro_batch=1), gpu="a100-80gb")
    assert est.capacity_bytes == 80 * 1000**3 and est.fits is True
    big = estimate_memory(m, ExecutionPlan(micro_batch=1), gpu="A10")
    assert big.fits is False
    assert est.to_dict()["total"] == est.total


@pytest.mark.parametrize(("call", "field"), [
    (lambda: estimate_memory(ModelDims(768, 12, 12, 50257, 0), ExecutionPlan()), "model.seq_length"),
    (lambda: estimate_memory(ModelDims(768, 12, 10, 50257, 1024), ExecutionPlan()), "model.num_heads"),
    (lambda: estimate_memory(REGISTERED["gpt2-small"], ExecutionPlan(dp=2), num_gpus=4), "num_gpus"),
    (lambda: estimate_memory(REGISTERED["gpt2-small"], ExecutionPlan(), gpu="B300-1TB"), "gpu"),
    (lambda: estimate_memory(REGISTERED["gpt2-small"], ExecutionPlan(), mode="guess"), "mode"),
    # the traced mode is torch code, a layer above the library: named, not run
    (lambda: estimate_memory(REGISTERED["gpt2-small"], ExecutionPlan(), mode="traced"), "mode"),
    (lambda: estimate_memory(REGISTERED["gpt2-small"], ExecutionPlan(tp=5)), "plan.tp"),
])
def test_bad_input_names_the_field(call: object, field: str) -> None:
    with pytest.raises(PlanInputError) as e:
        call()  # type: ignore[operator]
    assert e.value.field == field
    assert isinstance(e.value, ValueError)


def test_estimator_imports_without_torch() -> None:
    code = ("import sys; import tessera.estimator.memory, tessera.estimator.plans, tessera.estimator.models, "
            "tessera.estimator.memory_terms, tessera.estimator.catalog, tessera.common.gpus; "
            "from tessera.estimator.memory import estimate_memory; from tessera.estimator.models import REGISTERED; "
            "from tessera.estimator.plans import ExecutionPlan; estimate_memory(REGISTERED['llama2-7b'], ExecutionPlan()); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
