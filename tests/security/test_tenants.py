"""Tenants and roles on a real controller process over real gRPC (docs/auth.md).

The controller is started by localcluster with its tokens file: `admin` (tenant default, role
admin), `alice` (team-a, user) and `bob` (team-b, user). Jobs ask for H100s that the one agent
(A10s) does not have, so they stay PENDING and no worker runs.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tessera.clients.sdk import Client, RpcError
from tessera.common.localcluster import ca_only
from tessera.common.rpc import sync_channel
from tessera.common.tokens import TOKEN_PREFIX, hash_token, new_token
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2, controller_pb2_grpc
from tests.procs import BIN, REPO, Daemon, env, kill_strays, start_agent, start_controller, wait_for


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("tenants")
    d = start_controller(root / "state")
    agent = start_agent(d, "node-a10", REPO / "examples/inventories/a10-node.yaml", root / "node-a10")
    try:
        with Client(d.address, token=d.token) as c:
            wait_for(lambda: any(n.state == P.NODE_STATE_READY for n in c.nodes()), 30, "node-a10 READY")
        yield d
    finally:
        agent.stop()
        d.stop()
        kill_strays(root)


def as_(ctl: Daemon, name: str) -> Client:
    return Client(ctl.address, token=ctl.tokens[name])


def spec(name: str, tenant: str = "") -> P.JobSpec:
    return P.JobSpec(name=name, tenant=tenant, global_batch_size=16, iterations=10,
                     model=P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256, seq_length=64),
                     hint=P.ResourceHint(gpu_types=["H100"]))  # no H100 here: stays PENDING


def refused(fn: object) -> RpcError:
    with pytest.raises(RpcError) as ei:
        fn()  # type: ignore[operator]
    return ei.value


def test_whoami_names_each_token_holder(ctl: Daemon) -> None:
    for name, tenant, role in (("admin", "default", "admin"), ("alice", "team-a", "user"), ("bob", "team-b", "user")):
        with as_(ctl, name) as c:
            me = c.whoami()
            assert (me.principal, me.tenant, me.role) == (name, tenant, role)


def test_missing_and_wrong_tokens_are_unauthenticated(ctl: Daemon) -> None:
    for token in (None, new_token(), "tsr_short", ctl.tokens["alice"] + "x"):
        with Client(ctl.address, token=token) as c:
            for call in (c.whoami, c.list, c.nodes, lambda: c.get("j-000000000000"),
                         lambda: c.submit(spec("nope")), lambda: c.cancel("j-000000000000"),
                         lambda: list(c.watch("j-000000000000", timeout=10)), lambda: c.logs("j-000000000000"),
                         lambda: c.drain("node-a10"), lambda: c.undrain("node-a10")):
                err = refused(call)
                assert err.code == "UNAUTHENTICATED", (token, err)
                assert ctl.tokens["alice"] not in err.message
    # Not a bearer token, or two of them: refused the same way, with no detail about the tokens.
    with sync_channel(ctl.address, tls=ca_only()) as ch:
        stub = controller_pb2_grpc.ControllerStub(ch)
        for md in ((("authorization", f"Basic {ctl.tokens['admin']}"),),
                   (("authorization", "Bearer"),),
                   (("authorization", f"Bearer {ctl.tokens['admin']}"), ("authorization", "Bearer x"))):
            with pytest.raises(grpc.RpcError) as ei:
                stub.WhoAmI(controller_pb2.WhoAmIRequest(), metadata=md, timeout=10)
            assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # The admin's token on the right header is accepted by the same raw stub.
        me = stub.WhoAmI(controller_pb2.WhoAmIRequest(), metadata=(("authorization", f"Bearer {ctl.tokens['admin']}"),),
                         timeout=10)
        assert me.role == "admin"


def test_a_tenant_cannot_touch_another_tenants_job(ctl: Daemon) -> None:
    with as_(ctl, "alice") as alice, as_(ctl, "bob") as bob, as_(ctl, "admin") as admin:
        job = alice.submit(spec("secret-a"))
        assert job.spec.tenant == "team-a"
        missing = refused(lambda: bob.get("j-doesnotexist")).message
        for call in (lambda: bob.get(job.id), lambda: bob.get(job.id, with_events=True),
                     lambda: bob.cancel(job.id), lambda: list(bob.watch(job.id, timeout=10)),
                     lambda: bob.logs(job.id)):
            err = refused(call)
            # Word for word the answer for a job that does not exist: bob learns nothing.
            assert err.code == "NOT_FOUND" and err.message == missing.replace("j-doesnotexist", job.id), err
        assert alice.get(job.id).state == P.JOB_STATE_PENDING  # bob's cancel did nothing
        # The owner and an admin are let through to the state's own answer.
        assert refused(lambda: alice.logs(job.id)).code == "FAILED_PRECONDITION"  # not placed yet
        assert admin.get(job.id).spec.name == "secret-a"
        events = []  # a PENDING job's stream does not end: the owner reads it until a deadline
        with pytest.raises(RpcError) as ei:
            for e in alice.watch(job.id, timeout=2):
                events.append(e.kind)
        assert ei.value.code == "DEADLINE_EXCEEDED" and events[0] == "SUBMITTED"
        assert alice.cancel(job.id).state == P.JOB_STATE_CANCELLED


def test_list_jobs_is_scoped_to_the_callers_tenant(ctl: Daemon) -> None:
    with as_(ctl, "alice") as alice, as_(ctl, "bob") as bob, as_(ctl, "admin") as admin:
        a = alice.submit(spec("list-a"))
        b = bob.submit(spec("list-b"))
        assert {j.spec.tenant for j in alice.list()} == {"team-a"} and a.id in {j.id for j in alice.list()}
        assert {j.spec.tenant for j in bob.list()} == {"team-b"} and b.id in {j.id for j in bob.list()}
        assert {a.id, b.id} <= {j.id for j in admin.list()}
        assert {j.spec.tenant for j in admin.list(tenant="team-b")} == {"team-b"}
        assert alice.list(tenant="team-a")  # naming its own tenant is fine
        err = refused(lambda: alice.list(tenant="team-b"))
        assert err.code == "PERMISSION_DENIED" and "tenant" in err.message


def test_submit_is_for_the_callers_tenant(ctl: Daemon) -> None:
    with as_(ctl, "alice") as alice, as_(ctl, "admin") as admin:
        err = refused(lambda: alice.submit(spec("elsewhere", tenant="team-b")))
        assert err.code == "PERMISSION_DENIED" and "spec.tenant" in err.message
        assert alice.submit(spec("mine", tenant="team-a")).spec.tenant == "team-a"
        assert admin.submit(spec("for-b", tenant="team-b")).spec.tenant == "team-b"
        assert admin.submit(spec("own")).spec.tenant == "default"


def test_request_ids_are_scoped_per_tenant(ctl: Daemon) -> None:
    with as_(ctl, "alice") as alice, as_(ctl, "bob") as bob:
        first = alice.submit_ex(spec("idem-a"), request_id="shared-rid-1")
        assert first.created
        # bob reusing alice's request id (same spec, or another) gets his own new job, never hers.
        same = bob.submit_ex(spec("idem-a"), request_id="shared-rid-1")
        assert same.created and same.job.id != first.job.id and same.job.spec.tenant == "team-b"
        other = bob.submit_ex(spec("idem-b"), request_id="shared-rid-2")
        clash = alice.submit_ex(spec("idem-c"), request_id="shared-rid-2")
        assert other.created and clash.created and clash.job.id != other.job.id
        # Within one tenant a retry still returns the first job, and another spec still conflicts.
        again = alice.submit_ex(spec("idem-a"), request_id="shared-rid-1")
        assert not again.created and again.job.id == first.job.id
        err = refused(lambda: alice.submit(spec("idem-z"), request_id="shared-rid-1"))
        assert err.code == "ALREADY_EXISTS" and "request_id: shared-rid-1 " in err.message


def test_node_operations_need_admin(ctl: Daemon) -> None:
    with as_(ctl, "alice") as alice, as_(ctl, "admin") as admin:
        assert [n.id for n in alice.nodes()] == ["node-a10"]  # nodes are readable by every user
        for call in (lambda: alice.drain("node-a10"), lambda: alice.undrain("node-a10")):
            err = refused(call)
            assert err.code == "PERMISSION_DENIED" and "admin" in err.message
        assert alice.node("node-a10").state == P.NODE_STATE_READY
        with sync_channel(ctl.address, tls=ca_only()) as ch:
            stub = controller_pb2_grpc.ControllerStub(ch)
            with pytest.raises(grpc.RpcError) as ei:
                stub.RemoveNode(controller_pb2.RemoveNodeRequest(request_id="rm-1", node_id="node-a10"),
                                metadata=(("authorization", f"Bearer {ctl.tokens['alice']}"),), timeout=10)
            assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert admin.drain("node-a10", reason="test").state in (P.NODE_STATE_DRAINING, P.NODE_STATE_DRAINED)
        assert admin.undrain("node-a10").state == P.NODE_STATE_READY
    audit = [e for e in ctl.events() if e.get("event") == "rpc_call" and e.get("method") == "DrainNode"]
    assert audit and audit[-1]["principal"] == "admin"


def test_tokens_file_holds_hashes_only(ctl: Daemon) -> None:
    path = Path(ctl.argv[ctl.argv.index("--tokens") + 1])
    text = path.read_text()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    for token in ctl.tokens.values():
        assert token.startswith(TOKEN_PREFIX) and token not in text and token[len(TOKEN_PREFIX):] not in text
        assert hash_token(token) in text
    assert json.loads(path.with_name(path.name.replace("-tokens.yaml", "-credentials.json")).read_text())


def test_tessctl_calls_as_its_config_context(ctl: Daemon, tmp_path: Path) -> None:
    (tmp_path / "alice.token").write_text(ctl.tokens["alice"] + "\n")
    (tmp_path / "alice.token").chmod(0o600)  # readable by others: tessctl warns on stderr (docs/cli.md)
    config = tmp_path / "config.yaml"
    config.write_text(f"current-context: a\ncontexts:\n  a: {{controller: {ctl.address}, token_file: alice.token}}\n"
                      f"  b: {{controller: {ctl.address}, token: {ctl.tokens['bob']}}}\n")
    config.chmod(0o600)
    e = {**env(), "TESSERA_CONFIG": str(config)}
    for var in ("TESSERA_TOKEN", "TESSERA_CONTROLLER"):
        e.pop(var, None)

    def tessctl(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "tessctl"), *args], capture_output=True, text=True, env={**e, **extra},
                              cwd=REPO, timeout=60, check=False)

    assert json.loads(tessctl("whoami", "-o", "json").stdout)["principal"] == "alice"
    assert json.loads(tessctl("--context", "b", "whoami", "-o", "json").stdout)["tenant"] == "team-b"
    me = tessctl("whoami", "-o", "json", TESSERA_TOKEN=ctl.tokens["admin"])  # env beats the context
    assert json.loads(me.stdout)["role"] == "admin"
    me = tessctl("whoami", "-o", "json", "--token", ctl.tokens["bob"], TESSERA_TOKEN=ctl.tokens["admin"])
    assert json.loads(me.stdout)["principal"] == "bob"  # the flag beats the environment
    jobs = json.loads(tessctl("get", "jobs", "-o", "json").stdout)["jobs"]
    assert jobs and {j["spec"]["tenant"] for j in jobs} == {"team-a"}
    denied = tessctl("drain", "node-a10")
    assert denied.returncode == 1 and denied.stderr.startswith("tessctl: error: PERMISSION_DENIED: DrainNode needs "
                                                               "role admin")
    assert len(denied.stderr.splitlines()) == 1
    anon = tessctl("get", "jobs", TESSERA_CONFIG=str(tmp_path / "none.yaml"), TESSERA_CONTROLLER=ctl.address)
    assert anon.returncode == 1 and "cannot read" in anon.stderr  # an explicit config file must exist
    anon = tessctl("--controller", ctl.address, "get", "jobs", TESSERA_CONFIG="", HOME=str(tmp_path))
    assert anon.returncode == 1 and "UNAUTHENTICATED" in anon.stderr
