"""Espresso's cost tree (Alg. 1) over the stage placer: the bounds never exceed the estimate, the tree
returns the exhaustive optimum on random small instances, literal cases, and bad input."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from tessera.common.errors import InvalidArgument, InvalidInput
from tessera.estimator.cells import CellModel
from tessera.estimator.cost_bounds import bound
from tessera.estimator.cost_tree import (
    CostInputError,
    GpuOffer,
    NoFeasiblePlan,
    _allocations,
    _place,
    _prepare,
    cheapest_plan,
    count_allocations,
    exhaustive_cheapest,
    fastest_plan,
)

SMALL = CellModel("gpt", hidden_size=512, num_layers=8, num_heads=8, vocab_size=8000, seq_length=512,
                  global_batch=16, name="small")
MID = CellModel("gpt", hidden_size=2048, num_layers=9, num_heads=16, vocab_size=32000, seq_length=2048,
                global_batch=8, name="mid")
# Large enough that an RTX A4000 (16 GB) holds only a few of its layers.
BIG = CellModel("gpt", hidden_size=4096, num_layers=10, num_heads=32, vocab_size=32000, seq_length=2048,
                global_batch=16, name="big")
TYPES = ["RTX-A6000-48GB", "A30-24GB", "RTX-3090-24GB", "RTX-A4000-16GB", "A100-40GB"]
NIC = 2.5 / 8  # Espresso Sec. V-A: 2.5 Gb/s between instances (GB/s per direction)


def espresso(quotas: tuple[int, int, int, int]) -> list[GpuOffer]:
    """Espresso's Table I types and prices (yuan per GPU-hour), with the given quotas."""
    return [GpuOffer(t, p, q, 4, NIC) for t, p, q in zip(("A6000", "A30", "RTX3090", "A4000"), (6, 4, 2.5, 2),
                                                             quotas, strict=True)]


def _instance(rng: random.Random) -> tuple[CellModel, list[GpuOffer], int, int]:
    model = rng.choice([SMALL, MID, BIG])
    offers = [GpuOffer(t, round(rng.uniform(0.5, 8), 2), rng.randint(1, 6), rng.choice([1, 2, 4]),
                       rng.choice([0.3125, 3.125, 12.5])) for t in rng.sample(TYPES, rng.randint(2, 4))]
    return model, offers, rng.randint(1, 50), rng.randint(1, 3)


def test_bounds_never_exceed_the_estimate_of_any_allocation_below_a_node() -> None:
    rng = random.Random(7)
    for _ in range(6):
        model, offers, z, stages = _instance(rng)
        for overlap in (False, True):
            p = _prepare(model, offers, z, math.inf, None, stages, None, overlap)
            for shape, alloc in _allocations(p):
                hp = _place(p, shape, alloc, None)
                cost = z * hp.iter_time * shape.dp * sum(n * shape.prices[t] for t, n in alloc.items()) / 3600
                order = sorted(shape.pools)
                # every node above this leaf: the counts of the first j types fixed, the rest open
                for j in range(len(order) + 1):
                    fixed = {t: alloc.get(t, 0) for t in order[:j]}
                    b = bound(shape, fixed, order[j:] if sum(fixed.values()) < shape.k else [], z)
                    assert b.time_s <= z * hp.iter_time * (1 + 1e-9)
                    assert b.cost <= cost * (1 + 1e-9)
                    if hp.fits:
                        assert b.holds


def test_the_tree_returns_the_exhaustive_optimum_on_random_small_instances() -> None:
    rng = random.Random(2025)
    pruned = 0
    for _ in range(40):
        model, offers, z, stages = _instance(rng)
        try:
            fastest = fastest_plan(model, offers, z, max_stages=stages).total_time_s
        except NoFeasiblePlan as exc:
            assert exc.best_time_s == math.inf
            fastest = 100.0
        slo = fastest * rng.choice([0.9, 1.0, 1.1, 1.5, 3, 10])
        try:
            tree = cheapest_plan(model, offers, z, slo, max_stages=stages)
        except NoFeasiblePlan as exc:
            with pytest.raises(NoFeasiblePlan) as ex:
                exhaustive_cheapest(model, offers, z, slo, max_stages=stages)
            assert ex.value.best_time_s == pytest.approx(exc.best_time_s, rel=1e-12)
            continue
        opt = exhaustive_cheapest(model, offers, z, slo, max_stages=stages)
        assert tree.cost == pytest.approx(opt.cost, rel=1e-9), (model.name, offers, z, slo)
        assert tree.estimate == opt.estimate or tree.cost == pytest.approx(opt.cost, rel=1e-12)
        assert tree.total_time_s <= slo and tree.placed <= opt.placed
        pruned += tree.pruned
    assert pruned > 0  # the bounds did cut the trees


def test_the_cheapest_plan_can_mix_gpu_types_and_says_what_it_is() -> None:
    offers = espresso((2, 2, 2, 2))
    plan = cheapest_plan(BIG, offers, 10, 40.0, max_stages=3)
    assert plan.cost == pytest.approx(exhaustive_cheapest(BIG, offers, 10, 40.0, max_stages=3).cost, rel=1e-12)
    assert len(plan.gpus) >= 2  # more than one type
    assert sum(s.layers for s in plan.stages) == BIG.num_layers
    assert [s.first_layer for s in plan.stages] == list(itertools.accumulate([0] + [s.layers for s in plan.stages][:-1]))
    assert plan.num_gpus == sum(s.dp for s in plan.stages)
    assert plan.total_time_s == pytest.approx(10 * plan.iter_time_s) and plan.total_time_s <= 40
    per_hour = sum(n * o.price_per_hour for t, n in plan.gpus for o in offers if o.gpu_type == t)
    assert plan.price_per_hour == pytest.approx(per_hour)
    assert plan.cost == pytest.approx(per_hour * plan.total_time_s / 3600)  # Espresso Eq. 1
    # any single type within its quota either misses the SLO or costs more
    for o in offers:
        try:
            assert cheapest_plan(BIG, [o], 10, 40.0, max_stages=3).cost > plan.cost
        except NoFeasiblePlan:
            pass


def test_a_tighter_slo_buys_a_faster_dearer_plan() -> None:
    offers = espresso((2, 2, 2, 2))
    loose = cheapest_plan(BIG, offers, 10, 1000.0, max_stages=3)
    tight = cheapest_plan(BIG, offers, 10, 0.9 * loose.total_time_s, max_stages=3)
    assert tight.total_time_s < loose.total_time_s and tight.cost > loose.cost
    exact = exhaustive_cheapest(BIG, offers, 10, 0.9 * loose.total_time_s, max_stages=3)
    assert tight.cost == pytest.approx(exact.cost, rel=1e-12)


def test_an_slo_no_plan_meets_says_the_best_time_any_plan_reaches() -> None:
    offers = espresso((2, 2, 2, 2))
    fastest = fastest_plan(BIG, offers, 10, max_stages=3)
    with pytest.raises(NoFeasiblePlan) as ex:
        cheapest_plan(BIG, offers, 10, 0.99 * fastest.total_time_s, max_stages=3)
    assert isinstance(ex.value, InvalidInput)
    assert ex.value.best_time_s == pytest.approx(fastest.total_time_s, rel=1e-12)
    assert "slo_s" in str(ex.value) and f"{fastest.total_time_s:.1f}" in str(ex.value)
    # the plan that reaches it meets an SLO of exactly that time
    assert cheapest_plan(BIG, offers, 10, fastest.total_time_s, max_stages=3).total_time_s <= fastest.total_time_s
    # nothing holds the model: the best time is infinite
    with pytest.raises(NoFeasiblePlan) as ex:
        cheapest_plan(BIG, [GpuOffer("A4000", 2, 1)], 10, 1e9, max_stages=2)
    assert ex.value.best_time_s == math.inf and "memory" in str(ex.value)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"offers": [GpuOffer("A30", 4, 2)], "slo_s": 0}, "slo_s"),
    ({"offers": [GpuOffer("A30", 4, 2)], "slo_s": -5}, "slo_s"),
    ({"offers": [GpuOffer("A30", 4, 2)], "iterations": 0}, "iterations"),
    ({"offers": []}, "offers"),
    ({"offers": [GpuOffer("A30", 4, 2), GpuOffer("a30-24gb", 3, 1)]}, "offers[1].gpu_type"),
    ({"offers": [GpuOffer("A30", 4, 20)], "cluster": {"A30": 16}}, "offers[0].quota"),
    ({"offers": [GpuOffer("A30", 4, 2)], "cluster": {"A6000": 8}}, "offers[0].quota"),
    ({"offers": [GpuOffer("A30", 4, 2)], "max_stages": 0}, "max_stages"),
])
def test_bad_input_names_the_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"model": SMALL, "iterations": 10, "slo_s": 100.0, **kwargs}
    with pytest.raises(CostInputError) as ex:
        cheapest_plan(args.pop("model"), args.pop("offers"), args.pop("iterations"), args.pop("slo_s"),  # type: ignore[arg-type]
                      **args)  # type: ignore[arg-type]
    assert ex.value.field == field and isinstance(ex.value, InvalidArgument)


@pytest.mark.parametrize(("args", "field", "words"), [
    (("A30", -1.0, 2), "price_per_hour", ">= 0"),
    (("A30", None, 2), "price_per_hour", "None"),
    (("A30", float("nan"), 2), "price_per_hour", "nan"),
    (("A30", 4.0, 0), "quota", ">= 1"),
    (("A30", 4.0, -3), "quota", ">= 1"),
    (("A3O", 4.0, 2), "gpu_type", "did you mean"),
    (("A30", 4.0, 2, 8, 1e-300), "nic_gbps", "0.0125..10,000"),  # the pools' bounds, not just > 0
    (("A30", 4.0, 2, 8, float("nan")), "nic_gbps", "nan"),
])
def test_bad_offers_name_the_field(args: tuple[object, ...], field: str, words: str) -> None:
    with pytest.raises(CostInputError) as ex:
        GpuOffer(*args)  # type: ignore[arg-type]
    assert ex.value.field == field and words in str(ex.value)


def test_count_allocations_counts_what_the_exhaustive_solver_places() -> None:
    offers = espresso((2, 2, 2, 2))
    n = count_allocations(MID, offers, max_stages=2)
    assert n == exhaustive_cheapest(MID, offers, 5, 1e9, max_stages=2).placed


def test_best_placement_is_exact_too_and_never_dearer_than_any_baseline() -> None:
    from tessera.estimator.cost_baselines import hph_plus, sia_plus, whale_plus

    rng = random.Random(11)
    for _ in range(8):
        model, offers, z, stages = _instance(rng)
        try:
            slo = 1.5 * fastest_plan(model, offers, z, max_stages=stages).total_time_s
        except NoFeasiblePlan:
            continue
        best = cheapest_plan(model, offers, z, slo, max_stages=stages, placement="best")
        opt = exhaustive_cheapest(model, offers, z, slo, max_stages=stages, placement="best")
        assert best.cost == pytest.approx(opt.cost, rel=1e-9)
        for solve in (cheapest_plan, sia_plus, whale_plus, hph_plus):
            try:
                other = solve(model, offers, z, slo, max_stages=stages)
            except NoFeasiblePlan:
                continue
            assert best.cost <= other.cost * (1 + 1e-9), solve.__name__
    with pytest.raises(CostInputError) as ex:
        cheapest_plan(SMALL, [GpuOffer("A30", 4, 2)], 10, 100.0, placement="fastest")
    assert ex.value.field == "placement"


def test_an_slo_no_plan_meets_is_written_in_whole_seconds() -> None:
    # 14 days read "1.2096e+06 s" beside the controller's "1,209,600 s" for the same SLO (an audit).
    m = CellModel("gpt", hidden_size=128, num_layers=6, num_heads=4, vocab_size=4096, seq_length=128,
                  global_batch=16, name="tiny")
    with pytest.raises(NoFeasiblePlan) as e:
        cheapest_plan(m, [GpuOffer("A10-24GB", 0.75, 1, 4, 12.5)], 100_000_000, 14 * 86400.0)
    assert "runs 100000000 iterations within 1,209,600 s; the fastest takes " in e.value.reason
    with pytest.raises(NoFeasiblePlan) as e:
        cheapest_plan(m, [GpuOffer("A10-24GB", 0.75, 1, 4, 12.5)], 1000, 0.2)
    assert "within 0.2 s; the fastest takes " in e.value.reason
