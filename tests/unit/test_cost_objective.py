"""The cost objective's pass in plan_round (controller/core/cost_objective.py): offers from the free
GPUs, the cheapest plan becoming a mixed-type pipeline placed stage by stage, pending reasons with
the best time, and finalize's per-stage type check."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from tessera.controller.core import cost_objective as co
from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.policy import RoundConfig, RoundContext, RoundPlanError, finalize, plan_round
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    Decision,
    GpuView,
    JobView,
    NodeView,
    Objective,
    PendingKind,
    PlanChoice,
    RunningView,
    Slice,
    Snapshot,
    StageAssignment,
)
from tessera.estimator.cells import CellModel
from tessera.estimator.cost_tree import GpuOffer, NoFeasiblePlan
from tessera.estimator.models import ModelDims

GB = 1000**3
A100, A10 = "A100-80GB", "A10-24GB"
TINY = ModelDims(64, 12, 4, 256, 64, "tiny")
PRICES = ((A10, 1.0), (A100, 4.0))


def node(nid: str, model: str, n: int, busy: tuple[int, ...] = ()) -> NodeView:
    return NodeView(nid, tuple(GpuView(i, model, 24 * GB) for i in range(n)), frozenset(busy))


def cost_job(jid: str = "c", slo_s: float = 3600.0, t: float = 0.0, **kw: object) -> JobView:
    return JobView(jid, t, TINY, 16, iterations=100, objective=Objective.COST, slo_s=slo_s, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class FakeStage:
    gpu_type: str
    dp: int
    first_layer: int
    end: int

    @property
    def layers(self) -> int:
        return self.end - self.first_layer


@dataclass(frozen=True)
class FakeEstimate:
    memory_per_gpu: float = 1e9


@dataclass(frozen=True)
class FakePlan:
    """What the pass reads of estimator.cost_tree.CostPlan."""

    stages: tuple[FakeStage, ...]
    iter_time_s: float
    total_time_s: float
    cost: float
    num_microbatches: int = 8
    estimate: FakeEstimate = FakeEstimate()

    @property
    def dp(self) -> int:
        return self.stages[0].dp


class Recorder:
    """A solver that answers one plan (or raises) and records the offers it was given."""

    def __init__(self, *answers: FakePlan | NoFeasiblePlan) -> None:
        self.answers = list(answers)
        self.offers: list[list[GpuOffer]] = []

    def __call__(self, model: CellModel, offers: Sequence[GpuOffer], iterations: int, slo_s: float) -> FakePlan:
        self.offers.append(list(offers))
        got = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(got, NoFeasiblePlan):
            raise got
        return got


MIXED = FakePlan((FakeStage(A100, 2, 0, 8), FakeStage(A10, 2, 8, 12)), 0.5, 50.0, 0.07)


def snap(*nodes: NodeView, pending: tuple[JobView, ...] = (), running: tuple[RunningView, ...] = (),
         prices: tuple[tuple[str, float], ...] = PRICES) -> Snapshot:
    totals: dict[str, int] = {}
    for n in nodes:
        for g in n.gpus:
            totals[g.model] = totals.get(g.model, 0) + 1
    return Snapshot(nodes, pending, tuple((m, 24 * GB, c) for m, c in sorted(totals.items())), running, prices=prices)


def test_the_cheapest_plan_becomes_a_mixed_pipeline_placed_stage_by_stage() -> None:
    s = snap(node("a100", A100, 4, busy=(0,)), node("a10", A10, 4))
    solver = Recorder(MIXED)
    (d,), nodes = co.place(s, s.pending + (cost_job(),), solver)
    # Offers: the free GPUs per type at their prices.
    assert [(o.gpu_type, o.price_per_hour, o.quota) for o in solver.offers[0]] == [(A10, 1.0, 4), (A100, 4.0, 3)]
    assert d.action is Action.START and d.plan is not None and d.cell is not None
    assert d.slices == (Slice("a100", (1, 2)), Slice("a10", (0, 1)))
    assert d.plan.stages == (StageAssignment(A100, 2, 0, 8), StageAssignment(A10, 2, 8, 12))
    assert (d.plan.dp, d.plan.tp, d.plan.pp) == (2, 1, 2)
    assert d.plan.micro_batch * d.plan.grad_accum * d.plan.dp == 16  # the global batch is kept
    assert d.cell == Cell(f"{A100}+{A10}", 4, 2) and d.iteration_s == 0.5
    assert d.plan.prediction is not None and d.plan.prediction.total_s == 50.0 and d.plan.prediction.cost == 0.07
    assert d.plan.prediction.allocation == f"2 x {A100} (layers 0-7) | 2 x {A10} (layers 8-11)"
    assert "predicted 50 s" in d.reason and "cost 0.07" in d.reason
    # The policy's snapshot has those GPUs busy.
    assert {n.id: n.busy for n in nodes} == {"a100": frozenset({0, 1, 2}), "a10": frozenset({0, 1})}


def test_plan_round_places_cost_jobs_whatever_the_policy_and_hides_them_from_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    seen: list[tuple[str, ...]] = []

    class Idle:
        name = "idle"

        def plan(self, ctx: RoundContext) -> list[Decision]:
            seen.append(tuple(j.id for j in ctx.pending) + tuple(sorted(ctx.running)))
            # The GPUs the cost pass gave are busy in the policy's snapshot.
            busy.append({n.id: n.busy for n in ctx.snap.nodes})
            return []

    busy: list[dict[str, frozenset[int]]] = []
    monkeypatch.setattr(co, "default_solver", Recorder(MIXED))
    plain = JobView("p", 1.0, TINY, 16)
    s = snap(node("a100", A100, 4), node("a10", A10, 4), pending=(cost_job(), plain))
    plan = plan_round(s, TableEstimates({}), Idle(), RoundConfig())
    assert seen == [("p",)]
    assert busy == [{"a100": frozenset({0, 1}), "a10": frozenset({0, 1})}]
    acts = {d.job_id: d.action for d in plan.decisions}
    assert acts == {"c": Action.START, "p": Action.PENDING}


def test_a_running_mixed_pipeline_is_kept_and_checked_stage_by_stage() -> None:
    stages = (StageAssignment(A100, 1, 0, 6), StageAssignment(A10, 1, 6, 12))
    plan = PlanChoice(1, 1, 2, 4, 4, f"{A100}+{A10}", 0, "cost-tree", stages=stages)
    r = RunningView(cost_job("r"), Cell(f"{A100}+{A10}", 2, 2), (Slice("a100", (0,)), Slice("a10", (0,))), plan)
    s = snap(node("a100", A100, 2, busy=(0,)), node("a10", A10, 2, busy=(0,)), running=(r,))

    class Idle:
        name = "idle"

        def plan(self, ctx: RoundContext) -> list[Decision]:
            assert not ctx.running  # the policy never moves a cost job
            return []

    out = plan_round(s, TableEstimates({}), Idle())
    (keep,) = out.decisions
    assert keep.action is Action.KEEP and keep.plan == plan and keep.slices == r.slices
    # The same stages in the wrong order of GPUs: a stage on GPUs of another type is refused.
    swapped = Decision("r", Action.KEEP, "x", plan, (Slice("a10", (0,)), Slice("a100", (0,))), r.cell)
    with pytest.raises(RoundPlanError, match="not of type"):
        finalize(RoundContext(s, TableEstimates({}), RoundConfig()), [swapped], "idle")
    # Without stages, a gang of two types is still refused (one GPU type per gang).
    plain = Decision("r", Action.KEEP, "x", None, r.slices, Cell(A100, 2))
    with pytest.raises(RoundPlanError, match="not of type"):
        finalize(RoundContext(s, TableEstimates({}), RoundConfig()), [plain], "idle")


def test_no_plan_meets_the_slo_pending_with_the_best_time() -> None:
    s = snap(node("a100", A100, 2), node("a10", A10, 2))
    solver = Recorder(NoFeasiblePlan(812.0, "slowest stage A10-24GB"))
    (d,), _ = co.place(s, (cost_job(slo_s=10.0),), solver)
    assert d.action is Action.PENDING and d.pending is PendingKind.FITS_NOWHERE
    assert "even on the whole cluster" in d.reason and "812 s" in d.reason and "SLO (10 s" in d.reason
    # Busy GPUs now, room on the whole cluster: it waits for GPUs, saying what the free ones reach.
    s2 = snap(node("a100", A100, 2, busy=(0,)), node("a10", A10, 2))
    solver2 = Recorder(NoFeasiblePlan(300.0, "too few GPUs"), MIXED)
    (d2,), _ = co.place(s2, (cost_job(slo_s=100.0),), solver2)
    assert d2.pending is PendingKind.NO_ROOM_NOW and "free GPUs reach 300 s" in d2.reason
    assert [o.quota for o in solver2.offers[1]] == [2, 2]  # the whole cluster's


def test_bad_input_missing_price_no_slo_deadline_passed_no_prices() -> None:
    nodes = (node("a100", A100, 2), node("a10", A10, 2))
    solver = Recorder(MIXED)
    (d,), _ = co.place(snap(*nodes, prices=((A100, 4.0),)), (cost_job(),), solver)
    assert d.action is Action.PENDING and f"no price for GPU type {A10}" in d.reason
    # It says that --prices is read at start only, and which types it may use are priced (it could
    # run on those alone, given gpu_types), so it does not read as if the job could never run.
    assert "read at start only" in d.reason and "restart the controller" in d.reason
    assert f"priced: {A100} (a job with gpu_types limited to those can run on them)" in d.reason
    (d,), _ = co.place(snap(*nodes, prices=(("H100-80GB", 4.0),)), (cost_job(),), solver)
    assert f"no price for GPU type {A10}, {A100}" in d.reason and "priced:" not in d.reason
    # A job restricted to the priced type is fine.
    (d,), _ = co.place(snap(*nodes, prices=((A100, 4.0),)), (cost_job(gpu_types=(A100,)),),
                       Recorder(FakePlan((FakeStage(A100, 1, 0, 12),), 1.0, 100.0, 0.1)))
    assert d.action is Action.START
    for job, why in ((cost_job(slo_s=0.0), "needs an SLO"), (cost_job(slo_s=-1.0), "deadline has passed")):
        (d,), _ = co.place(snap(*nodes), (job,), solver)
        assert d.action is Action.PENDING and why in d.reason
    (d,), _ = co.place(snap(*nodes, prices=()), (cost_job(),), solver)
    assert "--prices" in d.reason
    assert not solver.offers  # none of these reached the solver


def test_stages_pack_on_nodes_of_their_own_or_continue_where_the_last_ended() -> None:
    free = co._Free.of((node("x1", A10, 4), node("x2", A10, 2), node("y", A100, 8)))
    st = (StageAssignment(A10, 2, 0, 3), StageAssignment(A10, 2, 3, 6), StageAssignment(A100, 2, 6, 9),
          StageAssignment(A10, 2, 9, 12))
    slices, short = co.pack(st, free)
    # Best fit: the first stage takes x2 (2 free, all of it), the second cannot continue there and
    # takes x1, the third goes to y; the fourth (A10) cannot continue on y and every A10 node already
    # holds an earlier, non-adjacent stage (its ranks would not be contiguous there).
    assert short == A10 and slices == ()
    slices, short = co.pack(st[:3], free)
    assert slices == (Slice("x2", (0, 1)), Slice("x1", (0, 1)), Slice("y", (0, 1))) and short == ""
    # Adjacent stages of one type continue on the node the previous ended on (contiguous ranks).
    slices, _ = co.pack((StageAssignment(A100, 2, 0, 6), StageAssignment(A100, 2, 6, 12)), free)
    assert slices == (Slice("y", (0, 1, 2, 3)),)
    # A stage wider than any node spans several nodes.
    slices, _ = co.pack((StageAssignment(A10, 6, 0, 12),), free)
    assert slices == (Slice("x1", (0, 1, 2, 3)), Slice("x2", (0, 1)))


def test_a_plan_that_does_not_pack_is_solved_again_with_a_smaller_quota() -> None:
    # Two A10 nodes with 1 free each: a dp-2 A10 stage needs both (spanning is fine); a plan of two
    # dp-2 A10 stages cannot pack; the retry offers 2 fewer A10s.
    s = snap(node("a", A10, 2, busy=(0,)), node("b", A10, 2, busy=(0,)), node("g", A100, 4))
    two = FakePlan((FakeStage(A10, 2, 0, 6), FakeStage(A10, 2, 6, 12)), 1.0, 10.0, 1.0)
    on_a100 = FakePlan((FakeStage(A100, 2, 0, 6), FakeStage(A100, 2, 6, 12)), 1.0, 10.0, 2.0)
    solver = Recorder(two, on_a100)
    (d,), _ = co.place(s, (cost_job(),), solver)
    assert [[(o.gpu_type, o.quota) for o in offers] for offers in solver.offers] == [[(A10, 2), (A100, 4)],
                                                                                     [(A100, 4)]]
    assert d.action is Action.START and d.slices == (Slice("g", (0, 1, 2, 3)),)


def test_batch_split_keeps_the_global_batch() -> None:
    assert co.batch_split(16, 2, 2) == (1, 8)
    assert co.batch_split(32, 1, 3) == (4, 8)
    assert co.batch_split(12, 5, 2) is None


def test_input_the_cost_tree_refuses_leaves_the_job_pending_not_the_round_failed() -> None:
    # A replay's cluster may name a type the catalog does not know; a price for it reaches the offers.
    s = snap(node("x", "X", 2), prices=(("X", 1.0),))
    (d,), _ = co.place(s, (cost_job(),))
    assert d.action is Action.PENDING and d.pending is PendingKind.FITS_NOWHERE
    assert d.reason.startswith("the cost tree cannot plan the job: gpu_type: ")


def test_offers_carry_the_memory_the_nodes_report() -> None:
    full = NodeView("f", (GpuView(0, A100, 80 * GB), GpuView(1, A100, 80 * GB)))
    o = co._offer(A100, 4.0, 2, (full,))
    assert o is not None and o.memory_bytes == 0  # the catalog's: not overridden
    held = NodeView("h", (GpuView(0, A100, 80 * GB, foreign_used_bytes=30 * GB),))
    small = NodeView("s", (GpuView(0, A10, 2 * GB),))
    o = co._offer(A100, 4.0, 3, (full, held, small))
    assert o is not None and (o.memory_bytes, o.gpus_per_node, o.quota) == (50 * GB, 2, 3)  # the least
    o = co._offer(A10, 1.0, 1, (full, held, small))
    assert o is not None and o.memory_bytes == 2 * GB


def test_a_type_with_a_gpu_whose_memory_others_hold_entirely_offers_no_gpus() -> None:
    gone = GpuView(0, A100, 80 * GB, foreign_used_bytes=80 * GB)
    assert co._offer(A100, 4.0, 1, (NodeView("z", (gone,)),)) is None  # not the catalog's 80 GB
    mixed = NodeView("m", (gone, GpuView(1, A100, 40 * GB)))
    # The full one holds no stage: out of the quota and of the least, whatever the order.
    for n in (mixed, NodeView("r", (mixed.gpus[1], gone))):
        o = co._offer(A100, 4.0, 2, (n,))
        assert o is not None and (o.quota, o.memory_bytes) == (1, 40 * GB)
        assert co._offer(A100, 4.0, 1, (n,)) is None
    one = co._offer(A100, 4.0, 1, (NodeView("o", (GpuView(0, A100, 80 * GB, foreign_used_bytes=80 * GB - 1),)),))
    assert one is not None and one.memory_bytes == 1
    # End to end: the job is not started on the full GPU; it waits for memory.
    s = Snapshot((NodeView("z", (gone,)),), (), ((A100, 80 * GB, 1),), prices=((A100, 1.0),))
    (d,), _ = co.place(s, (cost_job(slo_s=1e9),))
    assert d.action is Action.PENDING and d.pending is PendingKind.NO_ROOM_NOW
    assert d.reason == f"waiting for GPUs: other processes hold all the memory of a GPU of {A100}"
    # The solver is not asked with no offers; with A10s free too, only they are offered.
    solver = Recorder(NoFeasiblePlan(float("inf"), "none fits"))
    s = snap(NodeView("z", (gone,)), node("a10", A10, 2))
    co.place(s, (cost_job(),), solver)
    assert [[o.gpu_type for o in offers] for offers in solver.offers] == [[A10], [A10]]
