"""Other tenants' job ids, taken out of what a user reads (docs/auth.md, "Choices").

A job's reason and events may name other jobs: the guaranteed job that preempted or shrank it,
the jobs a guaranteed job preempted, the job a policy shrank another for. A user may not learn
that another tenant's job exists (its id answers NOT_FOUND, word for word as a missing one), so
every id of the controller's form (`j-` and 12 hex digits) that names a job the reader may not
see is replaced. Where the text says "job" before it ("guaranteed job j-... of tenant team-a",
"best-effort jobs j-..., j-..."), the noun is there and the id reads "(another tenant's)";
standing alone, the id is the noun, and reads "another tenant's job" (several in one list: "2 jobs
of other tenants", after the ids the reader may see). Before, every id read "(another tenant's)",
and "waiting for j-... to checkpoint and stop" became "waiting for (another tenant's) to
checkpoint and stop" (a live audit). Done where records become API messages, so every policy's
texts are covered, those of later policies too; the stored texts keep the ids for admins and the
logs.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from tessera.common.tokens import Principal
from tessera.controller.access import may_see

LIVE_JOB_ID = re.compile(r"\bj-[0-9a-f]{12}\b")
HIDDEN = "(another tenant's)"
ALONE = "another tenant's job"
# A list of ids ("j-1, j-2 and j-3"), with the word "job(s)" before it when the text has it.
_ID = LIVE_JOB_ID.pattern
_LIST = re.compile(rf"(?P<lead>\bjobs? )?(?P<ids>{_ID}(?:(?:, |,? and ){_ID})*)")

Hide = Callable[[str], str]


def hider(principal: Principal, tenant_of: Callable[[str], str | None]) -> Hide | None:
    """What turns a text into what `principal` may read; None when it may read everything (an
    admin). `tenant_of`: a job id's tenant, None for no such job (hidden too)."""
    if principal.sees_all:
        return None

    def shown(job_id: str) -> bool:
        tenant = tenant_of(job_id)
        return tenant is not None and may_see(principal, tenant)

    def name(m: re.Match[str]) -> str:
        ids = LIVE_JOB_ID.findall(m.group("ids"))
        if all(shown(i) for i in ids):
            return m.group(0)
        lead = m.group("lead") or ""
        if lead:  # "job j-...": the id names which job; hidden, it says whose
            return lead + LIVE_JOB_ID.sub(lambda i: i.group(0) if shown(i.group(0)) else HIDDEN, m.group("ids"))
        seen = [i for i in ids if shown(i)]
        n = len(ids) - len(seen)
        parts = [*seen, ALONE if n == 1 else f"{n} jobs of other tenants"]
        return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"

    def hide(text: str) -> str:
        return _LIST.sub(name, text) if "j-" in text else text

    return hide
