"""Tenants and guarantees for every policy: a layer around the policy inside `plan_round`.

Morphling Sec. 4-5 (../shared/seeds/morphling.txt): a guaranteed job within its tenant's quota is
scheduled at once (Algorithm 1 lines 2-3), possibly by shrinking or preempting others (lines 8-17;
"shrinking a job to 0 results in a preemption, which will return to the queue"), and its
performance must be at least as good as with the resources and plan it was promised; best-effort
jobs "use free cluster resources opportunistically, and can be preempted anytime".

The layer, with tenants configured (Snapshot.tenants not empty; without them `plan_round` never
calls it and nothing changes):
1. admission (controller/core/quotas.py): running guaranteed jobs keep their charge, pending ones
   are admitted in queue order while their promise fits what is left of their tenant's quota;
   those over quota are hidden from the policy and wait with a reason naming the tenant, the
   type, the quota and the use;
2. the policy plans the round as always (it sees the admitted jobs and their promises in
   `RoundContext.guaranteed`);
3. repair: every admitted job whose decision leaves it slower than its promise (left pending,
   stopped, shrunk, moved to slower GPUs, or moved at all while it has no slack to pay the
   restart) is fixed: a running one is kept where it was if that met its promise, else it gets
   the promise's GPUs (fewest nodes) from the GPUs left free by the plan and, where those are not
   enough, from best-effort work: the fewest victims, borrowers of quota first, jobs the policy
   was only about to start before running ones. Running victims stop (the engine checkpoints
   and requeues them), victims the policy was about to start wait. Decisions the policy made that
   already hold the promise are left exactly as they are: a policy that handles guarantees itself
   (Morphling's Algorithm 1) is never overridden unless it left a guarantee violated.

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

from tessera.controller.core.decisions import change_kind, synth_plan, thr_text, where
from tessera.controller.core.placement import ClusterState
from tessera.controller.core.quotas import Admission, Charge
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    CellEstimate,
    Decision,
    JobView,
    PendingKind,
    Promise,
    RunningView,
    Slice,
    Snapshot,
)

# Relative slack on comparisons of iteration times (estimates of the same Cell compare equal).
EPS = 1e-9
_PLACED = (Action.START, Action.MIGRATE, Action.KEEP)


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

    def ideal_nodes(self, gpu_type: str, gpus: int) -> int: ...

    def total_gpus(self, gpu_type: str) -> int: ...


def policy_view(snapshot: Snapshot, adm: Admission) -> Snapshot:
    """What the policy sees: the snapshot without the guaranteed jobs over quota."""
    hidden = set(adm.over_quota)
    if not hidden:
        return snapshot
    arr = snapshot.arrivals
    return dataclasses.replace(
        snapshot, pending=tuple(j for j in snapshot.pending if j.id not in hidden),
        arrivals=None if arr is None else tuple(a for a in arr if a not in hidden))


def promises(adm: Admission) -> dict[str, Promise]:
    """The admitted guaranteed jobs and their promises (type filled in): `RoundContext.guaranteed`."""
    return {jid: c.promise for jid, c in adm.charges.items()}


def repair(ctx: RoundView, adm: Admission, decisions: Sequence[Decision], policy_name: str) -> list[Decision]:
    """Step 3 of the module docstring over the policy's finalized decisions, plus the waits of the
    guaranteed jobs over quota: a decision for every job of `ctx`."""
    out = Guard(ctx, adm, policy_name).repair(decisions)
    for jid, why in adm.over_quota.items():
        out.append(Decision(jid, Action.PENDING, why, pending=PendingKind.WAITING))
    return out


def promise_time(ctx: RoundView, job: JobView, promise: Promise) -> float:
    """t_P: the promise's iteration time on the round's estimates; 0 = unknown (no estimate)."""
    est: object = ctx.estimates
    inner = getattr(est, "inner", None)
    for e in (est, inner):
        if isinstance(e, PromiseTimes):
            t = e.promise_time(job, promise)
            if t > 0:
                return t
    k = ctx.ideal_nodes(promise.gpu_type, promise.gpus)
    b = ctx.best(job, promise.gpu_type, promise.gpus, k) if k > 0 else None
    return b.iteration_s if b is not None else 0.0


class Guard:
    """The repair step over a round's finalized decisions (module docstring, step 3)."""

    def __init__(self, ctx: RoundView, adm: Admission, policy_name: str) -> None:
        self.ctx = ctx
        self.adm = adm
        self.name = policy_name
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
        done >= (now - submit) / t_P (docs/tenants.md derives it)."""
        need = max(0.0, self.ctx.snap.now - job.submit_time) / t_p
        return job.done_iterations >= need * (1 - EPS)

    # ------------------------------------------------------------------ the ledger

    def _ledger(self, decisions: Sequence[Decision]) -> ClusterState:
        """Free GPUs after the plan: idle ones (not busy for a reason outside the round) less every
        placed decision's."""
        held = {(s.node_id, i) for r in self.ctx.running.values() for s in r.slices for i in s.gpu_indices}
        nodes = [dataclasses.replace(n, busy=frozenset(i for i in n.busy if (n.id, i) not in held))
                 for n in self.ctx.snap.nodes]
        st = ClusterState.from_nodes(nodes)
        for d in decisions:
            if d.action in _PLACED:
                st.take(d.slices, self.type_of(d))
        return st

    def holders(self, slices: Sequence[Slice]) -> set[str]:
        want = {(s.node_id, i) for s in slices for i in s.gpu_indices}
        out = set()
        for jid, d in self.dec.items():
            if d.action in _PLACED and any((s.node_id, i) in want for s in d.slices for i in s.gpu_indices):
                out.add(jid)
        return out

    # ------------------------------------------------------------------ repair

    def repair(self, decisions: Sequence[Decision]) -> list[Decision]:
        self.dec = {d.job_id: d for d in decisions}
        self.state = self._ledger(decisions)
        self.borrowing = self._borrowing()
        order = sorted((jid for jid in self.adm.charges if jid in self.ctx.running),
                       key=lambda j: (self.ctx.running[j].since, j))
        order += [j.id for j in self.ctx.pending if j.id in self.adm.charges]
        for jid in order:
            if jid in self.dec:
                self._fix(jid)
        return list(self.dec.values())

    def _borrowing(self) -> set[str]:
        """Best-effort jobs placed on quota: per type, those beyond the GPUs no tenant is guaranteed
        (the newest placements first count as borrowing)."""
        out: set[str] = set()
        per: dict[str, list[tuple[float, str, int]]] = {}
        for jid, d in self.dec.items():
            if d.action not in _PLACED or jid in self.adm.charges:
                continue
            r = self.ctx.running.get(jid)
            since = r.since if r is not None and d.action is Action.KEEP else math.inf
            gpus = sum(len(s.gpu_indices) for s in d.slices)
            per.setdefault(self.type_of(d), []).append((since, jid, gpus))
        for t, rows in per.items():
            free_of_quota = max(0, self.ctx.total_gpus(t) - self.adm.total_quota(t))
            used = 0
            for _, jid, gpus in sorted(rows):
                used += gpus
                if used > free_of_quota:
                    out.add(jid)
        return out

    def _fix(self, jid: str) -> None:
        ctx = self.ctx
        job = self.jobs[jid]
        charge = self.adm.charges[jid]
        d = self.dec[jid]
        t_p = promise_time(ctx, job, charge.promise)
        if t_p <= 0:
            return  # no estimate of the promise: nothing to hold the job to (docs/tenants.md)
        orig = ctx.running.get(jid)
        if d.action in _PLACED:
            dt = self.type_of(d)
            fast = self.decision_speed(job, d) <= t_p * (1 + EPS)
            moved = d.action is Action.MIGRATE
            if fast and (not moved or self.has_slack(job, t_p)) and self.adm.recharge(jid, dt):
                return
            charge = self.adm.charges[jid]
        why = self._what_was_wrong(job, d, t_p)
        # A running job whose place met its promise stays there, if only best-effort work took it.
        if orig is not None and orig.cell.gpu_type == charge.gpu_type:
            ok = self.speed(job, orig.cell.gpu_type, orig.cell.gpus, len(orig.slices)) <= t_p * (1 + EPS)
            takers = self.holders(orig.slices) - {jid}
            if ok and not takers & set(self.adm.charges):
                self._release(jid)
                for v in sorted(takers):
                    self._evict(v, job, charge)
                self.state.take(orig.slices, orig.cell.gpu_type)
                it = self.speed(job, orig.cell.gpu_type, orig.cell.gpus, len(orig.slices))
                self.dec[jid] = Decision(jid, Action.KEEP, f"{self._tag(job)}: kept in {orig.cell}: {why}"
                                         + self._victims_text(takers), orig.plan, orig.slices, orig.cell,
                                         iteration_s=it, opportunistic=orig.opportunistic)
                return
        had = d.action in _PLACED
        if had:
            self._release(jid)
        found = self._search(job, charge.gpu_type, charge.gpus, t_p)
        if found is None:
            if had:
                self.state.take(d.slices, self.type_of(d))
                self.dec[jid] = dataclasses.replace(d, reason=f"{d.reason}; {self._tag(job)}: {why}, and no "
                                                    "best-effort work holds enough GPUs to restore its promise")
            elif orig is None:
                self.dec[jid] = Decision(jid, Action.PENDING, self._no_room(job, charge),
                                         pending=PendingKind.NO_ROOM_NOW)
            else:
                self.dec[jid] = dataclasses.replace(d, reason=f"{d.reason}; {self._tag(job)}: no best-effort "
                                                    "work holds enough GPUs to restore its promise")
            return
        slices, victims = found
        for v in victims:
            self._evict(v, job, charge)
        t = charge.gpu_type
        self.state.take(slices, t)
        est = ctx.best(job, t, charge.gpus, len(slices))
        cell = Cell(t, charge.gpus, est.cell.stages if est else 0)
        plan = synth_plan(job, est, cell)
        it = est.iteration_s if est else 0.0
        text = (f"{self._tag(job)}: {cell} on {where(slices)} (its promise{self._plan_text(charge)}); "
                f"{thr_text(job, est)}{self._victims_text(set(victims))}")
        if orig is None:
            used = self.adm.used_before.get(jid, 0)
            q = self.adm.quota.get((charge.tenant, t), 0)
            self.dec[jid] = Decision(jid, Action.START, f"{text}; admitted within quota ({used} of {q} x {t} "
                                     f"in use before it); {why}", plan, slices, cell, iteration_s=it)
        else:
            self.dec[jid] = Decision(jid, Action.MIGRATE, f"{text}; {why}", plan, slices, cell, orig.cell,
                                     change_kind(orig.cell, cell), it)

    def _search(self, job: JobView, gpu_type: str, gpus: int, t_p: float) -> tuple[tuple[Slice, ...], list[str]] | None:
        """GPUs for the promise (fewest nodes, as fast as t_P) and the victims to free them:
        none if the free GPUs do; else the cheapest single victim that does; else victims added
        biggest first until they do, then any that turn out not needed given back."""
        cands = [jid for jid, d in self.dec.items()
                 if d.action in _PLACED and jid not in self.adm.charges and self.type_of(d) == gpu_type]

        def fits(evict: Sequence[str]) -> tuple[Slice, ...] | None:
            for v in evict:
                self.state.release(self.dec[v].slices, gpu_type)
            try:
                sl = self.state.place(gpu_type, gpus)
                if sl is not None and self.speed(job, gpu_type, gpus, len(sl)) > t_p * (1 + EPS):
                    sl = None
                return sl
            finally:
                for v in evict:
                    self.state.take(self.dec[v].slices, gpu_type)

        sl = fits(())
        if sl is not None:
            return sl, []
        if not cands:
            return None

        def gpus_of(v: str) -> int:
            return sum(len(s.gpu_indices) for s in self.dec[v].slices)

        def cost(v: str) -> tuple[int, int]:
            # borrowers first, then jobs the policy was only about to start (they lose nothing)
            return (0 if v in self.borrowing else 1, 0 if v not in self.ctx.running else 1)

        for v in sorted(cands, key=lambda v: (*cost(v), gpus_of(v), v)):
            sl = fits((v,))
            if sl is not None:
                return sl, [v]
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
        return sl, chosen

    def _release(self, jid: str) -> None:
        d = self.dec[jid]
        if d.action in _PLACED:
            self.state.release(d.slices, self.type_of(d))

    def _evict(self, v: str, job: JobView, charge: Charge) -> None:
        """Take a victim's GPUs for guaranteed `job`: a running victim stops (checkpointed and
        requeued by the engine), one the policy was about to start waits."""
        self._release(v)
        what = (f"guaranteed job {job.id} of tenant {charge.tenant} reclaims {charge.gpus} x "
                f"{charge.gpu_type} of its quota")
        if v in self.ctx.running:
            self.dec[v] = Decision(v, Action.STOP, f"preempted: {what}; back to the queue from its checkpoint")
        else:
            self.dec[v] = Decision(v, Action.PENDING, f"waiting: {self.name} would have started it, but {what}",
                                   pending=PendingKind.NO_ROOM_NOW)

    # ------------------------------------------------------------------ reasons

    def _tag(self, job: JobView) -> str:
        return f"guaranteed (tenant {job.tenant})"

    @staticmethod
    def _plan_text(charge: Charge) -> str:
        return f", plan {charge.promise.plan}" if charge.promise.plan else ""

    @staticmethod
    def _victims_text(victims: set[str]) -> str:
        if not victims:
            return ""
        vs = sorted(victims)
        return f"; preempts best-effort {', '.join(vs[:5])}{', ...' if len(vs) > 5 else ''}"

    def _what_was_wrong(self, job: JobView, d: Decision, t_p: float) -> str:
        p = f"its promise gives {t_p:.4g} s/iter"
        if d.action is Action.PENDING:
            return f"{self.name} left it waiting ({d.reason}); {p}"
        if d.action is Action.STOP:
            return f"{self.name} would stop it ({d.reason}); {p}"
        if d.action is Action.DROP:
            return f"{self.name} would drop it ({d.reason}); {p}"
        got = self.decision_speed(job, d)
        cell = d.cell or Cell(self.type_of(d), sum(len(s.gpu_indices) for s in d.slices))
        if got > t_p * (1 + EPS):
            return f"{self.name}'s {d.action} to {cell} would run at {got:.4g} s/iter, slower than {p}"
        if d.action is Action.MIGRATE:
            return (f"{self.name}'s {d.change or 'move'} to {cell} would cost a restart it has no slack for "
                    f"({job.done_iterations:.0f} iterations done, {p})")
        return f"{self.name} placed it on {self.type_of(d)}, where its tenant has no quota left"

    def _no_room(self, job: JobView, charge: Charge) -> str:
        return (f"waiting: {self._tag(job)} within quota, needs {charge.gpus} x {charge.gpu_type} on the fewest "
                f"nodes as fast as its promise; the free GPUs and the best-effort work on {charge.gpu_type} "
                f"are not enough (other GPUs are held by guaranteed jobs or unavailable)")
