"""The simulation loop on a literal cluster: the artifact's rules to the second, and the fair rules."""

from __future__ import annotations

import pytest

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import RoundConfig, RoundContext
from tessera.controller.core.snapshot import Action, Cell, Decision, Slice
from tessera.controller.sim.clusters import Cluster, NodeGroup
from tessera.controller.sim.engine import ARENA, FAIR, Rules, Simulator, Truth
from tessera.controller.sim.metrics import compare, summarize
from tessera.controller.sim.traces import TraceJob
from tessera.estimator.models import ModelDims

M = ModelDims(64, 2, 4, 256, 64, "m")
CLUSTER = Cluster("tiny", (NodeGroup("x-", 1, 4, "X", 40.0),))


def tj(jid: str, t: float, gpus: int, iters: int, key: str = "k") -> TraceJob:
    return TraceJob(jid, t, iters, key, M, 10, gpus, "X")


def sim(trace: list[TraceJob], rules: Rules, table: dict[tuple[str, str, int], float]) -> Simulator:
    est = TableEstimates(table)
    return Simulator(CLUSTER, trace, est, Truth(est), rules, "t", RoundConfig(interval_s=rules.interval_s))


def test_arena_rules_chunks_progress_and_restart_debt() -> None:
    # 100 iterations after the artifact's division by 5; 10 s each: 1,000 s of work.
    one = [tj("a", 1000.0, 1, 500)]
    res = sim(one, ARENA, {("k", "X", 1): 10.0}).run(make_policy("fcfs", "artifact"))
    a = res.jobs[0]
    # Progress is floor(cumulative execution time / iteration time): 4 rounds of 300 s.
    assert a.end is not None and a.end - a.arrive_time == 1200.0
    # 1 GPU pays min(150 s, 600 s) = 150 s: inside the round, so only the throughput is scaled.
    assert res.rounds[0].throughput == 1.0 * (300 - 150) / 300
    # 4 GPUs pay 600 s > 300 s: a debt that costs one whole round of progress.
    four = [tj("b", 1000.0, 4, 500)]
    res4 = sim(four, ARENA, {("k", "X", 4): 10.0}).run(make_policy("fcfs", "artifact"))
    b = res4.jobs[0]
    assert b.end is not None and b.end - b.arrive_time == 1500.0
    assert [r.throughput for r in res4.rounds[:3]] == [0.0, 0.0, 1.0]
    # Crius pays min(10 s x GPUs, 40 s): no debt.
    resc = sim(four, ARENA, {("k", "X", 4): 10.0}).run(make_policy("crius"))
    assert resc.jobs[0].end is not None and resc.jobs[0].end - resc.jobs[0].arrive_time == 1200.0


def test_arena_arrivals_come_in_300_s_chunks_stamped_with_the_round_time() -> None:
    trace = [tj("a", 1000.0, 1, 5), tj("b", 1299.0, 1, 5), tj("c", 1300.0, 1, 5), tj("d", 1301.0, 1, 5)]
    res = sim(trace, ARENA, {("k", "X", 1): 1.0}).run(make_policy("fcfs", "artifact"), rounds=5)
    assert [j.arrive_round for j in res.jobs] == [0, 0, 0, 1]
    assert [j.arrive_time for j in res.jobs] == [1000.0, 1000.0, 1000.0, 1300.0]


def test_fair_rules_count_every_second() -> None:
    trace = [tj("a", 1000.0, 1, 500)]
    res = sim(trace, FAIR, {("k", "X", 1): 10.0}).run(make_policy("fcfs"))
    a = res.jobs[0]
    assert a.end == 1000.0 + 260.0 + 1000.0  # restart cost, then 100 iterations of 10 s
    s = summarize(res)
    assert s["jobs_finished"] == 1 and s["jct_avg_s"] == 1260.0 and s["restarts_per_job"] == 0


def test_waiting_suspension_and_comparison() -> None:
    # Two 4-GPU jobs on a 4-GPU node: the second waits for the first.
    trace = [tj("a", 0.0, 4, 5000), tj("b", 10.0, 4, 5000)]
    s = sim(trace, ARENA, {("k", "X", 4): 1.0, ("k", "X", 2): 1.5, ("k", "X", 1): 2.5})
    fc = s.run(make_policy("fcfs", "artifact"))
    cr = s.run(make_policy("crius"))
    assert summarize(fc)["jobs_finished"] == 2 and fc.jobs[1].queue_s > 0
    comp = compare({"crius": cr, "fcfs": fc}, "crius")
    assert set(comp["fcfs"]) >= {"jct_reduction_finished", "jct_reduction_padded", "throughput_ratio"}


def test_until_done_stops_once_no_waiting_job_can_ever_start() -> None:
    # "big" asks for 8 GPUs of a 4-GPU cluster: FCFS can never start it.
    trace = [tj("a", 0.0, 1, 50), tj("big", 0.0, 8, 50)]
    s = sim(trace, FAIR, {("k", "X", 1): 10.0})
    exact = s.run(make_policy("fcfs"), rounds=400)
    assert len(exact.rounds) == 400  # an explicit round count is kept (the artifact's averaging needs it)
    done = s.run(make_policy("fcfs"), rounds=400, until_done=True)
    a, big = done.jobs
    assert a.end is not None and big.state == "pending"
    # "a" ends at 360 s (260 s start cost + 10 iterations of 10 s); the round at 600 s sees it
    # done, starts nothing and has nothing running: the run ends with that round.
    assert a.end == 360.0 and [r.time for r in done.rounds] == [0.0, 300.0, 600.0]


def test_summary_of_a_run_where_every_job_was_dropped() -> None:
    # ElasticFlow (paper mode) declines a job whose data-parallel replica fits no share: the
    # summary of a run with only such jobs has no queue times to average, and says so with zeros.
    trace = [tj("a", 0.0, 1, 50)]
    res = sim(trace, FAIR, {("k", "X", 1): 10.0}).run(make_policy("fcfs"))
    res.jobs[0].state = "dropped"
    s = summarize(res)
    assert s["jobs_dropped"] == 1 and s["queue_avg_all_s"] == 0.0 and s["jobs_finished"] == 0


def test_a_start_the_truth_cannot_run_is_counted() -> None:
    # The policy's estimates offer 1 GPU; the truth has no time for it (the model does not run
    # there): the job holds its GPU without progress, and the summary says so.
    trace = [tj("a", 0.0, 1, 50)]
    est = TableEstimates({("k", "X", 1): 10.0})
    truth = Truth(TableEstimates({("k", "X", 2): 10.0}))
    res = Simulator(CLUSTER, trace, est, truth, FAIR, "t", RoundConfig(interval_s=300.0)).run(
        make_policy("fcfs"), rounds=3)
    a = res.jobs[0]
    assert a.state == "running" and a.done == 0.0 and a.unrunnable == 1
    s = summarize(res)
    assert s["unrunnable_placements"] == 1 and s["jobs_placed_unrunnable"] == 1 and s["jobs_finished"] == 0
    ok = sim(trace, FAIR, {("k", "X", 1): 10.0}).run(make_policy("fcfs"))
    assert summarize(ok)["unrunnable_placements"] == 0


def test_replay_places_cost_jobs_as_mixed_pipelines_timed_by_the_cost_tree() -> None:
    # Three one-GPU nodes of three types whose memory holds the model only split in two (as the e2e's
    # declared agents): the first cost job gets A10 + A40 stages, the second waits for them, then gets them.
    cl = Cluster("mixed", (NodeGroup("a10-", 1, 1, "A10-24GB", 1.63), NodeGroup("a40-", 1, 1, "A40-48GB", 1.63),
                           NodeGroup("a100-", 1, 1, "A100-80GB", 1.63)))
    big = ModelDims(128, 6, 4, 4096, 128, "six")
    trace = [TraceJob(j, 0.0, 1000, "six", big, 16, 0, "", objective="cost", slo_s=3600.0) for j in ("c1", "c2")]
    est = TableEstimates({})
    s = Simulator(cl, trace, est, Truth(est), FAIR, "t", RoundConfig(interval_s=300.0),
                  prices={"A10-24GB": 1.0, "A40-48GB": 2.0, "A100-80GB": 4.0})
    res = s.run(make_policy("fcfs"))
    c1, c2 = res.jobs
    assert c1.cell is not None and c1.cell.gpu_type == "A10-24GB+A40-48GB" and c1.cell.stages == 2
    assert c1.plan is not None and [st.gpu_type for st in c1.plan.stages] == ["A10-24GB", "A40-48GB"]
    assert [sl.node_id for sl in c1.slices] == ["a10-00", "a40-00"]
    # Timed at the cost tree's iteration time: the restart cost, then its iterations (the fair rules: 1,000 / 5).
    assert c1.plan.prediction is not None and c1.it_s == c1.plan.prediction.iteration_s > 0
    assert c1.iters_total == 200 and c1.end == pytest.approx(260.0 + 200 * c1.it_s)
    assert c2.first_start == 300.0 and c2.end is not None and "waiting for GPUs" not in c2.reason
    assert summarize(res)["jobs_finished"] == 2


def test_running_views_carry_the_first_start_as_live_snapshots_do() -> None:
    # Live, RunningView.since is the job's first start (controller/snapshots.py, start_time); quota
    # admission and gavel order running jobs by it, so a replay must give the same, not 0 for all.
    trace = [tj("a", 0.0, 2, 5000), tj("b", 700.0, 2, 5000)]
    seen: dict[str, set[float]] = {}

    def observe(snap) -> None:  # type: ignore[no-untyped-def]
        for r in snap.running:
            seen.setdefault(r.job.id, set()).add(r.since)

    s = sim(trace, FAIR, {("k", "X", 2): 1.0})
    res = s.run(make_policy("fcfs"), rounds=6, observe=observe)
    starts = {j.t.id: j.first_start for j in res.jobs}
    assert starts["a"] == 0.0 and starts["b"] is not None and starts["b"] > 0
    assert seen == {"a": {0.0}, "b": {starts["b"]}}


class _GrowOnce:
    """Starts the job on 1 GPU, moves it onto 2 one round later, then keeps it."""

    name = "grow-once"

    def plan(self, ctx: RoundContext) -> list[Decision]:
        if ctx.pending:
            return [Decision(j.id, Action.START, "one", slices=(Slice("x-00", (0,)),), cell=Cell("X", 1))
                    for j in ctx.pending]
        return [Decision(r.job.id, Action.MIGRATE, "two", slices=(Slice("x-00", (0, 1)),), cell=Cell("X", 2))
                for r in ctx.running.values() if r.cell.gpus == 1]


def test_restarts_are_charged_in_gpu_seconds_the_first_start_is_not() -> None:
    res = sim([tj("a", 0.0, 1, 5000)], FAIR, {("k", "X", 1): 10.0, ("k", "X", 2): 5.0}).run(_GrowOnce())
    a = res.jobs[0]
    # The first start pays 260 s on 1 GPU, the move 260 s on 2: only the move is a restart.
    assert a.launches == 2 and a.changes == 1
    assert a.restart_gpu_s == 260.0 * 2
