"""The minimum run time before a round may restart a best-effort job (controller/core/minrun.py,
--min-run): literal snapshots, a literal table of iteration times."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest

from tessera.controller.core import minrun
from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.forecast import ForecastConfig, forecast
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import RoundConfig, plan_round
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    Decision,
    GpuView,
    JobView,
    NodeView,
    PendingKind,
    PlanChoice,
    Priority,
    Promise,
    RoundPlan,
    RunningView,
    Slice,
    Snapshot,
    TenantQuota,
)
from tessera.controller.main import engine_config, parse_args
from tessera.controller.store import JobRecord
from tessera.controller.transitions import started
from tessera.estimator.models import ModelDims
from tessera.v1 import common_pb2

GB = 1000**3
M = ModelDims(1024, 24, 16, 32000, 1024, "m")
EST = TableEstimates({("k", "X", n): 8.0 / n for n in (1, 2, 4, 8)}, node_slowdown=0.1)
TENANTS = (TenantQuota("A", (("X", 4),)), TenantQuota("B"))
NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def job(jid: str, n: int, tenant: str = "B", guaranteed: bool = False) -> JobView:
    prio = Priority.GUARANTEED if guaranteed else Priority.BEST_EFFORT
    promise = Promise(n, 8 * n, "zero-dp") if guaranteed else None
    return JobView(jid, NOW - 1000, M, 64, n, (), "X", 1000, 0.0, estimate_key="k", tenant=tenant, priority=prio,
                   promise=promise)


def snap(running: Sequence[RunningView], pending: Sequence[JobView], now: float = NOW,
         tenants: tuple[TenantQuota, ...] = TENANTS) -> Snapshot:
    busy = frozenset(i for r in running for s in r.slices for i in s.gpu_indices)
    n = NodeView("n1", tuple(GpuView(i, "X", 40 * GB) for i in range(4)), busy)
    return Snapshot((n,), tuple(pending), (("X", 40 * GB, 4),), running=tuple(running), now=now, tenants=tenants)


def best_effort_on_all(placed_at: float | None) -> RunningView:
    return RunningView(job("be", 4), Cell("X", 4), (Slice("n1", (0, 1, 2, 3)),), since=NOW - 5000,
                       placed_at=placed_at)


def decide(s: Snapshot, min_run: float, policy: str = "fcfs") -> tuple[RoundPlan, dict[str, Decision]]:
    plan = plan_round(s, EST, make_policy(policy), RoundConfig(min_run_s=min_run))
    return plan, {d.job_id: d for d in plan.decisions}


def test_without_it_a_guaranteed_job_preempts_a_best_effort_job_placed_a_minute_ago() -> None:
    _, d = decide(snap([best_effort_on_all(NOW - 60)], [job("g", 4, "A", guaranteed=True)]), 0.0)
    assert d["be"].action is Action.STOP and d["g"].action is Action.START


def test_a_young_best_effort_job_is_kept_and_the_guaranteed_job_says_until_when() -> None:
    plan, d = decide(snap([best_effort_on_all(NOW - 60)], [job("g", 4, "A", guaranteed=True)]), 600.0)
    assert d["be"].action is Action.KEEP and d["be"].slices == (Slice("n1", (0, 1, 2, 3)),)
    assert "not restarted by a round before 2027-01-15T08:09:00Z (--min-run 600 s" in d["be"].reason
    assert d["g"].action is Action.PENDING and d["g"].pending is PendingKind.NO_ROOM_NOW
    assert d["g"].reason.endswith("; best-effort jobs placed less than --min-run 600 s ago may not be preempted "
                                  "yet: be (4 x X); the first is free at 2027-01-15T08:09:00Z")
    assert plan.wakes == (NOW + 540,)


def test_once_its_minimum_run_has_passed_it_may_be_preempted() -> None:
    _, d = decide(snap([best_effort_on_all(NOW - 600)], [job("g", 4, "A", guaranteed=True)]), 600.0)
    assert d["be"].action is Action.STOP and d["g"].action is Action.START


def test_a_placement_of_unknown_time_is_never_exempt() -> None:
    _, d = decide(snap([best_effort_on_all(None)], [job("g", 4, "A", guaranteed=True)]), 600.0)
    assert d["be"].action is Action.STOP


def test_guaranteed_jobs_are_never_hidden_so_their_quota_stays_charged() -> None:
    # A's running guaranteed job holds its whole quota; its second one must not be admitted because
    # the first was placed a minute ago (hidden, its quota would look free).
    g1 = RunningView(job("g1", 4, "A", guaranteed=True), Cell("X", 4), (Slice("n1", (0, 1, 2, 3)),),
                     since=NOW - 60, placed_at=NOW - 60)
    plan, d = decide(snap([g1], [job("g2", 4, "A", guaranteed=True)]), 600.0)
    assert d["g1"].action is Action.KEEP and "--min-run" not in d["g1"].reason
    assert d["g2"].action is Action.PENDING and "--min-run" not in d["g2"].reason
    assert plan.admitted == ("g1",) and plan.wakes == ()


def test_a_throughput_policy_neither_grows_nor_moves_a_young_job() -> None:
    # Alone on 4 GPUs with 1 of them, crius grows it (more GPUs, faster) unless it was placed just now.
    young = RunningView(job("be", 4), Cell("X", 1), (Slice("n1", (0,)),), since=NOW - 60, placed_at=NOW - 60)
    s = snap([young], [], tenants=())
    _, free = decide(s, 0.0, "crius")
    assert free["be"].action is Action.MIGRATE
    plan, held = decide(s, 600.0, "crius")
    # Nobody waits, but the plan may change when the exemption ends (crius grows it): a round then.
    assert held["be"].action is Action.KEEP and plan.wakes == (NOW + 540,)


def test_best_effort_jobs_waiting_are_not_told_about_it() -> None:
    _, d = decide(snap([best_effort_on_all(NOW - 60)], [job("b2", 4)]), 600.0)
    assert d["b2"].action is Action.PENDING and "--min-run" not in d["b2"].reason


def test_the_forecast_starts_the_guaranteed_job_when_the_minimum_run_ends() -> None:
    s = snap([best_effort_on_all(NOW - 60)], [job("g", 4, "A", guaranteed=True)])
    cfg = ForecastConfig(rounds_at_departures=True, start_cost_s=0.0)
    early = forecast(s, EST, make_policy("fcfs"), RoundConfig(), cfg)
    late = forecast(s, EST, make_policy("fcfs"), RoundConfig(min_run_s=600.0), cfg)
    assert early["g"].start == pytest.approx(NOW)
    assert late["g"].start == pytest.approx(NOW + 540)


def test_a_start_records_when_its_placement_was_made() -> None:
    rec = JobRecord("j", "r", common_pb2.JobSpec(), common_pb2.JOB_STATE_PENDING, "", NOW - 10)
    after, _ = started(rec, PlanChoice(1, 1, 1, 8, 1, "X", 0, ""), (Slice("n1", (0,)),), "h:1", "why", "PLACED", NOW)
    assert after.placement is not None and after.placement.placed_at == NOW
    again, _ = started(dataclasses.replace(after, state=common_pb2.JOB_STATE_MIGRATING), PlanChoice(1, 1, 1, 8, 1, "X", 0, ""),
                       (Slice("n1", (1,)),), "h:1", "why", "MIGRATED", NOW + 50)
    assert again.placement is not None and again.placement.placed_at == NOW + 50 and again.start_time == NOW


def test_the_flag_reaches_the_engine_and_bad_values_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--insecure", "--state-dir", "/tmp/x"]
    assert engine_config(parse_args(base), Path("/tmp/x/ckpt")).min_run_s == 0.0
    assert engine_config(parse_args([*base, "--min-run", "900"]), Path("/tmp/x/ckpt")).min_run_s == 900.0
    for value in ("-1", "nan", "1e9"):
        with pytest.raises(SystemExit) as exc:
            parse_args([*base, "--min-run", value])
        assert exc.value.code == 2
        assert "--min-run must be seconds in [0, 100,000,000] (0 = off)" in capsys.readouterr().err


def test_a_placement_dated_ahead_of_the_clock_is_not_exempt() -> None:
    # Another controller's clock, or one stepped back: an hour ahead would have exempted it 600 s + 1 h.
    _, d = decide(snap([best_effort_on_all(NOW + 3600)], [job("g", 4, "A", guaranteed=True)]), 600.0)
    assert d["be"].action is Action.STOP and d["g"].action is Action.START
    _, exempt = minrun.split(snap([best_effort_on_all(NOW + 30)], []), 600.0)
    assert [e.run.job.id for e in exempt] == ["be"]  # within the tolerated skew


def test_a_waiting_job_is_told_only_of_exempt_jobs_on_types_it_may_use() -> None:
    g = job("g", 4, "A", guaranteed=True)
    assert minrun._usable(g, "X") and minrun._usable(g, "Y")
    assert not minrun._usable(dataclasses.replace(g, gpu_types=("Y",)), "X")
    assert not minrun._usable(dataclasses.replace(g, promise=Promise(4, 0, "", "Y")), "X")


def test_large_settings_read_as_given() -> None:
    assert (minrun._secs(600.0), minrun._secs(1234567.0), minrun._secs(1e8), minrun._secs(0.5)) == \
        ("600 s", "1,234,567 s", "100,000,000 s", "0.5 s")
