"""The stage placer's limits: the exhaustive search counts its plans (the distinct orders of the
stages' types arithmetically) and refuses before enumerating; it enumerates the orders lazily, in
the order sorted(set(permutations)) gave; Alg. 2 refuses work over MAX_PLACE_WORK before starting,
as INVALID_ARGUMENT through PlaceStages."""

from __future__ import annotations

import itertools

import pytest

from tessera.common.errors import InvalidArgument
from tessera.estimator.cells import CellInputError, CellModel, GpuPool
from tessera.estimator.plans import PlanInputError
from tessera.estimator.service.handlers import Estimator
from tessera.estimator.stage_placer import (
    MAX_PLACE_WORK,
    HeteroPlan,
    StagePlacer,
    _best,
    distinct_orders,
    order_count,
)
from tessera.v1 import common_pb2, estimator_pb2

SMALL = CellModel("gpt", hidden_size=512, num_layers=8, num_heads=8, vocab_size=8000, seq_length=512,
                  global_batch=16, name="small")
L32 = CellModel("gpt", hidden_size=128, num_layers=32, num_heads=4, vocab_size=512, seq_length=64, global_batch=64,
                name="l32")
A100 = GpuPool("A100-40GB", 8, 4, nic_gbps=12.5)
A6000 = GpuPool("RTX-A6000-48GB", 8, 4, intra_link="pcie", nic_gbps=3.125)
A4000 = GpuPool("RTX-A4000-16GB", 8, 4, nic_gbps=3.125)
TYPES = ["A10-24GB", "A100-40GB", "A100-80GB", "A30-24GB", "A40-48GB", "H100-80GB", "L4-24GB", "L40S-48GB",
         "RTX-3090-24GB", "RTX-A6000-48GB"]


@pytest.mark.parametrize("names", [["b", "a", "b", "c"], list("aabbc"), ["x"], list("dcba"), list("aaaa"),
                                   ["A100", "H100", "A100", "L4", "H100", "A100"]])
def test_the_lazy_orders_are_those_of_sorted_set_permutations(names: list[str]) -> None:
    want = sorted(set(itertools.permutations(names)))
    assert list(distinct_orders(names)) == want
    assert order_count(names) == len(want)


def test_the_multinomial_counts_distinct_orders_without_enumerating() -> None:
    assert order_count(["H100"] * 12) == 1
    assert order_count(TYPES) == 3_628_800  # 10!
    assert order_count(["a"] * 6 + ["b"] * 4 + ["c"] * 3) == 60_060  # 13! / (6! 4! 3!)


def test_twelve_stages_of_one_type_are_refused_with_the_counts_before_enumerating() -> None:
    # Before: sorted(set(permutations)) over 12! orders, 45.7 s, then the same refusal.
    sp = StagePlacer(L32, [GpuPool("H100", 64, 8)] * 12, dp=1)
    with pytest.raises(CellInputError, match=r"^exhaustive: 84672315 plans exceed max_plans 2000000 \(1 distinct "
                                             r"order\(s\) of the 12 stages' types x 84672315 splits of 32 layers\)"):
        sp.exhaustive()
    # ten distinct types: 10! orders x C(31, 9) splits (before: 9.6 s and 695 MB to refuse)
    sp = StagePlacer(L32, [GpuPool(t, 64, 8) for t in TYPES], dp=1)
    with pytest.raises(CellInputError, match=r"^exhaustive: 73156880160000 plans exceed max_plans 2000000 "
                                             r"\(3628800 distinct order\(s\)"):
        sp.exhaustive()


def test_the_exhaustive_optimum_is_the_old_enumeration_s() -> None:
    for pools in ([A100, A6000, A4000], [A4000, A4000, A100, A6000], [A100, A4000, A100, A4000]):
        sp = StagePlacer(SMALL, pools, dp=1)
        by_gpu = {p.gpu: p for p in pools}
        old: HeteroPlan = _best([sp.best_split([by_gpu[t] for t in order])
                                 for order in sorted(set(itertools.permutations([p.gpu for p in pools])))])
        new = sp.exhaustive()
        assert (new.describe(), new.iter_time, new.stages) == (old.describe(), old.iter_time, old.stages)


def test_alg2_refuses_work_over_the_limit_naming_the_sizes() -> None:
    sp = StagePlacer(SMALL, [A100, A6000, A4000], dp=1)
    assert sp.place_work() == 3 * 3 * 8**2
    with pytest.raises(CellInputError, match=r"^stages: placing 3 stages of 3 GPU type\(s\) over 8 layers is too "
                                             r"large: 3 x 3 x 8\^2 = 576 exceeds the limit 575"):
        sp.place(max_work=575)
    assert sp.steps == 0  # refused before any stage cost
    assert sp.place(max_work=576).fits and sp.steps > 0
    # the audit's 26.8 s case: 512 layers, 64 stages, 8 types
    big = CellModel("gpt", hidden_size=128, num_layers=512, num_heads=4, vocab_size=512, seq_length=64,
                    global_batch=4096)
    sp = StagePlacer(big, [GpuPool(TYPES[i % 8], 4096, 8) for i in range(64)], dp=1)
    with pytest.raises(CellInputError, match=f"8 x 64 x 512\\^2 = 134217728 exceeds the limit {MAX_PLACE_WORK}"):
        sp.place()


def test_place_stages_answers_invalid_argument_for_work_over_the_limit() -> None:
    model = common_pb2.ModelSpec(hidden_size=128, num_layers=512, num_heads=4, vocab_size=512, seq_length=64)
    req = estimator_pb2.PlaceStagesRequest(model=model, global_batch_size=4096, stages=[
        estimator_pb2.GpuPool(gpu=TYPES[i % 8], num_gpus=4096, gpus_per_node=8) for i in range(64)])
    with pytest.raises(PlanInputError, match=r"^stages: placing 64 stages of 8 GPU type\(s\) over 512 layers") as exc:
        Estimator().place_stages(req)
    assert isinstance(exc.value, InvalidArgument) and exc.value.code == "INVALID_ARGUMENT"


def test_steps_count_lookups_and_the_operators_of_each_cost_computed() -> None:
    sp = StagePlacer(SMALL, [A100, A4000], dp=1)
    sp.stage_cost(A100, 0, 0, 3)
    assert sp.steps == 1 + 3
    sp.stage_cost(A100, 0, 0, 3)
    assert sp.steps == 1 + 3 + 1
