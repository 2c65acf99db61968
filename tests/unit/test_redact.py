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
                          "resumes j-bbbbbbbbbbbb, not another tenant's job")  # no such job: hidden too
    # Only whole ids of the controller's form: names, longer hex runs and other words stay.
    assert hide("job j-0123456789abc, nj-0123456789ab, j-0123456789AB") == (
        "job j-0123456789abc, nj-0123456789ab, j-0123456789AB")


def test_an_admin_reads_everything() -> None:
    assert hider(Principal("root", "ops", "admin"), TENANTS.get) is None


def test_a_hidden_id_leaves_a_sentence_that_reads() -> None:
    """Standing alone, the id is the noun: "another tenant's job" (a live audit read "waiting for
    (another tenant's) to checkpoint and stop"); after "job" it says whose."""
    tenants = {**TENANTS, "j-aaaaaaaaaaaa": "team-a"}
    hide = hider(Principal("bob", "team-b", "user"), tenants.get)
    assert hide is not None
    assert hide("waiting for j-0123456789ab to checkpoint and stop: it starts on their GPUs once they are free") == (
        "waiting for another tenant's job to checkpoint and stop: it starts on their GPUs once they are free")
    assert hide("waiting for j-0123456789ab, j-aaaaaaaaaaaa to checkpoint and stop") == (
        "waiting for 2 jobs of other tenants to checkpoint and stop")
    assert hide("waiting for j-0123456789ab, j-bbbbbbbbbbbb and j-aaaaaaaaaaaa to checkpoint") == (
        "waiting for j-bbbbbbbbbbbb and 2 jobs of other tenants to checkpoint")
    assert hide("crius: scaled down to make room for j-0123456789ab") == (
        "crius: scaled down to make room for another tenant's job")
    assert hide("preempts best-effort jobs j-0123456789ab, j-bbbbbbbbbbbb; admitted") == (
        "preempts best-effort jobs (another tenant's), j-bbbbbbbbbbbb; admitted")
    assert hide("its GPUs stay with guaranteed job j-0123456789ab, kept where it runs") == (
        "its GPUs stay with guaranteed job (another tenant's), kept where it runs")
