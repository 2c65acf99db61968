"""The cost pass's pending reasons and start reasons (controller/core/cost_objective.py): a memory
failure said as one, not as an SLO's best time, and costs to four decimals, as `describe job` shows
the predicted cost."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.controller.core import cost_objective as co
from tessera.controller.core.snapshot import (
    Action,
    GpuView,
    JobView,
    NodeView,
    Objective,
    PendingKind,
    Snapshot,
)
from tessera.estimator.cells import CellModel
from tessera.estimator.cost_tree import GpuOffer, NoFeasiblePlan
from tessera.estimator.models import ModelDims

GB = 1000**3
A100, A10 = "A100-80GB", "A10-24GB"
TINY = ModelDims(64, 12, 4, 256, 64, "tiny")
# The cost tree's own words for a model no allocation holds (estimator/cost_tree.py).
NO_MEMORY = "no allocation of 2 GPU type(s) within their quotas, at most 8 stages holds tiny in GPU memory"


@dataclass(frozen=True)
class Stage:
    gpu_type: str
    dp: int
    first_layer: int
    layers: int


@dataclass(frozen=True)
class Estimate:
    memory_per_gpu: float = 1e9


@dataclass(frozen=True)
class Plan:
    """What the pass reads of a CostPlan: one A10 stage of the whole model, a cheap run."""

    stages: tuple[Stage, ...] = (Stage(A10, 1, 0, 12),)
    iter_time_s: float = 0.03
    total_time_s: float = 3.0
    cost: float = 0.0037
    num_microbatches: int = 4
    estimate: Estimate = Estimate()
    dp: int = 1


class Answers:
    """A solver giving its answers in turn (the last one again), raising the NoFeasiblePlans."""

    def __init__(self, *answers: Plan | NoFeasiblePlan) -> None:
        self.answers = list(answers)

    def __call__(self, model: CellModel, offers: Sequence[GpuOffer], iterations: int, slo_s: float) -> Plan:
        got = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(got, NoFeasiblePlan):
            raise got
        return got


def _snap(busy_a10: tuple[int, ...] = ()) -> Snapshot:
    nodes = (NodeView("a100", (GpuView(0, A100, 24 * GB),), frozenset({0})),
             NodeView("a10", tuple(GpuView(i, A10, 24 * GB) for i in range(2)), frozenset(busy_a10)))
    return Snapshot(nodes, (), ((A10, 24 * GB, 2), (A100, 24 * GB, 1)), (), prices=((A10, 1.0), (A100, 4.0)))


def _job() -> JobView:
    return JobView("c", 0.0, TINY, 16, iterations=60, objective=Objective.COST, slo_s=3600.0)


def test_free_gpus_that_hold_no_plan_in_memory_are_said_so() -> None:
    solver = Answers(NoFeasiblePlan(math.inf, NO_MEMORY), Plan())
    (d,), _ = co.place(_snap(busy_a10=(1,)), (_job(),), solver)
    assert d.action is Action.PENDING and d.pending is PendingKind.NO_ROOM_NOW
    assert d.reason == ("waiting for GPUs: no allocation of the free GPUs meets the SLO (3,600 s for 60 iterations); "
                        "no allocation of the free GPUs holds the model in memory; the whole cluster would "
                        "(3 s at 0.0037)")


def test_no_plan_of_the_whole_cluster_in_memory_is_said_plainly() -> None:
    (d,), _ = co.place(_snap(), (_job(),), Answers(NoFeasiblePlan(math.inf, NO_MEMORY)))
    assert d.action is Action.PENDING and d.pending is PendingKind.FITS_NOWHERE
    assert d.reason == ("no plan fits in memory, even on the whole cluster: no allocation of 2 GPU type(s) within "
                        "their quotas, at most 8 stages holds tiny in GPU memory")


def test_an_slo_no_plan_meets_keeps_the_best_time() -> None:
    why = "slo_s: no allocation of 2 GPU type(s) runs 60 iterations within 1 s; the fastest takes 812.0 s (x)"
    (d,), _ = co.place(_snap(), (_job(),), Answers(NoFeasiblePlan(812.0, why)))
    assert d.pending is PendingKind.FITS_NOWHERE
    assert d.reason.endswith(f"even on the whole cluster: the best any plan reaches is 812 s ({why})")


def test_a_start_says_its_cost_to_four_decimals_as_describe_does() -> None:
    (d,), _ = co.place(_snap(), (_job(),), Answers(Plan()))
    assert d.action is Action.START
    assert d.reason.endswith("predicted 3 s for 60 iterations (SLO 3,600 s), cost 0.0037")
    assert d.plan is not None and d.plan.prediction is not None and d.plan.prediction.cost == 0.0037
    assert co.cost_text(1234.56789) == "1,234.5679" and co.cost_text(0.0) == "0.0000"
