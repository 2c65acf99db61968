"""ExecutionPlan: derived sizes, cache key, and errors that name the field."""

from __future__ import annotations

import pytest

from tessera.estimator.models import REGISTERED, ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError


def field_of(exc: pytest.ExceptionInfo[PlanInputError]) -> str:
    return exc.value.field


def test_defaults_and_derived_sizes() -> None:
    p = ExecutionPlan(dp=4, tp=2, pp=2, micro_batch=2, grad_accum=8)
    assert p.num_gpus == 16
    assert p.global_batch == 4 * 2 * 8
    assert p.zero_stage == 0 and p.precision == "megatron-bf16" and p.flash_attention
    assert [ExecutionPlan(dp=2, sharding=s).zero_stage for s in ("none", "zero1", "zero2", "zero3", "fsdp")] == \
        [0, 1, 2, 3, 3]
    assert p.key == "dp4-tp2-pp2-mb2-ga8-none-off:none-ac:none-sp0-fa1-megatron-bf16-ep1-v1"
    assert ExecutionPlan.from_dict(p.to_dict()) == p
    assert p.with_(tp=1).tp == 1


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"dp": 0}, "plan.dp"), ({"tp": -2}, "plan.tp"), ({"pp": 0}, "plan.pp"), ({"micro_batch": 0}, "plan.micro_batch"),
    ({"grad_accum": 0}, "plan.grad_accum"), ({"sharding": "zero4"}, "plan.sharding"),
    ({"offload": "disk"}, "plan.offload"), ({"checkpointing": "some"}, "plan.checkpointing"),
    ({"precision": "fp8"}, "plan.precision"), ({"sequence_parallel": 1}, "plan.sequence_parallel"),
    ({"dp": 4, "ep": 3}, "plan.ep"), ({"offload": "optimizer+params", "sharding": "zero2"}, "plan.offload"),
    ({"virtual_stages": 2}, "plan.virtual_stages"), ({"dp": True}, "plan.dp"),
])
def test_bad_plan_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(PlanInputError) as e:
        ExecutionPlan(**kwargs)  # type: ignore[arg-type]
    assert field_of(e) == field
    assert str(e.value).startswith(field + ":")


def test_sizes_must_multiply_to_the_gpu_count() -> None:
    p = ExecutionPlan(dp=2, tp=2)
    assert p.check(num_gpus=4) is p
    with pytest.raises(PlanInputError) as e:
        p.check(num_gpus=8)
    assert field_of(e) == "num_gpus" and "2*2*1 = 4" in str(e.value)
    with pytest.raises(PlanInputError) as e:
        p.check(num_gpus=0)
    assert field_of(e) == "num_gpus"


@pytest.mark.parametrize(("model", "plan", "field"), [
    (REGISTERED["gpt2-small"], ExecutionPlan(tp=8), "plan.tp"),  # 12 heads
    (ModelDims(1024, 4, 16, 1000, 128, num_kv_heads=2), ExecutionPlan(tp=4), "plan.tp"),
    (ModelDims(1024, 4, 16, 1000, 128, ffn_hidden=1000), ExecutionPlan(tp=16), "plan.tp"),
    (REGISTERED["gpt2-small"], ExecutionPlan(pp=13), "plan.pp"),
    (ModelDims(1024, 4, 16, 1000, 130), ExecutionPlan(tp=4, sequence_parallel=True), "plan.sequence_parallel"),
    (REGISTERED["gpt2-small"], ExecutionPlan(dp=2, ep=2), "plan.ep"),
    (REGISTERED["moe-690m"], ExecutionPlan(dp=32, ep=32), "plan.ep"),  # 16 experts
    (ModelDims(0, 4, 16, 1000, 128), ExecutionPlan(), "model.hidden_size"),
    (ModelDims(1024, -1, 16, 1000, 128), ExecutionPlan(), "model.num_layers"),
    (ModelDims(1000, 4, 16, 1000, 128), ExecutionPlan(), "model.num_heads"),
    (ModelDims(1024, 4, 16, 1000, 128, num_kv_heads=3), ExecutionPlan(), "model.num_kv_heads"),
    (ModelDims(1024, 4, 16, 1000, 128, family="moe"), ExecutionPlan(), "model.num_experts"),
    (ModelDims(1024, 4, 16, 1000, 128, family="moe", num_experts=4, top_k=5), ExecutionPlan(), "model.top_k"),
    (ModelDims(1024, 4, 16, 1000, 128, num_experts=4), ExecutionPlan(), "model.num_experts"),
    (ModelDims(1024, 4, 16, 1000, 128, family="rnn"), ExecutionPlan(), "model.family"),  # type: ignore[arg-type]
])
def test_plan_against_model_names_the_field(model: ModelDims, plan: ExecutionPlan, field: str) -> None:
    with pytest.raises(PlanInputError) as e:
        plan.check(model=model)
    assert field_of(e) == field


def test_unknown_key_in_a_plan_mapping() -> None:
    with pytest.raises(PlanInputError) as e:
        ExecutionPlan.from_dict({"dp": 2, "zero": 1})
    assert field_of(e) == "plan.zero"
