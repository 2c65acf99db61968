"""The churn guard's core (controller/core/churn.py), on literal inputs: only quick ends of preemptor
starts count, the window slides, a tenant cools off and recovers, limit 0 turns it off; what the
policy sees of a cooling tenant's jobs, and which starts are preemptors. The controller's flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.controller.core.churn import ChurnConfig, Ledger, Seen, after_round, demote, freed_gpus
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    Decision,
    JobView,
    Priority,
    Promise,
    RoundPlan,
    RunningView,
    Slice,
    Snapshot,
    TenantQuota,
)
from tessera.controller.main import engine_config, parse_args
from tessera.estimator.models import registered

TENANTS = (TenantQuota("team-a"), TenantQuota("team-b", (("A10-24GB", 8),)))


def view(job_id: str, tenant: str = "team-b", guaranteed: bool = True) -> JobView:
    if guaranteed:
        return JobView(job_id, 0.0, registered("gpt2-small"), 8, 4, tenant=tenant, priority=Priority.GUARANTEED,
                       promise=Promise(4, 0, "", "A10-24GB"))
    return JobView(job_id, 0.0, registered("gpt2-small"), 8, 4, tenant=tenant)


def running(job: JobView, gpus: int = 8) -> RunningView:
    return RunningView(job, Cell("A10-24GB", gpus), (Slice("n1", tuple(range(gpus))),))


def churned(ledger: Ledger, tenant: str, *ends: float) -> None:
    """Preemptor jobs of `tenant` started 10 s before each end, ended then."""
    for i, t in enumerate(ends):
        ledger.started(f"{tenant}-{t}-{i}", tenant, t - 10, preempting=True)
        assert ledger.ended(f"{tenant}-{t}-{i}", t)


def test_only_quick_ends_of_preemptor_starts_count() -> None:
    ledger = Ledger(ChurnConfig())
    ledger.started("p", "team-b", 0.0, preempting=True)
    assert ledger.ended("p", 600.0)  # within quick_s of its start
    ledger.started("q", "team-b", 0.0, preempting=False)  # started in a round that stopped nobody
    assert not ledger.ended("q", 5.0)
    ledger.started("slow", "team-b", 0.0, preempting=True)
    assert not ledger.ended("slow", 601.0)  # ran longer than quick_s: no churn
    assert ledger.events == {"team-b": [600.0]}
    assert ledger.cooling("team-b", 700.0) is None


def test_a_later_start_of_a_tracked_preemptor_moves_its_start() -> None:
    """The round that preempted may find the victim's GPUs still held: the job starts a round later."""
    ledger = Ledger(ChurnConfig())
    ledger.started("p", "team-b", 0.0, preempting=True)
    ledger.started("p", "team-b", 900.0, preempting=False)
    assert ledger.ended("p", 1000.0)


def test_the_window_slides_then_the_tenant_cools_off_and_recovers() -> None:
    ledger = Ledger(ChurnConfig(limit=3, window_s=3600.0, cooloff_s=3600.0))
    churned(ledger, "team-b", 1000.0, 4000.0, 7000.0)  # never 3 within an hour
    assert ledger.cooling("team-b", 7000.0) is None
    churned(ledger, "team-b", 7500.0)  # 4000, 7000, 7500: within the hour up to 7500
    c = ledger.cooling("team-b", 7500.0)
    assert c is not None and (c.until, c.events, c.last) == (11100.0, 3, 7500.0)
    assert ledger.cooling("team-a", 7500.0) is None  # per tenant
    churned(ledger, "team-b", 8000.0)  # a further event moves the end of the cool-off
    c = ledger.cooling("team-b", 11599.0)
    assert c is not None and (c.until, c.events) == (11600.0, 3)  # 7000, 7500, 8000: 4000 slid out
    assert ledger.cooling("team-b", 11600.0) is None  # recovered
    ledger.observe({}, 11600.0)
    assert ledger.cooling_off == {}


def test_observe_counts_ends_and_forgets_what_cannot_end_quickly() -> None:
    ledger = Ledger(ChurnConfig())
    for j in ("cancelled", "done", "gone", "long", "young"):
        ledger.started(j, "team-b", 0.0, preempting=True)
    ledger.demoted |= {"d-running", "d-pending", "d-ended"}
    ledger.observe({"cancelled": Seen(ended_at=30.0), "done": Seen(ended_at=40.0, succeeded=True), "gone": None,
                    "long": Seen(), "young": Seen(), "d-running": Seen(), "d-pending": Seen(pending=True),
                    "d-ended": Seen(ended_at=5.0)}, 601.0)
    assert ledger.events == {"team-b": [30.0]}  # "done" succeeded: its work, not churn
    assert set(ledger.starts) == set()  # long and young both started 601 s ago: past quick_s
    assert ledger.demoted == {"d-running"}  # best-effort until next pending
    ledger.started("young", "team-b", 600.0, preempting=True)
    ledger.observe({"young": Seen()}, 700.0)
    assert set(ledger.starts) == {"young"}


def test_a_limit_of_0_disables_the_guard() -> None:
    ledger = Ledger(ChurnConfig(limit=0))
    ledger.started("p", "team-b", 0.0, preempting=True)
    assert not ledger.ended("p", 1.0)
    assert ledger.cooling("team-b", 2.0) is None
    snap = Snapshot((), (view("g"),), now=2.0, tenants=TENANTS)
    assert demote(snap, ledger) == (snap, {})


def cooling_ledger() -> Ledger:
    ledger = Ledger(ChurnConfig())
    churned(ledger, "team-b", 100.0, 200.0, 300.0)
    return ledger


def test_a_cooling_tenants_pending_guaranteed_jobs_are_shown_as_best_effort() -> None:
    ledger = cooling_ledger()
    other = view("ga", tenant="team-a")  # team-a has no quota: best-effort in the core anyway
    mine, be = view("gb"), view("be", guaranteed=False)
    run = running(view("gr"))  # running guaranteed jobs keep their guarantee
    snap = Snapshot((), (mine, other, be), now=400.0, running=(run,), tenants=TENANTS)
    shown, notes = demote(snap, ledger)
    assert [(j.id, j.priority, j.promise) for j in shown.pending] == [
        ("gb", Priority.BEST_EFFORT, None), ("ga", Priority.GUARANTEED, other.promise),
        ("be", Priority.BEST_EFFORT, None)]
    assert shown.running == (run,)
    assert notes == {"gb": "guaranteed, but tenant team-b may not preempt until 1970-01-01T01:05:00Z: 3 of its "
                           "guaranteed jobs that preempted others were cancelled or failed within 10m of their start in the 1h up "
                           "to 1970-01-01T00:05:00Z (churn guard)"}
    assert demote(Snapshot((), (mine,), now=400.0), ledger) == (Snapshot((), (mine,), now=400.0), {})  # no tenants
    assert demote(Snapshot((), (mine,), now=3900.0, tenants=TENANTS), ledger)[1] == {}  # recovered


def test_preemptor_starts_are_those_that_take_another_tenants_stopped_or_shrunk_gpus() -> None:
    def on(node: str, *gpus: int) -> tuple[Slice, ...]:
        return (Slice(node, gpus),)

    victims = {"a1": RunningView(view("a1", "team-a", guaranteed=False), Cell("A10-24GB", 4), on("n1", 0, 1, 2, 3)),
               "a2": RunningView(view("a2", "team-a", guaranteed=False), Cell("A10-24GB", 4), on("n2", 0, 1, 2, 3)),
               "b1": RunningView(view("b1", "team-b", guaranteed=False), Cell("A10-24GB", 4), on("n3", 0, 1, 2, 3))}
    assert freed_gpus(RoundPlan((Decision("a1", Action.STOP, "preempted"),)), victims) == {
        ("n1", g): {"team-a"} for g in range(4)}
    shrink = RoundPlan((Decision("a1", Action.MIGRATE, "shrunk", slices=on("n1", 0, 1)),))
    assert freed_gpus(shrink, victims) == {("n1", 2): {"team-a"}, ("n1", 3): {"team-a"}}
    moved = RoundPlan((Decision("a1", Action.MIGRATE, "moved", slices=on("n4", 0, 1, 2, 3)),
                       Decision("a2", Action.KEEP, "kept")))
    assert freed_gpus(moved, victims) == {}

    tenants = (TenantQuota("team-a", (("A10-24GB", 8),)), TenantQuota("team-b", (("A10-24GB", 8),)))
    snap = Snapshot((), (view("g1"), view("g2", "team-a"), view("g3")), now=50.0, running=tuple(victims.values()),
                    tenants=tenants)
    own = RoundPlan((Decision("g1", Action.START, "guaranteed", slices=on("n3", 0, 1, 2, 3)),
                     Decision("b1", Action.STOP, "preempted")))
    ledger = Ledger(ChurnConfig())
    assert after_round(ledger, own, snap, {}) is own
    assert ledger.starts == {}  # it took its own tenant's GPUs only
    # g1 lands on the GPUs a1's shrink gave up; g3, of the same tenant, starts on free GPUs (n5) and
    # g2 on its own tenant's: neither is a preemptor (a bystander is not charged for another's stop).
    both = RoundPlan((Decision("g1", Action.START, "guaranteed", slices=on("n1", 2, 3)),
                      Decision("g2", Action.START, "guaranteed", slices=on("n1", 2, 3)),
                      Decision("g3", Action.START, "guaranteed", slices=on("n5", 0, 1)),
                      Decision("a1", Action.MIGRATE, "shrunk", slices=on("n1", 0, 1))))
    after_round(ledger, both, snap, {})
    assert ledger.starts == {"g1": ("team-b", 50.0)}


def test_a_demoted_start_stays_best_effort_and_says_why() -> None:
    ledger = cooling_ledger()
    snap = Snapshot((), (view("gb"),), now=400.0, running=(running(view("a1", "team-a", guaranteed=False)),),
                    tenants=TENANTS)
    shown, notes = demote(snap, ledger)
    plan = RoundPlan((Decision("gb", Action.START, "fcfs: 4 x A10-24GB on n2"),
                      Decision("a1", Action.STOP, "preempted")))
    out = after_round(ledger, plan, shown, notes)
    assert out.decisions[0].reason == f"{notes['gb']}; started as best-effort on free GPUs: fcfs: 4 x A10-24GB on n2"
    assert out.decisions[1] == plan.decisions[1]
    assert ledger.demoted == {"gb"} and "gb" not in ledger.starts  # a best-effort start preempts nobody
    later = Snapshot((), (), now=500.0, running=(running(view("gb"), 4),), tenants=TENANTS)
    assert demote(later, ledger)[0].running[0].job.priority is Priority.BEST_EFFORT
    waiting = after_round(ledger, RoundPlan((Decision("gb", Action.PENDING, "waiting: no room"),)), shown, notes)
    assert waiting.decisions[0].reason == f"{notes['gb']}; meanwhile best-effort: waiting: no room"


def _args(*argv: str) -> list[str]:
    return ["--insecure", "--state-dir", "/tmp/x", *argv]


def test_the_flags_reach_the_engine_config_and_bad_ones_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert engine_config(parse_args(_args()), Path("/tmp/x/ckpt")).churn == ChurnConfig(3, 3600.0, 600.0, 3600.0)
    cfg = engine_config(parse_args(_args("--churn-limit", "0", "--churn-window", "60", "--churn-quick", "5",
                                         "--churn-cooloff", "7200")), Path("/tmp/x/ckpt"))
    assert cfg.churn == ChurnConfig(0, 60.0, 5.0, 7200.0) and not cfg.churn.enabled
    for flag, value, said in (("--churn-limit", "-1", "--churn-limit must be a number of events in 0..1,000,000"),
                              ("--churn-quick", "0", "--churn-quick must be seconds in (0, 100,000,000], got 0.0"),
                              ("--churn-window", "nan", "--churn-window must be seconds in (0, 100,000,000]"),
                              ("--churn-cooloff", "1e9", "--churn-cooloff must be seconds in (0, 100,000,000]")):
        with pytest.raises(SystemExit) as exc:
            parse_args(_args(flag, value))
        assert exc.value.code == 2
        assert said in capsys.readouterr().err


def test_the_ledger_round_trips_through_its_stored_form_and_bad_ones_are_refused() -> None:
    from tessera.controller.core.churn import Cooling, dump, load

    cfg = ChurnConfig()
    ledger = Ledger(cfg)
    ledger.starts = {"j-1": ("team-b", 100.0)}
    ledger.events = {"team-b": [10.0, 50.5]}
    ledger.cooling_off = {"team-b": Cooling("team-b", 3650.5, 3, 50.5)}
    ledger.demoted = {"j-2"}
    back = load(cfg, dump(ledger))
    assert (back.starts, back.events, back.cooling_off, back.demoted) == \
        (ledger.starts, ledger.events, ledger.cooling_off, ledger.demoted)
    for bad in ("[]", '{"starts": {"j": ["t"]}}', '{"events": {"t": ["soon"]}}', '{"events": {"t": [NaN]}}',
                '{"cooling_off": {"t": [1, 2]}}', '{"demoted": [1]}', "{", '{"events": {"t": [true]}}'):
        with pytest.raises(ValueError):
            load(cfg, bad)
