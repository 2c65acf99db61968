"""The cap on a tenant's jobs not yet ended (controller/unended.py; docs/operations.md, "Limits") on
a real tessera-controller process over real gRPC on loopback: `--max-unended-jobs 3`, and team-b's
own `max_unended_jobs: 1` in the tenants file.

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
