"""Tenants and quotas in the live controller (docs/tenants.md, "Live"): the reloadable tenants file,
what SubmitJob refuses because of it, and what `tessctl get tenants` shows.

`TenantsSource` holds the file's current config. It reloads when asked (SIGHUP) or when the file's
mtime, size or inode changed (checked at every round); a file that no longer parses or cannot be read
is refused with a log line and the config before it stays: a typo never drops every quota. The
admission rules (`submit_refusal`) and the usage (`tenant_rows`) are pure.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from tessera.common import jobspec
from tessera.common.errors import FailedPrecondition
from tessera.common.gpus import UnknownGpuError, lookup
from tessera.common.utctime import utc_text
from tessera.controller.store import ACTIVE, JobRecord
from tessera.controller.tenantsfile import TenantsConfig, TenantsFileError, over_cluster, read_tenants_file
from tessera.v1 import common_pb2, controller_pb2

log = structlog.get_logger("tessera.controller.tenants")
P = common_pb2


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class TenantsSource:
    """The controller's tenants config from `path` ("" = no tenants file: no quotas, every job
    best-effort). The first load raises TenantsFileError (the controller refuses to start); later
    ones keep the old config on any problem and say why in `last_error`."""

    def __init__(self, path: str, wall: Callable[[], float], strict: bool = True) -> None:
        self.path, self.wall = path, wall
        self.config: TenantsConfig | None = None
        self.loaded_at = 0.0
        self.last_error = ""
        self._stamp: tuple[int, int, int] | None = None
        self._reload = False
        self._warned: tuple[str, ...] = ()
        if path and strict:
            self._load()
        elif path:
            # Not strict (a standby taking the lead, docs/ha.md): a file gone bad since the controller
            # started leaves no config to keep: every submission is refused until it is fixed.
            self._reload = True
            self.refresh()

    @property
    def configured(self) -> bool:
        return self.config is not None

    def request_reload(self) -> None:
        """SIGHUP: read the file again at the next `refresh`, even if it looks unchanged."""
        self._reload = True

    def _load(self) -> None:
        stamp = _stamp(self.path)
        config = read_tenants_file(self.path)
        self.config, self._stamp, self.loaded_at, self.last_error = config, stamp, self.wall(), ""
        log.info("tenants_loaded", file=self.path, tenants=len(config.tenants),
                 quotas={t.name: dict(t.gpus) for t in config.tenants if t.gpus},
                 max_unended_jobs=dict(config.unended_caps))

    def refresh(self) -> bool:
        """Reload if asked or if the file changed; True when a new config was taken."""
        if not self.path:
            return False
        stamp = _stamp(self.path)
        if not self._reload and stamp == self._stamp:
            return False
        self._reload = False
        try:
            self._load()
        except TenantsFileError as exc:
            self._stamp = stamp  # refused once per change of the file, not at every round
            kept = "the config loaded before is kept" if self.config is not None else "no config: submissions refused"
            now = self.wall()
            self.last_error = f"reload refused at {utc_text(now) or f'{now:.0f}'}, {kept}: {exc}"
            log.error("tenants_reload_refused", file=self.path, error=str(exc), kept=kept)
            return False
        return True

    def warnings(self, registered: Mapping[str, int]) -> list[str]:
        """The config's problems against the registered GPUs, and the last refused reload; logged
        once each time they change."""
        out = over_cluster(self.config, registered) if self.config is not None else []
        if self.last_error:
            out.append(self.last_error)
        if tuple(out) != self._warned:
            self._warned = tuple(out)
            for w in out:
                log.warning("tenants_warning", file=self.path, warning=w)
        return out


def on_sighup(source: TenantsSource, kick: Callable[[], None]) -> None:
    """SIGHUP: read the tenants file again at once; `kick` asks for the round that does it."""
    log.info("sighup", action="reloading the tenants file", file=source.path or "(none)")
    source.request_reload()
    kick()


# -- admission at submit -------------------------------------------------------------------------------


def _canonical(gpu_type: str) -> str:
    try:
        return lookup(gpu_type).name
    except UnknownGpuError:
        return gpu_type


def submit_refusal(config: TenantsConfig | None, path: str, spec: common_pb2.JobSpec,
                   error: str = "", operator: bool = True) -> FailedPrecondition | None:
    """Why a validated spec may never be admitted here, or None (docs/tenants.md, "Live"):
    - any job while the tenants file `path` is configured but could not be loaded (`error`);
    - a guaranteed job on a controller without a tenants file (no quota could ever admit it);
    - a job of a tenant the file does not name, while there is one;
    - a guaranteed job whose promise alone exceeds its tenant's whole quota of the type (or of every
      type it may run on). A promise within the quota but over what is left now is accepted: it
      waits, PENDING with the reason.
    `operator`: the caller sees all tenants (an admin); a user is told neither the file's path, nor
    its parse error, nor the other tenants' names (as `get tenants` shows a user its own tenant only)."""
    tenant = spec.tenant or "default"
    if not operator:
        path, error = Path(path).name, "ask an operator" if error else ""
    if config is None and path and error:
        return FailedPrecondition(f"the tenants file {path} could not be loaded, so no tenant may submit until it "
                                  f"is fixed (it is read again when it changes, or on SIGHUP): {error}")
    if config is None:
        if jobspec.guaranteed(spec):
            return FailedPrecondition("priority: a guaranteed job needs a tenant quota, and this controller has "
                                      "no tenants file (--tenants): submit it as best-effort")
        return None
    quota = config.get(tenant)
    if quota is None:
        known = f"; known: {', '.join(config.names[:20]) or 'none'}" if operator else ""
        return FailedPrecondition(f"tenant: {tenant} is not a tenant of this controller (tenants file {path}"
                                  f"{known})")
    if not jobspec.guaranteed(spec):
        return None
    g = spec.guarantee
    have = ", ".join(f"{n} x {t}" for t, n in quota.gpus) or "none"
    if g.gpu_type:
        gpu_type = _canonical(g.gpu_type)
        limit = quota.quota(gpu_type)
        if limit == 0:
            return FailedPrecondition(f"guarantee.gpu_type: tenant {tenant} has no guaranteed quota of {gpu_type} "
                                      f"(its quota: {have})")
        if g.num_gpus > limit:
            return FailedPrecondition(f"guarantee.num_gpus: {g.num_gpus} GPUs of {gpu_type} exceed tenant {tenant}'s "
                                      f"whole quota of {limit}: the job could never be admitted")
        return None
    allowed = {_canonical(t) for t in spec.hint.gpu_types}
    limits = {t: n for t, n in quota.gpus if not allowed or t in allowed}
    if not limits:
        return FailedPrecondition(f"guarantee: tenant {tenant} has no guaranteed quota of a type the job may run on "
                                  f"(its quota: {have})")
    if g.num_gpus > max(limits.values()):
        return FailedPrecondition(f"guarantee.num_gpus: {g.num_gpus} GPUs exceed tenant {tenant}'s whole quota of "
                                  f"every type ({have}): the job could never be admitted")
    return None


# -- usage ---------------------------------------------------------------------------------------------


@dataclass
class _Usage:
    guaranteed: dict[str, int]
    best_effort: dict[str, int]
    running: int = 0
    pending: int = 0


def _held(job: JobRecord) -> list[tuple[str, int]]:
    """(GPU type, GPUs) an active job holds, from its plan: one per stage of a pipeline over mixed
    types (whose `gpu_model` names them all, "A10-24GB+A40-48GB", which is no type)."""
    if job.plan is None:
        return []
    if job.plan.stages:
        return [(s.gpu_model, s.gpus) for s in job.plan.stages]
    return [(job.plan.gpu_model, job.plan.dp * job.plan.tp * job.plan.pp)]


def _pairs(d: Mapping[str, int]) -> list[controller_pb2.TypeGpus]:
    return [controller_pb2.TypeGpus(gpu_type=t, gpus=n) for t, n in sorted(d.items()) if n]


def tenant_rows(config: TenantsConfig | None, jobs: Iterable[JobRecord], only: str = "",
                default_cap: int = 0, pending: Mapping[str, int] | None = None) -> list[controller_pb2.Tenant]:
    """Per tenant (the file's, and any other that holds active jobs, e.g. one removed from the file):
    its quota, the GPUs its guaranteed jobs hold, the GPUs its best-effort jobs hold beyond what is
    left of its quota (borrowed), its running and pending jobs, and its cap of jobs not yet ended
    (the file's max_unended_jobs, else `default_cap`: --max-unended-jobs). `only`: that tenant alone.
    `pending`: the tenants' counts of pending jobs where the caller counted them in the store rather
    than read them (ListTenants: Store.count_jobs_by_tenant's keys, "" as "default" like a job's);
    `jobs` then holds no pending job."""
    usage: dict[str, _Usage] = {t: _Usage({}, {}) for t in (config.names if config else ())}
    for tenant, n in (pending or {}).items():
        if n:
            usage.setdefault(tenant or "default", _Usage({}, {})).pending += n
    for j in jobs:
        tenant = j.spec.tenant or "default"
        u = usage.setdefault(tenant, _Usage({}, {}))
        if j.state == P.JOB_STATE_PENDING:
            u.pending += 1
            continue
        if j.state not in ACTIVE:  # a MIGRATING job still holds its GPUs
            continue
        u.running += 1
        side = u.guaranteed if jobspec.guaranteed(j.spec) else u.best_effort
        for gpu_type, gpus in _held(j):
            side[gpu_type] = side.get(gpu_type, 0) + gpus
    out = []
    for name in sorted(usage):
        if only and name != only:
            continue
        u = usage[name]
        quota = config.get(name) if config else None
        q = dict(quota.gpus) if quota else {}
        borrowed = {t: max(0, n - max(0, q.get(t, 0) - u.guaranteed.get(t, 0))) for t, n in u.best_effort.items()}
        own = config.max_unended(name) if config else None
        out.append(controller_pb2.Tenant(name=name, quota=_pairs(q), guaranteed_in_use=_pairs(u.guaranteed),
                                         borrowed=_pairs(borrowed), jobs_running=u.running, jobs_pending=u.pending,
                                         max_unended_jobs=default_cap if own is None else own))
    return out


def unguarded_warnings(config: TenantsConfig | None, jobs: Iterable[JobRecord], unguarded: Collection[str]) -> list[str]:
    """One line per running guaranteed job that the last round did not admit (`unguarded`:
    controller/snapshots.py `Admissions`): its tenant's quota no longer covers it (a reloaded file
    cut it), so it runs as best-effort and may be preempted (docs/tenants.md). Before, `get
    tenants` showed QUOTA 1 beside GUARANTEED 2 and nothing else (a live audit)."""
    out = []
    for j in sorted(jobs, key=lambda j: j.id):
        if j.id not in unguarded or j.state not in ACTIVE:
            continue
        tenant = j.spec.tenant or "default"
        held = _held(j)
        t = _canonical(j.spec.guarantee.gpu_type) if j.spec.guarantee.gpu_type else held[0][0] if held else "?"
        promised = j.spec.guarantee.num_gpus or sum(n for _, n in held)
        quota = config.get(tenant) if config else None
        q = quota.quota(t) if quota else 0
        out.append(f"tenant {tenant}'s quota ({q} x {t}) no longer covers its running guaranteed job {j.id} "
                   f"(promised {promised} x {t}): it runs as best-effort, and may be preempted, until the quota "
                   "covers it again")
    return out
