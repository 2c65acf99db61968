"""SubmitJob's caps on jobs not yet ended (PENDING, STARTING, RUNNING, MIGRATING): per tenant,
`tessera-controller --max-unended-jobs N` (default 10,000; 0 = none), or the tenant's own
`max_unended_jobs` in the tenants file (docs/tenants.md); and over all tenants together,
`--max-unended-jobs-total N` (default 100,000; 0 = none). docs/operations.md, "Limits".

Nothing else bounds them: a script in a loop could submit millions of jobs, and every round, every
WatchJobs stream of the tenant (controller/watching.py rescans them at each wake-up) and the store
would grow with them. Slurm's MaxSubmitJobs and a Kubernetes ResourceQuota on count/jobs bound the
same thing. The total cap is what holds where tenants are free-form (no tenants file, or an
anonymous or admin caller naming any spec.tenant): rotating the tenant name passes every tenant's cap.

`refusal` and `total_refusal` are the rules, pure. `check` asks the store: one count of the tenant's
jobs and one of all jobs at every submit, no record read (SQLite answers them from its
jobs_tenant_state and jobs_state indexes; etcd from the jobs not ended that it keeps in memory once
it has read them), and, only at a cap, whether a stored job was submitted under the request id:
a retry gets its job back (created=False) whatever the counts, as without a cap. SubmitJob runs the
check and the store's create_job with no await between them, so concurrent submits cannot pass a
cap together (under etcd HA only the leader serves them).
"""

from __future__ import annotations

from tessera.common.errors import ResourceExhausted
from tessera.controller.store import ACTIVE
from tessera.controller.tenantsfile import TenantsConfig
from tessera.controller.transitions import request_key
from tessera.controller.view import EngineView
from tessera.v1 import common_pb2

UNENDED = frozenset({common_pb2.JOB_STATE_PENDING, *ACTIVE})
FLAG = "--max-unended-jobs"
TOTAL_FLAG = "--max-unended-jobs-total"


def cap_of(tenant: str, default: int, config: TenantsConfig | None) -> tuple[int, str]:
    """The tenant's cap (0 = none) and where it is set: the tenants file's entry of the tenant, else
    the controller's flag (`default`)."""
    own = config.max_unended(tenant) if config is not None else None
    if own is not None:
        return own, "max_unended_jobs in the tenants file"
    return default, f"the controller's {FLAG}"


def refusal(tenant: str, unended: int, cap: int, source: str) -> ResourceExhausted | None:
    """RESOURCE_EXHAUSTED when `tenant`, with `unended` jobs not yet ended, may not submit one more
    under `cap` (0 = no cap); None when it may."""
    if cap <= 0 or unended < cap:
        return None
    return ResourceExhausted(
        f"tenant {tenant} has {unended:,} job{'' if unended == 1 else 's'} not yet ended (pending or running), "
        f"and may have at most {cap:,} ({source}): the job was not stored; cancel some of them or wait for "
        "some to end, then submit it again")


def total_refusal(unended: int, cap: int) -> ResourceExhausted | None:
    """RESOURCE_EXHAUSTED when all tenants together, with `unended` jobs not yet ended, may not have one
    more under `cap` (0 = no cap); None when they may."""
    if cap <= 0 or unended < cap:
        return None
    return ResourceExhausted(
        f"the controller holds {unended:,} job{'' if unended == 1 else 's'} not yet ended (pending or running) "
        f"over all tenants, and may hold at most {cap:,} (the controller's {TOTAL_FLAG}): the job was not "
        "stored; cancel some jobs or wait for some to end, then submit it again")


def check(view: EngineView, tenant: str, request_id: str, default: int,
          config: TenantsConfig | None, total: int = 0) -> ResourceExhausted | None:
    """The refusal of a submit of `tenant` with `request_id`; None when it may go on (within the
    tenant's cap and the cap `total` over all tenants, or a retry of a job already stored)."""
    cap, source = cap_of(tenant, default, config)
    refused = refusal(tenant, view.count_jobs(UNENDED, tenant), cap, source) if cap > 0 else None
    if refused is None and total > 0:
        refused = total_refusal(view.count_jobs(UNENDED, ""), total)
    if refused is not None and view.has_request(request_key(tenant, request_id)):
        return None  # a retry: the store answers it with the job it made first
    return refused
