"""Who may call what on the Controller API, and which tenant's jobs a call may touch (docs/auth.md).

Pure: a Principal in, an answer or a TesseraError out. `METHOD_ROLES` is the one table of the
role each tessera.v1.Controller method needs; the AuthInterceptor (controller/auth.py) applies it
to every call before a handler runs, so a method missing from it is refused, not open. The
handlers apply the tenant rules below to what they read and write.
"""

from __future__ import annotations

from collections.abc import Mapping

from tessera.common.errors import PermissionDenied
from tessera.common.tokens import ADMIN, INSECURE, USER, Principal

METHOD_ROLES: Mapping[str, str] = {
    "SubmitJob": USER,
    "GetJob": USER,
    "ListJobs": USER,
    "CancelJob": USER,
    "WatchJobEvents": USER,
    "GetJobLogs": USER,
    "ListNodes": USER,  # nodes are shared by every tenant: seeing them is how a user reads capacity
    "WhoAmI": USER,
    # Streams of what GetJob, ListJobs and GetJobLogs answer, under the same tenant rules.
    "WatchJob": USER,
    "WatchJobs": USER,
    "StreamJobLogs": USER,
    "ListTenants": USER,  # a user sees its own tenant's quota and usage, an admin every tenant's
    "DrainNode": ADMIN,
    "UndrainNode": ADMIN,
    "RemoveNode": ADMIN,
}

# Calls that change something: the interceptor logs who made them (the audit trail).
MUTATING = frozenset({"SubmitJob", "CancelJob", "DrainNode", "UndrainNode", "RemoveNode"})


def authorize(method: str, principal: Principal) -> None:
    """PermissionDenied unless `principal`'s role may call `method`."""
    need = METHOD_ROLES.get(method)
    if need is None:
        raise PermissionDenied(f"{method} is open to no role")
    if principal.role == INSECURE or principal.role == ADMIN:
        return
    if principal.role == USER and need == USER:
        return
    raise PermissionDenied(f"{method} needs role {need}; {principal.name} has role {principal.role}")


def may_see(principal: Principal, tenant: str) -> bool:
    """Whether `principal` may read or act on a job of `tenant`. A handler answers NOT_FOUND when it
    may not, exactly as for a job that does not exist: a job id says nothing to another tenant."""
    return principal.sees_all or (bool(principal.tenant) and principal.tenant == tenant)


def submit_tenant(principal: Principal, requested: str) -> str:
    """The tenant a submitted job belongs to: the caller's own for a user (naming another one is
    PermissionDenied), the one named for an admin (its own when none is). Empty only without
    authentication (the engine's default tenant then)."""
    if principal.sees_all:
        return requested or principal.tenant
    if requested and requested != principal.tenant:
        raise PermissionDenied(f"spec.tenant: {principal.name} submits only for tenant {principal.tenant}, "
                               f"not {requested}")
    return _own(principal)


def list_tenant(principal: Principal, requested: str) -> str:
    """The tenant filter of a ListJobs: the caller's own for a user (another one is PermissionDenied),
    the one named for an admin ("" = every tenant)."""
    if principal.sees_all:
        return requested
    if requested and requested != principal.tenant:
        raise PermissionDenied(f"tenant: {principal.name} lists only the jobs of tenant {principal.tenant}")
    return _own(principal)


def _own(principal: Principal) -> str:
    if not principal.tenant:  # "" would mean "every tenant" to the store: never for a user
        raise PermissionDenied(f"{principal.name} has no tenant")
    return principal.tenant
