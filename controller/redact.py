"""Other tenants' job ids, taken out of what a user reads (docs/auth.md, "Choices").

A job's reason and events may name other jobs: the guaranteed job that preempted or shrank it,
the jobs a guaranteed job preempted, the job a policy shrank another for. A user may not learn
that another tenant's job exists (its id answers NOT_FOUND, word for word as a missing one), so
every id of the controller's form (`j-` and 12 hex digits) that names a job the reader may not
see reads "(another tenant's)". Done where records become API messages, so every policy's texts
are covered, those of later policies too; the stored texts keep the ids for admins and the logs.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from tessera.common.tokens import Principal
from tessera.controller.access import may_see

LIVE_JOB_ID = re.compile(r"\bj-[0-9a-f]{12}\b")
HIDDEN = "(another tenant's)"

Hide = Callable[[str], str]


def hider(principal: Principal, tenant_of: Callable[[str], str | None]) -> Hide | None:
    """What turns a text into what `principal` may read; None when it may read everything (an
    admin). `tenant_of`: a job id's tenant, None for no such job (hidden too)."""
    if principal.sees_all:
        return None

    def name(m: re.Match[str]) -> str:
        tenant = tenant_of(m.group(0))
        return m.group(0) if tenant is not None and may_see(principal, tenant) else HIDDEN

    def hide(text: str) -> str:
        return LIVE_JOB_ID.sub(name, text) if "j-" in text else text

    return hide
