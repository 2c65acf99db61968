"""The caps on jobs not yet ended (controller/unended.py; docs/operations.md, "Limits") on a real
tessera-controller process over real gRPC on loopback: `--max-unended-jobs 3`, and team-b's own
`max_unended_jobs: 1` in the tenants file; on another, `--max-unended-jobs-total 3` over all tenants
(no tenants file: tenants free-form, an admin may name any).

No agents: jobs stay PENDING until cancelled. The callers are localcluster's: alice (team-a), bob
(team-b), admin (tenant default).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.clients.sdk import Client, RpcError
from tessera.v1 import common_pb2 as P
from tests.procs import REPO, Daemon, start_controller, tessctl

TENANTS = """\
tenants:
  default: {}
  team-a: {}
  team-b:
    max_unended_jobs: 1
"""
TINY = str(REPO / "examples/jobs/tiny.yaml")


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root: Path = tmp_path_factory.mktemp("unended-cap")
    (root / "tenants.yaml").write_text(TENANTS)
    d = start_controller(root / "state", "--max-unended-jobs", "3", "--tenants", str(root / "tenants.yaml"))
    yield d
    d.stop()


def spec(name: str) -> P.JobSpec:
    return P.JobSpec(name=name, global_batch_size=16, iterations=10,
                     model=P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256, seq_length=64))


def refused(client: Client, name: str, request_id: str | None = None) -> RpcError:
    with pytest.raises(RpcError) as ei:
        client.submit(spec(name), request_id=request_id)
    return ei.value


def test_the_fourth_unended_job_of_a_tenant_is_refused_until_one_ends(ctl: Daemon) -> None:
    with Client(ctl.address, token=ctl.tokens["alice"]) as alice, Client(ctl.address, token=ctl.tokens["bob"]) as bob:
        first = alice.submit_ex(spec("a1"), request_id="a1")
        assert first.created
        alice.submit(spec("a2"))
        alice.submit(spec("a3"))
        err = refused(alice, "a4", "a4")
        assert err.code == "RESOURCE_EXHAUSTED"
        assert err.message == ("tenant team-a has 3 jobs not yet ended (pending or running), and may have at most 3 "
                               "(the controller's --max-unended-jobs): the job was not stored; cancel some of them "
                               "or wait for some to end, then submit it again")
        assert sorted(j.spec.name for j in alice.list()) == ["a1", "a2", "a3"]  # nothing stored

        # a retry of a stored job is answered with it, at the cap as below it
        again = alice.submit_ex(spec("a1"), request_id="a1")
        assert not again.created and again.job.id == first.job.id

        # another tenant submits all the same; team-b's own cap (the tenants file) is 1
        assert bob.submit_ex(spec("b1")).created
        err = refused(bob, "b2")
        assert err.code == "RESOURCE_EXHAUSTED" and err.message.startswith(
            "tenant team-b has 1 job not yet ended (pending or running), and may have at most 1 "
            "(max_unended_jobs in the tenants file)")

        # the CLI prints the controller's message on one line and exits 1
        cp = tessctl(ctl.address, "submit", "-f", TINY, check=False, token=ctl.tokens["alice"])
        assert cp.returncode == 1 and cp.stdout == ""
        assert cp.stderr.strip() == ("tessctl: error: RESOURCE_EXHAUSTED: tenant team-a has 3 jobs not yet ended "
                                     "(pending or running), and may have at most 3 (the controller's "
                                     "--max-unended-jobs): the job was not stored; cancel some of them or wait for "
                                     "some to end, then submit it again")

        # one ends: a submit is taken again, and the next one refused again
        assert alice.cancel(first.job.id).state == P.JOB_STATE_CANCELLED
        assert alice.submit_ex(spec("a4"), request_id="a4").created
        assert refused(alice, "a5").code == "RESOURCE_EXHAUSTED"
        # the ended job's request id still finds it, with the tenant at its cap
        again = alice.submit_ex(spec("a1"), request_id="a1")
        assert not again.created and again.job.id == first.job.id and again.job.state == P.JOB_STATE_CANCELLED
        assert len(alice.list()) == 4 and len(alice.list(states=["pending"])) == 3


@pytest.fixture(scope="module")
def total_ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_controller(tmp_path_factory.mktemp("unended-total") / "state", "--max-unended-jobs-total", "3")
    yield d
    d.stop()


TOTAL = ("the controller holds 3 jobs not yet ended (pending or running) over all tenants, and may hold at most 3 "
         "(the controller's --max-unended-jobs-total): the job was not stored; cancel some jobs or wait for some "
         "to end, then submit it again")


def test_the_fourth_unended_job_overall_is_refused_whatever_the_tenant(total_ctl: Daemon) -> None:
    tokens = total_ctl.tokens
    with Client(total_ctl.address, token=tokens["alice"]) as alice, \
            Client(total_ctl.address, token=tokens["bob"]) as bob, \
            Client(total_ctl.address, token=tokens["admin"]) as admin:
        first = alice.submit_ex(spec("a1"), request_id="a1")
        assert first.created
        assert bob.submit_ex(spec("b1"), request_id="b1").created
        assert admin.submit_ex(spec("d1"), request_id="d1").created  # tenant default: three tenants, three jobs

        err = refused(alice, "a2", "a2")  # alice has 1 of her 10,000, but the controller 3 of 3
        assert err.code == "RESOURCE_EXHAUSTED" and err.message == TOTAL
        assert refused(bob, "b2").message == TOTAL
        rotated = spec("x1")
        rotated.tenant = "t-new"  # an admin naming a tenant never seen: the same total
        with pytest.raises(RpcError) as ei:
            admin.submit(rotated)
        assert ei.value.code == "RESOURCE_EXHAUSTED" and ei.value.message == TOTAL
        assert len(admin.list(tenant="")) == 3  # nothing stored

        # a retry of a stored job is answered with it, at the total cap as below it
        again = alice.submit_ex(spec("a1"), request_id="a1")
        assert not again.created and again.job.id == first.job.id

        # one ends: a submit is taken again (any tenant's), and the next one refused again
        assert alice.cancel(first.job.id).state == P.JOB_STATE_CANCELLED
        assert bob.submit_ex(spec("b2"), request_id="b2").created
        assert refused(alice, "a2").message == TOTAL
