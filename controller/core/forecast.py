"""Forecasts of each job's start and finish (docs/forecasts.md).

The live snapshot is replayed forward with the same `plan_round`, policy and estimates the
controller uses, in a compact version of the simulator's loop (controller/sim/engine.py, "fair"
rules): rounds every `interval_s`, a start or move costs `start_cost_s` before the job progresses,
a job finishes after its remaining iterations at its iteration time. No job arrives after the
snapshot unless the caller passes an arrival model (`ForecastConfig.arrivals`: future jobs with
their submission times).

Iteration times: a running job's measured step time when the caller has one (`step_s`), else the
estimates' time of its Cell; a started job's from the deciding round (the decision's, else its
Cell's best). The band replays twice more with every job's iteration time scaled by the error of
its source: `measured_error` for measured times and measured tables, `estimate_error` for formula
and fitted estimates; a job's band is the earliest and latest of the three replays.

Bounded: at most `max_rounds` policy rounds per replay (quiet rounds are skipped: after a round
that changed nothing the next one is the first round boundary past the next finish), and nothing
past `horizon_s`. A job not started within the bounds gets no forecast ("beyond the forecast's
horizon"); a job running at the bound ends at its remaining iterations' time from there.

Pure: no clock, no I/O. The policy is copied before each replay (a stateful policy's live state
is not touched).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tessera.common.errors import InvalidInput
from tessera.controller.core.policy import CachedEstimates, Estimates, Policy, RoundConfig, plan_round
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    Decision,
    JobView,
    NodeView,
    PlanChoice,
    RunningView,
    Slice,
    Snapshot,
)
from tessera.controller.core.step_times import plausible

NO_PROGRESS = "no forecast: opaque job without progress"
# A job with its own entrypoint may state no iterations (it succeeds when every rank exits 0): its
# end is unknown, and in the replay it holds its GPUs (it had ended "now", and so did the GPUs'
# hold on the forecasts of the jobs queued behind it).
NO_ITERATIONS = "no forecast: the job states no iterations"
BEYOND = "no forecast: not started within the forecast's horizon"
DROPPED = "no forecast: the policy drops it"
# An end further away than this is no forecast: an opaque job's own step time (any value it
# reports) times its iterations reached 5e18 s, past what any clock or calendar shows.
FAR_END_S = 10 * 365 * 86400.0
FAR = "no forecast: it would end more than 10 years from now"
# Sources whose times are measurements (a running attempt's step times, the artifacts' measured
# tables, profiles) rather than formulas (estimator/, docs/estimator-cells.md).
MEASURED_SOURCES = ("measured", "table", "profiled", "learned")


class ForecastInputError(InvalidInput, ValueError):
    """A forecast configuration that cannot be used; the message names the field."""


@dataclass(frozen=True)
class ForecastConfig:
    # Policy rounds per replay, and how far past the snapshot a replay looks (seconds).
    max_rounds: int = 64
    horizon_s: float = 7 * 86400.0
    # Seconds between rounds (the controller's --round-interval; the simulator's 300 s).
    interval_s: float = 300.0
    # Seconds a start or a move costs the job before it progresses; None = the snapshot's
    # restart_cost_s.
    start_cost_s: float | None = None
    # Relative error of an iteration time by source (the band). Measured: a running attempt's
    # median step time; estimate: docs/estimator-cells.md's held-out iteration-time error of the
    # fitted model (mean |error| 10.1 %, 15.7 % for the Crius prior), rounded up.
    measured_error: float = 0.05
    estimate_error: float = 0.15
    band: bool = True
    # A round right after a job finishes (the live controller kicks a round at each departure)
    # instead of at the next round boundary (the simulator's rule).
    rounds_at_departures: bool = False
    # Future arrivals (an arrival model's draw): pending from their submit_time on.
    arrivals: tuple[JobView, ...] = ()
    # Deterministic budget of each replayed round (RoundConfig.max_evaluations): a forecast round
    # must cost less than a live one.
    max_evaluations: int = 20_000

    def __post_init__(self) -> None:
        if self.max_rounds < 1:
            raise ForecastInputError(f"max_rounds: must be >= 1, got {self.max_rounds}")
        for name in ("horizon_s", "interval_s"):
            if not getattr(self, name) > 0:
                raise ForecastInputError(f"{name}: must be > 0, got {getattr(self, name)}")
        for name in ("measured_error", "estimate_error"):
            v = getattr(self, name)
            if not 0 <= v < 1:
                raise ForecastInputError(f"{name}: must be in [0, 1), got {v}")
        if self.start_cost_s is not None and self.start_cost_s < 0:
            raise ForecastInputError(f"start_cost_s: must be >= 0, got {self.start_cost_s}")


@dataclass(frozen=True)
class JobForecast:
    """Expected start and finish (same clock as Snapshot.now); None = no forecast (`note` says
    why). A running job's start is when its current attempt started (`Snapshot` time of the
    caller), not forecast. Band: earliest and latest of the replays."""

    job_id: str
    start: float | None = None
    end: float | None = None
    start_low: float | None = None
    start_high: float | None = None
    end_low: float | None = None
    end_high: float | None = None
    note: str = ""
    # Policy rounds the nominal replay ran (the cost of the forecast, for the bench).
    rounds: int = 0


@dataclass
class _Run:
    view: JobView
    cell: Cell
    slices: tuple[Slice, ...]
    plan: PlanChoice | None
    opportunistic: bool
    it_s: float  # seconds per iteration in this replay; inf = never finishes (opaque, no progress)
    blocked: float  # start cost still to pay
    since: float
    placed_at: float | None  # when its placement was made: a minimum run time counts from it (minrun.py)


@dataclass(frozen=True)
class _Outcome:
    start: dict[str, float]
    end: dict[str, float]
    dropped: frozenset[str]
    rounds: int


def forecast(snap: Snapshot, estimates: Estimates, policy: Policy, round_config: RoundConfig | None = None,
             config: ForecastConfig | None = None, step_s: Mapping[str, float] | None = None,
             started: Mapping[str, float] | None = None) -> dict[str, JobForecast]:
    """A forecast of every pending and running job of `snap`. `step_s`: measured seconds per
    iteration of running jobs; `started`: when each running job's attempt started (its start)."""
    cfg = config or ForecastConfig()
    rcfg = dataclasses.replace(round_config or RoundConfig(interval_s=cfg.interval_s),
                               max_evaluations=cfg.max_evaluations, time_budget_s=0.0, clock=None)
    est = estimates if isinstance(estimates, CachedEstimates) else CachedEstimates(estimates)
    measured = dict(step_s or {})
    nominal = _replay(snap, est, policy, rcfg, cfg, measured, 0.0)
    outs = [nominal]
    if cfg.band and (cfg.measured_error or cfg.estimate_error):
        outs += [_replay(snap, est, policy, rcfg, cfg, measured, -1.0),
                 _replay(snap, est, policy, rcfg, cfg, measured, 1.0)]
    begun = dict(started or {})
    jobs = [*(r.job for r in snap.running), *snap.pending]
    out: dict[str, JobForecast] = {}
    placed = {r.job.id for r in snap.running}
    for j in jobs:
        running = j.id in placed
        note = ""
        if j.opaque and j.id not in measured:
            note = NO_PROGRESS
        elif j.iterations <= 0:
            note = NO_ITERATIONS
        elif j.id in nominal.dropped:
            note = DROPPED
        starts: list[float]
        s0: float | None
        if running:
            s0 = begun.get(j.id, snap.now)
            starts = [s0]
        else:
            starts = [o.start[j.id] for o in outs if j.id in o.start]
            s0 = nominal.start.get(j.id)
        ends = [o.end[j.id] for o in outs if j.id in o.end]
        e0 = nominal.end.get(j.id)
        if s0 is None and not note:
            note = BEYOND
        if note in (NO_PROGRESS, NO_ITERATIONS):
            e0, ends = None, []
        elif e0 is not None and not e0 - snap.now <= FAR_END_S:
            e0, ends, note = None, [], note or FAR
        ends = [e for e in ends if e - snap.now <= FAR_END_S]
        out[j.id] = JobForecast(j.id, s0, e0, min(starts) if s0 is not None and starts else None,
                                max(starts) if s0 is not None and starts else None,
                                min(ends) if e0 is not None and ends else None,
                                max(ends) if e0 is not None and ends else None, note, nominal.rounds)
    return out


def _error(cfg: ForecastConfig, source: str) -> float:
    return cfg.measured_error if source.startswith(MEASURED_SOURCES) else cfg.estimate_error


def _cell_time(est: Estimates, job: JobView, cell: Cell, nodes: int) -> tuple[float, str]:
    cells = est.cells(job, cell.gpu_type, cell.gpus, max(1, nodes))
    same = [c for c in cells if cell.stages and c.cell.stages == cell.stages] or list(cells)
    best = min(same, key=lambda c: c.iteration_s, default=None)
    return (best.iteration_s, best.source) if best is not None and best.iteration_s > 0 else (0.0, "")


def _iteration_s(est: Estimates, cfg: ForecastConfig, job: JobView, cell: Cell, nodes: int, decided: float,
                 plan: PlanChoice | None, measured: Mapping[str, float], side: float) -> float:
    """Seconds per iteration of `job` in this replay (side -1/0/+1: low/nominal/high). A measured
    time far off the Cell's estimate (`plausible`) is not used: it is the job's own report."""
    if job.iterations <= 0:
        return math.inf  # no iterations stated: it ends when its ranks exit, at no time the replay knows
    if job.id in measured and measured[job.id] > 0 and (
            job.opaque or plausible(measured[job.id], _cell_time(est, job, cell, nodes)[0])):
        base, src = measured[job.id], "measured"
    elif job.opaque:
        return math.inf  # its "iterations" say nothing about time until it reports progress
    elif decided > 0 and plan is not None and plan.stages:
        base, src = decided, "formula"
    else:
        base, src = _cell_time(est, job, cell, nodes)
        if base <= 0 and decided > 0:
            base, src = decided, "formula"
    if base <= 0:
        return math.inf
    return base * (1.0 + side * _error(cfg, src))


def _replay(snap: Snapshot, est: CachedEstimates, policy0: Policy, rcfg: RoundConfig, cfg: ForecastConfig,
            measured: Mapping[str, float], side: float) -> _Outcome:
    policy = copy.deepcopy(policy0)
    cost = snap.restart_cost_s if cfg.start_cost_s is None else cfg.start_cost_s
    nodes = {n.id: n for n in snap.nodes}
    busy = {n.id: set(n.busy) for n in snap.nodes}
    running: dict[str, _Run] = {}
    for r in snap.running:
        nn = len({s.node_id for s in r.slices})
        it = _iteration_s(est, cfg, r.job, r.cell, nn, 0.0, r.plan, measured, side)
        if r.plan is not None and r.plan.stages and r.plan.prediction is not None and r.job.id not in measured:
            it = r.plan.prediction.iteration_s * (1.0 + side * cfg.estimate_error)
        running[r.job.id] = _Run(r.job, r.cell, r.slices, r.plan, r.opportunistic, it, 0.0, r.since, r.placed_at)
    pending: dict[str, JobView] = {j.id: j for j in snap.pending}
    future = sorted((j for j in cfg.arrivals if j.id not in pending and j.id not in running),
                    key=lambda j: (j.submit_time, j.id))
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    dropped: set[str] = set()
    t = snap.now
    arrivals: tuple[str, ...] | None = snap.arrivals
    departures = snap.departures
    rounds = 0
    limit = snap.now + cfg.horizon_s
    interval = cfg.interval_s
    while rounds < cfg.max_rounds and t <= limit and (running or pending or future):
        if rounds:
            came = [j for j in future if j.submit_time <= t]
            future = future[len(came):]
            pending.update((j.id, j) for j in came)
            arrivals = tuple(j.id for j in came)
        views = tuple(NodeView(n.id, n.gpus, frozenset(busy[n.id]), n.cpus, n.host_memory_bytes, n.busy_cpus,
                               n.busy_host_memory_bytes) for n in nodes.values())
        run_views = tuple(RunningView(r.view, r.cell, r.slices, r.plan, r.opportunistic, r.since, r.placed_at)
                          for r in running.values())
        rs = dataclasses.replace(snap, nodes=views, pending=tuple(pending.values()), running=run_views, now=t,
                                 arrivals=arrivals, departures=departures)
        plan = plan_round(rs, est, policy, rcfg)
        rounds += 1
        changed = _apply(plan.decisions, running, pending, busy, start, dropped, est, cfg, measured, side, t, cost)
        nxt = _next_round(running, future, t, interval, changed, cfg.rounds_at_departures, plan.wakes)
        if nxt is None:
            break  # nothing will ever change: the rest wait forever
        departures = _progress(running, busy, end, t, nxt)
        t = nxt
    for jid, left in running.items():  # still running at the bound: its remaining iterations from there
        if math.isfinite(left.it_s):
            end[jid] = t + left.blocked + left.view.remaining_iterations * left.it_s
    return _Outcome(start, end, frozenset(dropped), rounds)


def _next_round(running: Mapping[str, _Run], future: Sequence[JobView], t: float, interval: float,
                changed: bool, at_departures: bool, wakes: Sequence[float] = ()) -> float | None:
    """When the next round runs: the next boundary; right at the next finish or arrival (or a
    wake the round asked for) when rounds follow departures; after a round that changed nothing,
    the first round past the next of those (quiet rounds skipped). None: nothing will ever happen
    again."""
    fin = [t + r.blocked + r.view.remaining_iterations * r.it_s for r in running.values() if math.isfinite(r.it_s)]
    wake = min([*fin, *(j.submit_time for j in future), *(w for w in wakes if w > t)], default=math.inf)
    if at_departures:
        nxt = min(wake, t + interval) if changed else wake
        return None if not math.isfinite(nxt) else nxt
    if changed:
        return t + interval
    if not math.isfinite(wake):
        return None
    return t + max(1, math.ceil((wake - t) / interval)) * interval


def _apply(decisions: Sequence[Decision], running: dict[str, _Run], pending: dict[str, JobView],
           busy: dict[str, set[int]], start: dict[str, float], dropped: set[str], est: Estimates,
           cfg: ForecastConfig, measured: Mapping[str, float], side: float, t: float, cost: float) -> bool:
    """Carry out a round's decisions on the replay's state; True when any job started, moved,
    stopped or was dropped."""
    changed = False
    for d in decisions:  # GPUs given up are released before any are taken (as the simulator does)
        if d.action in (Action.MIGRATE, Action.STOP, Action.DROP) and d.job_id in running:
            for s in running[d.job_id].slices:
                busy[s.node_id].difference_update(s.gpu_indices)
    for d in decisions:
        if d.action in (Action.START, Action.MIGRATE):
            view = pending.pop(d.job_id, None) if d.action is Action.START else None
            old = running.get(d.job_id)
            if view is None:
                if old is None:
                    continue
                view = old.view
            cell = d.cell or Cell(d.plan.gpu_model if d.plan else "", sum(len(s.gpu_indices) for s in d.slices))
            nn = len({s.node_id for s in d.slices})
            # A measured time belongs to the old placement; an opaque job's is its own wherever it runs.
            it = _iteration_s(est, cfg, view, cell, nn, d.iteration_s, d.plan, measured if view.opaque else {}, side)
            for s in d.slices:
                busy[s.node_id].update(s.gpu_indices)
            running[d.job_id] = _Run(view, cell, d.slices, d.plan, d.opportunistic, it, cost, t, t)
            start.setdefault(d.job_id, t)
            changed = True
        elif d.action is Action.STOP and d.job_id in running:
            pending[d.job_id] = running.pop(d.job_id).view
            changed = True
        elif d.action is Action.DROP:
            running.pop(d.job_id, None)
            pending.pop(d.job_id, None)
            dropped.add(d.job_id)
            changed = True
        elif d.action is Action.KEEP and d.job_id in running:
            running[d.job_id].opportunistic = d.opportunistic
    return changed


def _progress(running: dict[str, _Run], busy: dict[str, set[int]], end: dict[str, float], t: float,
              nxt: float) -> int:
    """Advance every running job over [t, nxt]; the finished ones leave. Returns how many left."""
    left = 0
    for jid in list(running):
        r = running[jid]
        avail = nxt - t
        use = min(r.blocked, avail)
        r.blocked -= use
        avail -= use
        if not math.isfinite(r.it_s):
            continue
        need = r.view.remaining_iterations * r.it_s
        if r.blocked <= 0 and need <= avail + 1e-6:  # float slack: a round set at the finish itself
            end[jid] = t + use + need
            for s in r.slices:
                busy[s.node_id].difference_update(s.gpu_indices)
            del running[jid]
            left += 1
        else:
            r.view = dataclasses.replace(r.view, done_iterations=r.view.done_iterations + avail / r.it_s)
    return left
