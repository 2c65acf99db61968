"""The host floor under a plan's step time (estimator/host_time.py), on literal tables."""

from __future__ import annotations

import math

import pytest

from tessera.estimator import host_time
from tessera.estimator.host_time import VARIANTS, HostCost, host_cost, host_seconds, variant_of
from tessera.estimator.models import ModelDims
from tessera.estimator.plan_time import BREAKDOWN_KEYS, estimate_plan_time
from tessera.estimator.plans import ExecutionPlan

TABLE = {
    "fsdp": HostCost(0.004, 0.010),
    "fsdp op": HostCost(0.012, 0.010),
    "fsdp full": HostCost(0.009, 0.011),
    "amp": HostCost(0.003, 0.008),
    "amp full": HostCost(0.006, 0.008),
    "lora": HostCost(0.005, 0.009),
    "fsdp float8 op": HostCost(0.030, 0.012),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_measured_variant_is_named_back_from_its_plan(name: str) -> None:
    assert variant_of(ExecutionPlan(micro_batch=1, **VARIANTS[name])) == name


def test_a_measured_recipe_is_read_from_the_table() -> None:
    cost, how = host_cost(ExecutionPlan(micro_batch=4, sharding="fsdp", checkpointing="op"), TABLE)
    assert cost == HostCost(0.012, 0.010) and how == "measured fsdp op"


def test_an_unmeasured_recipe_is_composed_from_what_each_part_adds_per_layer() -> None:
    # LoRA under full checkpointing, "lora full" unmeasured: lora's base + what full AC adds to amp
    # (the unsharded kind nearest to LoRA's), not to fsdp
    cost, how = host_cost(ExecutionPlan(precision="bf16", lora_rank=16, checkpointing="full"), TABLE)
    assert cost.per_layer_s == pytest.approx(0.003 + (0.005 - 0.003) + (0.006 - 0.003))
    assert cost.fixed_s == 0.008
    assert how == "composed amp +(lora - amp) +(amp full - amp)"
    # Float8 without checkpointing, "fsdp float8" unmeasured: the op pair gives Float8's share
    cost, _ = host_cost(ExecutionPlan(sharding="fsdp", float8="linear"), TABLE)
    assert cost.per_layer_s == pytest.approx(0.004 + (0.030 - 0.012))


def test_the_measured_table_prices_every_variant_it_was_measured_on() -> None:
    for name in VARIANTS:
        cost, how = host_cost(ExecutionPlan(micro_batch=1, **VARIANTS[name]))
        assert how == f"measured {name}" and cost.per_layer_s > 0 and cost.fixed_s >= 0


def test_what_the_table_cannot_price_has_no_floor() -> None:
    assert host_cost(ExecutionPlan(sharding="fsdp", checkpointing="op", compile=True), TABLE) is None
    assert host_cost(ExecutionPlan(sharding="fsdp"), {}) is None
    assert host_cost(ExecutionPlan(sharding="fsdp", float8="linear"), {"fsdp": TABLE["fsdp"]}) is None


def test_the_floor_counts_every_micro_batch_and_every_layer_of_the_rank() -> None:
    plan = ExecutionPlan(micro_batch=1, grad_accum=4, sharding="fsdp")
    seconds, source = host_seconds(plan, 16, table=TABLE)
    assert seconds == pytest.approx(4 * 16 * 0.004 + 0.010)
    assert source.startswith("host:measured fsdp")


def _tiny() -> ModelDims:
    return ModelDims(256, 6, 16, 2048, 512, "tiny", ffn_hidden=768, gated=True)


def test_a_step_of_short_kernels_takes_as_long_as_its_host(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = ExecutionPlan(micro_batch=1, sharding="fsdp", precision="amp")
    monkeypatch.setattr(host_time, "HOST_TABLE", {})
    without = estimate_plan_time(_tiny(), plan, "H100-80GB")
    assert without.breakdown["host_wait"] == 0.0
    monkeypatch.setattr(host_time, "HOST_TABLE", TABLE)
    t = estimate_plan_time(_tiny(), plan, "H100-80GB")
    assert set(t.breakdown) == set(BREAKDOWN_KEYS)
    floor = 6 * 0.004 + 0.010
    assert floor > sum(without.breakdown.values())  # the literal table binds on this model
    assert t.iter_time == pytest.approx(floor)
    assert math.isclose(sum(t.breakdown.values()), t.iter_time)
    assert t.breakdown["host_wait"] == pytest.approx(floor - without.iter_time)
    assert "host:measured fsdp" in t.source


def test_a_step_of_long_kernels_is_the_gpu_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    big = ModelDims(4096, 32, 32, 128256, 4096, "big", ffn_hidden=14336, gated=True, num_kv_heads=8)
    plan = ExecutionPlan(micro_batch=8, sharding="fsdp", precision="amp")
    monkeypatch.setattr(host_time, "HOST_TABLE", {})
    before = estimate_plan_time(big, plan, "H100-80GB")
    monkeypatch.setattr(host_time, "HOST_TABLE", TABLE)
    after = estimate_plan_time(big, plan, "H100-80GB")
    assert after.breakdown["host_wait"] == 0.0 and after.iter_time == before.iter_time


def test_each_pipeline_rank_launches_only_its_own_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_time, "HOST_TABLE", {"amp": HostCost(0.020, 0.008)})
    plan = ExecutionPlan(micro_batch=1, pp=2, grad_accum=2, precision="amp")
    t = estimate_plan_time(_tiny(), plan, "H100-80GB")
    assert t.breakdown["host_wait"] > 0
    assert t.iter_time == pytest.approx(2 * 3 * 0.020 + 0.008)  # 3 of the 6 layers on each stage


def test_layers_outside_checkpoint_every_are_priced_without_checkpointing() -> None:
    plan = ExecutionPlan(micro_batch=1, sharding="fsdp", checkpointing="full", checkpoint_every=4)
    seconds, source = host_seconds(plan, 16, 4, TABLE)
    assert seconds == pytest.approx(4 * 0.009 + 12 * 0.004 + 0.011)
    assert "12 of 16 layers as measured fsdp" in source
    every = ExecutionPlan(micro_batch=1, sharding="fsdp", checkpointing="full")
    assert host_seconds(every, 16, 16, TABLE)[0] == pytest.approx(16 * 0.009 + 0.011)


def test_checkpoint_every_reaches_the_floor_through_the_plan_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_time, "HOST_TABLE", {"amp": HostCost(0.020, 0.0), "amp full": HostCost(0.050, 0.0)})
    sparse = estimate_plan_time(_tiny(), ExecutionPlan(micro_batch=1, precision="amp", checkpointing="full",
                                                       checkpoint_every=3), "H100-80GB")
    assert sparse.iter_time == pytest.approx(2 * 0.050 + 4 * 0.020)  # layers 3 and 6 of 6 checkpointed


def test_float8_under_op_checkpointing_takes_its_delta_from_the_op_pair() -> None:
    table = {"fsdp": HostCost(0.008, 0.0), "fsdp op": HostCost(0.011, 0.0), "fsdp float8": HostCost(0.023, 0.0),
             "fsdp float8 op": HostCost(0.047, 0.0), "amp": HostCost(0.004, 0.0)}
    # "fsdp float8 op" left out would be composed as fsdp + (float8 - fsdp) + (op - fsdp): 44% low
    cost, how = host_cost(ExecutionPlan(precision="amp", float8="linear", checkpointing="op"), table)
    assert how == "composed amp +(fsdp float8 op - fsdp op) +(fsdp op - fsdp)"
    assert cost.per_layer_s == pytest.approx(0.004 + (0.047 - 0.011) + (0.011 - 0.008))


def test_full_checkpointing_is_composed_from_the_plans_own_kind_first() -> None:
    cost, how = host_cost(ExecutionPlan(precision="amp", float8="linear", checkpointing="full"),
                          {**TABLE, "fsdp float8": HostCost(0.020, 0.0)})
    assert how == "composed amp +(fsdp float8 - fsdp) +(amp full - amp)"
    assert cost.per_layer_s == pytest.approx(0.003 + 0.016 + 0.003)


def test_a_plan_outside_the_measured_set_says_the_floor_is_carried_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_time, "HOST_TABLE", {"amp": HostCost(0.5, 0.0)})
    t = estimate_plan_time(_tiny(), ExecutionPlan(micro_batch=1, dp=2, tp=2, precision="amp", sharding="zero1"),
                           "H100-80GB")
    assert t.breakdown["host_wait"] > 0
    assert "host:extrapolated to tp 2, zero1" in t.source
    alone = estimate_plan_time(_tiny(), ExecutionPlan(micro_batch=1, precision="amp"), "H100-80GB")
    assert "extrapolated" not in alone.source
