"""Other tenants' job ids out of what a user reads (controller/redact.py)."""

from __future__ import annotations

from tessera.common.tokens import Principal
from tessera.controller.redact import hider

TENANTS = {"j-0123456789ab": "team-a", "j-bbbbbbbbbbbb": "team-b"}


def test_a_user_reads_its_own_tenants_ids_and_no_other() -> None:
    hide = hider(Principal("bob", "team-b", "user"), TENANTS.get)
    assert hide is not None
    text = ("preempted: guaranteed job j-0123456789ab of tenant team-a reclaims 1 x A10; "
            "resumes j-bbbbbbbbbbbb, not j-ffffffffffff")
    assert hide(text) == ("preempted: guaranteed job (another tenant's) of tenant team-a reclaims 1 x A10; "
                          "resumes j-bbbbbbbbbbbb, not (another tenant's)")  # no such job: hidden too
    # Only whole ids of the controller's form: names, longer hex runs and other words stay.
    assert hide("job j-0123456789abc, nj-0123456789ab, j-0123456789AB") == (
        "job j-0123456789abc, nj-0123456789ab, j-0123456789AB")


def test_an_admin_reads_everything() -> None:
    assert hider(Principal("root", "ops", "admin"), TENANTS.get) is None
