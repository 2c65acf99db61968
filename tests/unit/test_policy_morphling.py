"""The morphling policy (controller/core/policies/morphling.py) on literal curves: Fig. 8's case,
Algorithm 1's slope choice, the shrink of the least sensitive job, a guaranteed job's minRes with a
better plan, no reconfiguration that does not pay its cost. Iteration times are literal tables of
plans per GPU count; golden outputs were worked out by hand (in each test's comment)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from tessera.controller.core.policies import OPTIONS_TYPES, make_policy
from tessera.controller.core.policies.morphling import MorphlingOptions
from tessera.controller.core.policies.morphling_curves import CpuNeed, Curves, MorphlingInputError
from tessera.controller.core.policy import RoundConfig, RoundContext, plan_round
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    CellEstimate,
    Change,
    Decision,
    GpuView,
    JobView,
    NodeView,
    Priority,
    Promise,
    RunningView,
    Slice,
    Snapshot,
    TenantQuota,
)
from tessera.controller.sim.oracles import MorphlingOracle
from tessera.estimator.models import ModelDims

GB = 1000**3
M = ModelDims(1024, 24, 16, 32000, 1024, "m")
PlanTable = Mapping[str, Mapping[int, Mapping[str, float]]]


class Plans:
    """Estimates with one Cell per plan: {key: {gpus: {plan: seconds per iteration}}}."""

    def __init__(self, table: PlanTable) -> None:
        self.table = table

    def cells(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> Sequence[CellEstimate]:
        plans = self.table.get(job.key, {}).get(gpus, {})
        return tuple(CellEstimate(Cell(gpu_type, gpus, 1), it, plan_name=p) for p, it in sorted(plans.items()))

    def gpu_counts(self, job: JobView, gpu_type: str) -> Sequence[int]:
        return sorted(self.table.get(job.key, {}))

    def promise_time(self, job: JobView, promise: Promise) -> float:
        return self.table.get(job.key, {}).get(promise.gpus, {}).get(promise.plan, 0.0)


def node(nid: str, n: int = 4, busy: Sequence[int] = ()) -> NodeView:
    return NodeView(nid, tuple(GpuView(i, "X", 80 * GB) for i in range(n)), frozenset(busy))


def job(jid: str, key: str, iters: int = 1000, t: float = 0.0, done: float = 0.0, **kw: object) -> JobView:
    return JobView(jid, t, M, 1, 0, (), "X", iters, done, estimate_key=key, **kw)  # type: ignore[arg-type]


def run(j: JobView, nid: str, idx: Sequence[int]) -> RunningView:
    return RunningView(j, Cell("X", len(idx)), (Slice(nid, tuple(idx)),))


def decide(snap: Snapshot, est: Plans, **opts: object) -> dict[str, Decision]:
    pol = make_policy("morphling", options={"restart_cost_s": 0.0, **opts})
    return {d.job_id: d for d in plan_round(snap, est, pol, RoundConfig(interval_s=60.0)).decisions}


# Algorithm 1 alone: the makespan guard off (its own tests below turn it on).
ALG1 = {"critical_factor": 0.0}


def plan_of(d: Decision) -> str:
    return d.reason.split("plan ")[-1].split(";")[0]


# Fig. 8 (Morphling Sec. 7.2): T5 gains more from GPUs than RoBERTa. Equal shares (2 + 2) give
# completion rates 1/2500 + 1/900 = 0.00151/s; Morphling's 3 + 1 gives 1/1100 + 1/1000 = 0.00191/s.
FIG8: PlanTable = {
    "t5": {1: {"zero-offload": 4.0}, 2: {"zero-offload": 2.5, "zero-dp": 3.0}, 3: {"tp-ga": 1.1},
           4: {"tp-ga": 0.9, "zero-dp": 1.0}},
    "roberta": {1: {"dp-ga": 1.0, "zero-offload": 1.6}, 2: {"zero-dp": 0.9}, 3: {"dp-ga": 0.85},
                4: {"dp-ga": 0.8}},
}


def test_fig8_two_jobs_on_four_gpus_get_unequal_shares_and_their_best_plans() -> None:
    snap = Snapshot((node("n0"),), (job("t5", "t5"), job("roberta", "roberta")), now=0.0)
    d = decide(snap, Plans(FIG8), **ALG1)
    assert (d["t5"].action, d["t5"].cell.gpus if d["t5"].cell else 0, plan_of(d["t5"])) == (Action.START, 3, "tp-ga")
    assert (d["roberta"].action, d["roberta"].cell.gpus if d["roberta"].cell else 0,
            plan_of(d["roberta"])) == (Action.START, 1, "dp-ga")
    rate = sum(1.0 / (1000 * x.iteration_s) for x in d.values())
    equal = 1.0 / (1000 * 2.5) + 1.0 / (1000 * 0.9)
    assert rate == pytest.approx(1 / 1100 + 1 / 1000)
    assert rate > equal * 1.25


def test_slope_choice_serves_the_steepest_curves_first() -> None:
    # One GPU each: a finishes in 1000 s (slope 0.001), b in 100 s (0.01), c in 200 s (0.005).
    # Two GPUs free: b and c start, a waits.
    table: PlanTable = {"a": {1: {"dp": 10.0}}, "b": {1: {"dp": 1.0}}, "c": {1: {"dp": 2.0}}}
    snap = Snapshot((node("n0", 2),), (job("a", "a", 100), job("b", "b", 100), job("c", "c", 100)), now=0.0)
    d = decide(snap, Plans(table), **ALG1)
    assert [d[k].action for k in ("a", "b", "c")] == [Action.PENDING, Action.START, Action.START]
    assert d["a"].reason.startswith("morphling: waiting; its best step (1 x X, plan dp)")


def test_the_least_sensitive_job_is_shrunk_for_a_steeper_one() -> None:
    # x barely slows on 1 GPU (1.0 -> 1.05 s), y halves (1.0 -> 2.0 s). z needs 1 GPU and finishes
    # in 100 s (value 0.01/s). Shrinking x loses 1/1000 - 1/1050 = 0.0000476/s, y 0.0005/s: x gives.
    table: PlanTable = {"x": {1: {"dp": 1.05}, 2: {"dp": 1.0}}, "y": {1: {"dp": 2.0}, 2: {"dp": 1.0}},
                        "z": {1: {"dp": 0.1}}}
    x, y = job("x", "x"), job("y", "y")
    snap = Snapshot((node("n0", 4, busy=(0, 1, 2, 3)),), (job("z", "z"),),
                    running=(run(x, "n0", (0, 1)), run(y, "n0", (2, 3))), now=600.0)
    d = decide(snap, Plans(table), **ALG1)
    assert (d["x"].action, d["x"].change, d["x"].slices) == (Action.MIGRATE, Change.SCALE_DOWN, (Slice("n0", (0,)),))
    assert d["y"].action is Action.KEEP
    assert (d["z"].action, d["z"].slices) == (Action.START, (Slice("n0", (1,)),))
    assert d["x"].reason.endswith("shrunk to 1 GPU (plan dp) for z, whose slope is higher")
    # With the makespan guard: drain = (1050 + 2000 + 100) / 4 = 787.5 s (x cheapest on 1 GPU,
    # y on 2, z on 1); x's 1050 s and y's 1000 s at their points are over 0.85 x 0.1 x 787.5, and
    # no point of theirs ends within 787.5 s, so both keep their 2 GPUs and z waits.
    d = decide(snap, Plans(table))
    assert [d[k].action for k in ("x", "y", "z")] == [Action.KEEP, Action.KEEP, Action.PENDING]


def test_a_shrink_that_loses_more_than_it_gains_is_not_made() -> None:
    # Same cluster, z now finishes in 20,000 s (value 0.00005/s): below twice x's loss of 0.0000476/s
    # (preempt_factor 2); with the plain slope comparison (preempt_factor 1) it is made.
    table: PlanTable = {"x": {1: {"dp": 1.05}, 2: {"dp": 1.0}}, "y": {1: {"dp": 2.0}, 2: {"dp": 1.0}},
                        "z": {1: {"dp": 20.0}}}
    snap = Snapshot((node("n0", 4, busy=(0, 1, 2, 3)),), (job("z", "z"),),
                    running=(run(job("x", "x"), "n0", (0, 1)), run(job("y", "y"), "n0", (2, 3))), now=600.0)
    d = decide(snap, Plans(table), **ALG1)
    assert [d[k].action for k in ("x", "y", "z")] == [Action.KEEP, Action.KEEP, Action.PENDING]
    d = decide(snap, Plans(table), preempt_factor=1.0, **ALG1)
    assert [d[k].action for k in ("x", "y", "z")] == [Action.MIGRATE, Action.KEEP, Action.START]


GUAR: PlanTable = {"g": {1: {"zero-offload": 5.0}, 2: {"zero-dp": 1.8, "zero-offload": 2.6},
                         4: {"zero-offload": 2.0, "zero-dp": 0.9}},
                   "be": {2: {"dp": 1.0}, 4: {"dp": 0.99}}}


def guaranteed(jid: str = "g") -> JobView:
    return job(jid, "g", 1000, tenant="A", priority=Priority.GUARANTEED, promise=Promise(4, 0, "zero-offload", "X"))


def test_min_res_is_the_fewest_gpus_whose_best_plan_meets_the_promise() -> None:
    # Promised 4 GPUs with ZeRO-Offload: 2.0 s. 2 GPUs with ZeRO-DP do 1.8 s: minRes = 2, zero-dp.
    g = guaranteed()
    snap = Snapshot((node("n0"),), (g,), now=0.0, tenants=(TenantQuota("A", (("X", 4),)),))
    ctx = RoundContext(snap, Plans(GUAR), RoundConfig())
    ctx.guaranteed = {"g": Promise(4, 0, "zero-offload", "X")}
    cv = Curves(ctx, CpuNeed())
    m = cv.min_res(g)
    assert cv.promised_time(g) == 2.0
    assert m is not None and (m.gpus, m.plan, m.it) == (2, "zero-dp", 1.8)


def test_a_guaranteed_job_starts_at_min_res_beside_best_effort_work() -> None:
    # 2 of 4 GPUs are held by a best-effort job that would lose more than g gains from its 2 GPUs:
    # be finishes in 100 s (0.01/s); g on 4 GPUs gains 1/900 - 1/1800 = 0.00056/s.
    be = job("be", "be", 100)
    snap = Snapshot((node("n0", 4, busy=(0, 1)),), (guaranteed(),), running=(run(be, "n0", (0, 1)),),
                    now=0.0, tenants=(TenantQuota("A", (("X", 4),)), TenantQuota("B")))
    d = decide(snap, Plans(GUAR))
    assert (d["g"].action, d["g"].cell.gpus if d["g"].cell else 0, d["g"].iteration_s) == (Action.START, 2, 1.8)
    assert plan_of(d["g"]) == "zero-dp"
    assert d["be"].action is Action.KEEP


def test_a_guaranteed_job_preempts_best_effort_work_for_its_min_res() -> None:
    be = job("be", "be", 100_000)
    snap = Snapshot((node("n0", 2, busy=(0, 1)),), (guaranteed(),), running=(run(be, "n0", (0, 1)),),
                    now=0.0, tenants=(TenantQuota("A", (("X", 4),)), TenantQuota("B")))
    d = decide(snap, Plans(GUAR))
    # In the tenants' words (docs/tenants.md, "Reasons"), as every other policy's victims read.
    assert d["be"].action is Action.STOP and d["be"].reason == (
        "morphling: preempted: guaranteed job g of tenant A reclaims 2 x X of its quota; back to the queue from "
        "its checkpoint")
    assert (d["g"].action, d["g"].slices) == (Action.START, (Slice("n0", (0, 1)),))


RECONF: PlanTable = {"r": {2: {"dp": 1.0}, 4: {"dp": 0.6}}}


@pytest.mark.parametrize(("done", "action"), [(900.0, Action.KEEP), (0.0, Action.MIGRATE)])
def test_a_reconfiguration_is_made_only_when_the_remaining_time_pays_its_cost(done: float, action: Action) -> None:
    # 2 GPUs free next to r. 100 iterations left: 100 s where it is, 60 s + 260 s on 4 GPUs: keep.
    # 1000 left: 1000 s against 600 + 260 = 860 s, but the hysteresis wants 1.5x: 1000 / 860 < 1.5
    # keeps it too; with grow_factor 1 it scales up.
    r = job("r", "r", 1000, done=done)
    snap = Snapshot((node("n0", 4, busy=(0, 1)),), (), running=(run(r, "n0", (0, 1)),), now=0.0,
                    restart_cost_s=260.0)
    assert decide(snap, Plans(RECONF), **ALG1)["r"].action is Action.KEEP
    d = decide(snap, Plans(RECONF), grow_factor=1.0)["r"]
    assert d.action is action
    if action is Action.MIGRATE:
        assert d.change is Change.SCALE_UP and d.cell == Cell("X", 4, 1)
    # The makespan guard moves a critical job to its point whenever that is faster, the cost
    # counted, without the hysteresis: r, alone, is critical (drain = 2 x its iterations / 4 GPUs).
    assert decide(snap, Plans(RECONF))["r"].action is action


def test_cpus_choose_a_plan_that_fits_the_node() -> None:
    # 1 GPU: ZeRO-Offload (faster) needs 8 + 16 CPUs, plain DP 8: a node with 12 free CPUs runs DP.
    table: PlanTable = {"o": {1: {"zero-offload": 1.0, "dp": 3.0}}}
    n = NodeView("n0", (GpuView(0, "X", 80 * GB),), cpus=16, busy_cpus=4)
    d = decide(Snapshot((n,), (job("o", "o"),), now=0.0), Plans(table), cpus_per_gpu=8, offload_cpus_per_gpu=16)
    assert (d["o"].action, plan_of(d["o"]), d["o"].iteration_s) == (Action.START, "dp", 3.0)
    roomy = NodeView("n0", (GpuView(0, "X", 80 * GB),), cpus=32)
    d = decide(Snapshot((roomy,), (job("o", "o"),), now=0.0), Plans(table), cpus_per_gpu=8, offload_cpus_per_gpu=16)
    assert plan_of(d["o"]) == "zero-offload"


def test_options_are_registered_frozen_and_checked() -> None:
    assert OPTIONS_TYPES["morphling"] is MorphlingOptions
    assert make_policy("morphling").name == "morphling"
    with pytest.raises(MorphlingInputError, match="preempt_factor"):
        MorphlingOptions(preempt_factor=0.5)
    with pytest.raises(MorphlingInputError, match="critical_factor"):
        MorphlingOptions(critical_factor=-0.5)
    with pytest.raises(MorphlingInputError, match="critical_keep"):
        MorphlingOptions(critical_keep=float("nan"))
    with pytest.raises(MorphlingInputError, match="restart_cost_s"):
        MorphlingOptions(restart_cost_s=-1.0)
    with pytest.raises(AttributeError):
        MorphlingOptions().grow_factor = 2.0  # type: ignore[misc]


MODELS = ("vit", "roberta", "bert", "t5", "gpt2", "llama7", "llama30")


def test_the_morphling_oracle_names_every_measured_plan(tmp_path: Path) -> None:
    for m in MODELS:
        d = tmp_path / "placements" / m
        d.mkdir(parents=True)
        rows = "exec_plan,placement,iter_time,forward,overlap_sync,optimize\n"
        if m == "gpt2":
            rows += "zero-dp,8,0.53,0,0,0\ngc,8,0.77,0,0,0\nzero-offload,4,0.9,0,0,0\n181,8,0.6,0,0,0\n"
        (d / "placements.csv").write_text(rows, encoding="utf-8")
    o = MorphlingOracle(tmp_path)
    j = job("j", "gpt2")
    cells = o.cells(j, "X", 8, 1)
    assert [(c.plan_name, c.iteration_s, c.cell.stages) for c in cells] == [
        ("zero-dp", 0.53, 1), ("181", 0.6, 1), ("gc", 0.77, 1)]
    assert cells[1].plan is not None and (cells[1].plan.pp, cells[1].plan.tp, cells[1].plan.dp) == (1, 8, 1)
    assert o.iteration_time("gpt2", "8", "gc") == 0.77
    assert o.iteration_time("gpt2", "8") == 0.53
    assert o.iteration_time("gpt2", "8", "344") == 0.53  # not measured there: the best plan
    assert o.promise_time(j, Promise(8, 0, "gc")) == 0.77
    assert o.promise_time(j, Promise(4, 0, "zero-offload")) == 0.9


def test_a_guaranteed_job_with_lead_moves_to_make_a_node_whole_for_another() -> None:
    # s (guaranteed, 1 GPU, 1000 iterations done at 1 s each: 900 s ahead of its promise) sits on
    # n0; o (guaranteed, just started: no lead) on n1; w (guaranteed, minRes 2 GPUs on one node)
    # arrives. Neither node has 2 free GPUs and neither holds best-effort work: s moves to n1.
    table: PlanTable = {"s": {1: {"dp": 1.0}}, "w": {2: {"dp": 1.0}}}
    s = job("s", "s", 5000, done=1000.0, tenant="A", priority=Priority.GUARANTEED, promise=Promise(1, 0, "dp", "X"))
    w = job("w", "w", 5000, t=90.0, tenant="A", priority=Priority.GUARANTEED, promise=Promise(2, 0, "dp", "X"))
    other = job("o", "s", 10, t=100.0, tenant="A", priority=Priority.GUARANTEED, promise=Promise(1, 0, "dp", "X"))
    snap = Snapshot((node("n0", 2, busy=(0,)), node("n1", 2, busy=(0,))), (w,),
                    running=(run(s, "n0", (0,)), run(other, "n1", (0,))), now=100.0,
                    tenants=(TenantQuota("A", (("X", 4),)), TenantQuota("B")))
    d = decide(snap, Plans(table))
    assert (d["s"].action, d["s"].change, d["s"].slices) == (Action.MIGRATE, Change.MOVE, (Slice("n1", (1,)),))
    assert d["s"].reason.endswith("moved to make room for guaranteed job w of tenant A (2 x X within its quota)")
    assert (d["w"].action, d["w"].slices) == (Action.START, (Slice("n0", (0, 1)),))
    assert d["o"].action is Action.KEEP


# The makespan guard (docs/scheduler-morphling.md, "Critical jobs"). drain = the known work's
# GPU-seconds at each job's most efficient point over the cluster's GPUs.


def test_a_long_job_on_the_critical_path_starts_before_the_slope_order() -> None:
    # The slope-choice case above: a 1000 s, b 100 s, c 200 s on 2 GPUs. drain = 1300 / 2 = 650 s,
    # a's 1000 s >= 0.85 x 650: waiting would make it end last (at 1100 s at best), so it starts
    # first; the slope order then serves b, and c waits. The average JCT is the same (467 s) and
    # the last job ends at 1000 s instead of 1100 s.
    table: PlanTable = {"a": {1: {"dp": 10.0}}, "b": {1: {"dp": 1.0}}, "c": {1: {"dp": 2.0}}}
    snap = Snapshot((node("n0", 2),), (job("a", "a", 100), job("b", "b", 100), job("c", "c", 100)), now=0.0)
    d = decide(snap, Plans(table))
    assert [d[k].action for k in ("a", "b", "c")] == [Action.START, Action.START, Action.PENDING]
    assert ("on the makespan's critical path: 1,000 s at its most efficient point, at least 0.85 x the 650 s"
            in d["a"].reason)


def test_a_job_alone_gets_no_critical_path_note() -> None:
    # Alone, a job is trivially its own critical path (its 1,000 s >= 0.85 x the 500 s drain on 2
    # GPUs): the guard places it as before, but its reason does not claim "1,000 s ... the 500 s".
    snap = Snapshot((node("n0", 2),), (job("a", "a", 100),), now=0.0)
    d = decide(snap, Plans({"a": {1: {"dp": 10.0}}}))
    assert d["a"].action is Action.START and "critical path" not in d["a"].reason


def test_a_critical_job_keeps_its_point_against_a_steeper_one() -> None:
    # a runs with 1000 s left on the only GPU; z would finish in 10 s. Algorithm 1 preempts a
    # (z's 0.1/s > 2 x a's 0.001/s). drain = 1010 s, and a, holding its point, stays critical while
    # its whole length there (2000 s) is at least 0.85 x 0.1 x 1010: it keeps the GPU.
    table: PlanTable = {"a": {1: {"dp": 1.0}}, "z": {1: {"dp": 0.01}}}
    snap = Snapshot((node("n0", 1, busy=(0,)),), (job("z", "z"),),
                    running=(run(job("a", "a", 2000, done=1000), "n0", (0,)),), now=600.0)
    d = decide(snap, Plans(table))
    assert [d[k].action for k in ("a", "z")] == [Action.KEEP, Action.PENDING]
    d = decide(snap, Plans(table), **ALG1)
    assert [d[k].action for k in ("a", "z")] == [Action.STOP, Action.START]


LONG: PlanTable = {"x": {2: {"dp": 1.0}, 4: {"dp": 0.6}}, "L": {2: {"dp": 10.0}}}


def test_a_critical_job_shrinks_best_effort_work_but_preempts_none() -> None:
    # x runs on all 4 GPUs with 100 iterations left (cheapest at 2 GPUs: 200 GPU-s); L needs 2
    # GPUs for 10,000 s (20,000 GPU-s). drain = 20,200 / 4 = 5,050 s and 10,000 >= 0.85 x 5,050:
    # x is shrunk to 2 GPUs for L. Algorithm 1 alone leaves L waiting (its 0.0001/s is below twice
    # what x loses).
    snap = Snapshot((node("n0", 4, busy=(0, 1, 2, 3)),), (job("L", "L"),),
                    running=(run(job("x", "x", done=900), "n0", (0, 1, 2, 3)),), now=600.0)
    d = decide(snap, Plans(LONG))
    assert (d["x"].action, d["x"].change, d["x"].cell.gpus if d["x"].cell else 0) == (
        Action.MIGRATE, Change.SCALE_DOWN, 2)
    assert "for L, on the makespan's critical path" in d["x"].reason
    assert (d["L"].action, d["L"].cell.gpus if d["L"].cell else 0) == (Action.START, 2)
    d = decide(snap, Plans(LONG), **ALG1)
    assert [d[k].action for k in ("x", "L")] == [Action.KEEP, Action.PENDING]


def test_a_critical_job_waits_rather_than_preempting() -> None:
    # As above, but x runs only on 4 GPUs: freeing 2 would preempt it, which the guard never does.
    table: PlanTable = {"x": {4: {"dp": 0.6}}, "L": LONG["L"]}
    snap = Snapshot((node("n0", 4, busy=(0, 1, 2, 3)),), (job("L", "L"),),
                    running=(run(job("x", "x", done=900), "n0", (0, 1, 2, 3)),), now=600.0)
    d = decide(snap, Plans(table))
    assert [d[k].action for k in ("x", "L")] == [Action.KEEP, Action.PENDING]
