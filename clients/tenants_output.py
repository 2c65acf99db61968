"""What `tessctl get tenants` prints (docs/cli.md, docs/tenants.md): a table or the
ListTenantsResponse's JSON. Pure functions of the message, as clients/output.py's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tessera.clients.output import NONE, safe, table, to_dict
from tessera.v1 import controller_pb2

TENANT_COLUMNS = ("TENANT", "QUOTA", "GUARANTEED", "BORROWED", "RUNNING", "PENDING", "MAX-UNENDED")


def gpus_text(pairs: Sequence[controller_pb2.TypeGpus]) -> str:
    """"16 x A100-80GB, 8 x H100-80GB"; "-" for none."""
    return ", ".join(f"{p.gpus} x {p.gpu_type}" for p in pairs) or NONE


def tenants_table(resp: controller_pb2.ListTenantsResponse) -> str:
    """The tenants, the tenants the churn guard keeps from preempting and why, then where the quotas
    come from and the warnings (over the cluster, a refused reload), one per line."""
    rows = [[t.name, gpus_text(t.quota), gpus_text(t.guaranteed_in_use), gpus_text(t.borrowed),
             str(t.jobs_running), str(t.jobs_pending), f"{t.max_unended_jobs:,}" if t.max_unended_jobs else NONE]
            for t in resp.tenants]
    lines = [table(TENANT_COLUMNS, rows)] if rows else []
    lines += [f"churn guard: {safe(t.no_preempt_reason)}" for t in resp.tenants if t.no_preempt_reason]
    if not resp.file:
        lines.append("no tenants file (--tenants): no quotas, every job is best-effort")
    lines += [f"warning: {safe(w)}" for w in resp.warnings]
    return "\n".join(lines)


def tenants_json(resp: controller_pb2.ListTenantsResponse) -> dict[str, Any]:
    """`get tenants -o json`: the ListTenantsResponse mapping."""
    return to_dict(resp)

