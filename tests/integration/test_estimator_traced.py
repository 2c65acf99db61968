"""Traced mode: one step under FakeTensorMode + MemTracker, against the formula and against real steps.

Tolerances, stated: the formula models the same program as the traced module, so it must be within
1% of the traced tensor bytes (parameters + gradients + optimizer + activations) on these configs;
the traced peak must equal, to the byte, MemTracker's peak of the same step on real CPU tensors; the
OS's view of a real step (peak RSS over the resident state, second step) must be within 2% of it.
"""

from __future__ import annotations

import pytest

from tessera.estimator.memory import estimate_memory
from tessera.estimator.models import REGISTERED, ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError

pytest.importorskip("torch")

from tessera.estimator.torch.traced import real_cpu_peak, run_step, traced_memory

BASE = {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "vocab_size": 1000, "seq_length": 256}
GPT = ModelDims(**BASE, name="tiny-gpt")
LLAMA = ModelDims(**BASE, name="tiny-llama", gated=True, ffn_hidden=512, num_kv_heads=2, tied_embeddings=False)
BERT = ModelDims(**BASE, name="tiny-bert", family="encoder")
MOE = ModelDims(**BASE, name="tiny-moe", family="moe", num_experts=4)

CONFIGS = [
    (GPT, ExecutionPlan(micro_batch=2, flash_attention=False)),
    (GPT, ExecutionPlan(tp=2, sequence_parallel=True, micro_batch=2, dp=2, sharding="zero1")),
    (LLAMA, ExecutionPlan(pp=2, grad_accum=4, micro_batch=2, checkpointing="full")),
    (BERT, ExecutionPlan(micro_batch=2, precision="amp")),
    (MOE, ExecutionPlan(dp=2, ep=2, sharding="zero2", micro_batch=2, precision="mixed")),
]


@pytest.mark.parametrize(("model", "plan"), CONFIGS, ids=lambda x: getattr(x, "name", None) or x.key)
def test_formula_matches_traced(model: ModelDims, plan: ExecutionPlan) -> None:
    traced = traced_memory(model, plan)
    formula = estimate_memory(model, plan)
    assert traced.source == "traced" and traced.stage == formula.stage
    # the resident state is counted, not estimated: exact
    assert (traced.parameters, traced.gradients, traced.optimizer) == \
        (formula.parameters, formula.gradients, formula.optimizer)
    assert abs(formula.tensor_bytes - traced.tensor_bytes) <= 0.01 * traced.tensor_bytes
    assert traced.total == traced.tensor_bytes + traced.other


def test_traced_equals_memtracker_on_real_cpu_tensors() -> None:
    m = ModelDims(128, 2, 4, 500, 128)
    plan = ExecutionPlan(micro_batch=2, precision="fp32", flash_attention=False)
    fake = run_step(m, plan, 0, fake=True)
    real = run_step(m, plan, 0, fake=False)
    assert fake.peak == real.peak
    assert (fake.parameters, fake.gradients, fake.optimizer) == (real.parameters, real.gradients, real.optimizer)


@pytest.mark.slow
def test_traced_against_the_os_on_a_real_cpu_step() -> None:
    m = ModelDims(512, 4, 8, 8000, 512)
    plan = ExecutionPlan(micro_batch=4, precision="fp32")
    traced = run_step(m, plan, 0)
    real = real_cpu_peak(m, plan)
    assert real["resident"] == traced.resident
    assert abs(real["peak"] - traced.peak) <= 0.02 * traced.peak


@pytest.mark.slow
def test_traced_7b_in_seconds() -> None:
    import time

    m = REGISTERED["llama2-7b"]
    plan = ExecutionPlan(tp=8, micro_batch=1)
    t0 = time.perf_counter()
    traced = traced_memory(m, plan)
    assert time.perf_counter() - t0 < 45
    formula = estimate_memory(m, plan)
    assert abs(formula.tensor_bytes - traced.tensor_bytes) <= 0.01 * traced.tensor_bytes


def test_traced_refuses_what_it_does_not_simulate() -> None:
    with pytest.raises(PlanInputError) as e:
        traced_memory(GPT, ExecutionPlan(dp=2, sharding="zero3"))
    assert e.value.field == "plan.sharding"
    with pytest.raises(PlanInputError) as e:
        traced_memory(GPT, ExecutionPlan(pp=2, virtual_stages=2))
    assert e.value.field == "plan.virtual_stages"
    # GPipe keeps every micro-batch in flight and the trace runs each: a bound, not hours of tracing.
    with pytest.raises(PlanInputError) as e:
        traced_memory(GPT, ExecutionPlan(pp=2, schedule="gpipe", grad_accum=65))
    assert e.value.field == "plan.grad_accum" and "at most 64" in e.value.reason
