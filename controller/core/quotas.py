"""Tenants' GPU quotas: which guaranteed jobs a round admits, and what each tenant uses.

Morphling Sec. 4-5 (../shared/seeds/morphling.txt): tenants hold GPU quotas; a guaranteed job
consumes quota, a best-effort job uses what is free and may be preempted at any time; Algorithm 1
(lines 2-3) first schedules "the guaranteed jobs whose resource demands are within the tenant's
remaining quota". Here a guaranteed job is charged its promise's GPUs (Promise.gpus) on one GPU
type: the promise's `gpu_type`, or, for a promise with gpu_type "", the type the job runs on (a
pending one: its type hint, else the allowed type with the most quota left).

Who is guaranteed in the core: tenants are configured (Snapshot.tenants not empty), the job's
priority is GUARANTEED, its tenant is one of Snapshot.tenants, and its promise (or, without one,
its GPU hint) names a GPU count. Anyone else is best-effort here; the live side refuses unknown
tenants at submission, the core only must not crash on them.

Admission order: running guaranteed jobs first (oldest placement first: RunningView.since, then
id), then pending ones in queue order (submission time, id). A pending job whose promise does not
fit what is left of its tenant's quota on any type it may use is over quota: it waits, not
admitted, with a reason naming the tenant, the type(s), the quota and the use. A running job
beyond its tenant's quota (the quota shrank under it) is not admitted and counts as best-effort
(`Admission.unguarded` says so: its reasons and those of its preemption name the quota).

With a `Sizer` (what `plan_round` passes: controller/core/admission.py builds it from the round's
estimates), three rules replace the plain ones (docs/tenants.md, "Admission with a sizer"):
- charge = minRes: Morphling Sec. 5, "We consider the quota usage of each job as its minimum
  demand": the fewest GPUs whose best plan is at least as fast as the promise;
- order: first the pending jobs admitted in an earlier round and not placed yet
  (`JobView.admitted_at` set: their SLA clock runs; never refused for their layout); then those
  waiting longer than `starve_s`, in queue order: one that does not fit stops its tenant's later
  admissions that round (the bound against starvation); then the rest (with `borrow`, also the
  borrowers: guaranteed jobs running as best-effort, never admitted) shortest promise first
  (remaining iterations x t_P);
- placement: a job is admitted only where its minRes can be laid out on the nodes beside the
  other admitted guaranteed jobs (the sizer's `reserve`); one that cannot waits like one over
  quota (its SLA clock has not started), and both may run as best-effort meanwhile.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tessera.controller.core.snapshot import JobView, Priority, Promise, RunningView, Snapshot, TenantQuota


@dataclass(frozen=True)
class Charge:
    """An admitted guaranteed job's use of its tenant's quota: `gpus` GPUs of `gpu_type` (the
    promise's GPUs, or its minRes with a `Sizer`)."""

    job_id: str
    tenant: str
    gpu_type: str
    gpus: int
    promise: Promise  # the job's promise with `gpu_type` set to the charged type


@dataclass
class Admission:
    """The quota accounting of one round."""

    # (tenant, GPU type) -> GPUs guaranteed.
    quota: dict[tuple[str, str], int]
    # (tenant, GPU type) -> GPUs charged to admitted guaranteed jobs.
    used: dict[tuple[str, str], int] = field(default_factory=dict)
    # Admitted guaranteed jobs (running or pending) -> their charge.
    charges: dict[str, Charge] = field(default_factory=dict)
    # Pending guaranteed jobs over their tenant's quota -> the reason they wait.
    over_quota: dict[str, str] = field(default_factory=dict)
    # Admitted pending jobs -> (tenant's use of the charged type before them).
    used_before: dict[str, int] = field(default_factory=dict)
    # Guaranteed jobs running as best-effort while not admitted (borrowers), and those of them
    # admitted this round (their SLA clock starts now).
    borrowers: set[str] = field(default_factory=set)
    # Running guaranteed jobs beyond their tenant's quota (a reloaded tenants file cut it under
    # them), neither borrowers nor admitted -> why they run as best-effort, for their reasons.
    unguarded: dict[str, str] = field(default_factory=dict)

    def left(self, tenant: str, gpu_type: str) -> int:
        return self.quota.get((tenant, gpu_type), 0) - self.used.get((tenant, gpu_type), 0)

    def total_quota(self, gpu_type: str) -> int:
        return sum(q for (_, t), q in self.quota.items() if t == gpu_type)

    def recharge(self, job_id: str, gpu_type: str) -> bool:
        """Move an admitted job's charge to another type (a promise without a type, placed on
        `gpu_type`): True if the tenant's quota there holds it, and the charge moved."""
        c = self.charges[job_id]
        if c.gpu_type == gpu_type:
            return True
        if c.promise.gpu_type and c.promise.gpu_type != gpu_type:
            return False
        if self.left(c.tenant, gpu_type) < c.gpus:
            return False
        self.used[(c.tenant, c.gpu_type)] -= c.gpus
        self.used[(c.tenant, gpu_type)] = self.used.get((c.tenant, gpu_type), 0) + c.gpus
        self.charges[job_id] = Charge(job_id, c.tenant, gpu_type, c.gpus,
                                      Promise(c.promise.gpus, c.promise.cpus, c.promise.plan, gpu_type))
        return True


def tenant_names(tenants: Iterable[TenantQuota]) -> set[str]:
    return {t.name for t in tenants}


def promised(job: JobView) -> Promise | None:
    """The job's promise; without one, its GPU hint and type hint; None if it names no GPU count."""
    if job.promise is not None and job.promise.gpus > 0:
        return job.promise
    if job.promise is None and job.gpus_hint > 0:
        return Promise(job.gpus_hint, 0, "", job.gpu_type_hint)
    return None


def is_guaranteed(job: JobView, tenants: Mapping[str, TenantQuota]) -> bool:
    """Guaranteed in the core: see the module docstring."""
    return (bool(tenants) and job.priority is Priority.GUARANTEED and job.tenant in tenants
            and promised(job) is not None)


def cluster_types(snap: Snapshot) -> list[str]:
    """GPU types the cluster has, READY or not, sorted."""
    out = {g.model for n in snap.nodes for g in n.gpus}
    out.update(m for m, _, _ in snap.cluster_gpus)
    return sorted(out)


def _allowed(job: JobView, types: Sequence[str]) -> list[str]:
    return [t for t in types if job.may_use(t)]


class Sizer(Protocol):
    """What admission asks of the round's estimates (controller/core/admission.py implements it)."""

    def min_gpus(self, job: JobView, promise: Promise) -> int:
        """minRes: the fewest GPUs of promise.gpu_type as fast as the promise (<= promise.gpus)."""
        ...

    def length_s(self, job: JobView, promise: Promise) -> float:
        """Seconds its remaining iterations take at the promise's speed (inf = unknown)."""
        ...

    def hold(self, running: RunningView, charge: Charge) -> None:
        """Count an admitted running job's GPUs as taken for the layout of the next ones."""
        ...

    def reserve(self, job: JobView, charge: Charge) -> bool:
        """Lay the charge out on the nodes beside those held and reserved; False (nothing
        reserved) when it cannot be."""
        ...


def is_borrower(r: RunningView) -> bool:
    """A guaranteed job running as best-effort, never admitted (module docstring)."""
    return r.job.admitted_at is None and r.opportunistic


def admit(snap: Snapshot, sizer: Sizer | None = None, starve_s: float = math.inf, borrow: bool = False) -> Admission:
    """Charge running guaranteed jobs, then admit pending ones (and, with `borrow`, borrowers) while
    their tenant's quota holds them: in queue order at their promise's GPUs, or with a `sizer` at
    minRes, shortest promise first and where the layout allows (module docstring)."""
    tenants = {t.name: t for t in snap.tenants}
    adm = Admission({(t.name, ty): n for t in snap.tenants for ty, n in t.gpus})
    if not tenants:
        return adm
    types = cluster_types(snap)
    waiting: list[JobView] = []
    for r in sorted(snap.running, key=lambda r: (r.since, r.job.id)):
        job = r.job
        p = promised(job)
        if p is None or not is_guaranteed(job, tenants):
            continue
        if borrow and sizer is not None and is_borrower(r):
            adm.borrowers.add(job.id)
            waiting.append(job)
            continue
        t = p.gpu_type or r.cell.gpu_type
        gpus = sizer.min_gpus(job, _typed(p, t)) if sizer is not None else p.gpus
        if adm.left(job.tenant, t) >= gpus:
            _charge(adm, job, t, p, gpus)
            if sizer is not None:
                sizer.hold(r, adm.charges[job.id])
        else:
            adm.unguarded[job.id] = unguarded_reason(adm, job, t, p, gpus)
    waiting += [j for j in snap.pending if is_guaranteed(j, tenants)]
    blocked: set[str] = set()
    for job in _order(snap, waiting, sizer, starve_s):
        p = promised(job)
        assert p is not None
        if job.tenant in blocked:
            adm.over_quota[job.id] = (f"waiting: its tenant {job.tenant}'s guaranteed jobs waiting longer than "
                                      f"{starve_s:.0f} s are admitted first")
            continue
        cands = [p.gpu_type] if p.gpu_type else _allowed(job, types)
        need = {t: sizer.min_gpus(job, _typed(p, t)) if sizer is not None else p.gpus for t in cands}
        fit = [t for t in cands if adm.left(job.tenant, t) >= need[t]]
        starving = sizer is not None and snap.now - job.submit_time > starve_s
        if not fit:
            adm.over_quota[job.id] = over_quota_reason(adm, job, p, cands or [p.gpu_type or "any type"], need)
            if starving:
                blocked.add(job.tenant)
            continue
        if job.gpu_type_hint in fit:
            t = job.gpu_type_hint
        else:
            t = min(fit, key=lambda ty: (-adm.left(job.tenant, ty), ty))
        before = adm.used.get((job.tenant, t), 0)
        _charge(adm, job, t, p, need[t])
        if sizer is not None and not sizer.reserve(job, adm.charges[job.id]) and job.admitted_at is None:
            _uncharge(adm, job.id)
            adm.over_quota[job.id] = no_layout_reason(adm, snap, job, need[t], t)
            if starving:
                blocked.add(job.tenant)
            continue
        adm.used_before[job.id] = before
    return adm


def _typed(p: Promise, gpu_type: str) -> Promise:
    return p if p.gpu_type == gpu_type else Promise(p.gpus, p.cpus, p.plan, gpu_type)


def _order(snap: Snapshot, jobs: Sequence[JobView], sizer: Sizer | None, starve_s: float) -> list[JobView]:
    """Queue order (submission time, id); with a sizer: those waiting over `starve_s` first in
    queue order, then shortest promise first (module docstring)."""
    if sizer is None:
        return sorted(jobs, key=lambda j: (j.submit_time, j.id))

    def key(j: JobView) -> tuple[int, float, float, str]:
        if j.admitted_at is not None:  # admitted before, not placed yet: its SLA clock runs
            return (0, j.submit_time, 0.0, j.id)
        if snap.now - j.submit_time > starve_s:
            return (1, j.submit_time, 0.0, j.id)
        p = promised(j)
        assert p is not None
        return (2, sizer.length_s(j, p), j.submit_time, j.id)
    return sorted(jobs, key=key)


def _uncharge(adm: Admission, job_id: str) -> None:
    c = adm.charges.pop(job_id)
    adm.used[(c.tenant, c.gpu_type)] -= c.gpus


def _charge(adm: Admission, job: JobView, gpu_type: str, p: Promise, gpus: int) -> None:
    k = (job.tenant, gpu_type)
    adm.used[k] = adm.used.get(k, 0) + gpus
    adm.charges[job.id] = Charge(job.id, job.tenant, gpu_type, gpus, Promise(p.gpus, p.cpus, p.plan, gpu_type))


# How the reason of a running guaranteed job its tenant's quota no longer covers begins (the engine
# stores it as the job's reason: controller/rounds.py `kept_notes`).
UNGUARDED = "running as best-effort: "


def unguarded_reason(adm: Admission, job: JobView, gpu_type: str, p: Promise, gpus: int) -> str:
    """Why a running guaranteed job runs as best-effort: its tenant's quota no longer covers it."""
    q, used = adm.quota.get((job.tenant, gpu_type), 0), adm.used.get((job.tenant, gpu_type), 0)
    before = f", {used} of them charged to its guaranteed jobs placed before it" if used else ""
    need = f"its promise ({p.gpus} x {gpu_type})" if gpus == p.gpus else \
        f"its promise's minimum demand ({gpus} x {gpu_type})"
    return f"{UNGUARDED}tenant {job.tenant}'s quota ({q} x {gpu_type}{before}) no longer covers {need}"


def registered(snap: Snapshot, gpu_type: str) -> int:
    """GPUs of the type the cluster has, READY or not."""
    return (sum(n for m, _, n in snap.cluster_gpus if m == gpu_type)
            or sum(1 for node in snap.nodes for g in node.gpus if g.model == gpu_type))


def no_layout_reason(adm: Admission, snap: Snapshot, job: JobView, gpus: int, gpu_type: str) -> str:
    """Why a job within quota is not admitted: the layout check (module docstring) found no room for
    its minRes beside the GPUs that the admitted guaranteed jobs, of every tenant, hold or were
    laid out on. Whose they are: a live audit read "its tenant's" where only another tenant's job
    held the GPUs (quotas of the type summing to more than the cluster has); no job is named."""
    tenants = {c.tenant for c in adm.charges.values() if c.gpu_type == gpu_type}
    own, others = job.tenant in tenants, bool(tenants - {job.tenant})
    have = registered(snap, gpu_type)
    whose = ("its tenant's and other tenants'" if own and others else "other tenants'" if others
             else "its tenant's" if own else "")
    text = (f"waiting: within tenant {job.tenant}'s quota, but its minimum demand ({gpus} x {gpu_type} on the fewest "
            "nodes as fast as its promise) cannot be laid out ")
    text += (f"beside the GPUs {whose} admitted guaranteed jobs hold" if whose else
             f"on the cluster's {have} x {gpu_type} as they are now")
    total = adm.total_quota(gpu_type)
    if others and total > have:
        text += (f"; the tenants' quotas of {gpu_type} sum to {total}, more than the {have} the cluster has "
                 "(oversubscribed): a job within its tenant's quota may wait for other tenants' guaranteed jobs")
    return text + ("; it is admitted when they leave room" if whose else "; it is admitted when the nodes have room")


def over_quota_reason(adm: Admission, job: JobView, p: Promise, types: Sequence[str],
                      need: Mapping[str, int] | None = None) -> str:
    per = "; ".join(f"{t}: quota {adm.quota.get((job.tenant, t), 0)}, charged {adm.used.get((job.tenant, t), 0)}"
                    for t in types)
    what = f"{p.gpus} x {p.gpu_type}" if p.gpu_type else f"{p.gpus} GPUs"
    if need and all(need.get(t, p.gpus) > adm.quota.get((job.tenant, t), 0) for t in types):
        # Refused at submission; here when a reloaded tenants file cut the quota under the promise.
        return (f"waiting: over quota for good: this guaranteed job's promise needs {what}, more than tenant "
                f"{job.tenant}'s whole quota ({per}); it is admitted only if the tenants file raises the quota "
                "again: cancel it, or resubmit it with a smaller promise or as best-effort")
    return (f"waiting: over quota: tenant {job.tenant}'s guaranteed jobs use its quota ({per}); this "
            f"guaranteed job's promise needs {what}; it is admitted when its tenant's use leaves room")
