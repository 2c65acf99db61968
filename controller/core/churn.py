"""The churn guard: a tenant whose guaranteed jobs keep preempting others and then end at once
cools off, and its pending guaranteed jobs preempt nobody meanwhile (docs/tenants.md, "Churn guard").

Without it, a tenant could churn everyone else's best-effort work: submit a guaranteed job (it
preempts or shrinks others' jobs, each paying a checkpoint, a stop and a restart), cancel it (or
let it fail or finish) right after, and again, for ever.

- A **preemptor start**: the round decided to START a guaranteed job of tenant T on GPUs that, in
  the same round, it took from a running job of another tenant (stopped, or shrunk: migrated to
  fewer GPUs). Whichever layer decided the stop (the guarantees' or the policy's own), the job
  that lands on the freed GPUs is the one it served; a guaranteed job that starts on free GPUs
  in the same round is no preemptor. A later START of the same job while it is tracked moves its
  start (the round that preempted may have found the victim's GPUs still held, and the job
  starts the round after).
- A **churn event**: a preemptor job was cancelled or failed within `quick_s` of its last start;
  its time is the job's end. One that succeeded did the work it was submitted for: a tenant's
  short guaranteed jobs (an evaluation of a few minutes) use its quota as designed, and nothing
  tells them from churn by their shape (a review cooled off a tenant whose short jobs reclaimed
  its own quota from a borrower), so they are not counted. The hole that leaves: a tenant that
  submits jobs of a few iterations each, which succeed, is not held back (docs/tenants.md).
- **Cooling off**: when T has at least `limit` events within `window_s` (up to its latest one), T
  cools off until `cooloff_s` after that event. Its PENDING guaranteed jobs are then shown to the
  policy as best-effort (no promise): they may start on free GPUs, preemptible, and stay
  best-effort while they run, until they are next pending. A start of one on GPUs the round takes
  from a running job is undone (`hold_back`): it preempts, shrinks or moves nobody. Running
  guaranteed jobs keep theirs.
- `limit` 0 disables the guard; without tenants it never acts.

Pure: no I/O, no clock; the caller gives the times (the engine's wall clock) and what became of
the jobs it tracks (`Seen`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from tessera.common.durations import format_duration
from tessera.common.utctime import utc_text
from tessera.controller.core.quotas import is_guaranteed
from tessera.controller.core.snapshot import (
    PLACED,
    Action,
    Decision,
    JobView,
    PendingKind,
    Priority,
    RoundPlan,
    RunningView,
    Slice,
    Snapshot,
)


@dataclass(frozen=True)
class ChurnConfig:
    """The guard's numbers (the controller's --churn-* flags)."""

    limit: int = 3  # churn events within window_s that start a cool-off; 0 = the guard is off
    window_s: float = 3600.0
    quick_s: float = 600.0  # a preemptor ending this soon after its last start is an event
    cooloff_s: float = 3600.0  # counted from the event that reached the limit

    @property
    def enabled(self) -> bool:
        return self.limit > 0


@dataclass(frozen=True)
class Cooling:
    """Tenant `tenant` may not preempt until `until`: `events` churn events within the window up
    to the one at `last`."""

    tenant: str
    until: float
    events: int
    last: float


@dataclass(frozen=True)
class Seen:
    """What became of a tracked job, as stored: `ended_at` (None = not ended), `pending` (PENDING),
    `succeeded` (it ended having done its iterations: no churn, see the module's text)."""

    ended_at: float | None = None
    pending: bool = False
    succeeded: bool = False


@dataclass
class Ledger:
    """The guard's memory: preemptor starts, churn events and cool-offs per tenant, and the jobs
    started as best-effort while their tenant cooled off."""

    cfg: ChurnConfig = field(default_factory=ChurnConfig)
    starts: dict[str, tuple[str, float]] = field(default_factory=dict)  # job -> (tenant, last start)
    events: dict[str, list[float]] = field(default_factory=dict)  # tenant -> event times, sorted
    cooling_off: dict[str, Cooling] = field(default_factory=dict)
    demoted: set[str] = field(default_factory=set)

    def started(self, job_id: str, tenant: str, at: float, preempting: bool) -> None:
        """A START decision of a guaranteed job at `at`: a preemptor from now on if `preempting`;
        a job tracked already moves its last start."""
        if preempting or job_id in self.starts:
            self.starts[job_id] = (tenant, at)

    def ended(self, job_id: str, at: float) -> bool:
        """A tracked job ended at `at`; True when that is a churn event (then counted)."""
        tracked = self.starts.pop(job_id, None)
        if tracked is None or not self.cfg.enabled:
            return False
        tenant, start = tracked
        if at - start > self.cfg.quick_s:
            return False
        times = self.events.setdefault(tenant, [])
        times.append(at)
        times.sort()  # the rounds see ends late, not always in order
        self._cool(tenant)
        return True

    def _cool(self, tenant: str) -> None:
        times = self.events[tenant]
        for last in times:
            n = sum(1 for t in times if last - self.cfg.window_s <= t <= last)
            old = self.cooling_off.get(tenant)
            if n >= self.cfg.limit and (old is None or last + self.cfg.cooloff_s > old.until):
                self.cooling_off[tenant] = Cooling(tenant, last + self.cfg.cooloff_s, n, last)

    def observe(self, seen: Mapping[str, Seen | None], now: float) -> None:
        """What became of the tracked jobs (None: no longer stored) at `now`: ends are counted, jobs
        no longer able to end quickly are forgotten, and so are old events and past cool-offs."""
        for job_id in list(self.starts):
            s = seen.get(job_id)
            if s is None or (s.ended_at is not None and s.succeeded):  # gone, or its work done: no churn
                self.starts.pop(job_id)
            elif s.ended_at is not None:
                self.ended(job_id, s.ended_at)
            elif now - self.starts[job_id][1] > self.cfg.quick_s:
                self.starts.pop(job_id)
        self.demoted = {j for j in self.demoted if (s := seen.get(j)) is not None and s.ended_at is None
                        and not s.pending}
        # Events only matter within a window of a later one; two windows keep those seen late.
        for tenant in list(self.events):
            self.events[tenant] = [t for t in self.events[tenant] if t >= now - 2 * self.cfg.window_s]
            if not self.events[tenant]:
                del self.events[tenant]
        self.cooling_off = {t: c for t, c in self.cooling_off.items() if c.until > now}

    def watched(self) -> set[str]:
        """The jobs whose fate `observe` needs."""
        return set(self.starts) | self.demoted

    def cooling(self, tenant: str, now: float) -> Cooling | None:
        c = self.cooling_off.get(tenant)
        return c if c is not None and c.until > now and self.cfg.enabled else None


def dump(ledger: Ledger) -> str:
    """The ledger as JSON, stored so that a restart or failover keeps it (controller/churnguard.py)."""
    return json.dumps({"starts": {j: [t, at] for j, (t, at) in sorted(ledger.starts.items())},
                       "events": {t: v for t, v in sorted(ledger.events.items())},
                       "cooling_off": {t: [c.until, c.events, c.last] for t, c in sorted(ledger.cooling_off.items())},
                       "demoted": sorted(ledger.demoted)}, separators=(",", ":"))


def load(cfg: ChurnConfig, text: str) -> Ledger:
    """A ledger `dump` wrote; ValueError naming what is not so (the caller starts afresh)."""
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("not an object")  # noqa: TRY004 - one error type for the caller

    def num(x: object, what: str) -> float:
        if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
            raise ValueError(f"{what}: not a finite number")
        return float(x)

    def table(name: str) -> dict[str, object]:
        t = doc.get(name, {})
        if not isinstance(t, dict) or not all(isinstance(k, str) for k in t):
            raise ValueError(f"{name}: not a map")
        return t

    out = Ledger(cfg)
    for job, v in table("starts").items():
        if not isinstance(v, list) or len(v) != 2 or not isinstance(v[0], str):
            raise ValueError(f"starts.{job}: not [tenant, time]")
        out.starts[job] = (v[0], num(v[1], f"starts.{job}"))
    for tenant, v in table("events").items():
        if not isinstance(v, list):
            raise ValueError(f"events.{tenant}: not a list")  # noqa: TRY004 - one error type for the caller
        out.events[tenant] = sorted(num(x, f"events.{tenant}") for x in v)
    for tenant, v in table("cooling_off").items():
        if not isinstance(v, list) or len(v) != 3:
            raise ValueError(f"cooling_off.{tenant}: not [until, events, last]")
        out.cooling_off[tenant] = Cooling(tenant, num(v[0], "until"), int(num(v[1], "events")), num(v[2], "last"))
    demoted = doc.get("demoted", [])
    if not isinstance(demoted, list) or not all(isinstance(j, str) for j in demoted):
        raise ValueError("demoted: not a list of job ids")
    out.demoted = set(demoted)
    return out


def note(c: Cooling, cfg: ChurnConfig) -> str:
    """Why a cooling tenant's guaranteed job preempts nobody (its reason in `describe job`)."""
    until = utc_text(c.until) or f"{c.until:.0f}"
    last = utc_text(c.last) or f"{c.last:.0f}"
    return (f"guaranteed, but tenant {c.tenant} may not preempt until {until}: {c.events} of its guaranteed "
            f"jobs that preempted others were cancelled or failed within {format_duration(cfg.quick_s)} of their start in the "
            f"{format_duration(cfg.window_s)} up to {last} (churn guard)")


def _best_effort(j: JobView) -> JobView:
    return dataclasses.replace(j, priority=Priority.BEST_EFFORT, promise=None)


def demote(snap: Snapshot, ledger: Ledger) -> tuple[Snapshot, dict[str, str]]:
    """The snapshot the policy sees: the pending guaranteed jobs of cooling tenants, and the running
    jobs started so, as best-effort; and the notes of those pending jobs (job id -> why)."""
    if not snap.tenants or not ledger.cfg.enabled:
        return snap, {}
    tenants = {t.name: t for t in snap.tenants}
    notes: dict[str, str] = {}
    pending = []
    for j in snap.pending:
        c = ledger.cooling(j.tenant, snap.now) if is_guaranteed(j, tenants) else None
        if c is not None:
            notes[j.id] = note(c, ledger.cfg)
            j = _best_effort(j)
        pending.append(j)
    running = tuple(dataclasses.replace(r, job=_best_effort(r.job)) if r.job.id in ledger.demoted else r
                    for r in snap.running)
    if not notes and running == snap.running:
        return snap, {}
    return dataclasses.replace(snap, pending=tuple(pending), running=running), notes


def _gpus(slices: Sequence[Slice]) -> set[tuple[str, int]]:
    return {(sl.node_id, g) for sl in slices for g in sl.gpu_indices}


def freed_gpus(plan: RoundPlan, running: Mapping[str, RunningView]) -> dict[tuple[str, int], set[str]]:
    """The GPUs the plan takes from running jobs it stops or shrinks (migrates to fewer GPUs), each
    with the tenants whose jobs held them."""
    out: dict[tuple[str, int], set[str]] = {}
    for d in plan.decisions:
        r = running.get(d.job_id)
        if r is None:
            continue
        held = _gpus(r.slices)
        if d.action is Action.STOP:
            lost = held
        elif d.action is Action.MIGRATE and len(_gpus(d.slices)) < len(held):
            lost = held - _gpus(d.slices)
        else:
            continue
        for g in lost:
            out.setdefault(g, set()).add(r.job.tenant)
    return out


def after_round(ledger: Ledger, plan: RoundPlan, snap: Snapshot, notes: Mapping[str, str]) -> RoundPlan:
    """Record the round's starts of guaranteed jobs (preemptors where another tenant's running job
    was stopped or shrunk) and of demoted ones; the plan with the demoted jobs' reasons saying why,
    none of them started on GPUs taken from a running job (`hold_back`)."""
    if not snap.tenants or not ledger.cfg.enabled:
        return plan
    growing = {r.job.id for r in snap.running
               if r.job.id in ledger.demoted and ledger.cooling(r.job.tenant, snap.now) is not None}
    plan = hold_back(plan, snap, notes, growing)
    tenants = {t.name: t for t in snap.tenants}
    views = {j.id: j for j in snap.pending}
    freed = freed_gpus(plan, {r.job.id: r for r in snap.running})
    for d in plan.starts():
        j = views.get(d.job_id)
        if j is None:
            continue
        if d.job_id in notes:
            ledger.demoted.add(d.job_id)
        elif is_guaranteed(j, tenants):
            took = any(freed.get(g, set()) - {j.tenant} for g in _gpus(d.slices))  # another tenant's GPUs
            ledger.started(j.id, j.tenant, snap.now, preempting=took)
    if not notes:
        return plan
    decisions = tuple(_noted(d, notes[d.job_id]) if d.job_id in notes else d for d in plan.decisions)
    return dataclasses.replace(plan, decisions=decisions)


def hold_back(plan: RoundPlan, snap: Snapshot, demoted: Collection[str], growing: Collection[str] = ()) -> RoundPlan:
    """The plan without the starts of `demoted` jobs (a cooling tenant's pending guaranteed jobs,
    shown to the policy as best-effort) on GPUs the round takes from running jobs: such a job
    preempts, shrinks or moves nobody (docs/tenants.md, "Churn guard"). Shown as best-effort, a
    policy may make room for it as for any best-effort job (a live audit: crius shrank another
    tenant's job for it at once, morphling for its slope), so each such start waits instead, and
    a job stopped or migrated for it keeps its GPUs (KEEP) unless the plan places another job on
    some of them. So too a move (a growth) of a `growing` job (one of those started so, still
    running while its tenant cools off) onto such GPUs: it keeps its own, unless the plan places
    another job on them. After the policy, whatever it is: the policies need not know the guard."""
    running = {r.job.id: r for r in snap.running}
    lost = _taken_from(plan, running)
    held = {d.job_id: _gpus(d.slices) & lost.keys() for d in plan.starts() if d.job_id in demoted}
    held = {j: g for j, g in held.items() if g}
    placed = [(d.job_id, _gpus(d.slices)) for d in plan.decisions if d.action in PLACED and d.job_id not in held]
    for d in plan.decisions:
        r = running.get(d.job_id)
        if d.job_id in growing and d.action is Action.MIGRATE and r is not None:
            onto, own = (_gpus(d.slices) - _gpus(r.slices)) & lost.keys(), _gpus(r.slices)
            if onto and not any(own & g for j, g in placed if j != d.job_id):
                held[d.job_id] = onto
    if not held:
        return plan
    taken = set().union(*held.values())
    # The GPUs of each decision that stays (a grower held keeps its own): a victim another job lands
    # on stays a victim.
    stays = {j: _gpus(running[j].slices) if j in held else g for j, g in placed}
    by = plan.policy or "the policy"
    out = []
    for d in plan.decisions:
        r = running.get(d.job_id)
        if d.job_id in held:
            how = " and ".join(f"{verb} {job}" for job, verb in sorted({lost[g] for g in held[d.job_id]}))
            what = f" on {d.cell}" if d.cell is not None else ""
            if r is not None:
                went = "grown" if len(_gpus(d.slices)) > len(_gpus(r.slices)) else "moved"
                out.append(Decision(r.job.id, Action.KEEP, f"{by}: running in {r.cell}; it would have {went} to "
                                    f"{d.cell or 'other GPUs'} by {how}, but while its tenant cools off it grows and "
                                    "moves onto free GPUs only", r.plan, r.slices, r.cell, opportunistic=r.opportunistic))
                continue
            out.append(Decision(d.job_id, Action.PENDING, f"waiting: {by} would have started it{what} by {how}, but "
                                "while its tenant cools off it starts on free GPUs only", pending=PendingKind.NO_ROOM_NOW))
        elif (r is not None and d.action in (Action.STOP, Action.MIGRATE) and _gpus(r.slices) & taken
              and not any(_gpus(r.slices) & g for j, g in stays.items() if j != d.job_id)):
            out.append(Decision(r.job.id, Action.KEEP, f"{by}: running in {r.cell}", r.plan, r.slices, r.cell,
                                opportunistic=r.opportunistic))
        else:
            out.append(d)
    return dataclasses.replace(plan, decisions=tuple(out))


def _taken_from(plan: RoundPlan, running: Mapping[str, RunningView]) -> dict[tuple[str, int], tuple[str, str]]:
    """The GPUs the plan takes from running jobs (stopped, or migrated off them: shrunk or moved),
    each with the job and how ("preempting", "shrinking", "moving")."""
    out: dict[tuple[str, int], tuple[str, str]] = {}
    for d in plan.decisions:
        r = running.get(d.job_id)
        if r is None or d.action not in (Action.STOP, Action.MIGRATE):
            continue
        held, kept = _gpus(r.slices), _gpus(d.slices)
        how = ("preempting" if d.action is Action.STOP else "shrinking" if len(kept) < len(held) else "moving")
        for g in held - kept:
            out[g] = (d.job_id, how)
    return out


def _noted(d: Decision, why: str) -> Decision:
    what = "started as best-effort on free GPUs" if d.action is Action.START else "meanwhile best-effort"
    return dataclasses.replace(d, reason=f"{why}; {what}: {d.reason}")
