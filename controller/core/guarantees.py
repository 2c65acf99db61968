"""Tenants and guarantees for every policy: a layer around the policy inside `plan_round`.

Morphling Sec. 4-5 (../shared/seeds/morphling.txt): a guaranteed job within its tenant's quota is
scheduled at once (Algorithm 1 lines 2-3), possibly by shrinking or preempting others (lines 8-17;
"shrinking a job to 0 results in a preemption, which will return to the queue"), and its
performance must be at least as good as with the resources and plan it was promised; best-effort
jobs "use free cluster resources opportunistically, and can be preempted anytime".

The layer, with tenants configured (Snapshot.tenants not empty; without them `plan_round` never
calls it and nothing changes):
1. admission (controller/core/quotas.py with admission.py's sizer): running guaranteed jobs keep
   their charge (minRes), pending ones are admitted shortest promise first (a starvation bound
   aside) while their minRes fits what is left of their tenant's quota and can be laid out beside
   the admitted guaranteed jobs; the others are hidden from the policy (or, with borrowing, shown
   as best-effort) and wait with a reason naming the tenant, the type, the quota and the use;
2. the policy plans the round as always (it sees the admitted jobs and their promises in
   `RoundContext.guaranteed`);
3. repair (`Guard`, two phases): every admitted job whose decision breaks its promise (left
   pending, stopped, slower than the promise, given more GPUs than the promise by a policy that
   does not handle guarantees, or moved while it has no slack to pay the restart) is fixed.
   Phase 1 keeps a running one where it was if that met its promise, whatever the policy put
   there (a displaced guaranteed job is placed again). Phase 2 gives the others GPUs as fast as
   the promise (its minimum demand first: fewer GPUs where the estimates say they are as fast)
   from the GPUs left free by the plan and, where those are not enough, from best-effort work:
   the fewest victims, borrowers of quota first, jobs the policy was only about to start before
   running ones, a single victim halved before one preempted. Running victims stop (the engine
   checkpoints and requeues them) or shrink (migrate to half), victims the policy was about to
   start wait or start on half. Decisions the policy made that already hold the promise are left
   exactly as they are: a policy that handles guarantees itself (Morphling's Algorithm 1) is
   never overridden unless it left a guarantee broken.

"At least as fast as the promise": the estimate of the decision (its `iteration_s`, else the best
Cell on its GPUs) is at most t_P, the promise's iteration time: the estimates' own
`promise_time(job, promise)` when they have one (a plan-aware estimator; `PromiseTimes`), else the
best Cell of the promise's GPUs placed on the fewest nodes. A running guaranteed job may be moved
only with slack for the move: its progress must already be at least (now - submit) / t_P
iterations, so that the restart it pays cannot put it behind what the promise gives (the SLA of
docs/tenants.md).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from tessera.controller.core.decisions import change_kind, synth_plan, thr_part, where
from tessera.controller.core.guarantee_notes import finish
from tessera.controller.core.guarantee_texts import (
    NO_ROOM_RUNNING,
    jobs_text,
    no_room,
    plan_text,
    reclaims,
    requeue_text,
    tag,
    victims_text,
)
from tessera.controller.core.placement import ClusterState, quotas
from tessera.controller.core.quotas import Admission, Charge
from tessera.controller.core.snapshot import (
    PLACED,
    Action,
    Cell,
    CellEstimate,
    Decision,
    JobView,
    Objective,
    PendingKind,
    Priority,
    Promise,
    RunningView,
    Slice,
    Snapshot,
)

# Relative slack on comparisons of iteration times (estimates of the same Cell compare equal).
EPS = 1e-9


@runtime_checkable
class PromiseTimes(Protocol):
    """Optional, on the estimates: the iteration time (seconds) of a job with exactly its promise
    (GPUs on the fewest nodes of `promise.gpu_type`, its CPUs and plan); 0 = unknown (the layer
    then uses the best Cell of those GPUs)."""

    def promise_time(self, job: JobView, promise: Promise) -> float: ...


class RoundView(Protocol):
    """What the layer reads of a round (controller/core/policy.py's RoundContext has it all)."""

    @property
    def snap(self) -> Snapshot: ...

    @property
    def estimates(self) -> object: ...

    @property
    def running(self) -> Mapping[str, RunningView]: ...

    @property
    def pending(self) -> Sequence[JobView]: ...

    def best(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> CellEstimate | None: ...

    def max_per_node(self, gpu_type: str) -> int: ...

    def gpu_counts(self, job: JobView, gpu_type: str) -> Sequence[int]: ...

    def total_gpus(self, gpu_type: str) -> int: ...


def policy_view(snapshot: Snapshot, adm: Admission, borrow: bool = False) -> Snapshot:
    """What the policy sees: the snapshot without the guaranteed jobs not admitted, or with
    `borrow` (what `plan_round` asks), with them as best-effort jobs (no promise): they may run on
    idle GPUs, preemptible, until admitted (docs/tenants.md, "Borrowing while not admitted")."""
    hidden = set(adm.over_quota)
    if not hidden:
        return snapshot
    if borrow:
        def be(j: JobView) -> JobView:
            return dataclasses.replace(j, priority=Priority.BEST_EFFORT, promise=None) if j.id in hidden else j
        return dataclasses.replace(
            snapshot, pending=tuple(be(j) for j in snapshot.pending),
            running=tuple(dataclasses.replace(r, job=be(r.job)) if r.job.id in hidden else r
                          for r in snapshot.running))
    arr = snapshot.arrivals
    return dataclasses.replace(
        snapshot, pending=tuple(j for j in snapshot.pending if j.id not in hidden),
        arrivals=None if arr is None else tuple(a for a in arr if a not in hidden))


def promises(adm: Admission) -> dict[str, Promise]:
    """The admitted guaranteed jobs and their promises (type filled in): `RoundContext.guaranteed`."""
    return {jid: c.promise for jid, c in adm.charges.items()}


def repair(ctx: RoundView, adm: Admission, decisions: Sequence[Decision], policy_name: str,
           handles: bool = False) -> list[Decision]:
    """Step 3 of the module docstring over the policy's finalized decisions, plus the waits of the
    guaranteed jobs over quota: a decision for every job of `ctx`. `handles`: the policy says it
    handles guarantees itself (its `handles_guarantees`); the layer then still repairs every
    guarantee it left broken, but lets it give guaranteed jobs more GPUs than their promise."""
    guard = Guard(ctx, adm, policy_name, handles)
    # The reasons of what it leaves as decided: waits over quota, jobs the quota no longer covers,
    # admitted jobs the policy started (guarantee_notes.py).
    return finish(ctx.snap, adm, guard.repair(decisions), guard.t_p)


def promise_time(ctx: RoundView, job: JobView, promise: Promise) -> float:
    """t_P: the promise's iteration time on the round's estimates; 0 = unknown (no estimate)."""
    est: object = ctx.estimates
    inner = getattr(est, "inner", None)
    for e in (est, inner):
        if isinstance(e, PromiseTimes):
            t = e.promise_time(job, promise)
            if t > 0:
                return t
    # The promise's GPUs on the fewest nodes, split evenly (as ClusterState.place lays a gang out).
    for q in quotas(promise.gpus, ctx.max_per_node(promise.gpu_type)):
        b = ctx.best(job, promise.gpu_type, promise.gpus, promise.gpus // q)
        if b is not None:
            return b.iteration_s
    return 0.0


class Guard:
    """The repair step over a round's finalized decisions (module docstring, step 3)."""

    def __init__(self, ctx: RoundView, adm: Admission, policy_name: str, handles: bool = False) -> None:
        self.ctx = ctx
        self.adm = adm
        self.name = policy_name
        # The policy handles guarantees itself (`handles_guarantees`): it may give a guaranteed job
        # more GPUs than its promise (Morphling's Algorithm 1 grows jobs over their minimum).
        self.handles = handles
        # Admitted jobs with an estimate of their promise -> t_P; jobs displaced by phase 1 -> why.
        self.t_p: dict[str, float] = {}
        self.why: dict[str, str] = {}
        self.jobs = {j.id: j for j in ctx.pending}
        self.jobs.update((jid, r.job) for jid, r in ctx.running.items())
        self.models = {n.id: n.models for n in ctx.snap.nodes}
        # Set by `repair`: the round's decisions by job, the GPUs they leave free, the borrowers.
        self.dec: dict[str, Decision] = {}
        self.state = ClusterState([])
        self.borrowing: set[str] = set()

    # ------------------------------------------------------------------ helpers

    def type_of(self, d: Decision) -> str:
        if d.cell is not None:
            return d.cell.gpu_type
        s = d.slices[0]
        return self.models[s.node_id][s.gpu_indices[0]]

    def parts(self, d: Decision) -> dict[str, tuple[Slice, ...]]:
        """A decision's GPUs by type: one type, or each stage's of a cost objective's pipeline
        over mixed types (its Cell's type names them all, joined by "+")."""
        if d.cell is not None and "+" not in d.cell.gpu_type:
            return {d.cell.gpu_type: tuple(d.slices)}
        out: dict[str, list[Slice]] = {}
        for s in d.slices:
            by: dict[str, list[int]] = {}
            for i in s.gpu_indices:
                by.setdefault(self.models[s.node_id][i], []).append(i)
            for t, ix in by.items():
                out.setdefault(t, []).append(Slice(s.node_id, tuple(ix)))
        return {t: tuple(v) for t, v in out.items()}

    def _hold(self, d: Decision, take: bool) -> None:
        for t, sl in self.parts(d).items():
            (self.state.take if take else self.state.release)(sl, t)

    def speed(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> float:
        b = self.ctx.best(job, gpu_type, gpus, nodes)
        return b.iteration_s if b is not None else math.inf

    def decision_speed(self, job: JobView, d: Decision) -> float:
        if d.iteration_s > 0:
            return d.iteration_s
        gpus = sum(len(s.gpu_indices) for s in d.slices)
        return self.speed(job, self.type_of(d), gpus, len(d.slices))

    def has_slack(self, job: JobView, t_p: float) -> bool:
        """Whether a move now (its restart included) keeps the job at or ahead of its promise:
        done >= (now - s_j) / t_P (docs/tenants.md derives it); s_j its admission (now for a
        borrower admitted this round), else its submission when the caller does not record it."""
        since = self.ctx.snap.now if job.id in self.adm.borrowers else (
            job.admitted_at if job.admitted_at is not None else job.submit_time)
        need = max(0.0, self.ctx.snap.now - since) / t_p
        return job.done_iterations >= need * (1 - EPS)

    # ------------------------------------------------------------------ the ledger

    def _ledger(self, decisions: Sequence[Decision]) -> ClusterState:
        """Free GPUs after the plan: idle ones (not busy for a reason outside the round) less every
        placed decision's."""
        held = {(s.node_id, i) for r in self.ctx.running.values() for s in r.slices for i in s.gpu_indices}
        nodes = [dataclasses.replace(n, busy=frozenset(i for i in n.busy if (n.id, i) not in held and i not in n.releasing))
                 for n in self.ctx.snap.nodes]
        st = ClusterState.from_nodes(nodes)
        for d in decisions:
            if d.action in PLACED:
                for t, sl in self.parts(d).items():
                    st.take(sl, t)
        return st

    def holders(self, slices: Sequence[Slice]) -> set[str]:
        want = {(s.node_id, i) for s in slices for i in s.gpu_indices}
        out = set()
        for jid, d in self.dec.items():
            if d.action in PLACED and any((s.node_id, i) in want for s in d.slices for i in s.gpu_indices):
                out.add(jid)
        return out

    # ------------------------------------------------------------------ repair

    def _begin(self, decisions: Sequence[Decision]) -> None:
        self.dec = {d.job_id: d for d in decisions}
        self.state = self._ledger(decisions)
        self.borrowing = self._borrowing()
        for jid, c in self.adm.charges.items():
            t = promise_time(self.ctx, self.jobs[jid], c.promise)
            if t > 0:  # no estimate of the promise: nothing to hold the job to (docs/tenants.md)
                self.t_p[jid] = t

    def preplace(self, decisions: Sequence[Decision]) -> list[Decision]:
        """Phase 2 for the admitted pending jobs only, largest charge first (whole nodes for large
        ones), before the policy plans (preplace.py); one the search cannot place is left as it was."""
        self._begin(decisions)
        waiting = {j.id for j in self.ctx.pending}
        admitted = [j for j in self.adm.charges if j in waiting and j in self.t_p]
        for jid in sorted(admitted, key=lambda j: -self.adm.charges[j].gpus):
            before = self.dec[jid]
            self._place(jid, f"placed at its promise before {self.name} plans the round")
            if self.dec[jid].action is not Action.START:
                self.dec[jid] = before
        return list(self.dec.values())

    def repair(self, decisions: Sequence[Decision]) -> list[Decision]:
        self._begin(decisions)
        running = sorted((j for j in self.t_p if j in self.ctx.running), key=lambda j: (self.ctx.running[j].since, j))
        pending = [j.id for j in self.ctx.pending if j.id in self.t_p]
        # Phase 1: a running guaranteed job whose place met its promise stays there when the policy
        # would break the promise; whatever the policy put on those GPUs makes way (a displaced
        # guaranteed job is placed again in phase 2).
        for jid in running:
            why = self.violation(jid)
            if why is not None and self.orig_ok(jid):
                self._restore(jid, why, displace=True)
        # Phase 2: every admitted job still short of its promise gets its place back, or the
        # promise's GPUs from free GPUs and best-effort work.
        for jid in running + pending:
            why = self.violation(jid)
            if why is not None:
                self._place(jid, self.why.get(jid, why))
        return list(self.dec.values())

    def violation(self, jid: str) -> str | None:
        """Why the job's decision breaks its promise (for its reason), None if it holds it. A
        decision that holds it on another type moves the job's charge there."""
        job, charge, d, t_p = self.jobs[jid], self.adm.charges[jid], self.dec[jid], self.t_p[jid]
        p = f"its promise gives {t_p:.4g} s/iter"
        if d.action not in PLACED:
            verb = {Action.PENDING: "left it waiting", Action.STOP: "would stop it"}.get(d.action, "would drop it")
            return f"{self.name} {verb} ({d.reason}); {p}"
        gpus = sum(len(s.gpu_indices) for s in d.slices)
        dt = self.type_of(d)
        cell = d.cell or Cell(dt, gpus)
        if dt != charge.gpu_type:
            # A typeless promise holds on the type the job runs on: its t_P there.
            other = dataclasses.replace(charge.promise, gpu_type=dt)
            t_p = promise_time(self.ctx, job, other) if not job.promise or not job.promise.gpu_type else 0.0
            if t_p <= 0:
                return f"{self.name} placed it on {dt}, not the {charge.gpu_type} of its promise"
            p = f"its promise gives {t_p:.4g} s/iter on {dt}"
        got = self.decision_speed(job, d)
        if got > t_p * (1 + EPS):
            return f"{self.name}'s {d.action} to {cell} would run at {got:.4g} s/iter, slower than {p}"
        if d.action is not Action.KEEP and gpus > charge.promise.gpus and not self.handles:
            return (f"{self.name}'s {d.action} to {cell} would hold more than its promise's {charge.promise.gpus} GPUs "
                    "(GPUs over a promise go to best-effort work)")
        if d.action is Action.MIGRATE and not self.has_slack(job, t_p):
            return (f"{self.name}'s {d.change or 'move'} to {cell} would cost a restart it has no slack for "
                    f"({job.done_iterations:.0f} iterations done, {p})")
        if not self.adm.recharge(jid, dt):
            return f"{self.name} placed it on {dt}, where its tenant has no quota left"
        self.t_p[jid] = t_p
        return None

    def orig_ok(self, jid: str) -> bool:
        """Whether the job's place before the round holds its promise."""
        orig = self.ctx.running.get(jid)
        if orig is None or orig.cell.gpu_type != self.adm.charges[jid].gpu_type:
            return False
        return self.speed(self.jobs[jid], orig.cell.gpu_type, orig.cell.gpus, len(orig.slices)) \
            <= self.t_p[jid] * (1 + EPS)

    def _restore(self, jid: str, why: str, displace: bool) -> bool:
        """Keep a running job where it was; the policy's other jobs on those GPUs make way: best-effort
        ones are evicted, guaranteed ones (only with `displace`) are placed again later. False, and
        nothing changed, if a guaranteed job holds them and `displace` is off."""
        orig = self.ctx.running[jid]
        job, charge = self.jobs[jid], self.adm.charges[jid]
        takers = self.holders(orig.slices) - {jid}
        guaranteed = {h for h in takers if h in self.adm.charges}
        if guaranteed and not displace:
            return False
        self._release(jid)
        for h in sorted(guaranteed):
            self._release(h)
            self.why[h] = f"its GPUs stay with guaranteed job {jid}, kept where it runs"
            self.dec[h] = (Decision(h, Action.STOP, self.why[h]) if h in self.ctx.running else
                           Decision(h, Action.PENDING, self.why[h], pending=PendingKind.NO_ROOM_NOW))
        for v in sorted(takers - guaranteed):
            self._evict(v, job, charge)
        self.state.take(orig.slices, orig.cell.gpu_type)
        it = self.speed(job, orig.cell.gpu_type, orig.cell.gpus, len(orig.slices))
        self.dec[jid] = Decision(jid, Action.KEEP, f"{tag(job)}: kept in {orig.cell}: {why}"
                                 + victims_text(takers - guaranteed), orig.plan, orig.slices, orig.cell,
                                 iteration_s=it, opportunistic=orig.opportunistic)
        return True

    def _place(self, jid: str, why: str) -> None:
        """Its place back if that held its promise and only best-effort work took it, else the
        promise's GPUs (fewest victims), else a wait with the reason."""
        ctx = self.ctx
        job, charge, d, t_p = self.jobs[jid], self.adm.charges[jid], self.dec[jid], self.t_p[jid]
        orig = ctx.running.get(jid)
        if orig is not None and self.orig_ok(jid) and self._restore(jid, why, displace=False):
            return
        had = d.action in PLACED
        if had:
            self._release(jid)
        found = self._search(job, charge.gpu_type, charge.promise.gpus, t_p)
        if found is None:
            if had:
                self._hold(d, take=True)
                self.dec[jid] = dataclasses.replace(d, reason=f"{d.reason}; {tag(job)}: {why}, and {NO_ROOM_RUNNING}")
            elif orig is None:
                self.dec[jid] = Decision(jid, Action.PENDING, no_room(job, charge),
                                         pending=PendingKind.NO_ROOM_NOW)
            elif not self._restore(jid, f"{why}; no room for its promise, so it keeps what it has", displace=False):
                # Running below its promise and the policy would stop it: it keeps its GPUs unless a
                # guaranteed job took them (a stopped job makes no progress at all).
                self.dec[jid] = dataclasses.replace(d, reason=f"{d.reason}; {tag(job)}: {NO_ROOM_RUNNING}")
            return
        slices, victims, shrunk = found
        for v in victims:
            self._evict(v, job, charge)
        for v, keep in shrunk.items():
            self._shrink(v, keep, job, charge)
        t = charge.gpu_type
        self.state.take(slices, t)
        n = sum(len(s.gpu_indices) for s in slices)
        est = ctx.best(job, t, n, len(slices))
        cell = Cell(t, n, est.cell.stages if est else 0)
        plan = synth_plan(job, est, cell)
        it = est.iteration_s if est else 0.0
        what = (f"its promise{plan_text(charge)}" if n == charge.promise.gpus else
                f"as fast as its promise of {charge.promise.gpus} x {t}{plan_text(charge)} by the estimates")
        text = (f"{tag(job)}: {cell} on {where(slices)} ({what})"
                f"{thr_part(job, est)}{victims_text(set(victims))}"
                + (f"; shrinks best-effort {jobs_text(set(shrunk))}" if shrunk else ""))
        if orig is None:
            used = self.adm.used_before.get(jid, 0)
            q = self.adm.quota.get((charge.tenant, t), 0)
            self.dec[jid] = Decision(jid, Action.START, f"{text}; admitted within quota ({used} of {q} x {t} "
                                     f"in use before it); {why}", plan, slices, cell, iteration_s=it)
        else:
            self.dec[jid] = Decision(jid, Action.MIGRATE, f"{text}; {why}", plan, slices, cell, orig.cell,
                                     change_kind(orig.cell, cell), it)

    def _borrowing(self) -> set[str]:
        """Best-effort jobs placed on quota: per type, those beyond the GPUs no tenant is guaranteed
        (the newest placements first count as borrowing)."""
        out: set[str] = set()
        per: dict[str, list[tuple[float, str, int]]] = {}
        for jid, d in self.dec.items():
            if d.action not in PLACED or jid in self.adm.charges:
                continue
            r = self.ctx.running.get(jid)
            since = r.since if r is not None and d.action is Action.KEEP else math.inf
            for t, sl in self.parts(d).items():
                per.setdefault(t, []).append((since, jid, sum(len(s.gpu_indices) for s in sl)))
        for t, rows in per.items():
            free_of_quota = max(0, self.ctx.total_gpus(t) - self.adm.total_quota(t))
            used = 0
            for _, jid, gpus in sorted(rows):
                used += gpus
                if used > free_of_quota:
                    out.add(jid)
        return out

    def _search(self, job: JobView, gpu_type: str, gpus: int,
                t_p: float) -> tuple[tuple[Slice, ...], list[str], dict[str, tuple[Slice, ...]]] | None:
        """GPUs as fast as the promise, the victims to preempt and those to shrink (victim -> the
        slices it keeps) to free them. The layouts tried: Morphling's minimum demand first (Sec. 5:
        "the fewest resources (possibly with a better plan) needed to achieve the performance of the
        original"), i.e. GPU counts up to the promise's, fewest first, each on the fewest nodes,
        more nodes only where the estimates say it is as fast. Victims: none if the free GPUs do,
        or with them those being freed (`NodeView.releasing`: a victim of an earlier round still
        checkpointing; the job starts once they are free; a live audit saw a second victim
        preempted for one job while the first stopped); else the cheapest single victim that does
        (borrowers first, then jobs the policy was only about to start, then the fewest GPUs taken
        from it; halving it before preempting it); else victims preempted biggest first until they
        do, then any that turn out not needed given back."""
        cands = [jid for jid, d in self.dec.items()
                 if d.action in PLACED and jid not in self.adm.charges and gpu_type in self.parts(d)]
        cap = self.ctx.max_per_node(gpu_type)
        counts = sorted({c for c in self.ctx.gpu_counts(job, gpu_type) if 0 < c < gpus} | {gpus})
        layouts = [(n, n // q) for n in counts for q in quotas(n, cap)
                   if self.speed(job, gpu_type, n, n // q) <= t_p * (1 + EPS)]
        if not layouts:
            return None

        def fits(evict: Sequence[str], shrink: Mapping[str, tuple[Slice, ...]] | None = None,
                 releasing: bool = True) -> tuple[Slice, ...] | None:
            freed = [(t, sl_) for v in evict for t, sl_ in self.parts(self.dec[v]).items()]
            freed += [(gpu_type, self._cut(v, keep)) for v, keep in (shrink or {}).items()]
            held = [] if releasing else self._releasing(gpu_type)  # the GPUs free now alone, first
            for sl_ in held:
                self.state.take(sl_, gpu_type)
            for t, sl_ in freed:
                self.state.release(sl_, t)
            try:
                for n, k in layouts:
                    sl = self.state.place(gpu_type, n, nodes=k)
                    if sl is not None:
                        return sl
                return None
            finally:
                for t, sl_ in freed:
                    self.state.take(sl_, t)
                for sl_ in held:
                    self.state.release(sl_, gpu_type)

        sl = fits((), releasing=False) or fits(())
        if sl is not None:
            return sl, [], {}
        if not cands:
            return None

        def gpus_of(v: str) -> int:
            return sum(len(s.gpu_indices) for s in self.parts(self.dec[v])[gpu_type])

        def cost(v: str) -> tuple[int, int]:
            # borrowers first, then jobs the policy was only about to start (they lose nothing)
            return (0 if v in self.borrowing else 1, 0 if v not in self.ctx.running else 1)

        options: list[tuple[tuple[int, int, int, int, str], str, tuple[Slice, ...] | None]] = []
        for v in cands:
            keep = self._half(v, gpu_type)
            if keep is not None:
                options.append(((*cost(v), gpus_of(v) - sum(len(s.gpu_indices) for s in keep), 0, v), v, keep))
            options.append(((*cost(v), gpus_of(v), 1, v), v, None))
        for _, v, keep in sorted(options, key=lambda o: o[0]):
            sl = fits((), {v: keep}) if keep is not None else fits((v,))
            if sl is not None:
                return (sl, [], {v: keep}) if keep is not None else (sl, [v], {})
        chosen: list[str] = []
        for v in sorted(cands, key=lambda v: (*cost(v), -gpus_of(v), v)):
            chosen.append(v)
            if fits(chosen) is not None:
                break
        else:
            return None
        for v in reversed(chosen[:-1]):
            rest = [c for c in chosen if c != v]
            if fits(rest) is not None:
                chosen = rest
        sl = fits(chosen)
        assert sl is not None
        return sl, chosen, {}

    def _releasing(self, gpu_type: str) -> list[tuple[Slice, ...]]:
        """The GPUs of `gpu_type` being freed (`NodeView.releasing`: free in the ledger, but not yet
        on the node) that no decision of the round holds."""
        held = {(s.node_id, i) for d in self.dec.values() if d.action in PLACED for s in d.slices for i in s.gpu_indices}
        return [(Slice(n.id, ix),) for n in self.ctx.snap.nodes if (ix := tuple(
            i for i in sorted(n.releasing) if n.models.get(i) == gpu_type and (n.id, i) not in held))]

    def _half(self, v: str, gpu_type: str) -> tuple[Slice, ...] | None:
        """The slices a victim keeps when halved (one node: its lower half of the GPUs; several:
        the first half of the nodes), None if it has one GPU or cannot run on the half."""
        d = self.dec[v]
        if d.plan is not None and d.plan.stages:  # a pipeline over mixed types is preempted whole
            return None
        if len(d.slices) == 1:
            s = d.slices[0]
            half = len(s.gpu_indices) // 2
            keep: tuple[Slice, ...] = (Slice(s.node_id, s.gpu_indices[:half]),) if half else ()
        else:
            keep = d.slices[:len(d.slices) // 2]
        n = sum(len(s.gpu_indices) for s in keep)
        if n <= 0 or self.ctx.best(self.jobs[v], gpu_type, n, len(keep)) is None:
            return None
        return keep

    def _cut(self, v: str, keep: Sequence[Slice]) -> tuple[Slice, ...]:
        """The slices a victim gives up when it keeps `keep`."""
        kept = {(s.node_id, i) for s in keep for i in s.gpu_indices}
        out = []
        for s in self.dec[v].slices:
            rest = tuple(i for i in s.gpu_indices if (s.node_id, i) not in kept)
            if rest:
                out.append(Slice(s.node_id, rest))
        return tuple(out)

    def _shrink(self, v: str, keep: tuple[Slice, ...], job: JobView, charge: Charge) -> None:
        """Halve a victim for guaranteed `job`: it goes on with the GPUs it keeps (a running one
        restarts from its checkpoint on them)."""
        d = self.dec[v]
        t = self.type_of(d)
        self.state.release(self._cut(v, keep), t)
        vj = self.jobs[v]
        n = sum(len(s.gpu_indices) for s in keep)
        est = self.ctx.best(vj, t, n, len(keep))
        cell = Cell(t, n, est.cell.stages if est else 0)
        gives = sum(len(s.gpu_indices) for s in self._cut(v, keep))
        why = (f"shrunk: {reclaims(job, charge, gives, self.adm.unguarded.get(v, ''))}; {cell} on {where(keep)}"
               f"{thr_part(vj, est, ', ')}")
        it = est.iteration_s if est else 0.0
        orig = self.ctx.running.get(v)
        if orig is None:
            self.dec[v] = Decision(v, Action.START, why, synth_plan(vj, est, cell), keep, cell, iteration_s=it)
        else:
            self.dec[v] = Decision(v, Action.MIGRATE, why, synth_plan(vj, est, cell), keep, cell, orig.cell,
                                   change_kind(orig.cell, cell), it)

    def _release(self, jid: str) -> None:
        d = self.dec[jid]
        if d.action in PLACED:
            self._hold(d, take=False)

    def _evict(self, v: str, job: JobView, charge: Charge) -> None:
        """Take a victim's GPUs for guaranteed `job`: a running victim stops (checkpointed and
        requeued by the engine), one the policy was about to start waits."""
        gives = sum(len(s.gpu_indices) for s in self.parts(self.dec[v]).get(charge.gpu_type, ()))
        self._release(v)
        what = reclaims(job, charge, gives, self.adm.unguarded.get(v, ""), held=v in self.ctx.running)
        if v in self.ctx.running:
            self.dec[v] = Decision(v, Action.STOP, f"preempted: {what}; {requeue_text(self.jobs[v])}")
        else:
            who = "the cost objective" if self.jobs[v].objective is Objective.COST else self.name
            self.dec[v] = Decision(v, Action.PENDING, f"waiting: {who} would have started it, but {what}",
                                   pending=PendingKind.NO_ROOM_NOW)
