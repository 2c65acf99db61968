"""Issue 13, limits, over real gRPC on loopback against a real tessera-controller process:
oversized submits refused (finding 5), ListJobs pages with thousands of jobs and large specs,
tampered continue tokens, RemoveNode, and forged registrations (finding 8)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from tessera.clients.sdk import Client, RpcError
from tessera.controller.store import JobRecord, SqliteStore
from tessera.v1 import agent_pb2 as A
from tessera.v1 import agent_pb2_grpc, controller_pb2_grpc
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2 as C
from tests.procs import Daemon, node_channel, start_controller, tessctl, tessctl_json, user_channel

MANY = 2100  # three pages of the server's largest (1,000), and the default 500 too


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_controller(tmp_path_factory.mktemp("limits") / "state")
    yield d
    d.stop()


@pytest.fixture(scope="module")
def client(ctl: Daemon) -> Iterator[Client]:
    with Client(ctl.address, timeout=60, token=ctl.token) as c:
        yield c


@pytest.fixture(scope="module")
def stub(ctl: Daemon) -> Iterator[controller_pb2_grpc.ControllerStub]:
    ch = user_channel(ctl)
    yield controller_pb2_grpc.ControllerStub(ch)
    ch.close()


def spec(name: str = "j", tenant: str = "default", env: dict[str, str] | None = None) -> P.JobSpec:
    return P.JobSpec(name=name, tenant=tenant, global_batch_size=16, iterations=10, env=env or {},
                     model=P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256, seq_length=64))


@pytest.fixture(scope="module")
def many(ctl: Daemon, client: Client) -> list[str]:
    """MANY small jobs in tenants many-a/many-b, and 80 of about 60 KiB in tenant big (4.8 MB in
    all: more than one page's bytes). Submitted over a few channels at once."""
    def submit(i: int) -> str:
        with Client(client.target, timeout=60, token=ctl.token) as c:
            if i < 80:
                return c.submit(spec(f"big-{i}", "big", {f"V{k}": "x" * 4000 for k in range(15)})).id
            return c.submit(spec(f"m-{i}", "many-a" if i % 3 else "many-b")).id

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(submit, range(MANY + 80)))


def test_ten_megabyte_submits_are_refused_and_listing_keeps_working(ctl: Daemon, client: Client) -> None:
    # finding 5: submits with about 10 MB or 3 MB of env each: over the users' port's 256 KiB
    # messages, gRPC's own RESOURCE_EXHAUSTED (controller/main.py CLIENT_MESSAGE_BYTES); under it,
    # the field
    for env in ({f"V{i}": "x" * 4000 for i in range(2600)}, {"BLOB": "x" * 10_000_000},
                {f"V{i}": "x" * 3000 for i in range(1100)}, {"BLOB": "x" * 3_000_000}):
        with pytest.raises(RpcError) as ei:
            client.submit(spec("huge-env", env=env))
        assert ei.value.code == "RESOURCE_EXHAUSTED"
    for env, field in (({f"V{i}": "x" * 100 for i in range(1100)}, "env"), ({"BLOB": "x" * 200_000}, "spec")):
        with pytest.raises(RpcError) as ei:
            client.submit(spec("huge-env", env=env))
        assert ei.value.code == "INVALID_ARGUMENT" and ei.value.message.startswith(f"{field}: ")
        assert len(ei.value.message) < 1000
    assert not [j for j in client.list() if j.spec.name == "huge-env"]
    cp = tessctl(ctl.address, "get", "jobs")
    assert cp.returncode == 0


def test_thousands_of_jobs_come_back_in_pages(stub: controller_pb2_grpc.ControllerStub, client: Client,
                                              many: list[str]) -> None:
    ids, pages, token = [], 0, ""
    while True:
        resp = stub.ListJobs(C.ListJobsRequest(tenant="many-a", limit=1000, continue_token=token), timeout=60)
        assert len(resp.jobs) <= 1000 and resp.ByteSize() < 16 * 2**20
        ids += [j.id for j in resp.jobs]
        pages += 1
        token = resp.continue_token
        if not token:
            break
    expected = [j for i, j in enumerate(many) if i >= 80 and i % 3]
    assert pages == 2 and sorted(ids) == sorted(expected) and len(ids) == len(set(ids))
    listed = client.list(tenant="many-a")
    assert [j.id for j in listed] == ids
    keys = [(j.submit_time, j.id) for j in listed]
    assert keys == sorted(keys)
    # default page (500), the SDK follows every page; states filter kept across pages
    first = stub.ListJobs(C.ListJobsRequest(tenant="many-a"), timeout=60)
    assert [j.id for j in first.jobs] == ids[:500] and first.continue_token
    everything = client.list()
    assert set(many) <= {j.id for j in everything}
    assert {j.id for j in client.list(states=["pending"], tenant="many-b")} == \
        {j for i, j in enumerate(many) if i >= 80 and not i % 3}
    assert [j.id for j in client.list(tenant="many-a", limit=7)] == ids[:7]


def test_a_page_stops_at_its_byte_budget(stub: controller_pb2_grpc.ControllerStub, many: list[str]) -> None:
    resp = stub.ListJobs(C.ListJobsRequest(tenant="big", limit=1000), timeout=60)
    assert 0 < len(resp.jobs) < 80 and resp.continue_token and resp.ByteSize() <= 4 * 2**20 + 2**16
    rest = stub.ListJobs(C.ListJobsRequest(tenant="big", limit=1000, continue_token=resp.continue_token), timeout=60)
    assert not rest.continue_token
    listed = list(resp.jobs) + list(rest.jobs)
    assert sorted(j.id for j in listed) == sorted(many[:80])
    assert [(j.submit_time, j.id) for j in listed] == sorted((j.submit_time, j.id) for j in listed)


def test_tessctl_follows_pages_and_stops_at_limit(ctl: Daemon, many: list[str]) -> None:
    out = tessctl_json(ctl.address, "get", "jobs", "--tenant", "many-b")
    assert len(out["jobs"]) == len([i for i in range(80, MANY + 80) if not i % 3]) and "continue_token" not in out
    assert len(tessctl_json(ctl.address, "get", "jobs", "--limit", "3")["jobs"]) == 3


def _tampered(token: str) -> str:
    raw = bytearray(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    raw[12] ^= 0x40  # inside the submit time
    return base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")


def test_bad_tokens_and_limits_are_invalid_arguments(stub: controller_pb2_grpc.ControllerStub,
                                                     many: list[str]) -> None:
    token = stub.ListJobs(C.ListJobsRequest(tenant="many-a", limit=10), timeout=30).continue_token
    assert token
    for req, field in (
        (C.ListJobsRequest(tenant="many-a", continue_token=_tampered(token)), "continue_token"),
        (C.ListJobsRequest(tenant="many-a", continue_token=token[:-2]), "continue_token"),
        (C.ListJobsRequest(tenant="many-a", continue_token="x" * 10_000), "continue_token"),
        (C.ListJobsRequest(tenant="many-a", continue_token="\u202e!!"), "continue_token"),
        (C.ListJobsRequest(tenant="many-b", continue_token=token), "continue_token"),  # another tenant's listing
        (C.ListJobsRequest(limit=-1), "limit"),
    ):
        with pytest.raises(grpc.RpcError) as ei:
            stub.ListJobs(req, timeout=30)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value.details()
        assert (ei.value.details() or "").startswith(f"{field}: ")
    resp = stub.ListJobs(C.ListJobsRequest(tenant="many-a", limit=10, continue_token=token), timeout=30)
    assert len(resp.jobs) == 10  # the genuine token still works


def _status(node_id: str, gpus: int = 2, model: str = "A100-80GB") -> A.NodeStatus:
    # draining: no agent serves at this address, so nothing may be placed there
    return A.NodeStatus(node_id=node_id, address="127.0.0.1:1", agent_version="test", draining=True,
                        inventory=P.NodeInventory(
        source=P.INVENTORY_SOURCE_DECLARED, hostname="h1",
        gpus=[P.Gpu(index=i, uuid=f"DECLARED-{node_id}-{i}", model=model, memory_bytes=80 * 10**9)
              for i in range(gpus)]))


def test_forged_registrations_are_refused(ctl: Daemon, client: Client) -> None:
    # Each node's own certificate: what is refused here is the content, not the identity
    # (tests/security covers that).
    for status, field in ((_status("forged-1", gpus=20_000), "status.inventory.gpus"),
                          (_status("forged-2", model="A100\u202e-80GB"), "status.inventory.gpus[0].model")):
        ch = node_channel(ctl, status.node_id)
        reg = agent_pb2_grpc.AgentRegistryStub(ch)
        try:
            for call in (lambda st, r=reg: r.Register(A.RegisterRequest(request_id="r", status=st), timeout=30),
                         lambda st, r=reg: r.Heartbeat(A.HeartbeatRequest(status=st, controller_epoch=1), timeout=30)):
                with pytest.raises(grpc.RpcError) as ei:
                    call(status)
                assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert (ei.value.details() or "").startswith(field + ":")
        finally:
            ch.close()
    assert not [n for n in client.nodes() if n.id.startswith("forged")]


def test_remove_node(ctl: Daemon, client: Client) -> None:
    ch = node_channel(ctl, "gone-1")
    reg = agent_pb2_grpc.AgentRegistryStub(ch)
    try:
        epoch = reg.Register(A.RegisterRequest(request_id="r1", status=_status("gone-1")), timeout=30).controller_epoch
        assert "gone-1" in [n.id for n in client.nodes()]
        assert client.remove_node("gone-1", request_id="rm-gone-1")
        assert "gone-1" not in [n.id for n in client.nodes()]
        assert client.remove_node("gone-1", request_id="rm-gone-1")  # the same request again
        with pytest.raises(RpcError) as ei:
            client.remove_node("gone-1")
        assert ei.value.code == "NOT_FOUND"
        with pytest.raises(RpcError) as ei:
            client.remove_node("Not A Node!")
        assert ei.value.code == "INVALID_ARGUMENT" and ei.value.message.startswith("node_id:")
        # the agent heartbeats again: told to register, and it comes back
        hb = reg.Heartbeat(A.HeartbeatRequest(status=_status("gone-1"), controller_epoch=epoch), timeout=30)
        assert hb.reregister
        reg.Register(A.RegisterRequest(request_id="r2", status=_status("gone-1")), timeout=30)
        assert "gone-1" in [n.id for n in client.nodes()]
        cp = tessctl(ctl.address, "delete", "node", "gone-1")
        assert cp.stdout.strip() == "node/gone-1 removed"
        cp = tessctl(ctl.address, "delete", "node", "gone-1", check=False)
        assert cp.returncode == 1 and "NOT_FOUND" in cp.stderr
    finally:
        ch.close()


def test_a_store_holding_ten_megabyte_specs_still_lists(tmp_path: Path) -> None:
    # finding 5 as it was left behind: two 10 MB specs stored before the bounds existed
    state = tmp_path / "state"
    state.mkdir()
    store = SqliteStore(state / "controller.db")
    for i in range(2):
        big = spec(f"legacy-{i}", env={f"V{k}": "x" * 4000 for k in range(2600)})
        store.create_job(JobRecord(f"j-legacy{i}", f"r-legacy-{i}", big, P.JOB_STATE_PENDING, "", float(i)),
                         ("SUBMITTED", ""))
    store.close()
    d = start_controller(state)
    try:
        out = tessctl_json(d.address, "get", "jobs")
        assert [j["spec"]["name"] for j in out["jobs"]] == ["legacy-0", "legacy-1"]
        assert all(j["spec_elided"] and not j["spec"]["env"] for j in out["jobs"])
        assert "legacy-0" in tessctl(d.address, "get", "jobs").stdout
        with Client(d.address, timeout=30, token=d.token) as c:
            assert len(c.get("j-legacy0").spec.env) == 2600  # GetJob has it whole
    finally:
        d.stop()
