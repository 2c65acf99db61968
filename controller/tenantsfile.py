"""The tenants file (`tessera-controller --tenants FILE`, docs/tenants.md): tenants and their GPU
quotas per type, the one parser.

    tenants:
      team-a:
        quota: {A100-80GB: 16, H100-80GB: 8}
      team-b: {}            # a tenant without quota: best-effort only
      team-c:
        max_unended_jobs: 500   # its own cap of jobs not yet ended (else --max-unended-jobs; 0 = none)

Pure but for `read_tenants_file`: a parsed document in, a `TenantsConfig` (the core's TenantQuota
values) out, or a `TenantsFileError` naming the field (`FILE line N: field F: why` when read from a
file). Read through tessera.common.yamlfile (duplicate keys, aliases, NaN, deep nesting refused).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.common import gpus as catalog
from tessera.common.jobspec import NAME_RE, NAME_RULE
from tessera.common.yamlfile import InputFileError, read_and_parse, refuse_unknown_keys
from tessera.controller.core.snapshot import TenantQuota

MAX_TENANTS = 10_000
# GPUs of one type one tenant may be guaranteed: far above any cluster, below overflow anywhere.
MAX_QUOTA = 1_000_000
# A tenant's own cap of jobs not yet ended (controller/unended.py): 0 = none.
MAX_UNENDED_JOBS = 100_000_000
TENANT_KEYS = ("quota", "max_unended_jobs")


class TenantsFileError(InputFileError):
    """A tenants file that cannot be used; `field` names the offending key."""


@dataclass(frozen=True)
class TenantsConfig:
    """The tenants, sorted by name; `tenants` is what a round's Snapshot.tenants holds."""

    tenants: tuple[TenantQuota, ...] = ()
    # (tenant, cap) of the tenants whose entry sets max_unended_jobs, sorted by name.
    unended_caps: tuple[tuple[str, int], ...] = ()

    def max_unended(self, name: str) -> int | None:
        """The tenant's own cap of jobs not yet ended (0 = none); None = the controller's flag."""
        return dict(self.unended_caps).get(name)

    def get(self, name: str) -> TenantQuota | None:
        return next((t for t in self.tenants if t.name == name), None)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tenants)

    def quota_sums(self) -> dict[str, int]:
        """Guaranteed GPUs of every tenant together, per type."""
        out: dict[str, int] = {}
        for t in self.tenants:
            for gpu_type, n in t.gpus:
                out[gpu_type] = out.get(gpu_type, 0) + n
        return out


def parse_tenants(doc: Any) -> TenantsConfig:
    """The config of one parsed document; TenantsFileError naming the field (no file, no line)."""
    if not isinstance(doc, Mapping):
        raise TenantsFileError("tenants", "the file must be a mapping with a 'tenants' mapping")
    refuse_unknown_keys(doc, ("tenants",), "", TenantsFileError, note="the file holds only 'tenants'")
    tenants = doc.get("tenants")
    if not isinstance(tenants, Mapping):
        raise TenantsFileError("tenants", "must be a mapping of tenant name to {quota: {GPU type: GPUs}}")
    if len(tenants) > MAX_TENANTS:
        raise TenantsFileError("tenants", f"more than {MAX_TENANTS:,} tenants")
    out = []
    caps: list[tuple[str, int]] = []
    for name, body in tenants.items():
        field = f"tenants.{name}"
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise TenantsFileError(f"tenants.{str(name)[:40]}", f"a tenant name must be {NAME_RULE} (as in the "
                                                                  "tokens file)")
        out.append(TenantQuota(name, _quota(field, body)))
        cap = body.get("max_unended_jobs") if isinstance(body, Mapping) else None
        if cap is not None:
            if isinstance(cap, bool) or not isinstance(cap, int) or not 0 <= cap <= MAX_UNENDED_JOBS:
                raise TenantsFileError(f"{field}.max_unended_jobs", f"must be a number of jobs in "
                                       f"0..{MAX_UNENDED_JOBS:,} (0 = no cap), got {cap!r:.40}")
            caps.append((name, cap))
    return TenantsConfig(tuple(sorted(out, key=lambda t: t.name)), tuple(sorted(caps)))


def _quota(field: str, body: Any) -> tuple[tuple[str, int], ...]:
    if body is None:
        return ()
    if not isinstance(body, Mapping):
        raise TenantsFileError(field, "must be a mapping: {quota: {GPU type: GPUs}}, or {} for none")
    refuse_unknown_keys(body, TENANT_KEYS, field, TenantsFileError)
    quota = body.get("quota")
    if quota is None:
        return ()
    if not isinstance(quota, Mapping):
        raise TenantsFileError(f"{field}.quota", "must be a mapping of GPU type to GPUs, e.g. {A100-80GB: 16}")
    gpus: dict[str, int] = {}
    for gpu_type, n in quota.items():
        key = f"{field}.quota.{str(gpu_type)[:40]}"
        try:
            canonical = catalog.lookup(str(gpu_type)).name
        except catalog.UnknownGpuError as exc:
            raise TenantsFileError(key, str(exc)[:300]) from None
        if canonical in gpus:
            raise TenantsFileError(key, f"{canonical} is given twice (names and aliases of one type)")
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_QUOTA:
            raise TenantsFileError(key, f"must be a number of GPUs in 0..{MAX_QUOTA:,}, got {n!r}")
        if n:
            gpus[canonical] = n
    return tuple(sorted(gpus.items()))


def read_tenants_file(path: str | Path) -> TenantsConfig:
    """Read and parse a tenants file; TenantsFileError `FILE line N: field F: why` (OSError when
    it cannot be opened is a TenantsFileError too, naming the file)."""
    return read_and_parse(path, parse_tenants, TenantsFileError)


def over_cluster(config: TenantsConfig, registered: Mapping[str, int]) -> list[str]:
    """Warnings for the GPU types whose quotas sum to more than the cluster's registered GPUs of the
    type: every promise within quota cannot be kept at once until nodes join (docs/tenants.md)."""
    out = []
    for gpu_type, total in sorted(config.quota_sums().items()):
        have = registered.get(gpu_type, 0)
        if total > have:
            holders = ", ".join(f"{t.name} {t.quota(gpu_type)}" for t in config.tenants if t.quota(gpu_type))
            out.append(f"quotas of {gpu_type} sum to {total} GPUs ({holders}) but the cluster has {have} "
                       "registered: guaranteed jobs within quota may wait for GPUs until nodes join")
    return out
