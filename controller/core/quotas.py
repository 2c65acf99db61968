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
beyond its tenant's quota (the quota shrank under it) is not admitted and counts as best-effort.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tessera.controller.core.snapshot import JobView, Priority, Promise, Snapshot, TenantQuota


@dataclass(frozen=True)
class Charge:
    """An admitted guaranteed job's use of its tenant's quota: `gpus` GPUs of `gpu_type`."""

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
                                      Promise(c.gpus, c.promise.cpus, c.promise.plan, gpu_type))
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
    return [t for t in types if not job.gpu_types or t in job.gpu_types]


def admit(snap: Snapshot) -> Admission:
    """Charge running guaranteed jobs, then admit pending ones in queue order while their tenant's
    quota holds them (module docstring)."""
    tenants = {t.name: t for t in snap.tenants}
    adm = Admission({(t.name, ty): n for t in snap.tenants for ty, n in t.gpus})
    if not tenants:
        return adm
    types = cluster_types(snap)
    for r in sorted(snap.running, key=lambda r: (r.since, r.job.id)):
        job = r.job
        p = promised(job)
        if p is None or not is_guaranteed(job, tenants):
            continue
        t = p.gpu_type or r.cell.gpu_type
        if adm.left(job.tenant, t) >= p.gpus:
            _charge(adm, job, t, p)
    for job in sorted(snap.pending, key=lambda j: (j.submit_time, j.id)):
        p = promised(job)
        if p is None or not is_guaranteed(job, tenants):
            continue
        cands = [p.gpu_type] if p.gpu_type else _allowed(job, types)
        fit = [t for t in cands if adm.left(job.tenant, t) >= p.gpus]
        if not fit:
            adm.over_quota[job.id] = over_quota_reason(adm, job, p, cands or [p.gpu_type or "any type"])
            continue
        if job.gpu_type_hint in fit:
            t = job.gpu_type_hint
        else:
            t = min(fit, key=lambda ty: (-adm.left(job.tenant, ty), ty))
        adm.used_before[job.id] = adm.used.get((job.tenant, t), 0)
        _charge(adm, job, t, p)
    return adm


def _charge(adm: Admission, job: JobView, gpu_type: str, p: Promise) -> None:
    k = (job.tenant, gpu_type)
    adm.used[k] = adm.used.get(k, 0) + p.gpus
    adm.charges[job.id] = Charge(job.id, job.tenant, gpu_type, p.gpus, Promise(p.gpus, p.cpus, p.plan, gpu_type))


def over_quota_reason(adm: Admission, job: JobView, p: Promise, types: Sequence[str]) -> str:
    per = "; ".join(f"{t}: quota {adm.quota.get((job.tenant, t), 0)}, in use {adm.used.get((job.tenant, t), 0)}"
                    for t in types)
    what = f"{p.gpus} x {p.gpu_type}" if p.gpu_type else f"{p.gpus} GPUs"
    return (f"waiting: over quota: tenant {job.tenant}'s guaranteed jobs use its quota ({per}); this "
            f"guaranteed job's promise needs {what}; it is admitted when its tenant's use leaves room")
