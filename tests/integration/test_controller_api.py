"""The controller's client API over real gRPC on loopback: validation, idempotency, errors.

No agents here: jobs stay PENDING, which is what these tests need.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.clients.sdk import Client, TesseraError
from tessera.v1 import common_pb2 as P
from tests.procs import Daemon, start_controller


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_controller(tmp_path_factory.mktemp("api") / "state")
    yield d
    d.stop()


@pytest.fixture
def client(ctl: Daemon) -> Iterator[Client]:
    with Client(ctl.address, token=ctl.token) as c:
        yield c


def spec(**kw: object) -> P.JobSpec:
    s = P.JobSpec(name="ok", model=P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256,
                                               seq_length=64), global_batch_size=16, iterations=10)
    for k, v in kw.items():
        setattr(s, k, v)
    return s


def code_of(fn: object) -> TesseraError:
    with pytest.raises(TesseraError) as ei:
        fn()  # type: ignore[operator]
    return ei.value


def test_submit_get_list(client: Client) -> None:
    job = client.submit(spec(name="first"))
    assert job.id.startswith("j-") and job.state == P.JOB_STATE_PENDING
    got = client.get(job.id, with_events=True)
    assert got.spec.name == "first" and got.spec.tenant == "default"
    assert [e.kind for e in got.events][:1] == ["SUBMITTED"]
    assert job.id in [j.id for j in client.list()]


def test_same_request_id_is_idempotent(client: Client) -> None:
    a = client.submit_ex(spec(name="idem"), request_id="req-idem-1")
    b = client.submit_ex(spec(name="idem"), request_id="req-idem-1")
    assert a.created and not b.created and a.job.id == b.job.id
    assert sum(1 for j in client.list() if j.spec.name == "idem") == 1
    err = code_of(lambda: client.submit(spec(name="other"), request_id="req-idem-1"))
    assert err.code == "ALREADY_EXISTS" and "request_id" in err.message
    assert client.get(a.job.id).spec.name == "idem"


@pytest.mark.parametrize("bad, field", [
    ({"name": ""}, "name"),
    ({"name": "../etc/passwd"}, "name"),
    ({"name": "a;rm -rf"}, "name"),
    ({"global_batch_size": -4}, "global_batch_size"),
    ({"iterations": 0}, "iterations"),
    ({"tenant": "Bad Tenant"}, "tenant"),
])
def test_bad_specs_rejected_with_field(client: Client, bad: dict[str, object], field: str) -> None:
    before = len(client.list())
    err = code_of(lambda: client.submit(spec(**bad)))
    assert err.code == "INVALID_ARGUMENT" and err.message.startswith(field)
    assert len(client.list()) == before


def test_bad_model_entrypoint_env_and_hints(client: Client) -> None:
    s = spec()
    s.model.hidden_size = 10**9
    assert "model.hidden_size" in code_of(lambda: client.submit(s)).message
    s = spec()
    s.model.num_heads = 5
    assert "model.hidden_size: must be divisible by num_heads" in code_of(lambda: client.submit(s)).message
    s = spec()
    s.ClearField("model")
    s.model.name = "no-such-model"
    assert "model.name: unknown model" in code_of(lambda: client.submit(s)).message
    s = spec()
    s.entrypoint.extend(["python -c 'import os'; rm -rf /"])
    assert "entrypoint[0]" in code_of(lambda: client.submit(s)).message
    s = spec()
    s.env["RANK"] = "3"
    assert "env.RANK: reserved" in code_of(lambda: client.submit(s)).message
    s = spec()
    s.hint.gpu_types.append("TPU-v9")
    assert "hint.gpu_types[0]" in code_of(lambda: client.submit(s)).message
    s = spec()
    s.hint.gpus = -1
    assert code_of(lambda: client.submit(s)).code == "INVALID_ARGUMENT"


def test_unknown_ids(client: Client) -> None:
    assert code_of(lambda: client.get("j-doesnotexist")).code == "NOT_FOUND"
    assert code_of(lambda: client.cancel("j-doesnotexist")).code == "NOT_FOUND"
    assert code_of(lambda: client.get("../../x")).code == "INVALID_ARGUMENT"
    assert code_of(lambda: client.drain("no-such-node")).code == "NOT_FOUND"
    assert code_of(lambda: client.logs("j-doesnotexist")).code == "NOT_FOUND"


def test_error_statuses_and_messages(client: Client) -> None:
    """The exact status and details of each error kind, unary and streaming (the interceptor's
    mapping, the engine's errors through controller.service.translate)."""
    def status(fn: object) -> tuple[str, str]:
        err = code_of(fn)
        return err.code, err.message

    assert status(lambda: client.get("j-doesnotexist")) == ("NOT_FOUND", "job j-doesnotexist not found")
    assert status(lambda: client.drain("no-such-node")) == ("NOT_FOUND", "node no-such-node not found")
    assert status(lambda: client.get("../../x")) == ("INVALID_ARGUMENT", "job_id: malformed")
    assert status(lambda: client.list(states=[99])) == ("INVALID_ARGUMENT", "states: unknown state 99")
    # A server stream: the same mapping, before the first event and for a job that is not there.
    assert status(lambda: list(client.watch("../../x", timeout=10))) == ("INVALID_ARGUMENT", "job_id: malformed")
    assert status(lambda: list(client.watch("j-doesnotexist", timeout=10))) == (
        "NOT_FOUND", "job j-doesnotexist not found")
    job = client.submit(spec(name="unplaced"))
    assert status(lambda: client.logs(job.id)) == ("FAILED_PRECONDITION", f"job {job.id} has not been placed yet")
    assert status(lambda: client.logs(job.id, rank=-1)) == ("INVALID_ARGUMENT", "rank, attempt, tail_bytes: must be >= 0")
    client.submit(spec(name="first"), request_id="reused-id")
    assert status(lambda: client.submit(spec(name="second"), request_id="reused-id")) == (
        "ALREADY_EXISTS", "request_id: reused-id was already used for a different job spec")


def test_cancel_pending_is_final_and_idempotent(client: Client) -> None:
    job = client.submit(spec(name="cancelme"))
    c1 = client.cancel(job.id)
    c2 = client.cancel(job.id)
    assert c1.state == c2.state == P.JOB_STATE_CANCELLED
    kinds = [e.kind for e in client.get(job.id, with_events=True).events]
    assert kinds.count("CANCELLED") == 1
    assert [e.kind for e in client.watch(job.id, timeout=10)][-1] == "CANCELLED"


def test_pending_reason_without_nodes(client: Client) -> None:
    job = client.submit(spec(name="lonely"))
    events = []
    for e in client.watch(job.id, timeout=10):
        events.append(e)
        if e.kind == "PENDING":
            break
    assert events[-1].message == "waiting for nodes: no GPUs registered"


def test_state_survives_restart(tmp_path: Path) -> None:
    d = start_controller(tmp_path / "state")
    with Client(d.address, token=d.token) as c:
        job = c.submit(spec(name="durable"), request_id="dur-1")
    d.kill9()
    d2 = start_controller(tmp_path / "state")
    try:
        with Client(d2.address, token=d2.token) as c:
            assert c.get(job.id).spec.name == "durable"
            again = c.submit_ex(spec(name="durable"), request_id="dur-1")
            assert not again.created and again.job.id == job.id
        started = [e for e in d2.events() if e.get("event") == "controller_started"]
        assert started[-1]["epoch"] == started[0]["epoch"] + 1
    finally:
        d2.stop()


def test_register_answers_the_fence(tmp_path: Path) -> None:
    """The agent learns how long it may go without an acknowledged heartbeat before it stops its
    workers (tests/procs' controller: --lease 3 --heartbeat-interval 0.5 --fence 2.5). Its own
    controller: a registered node would take the other tests' pending jobs."""
    from tessera.common.localcluster import node_channel
    from tessera.v1 import agent_pb2, agent_pb2_grpc

    ctl = start_controller(tmp_path / "state")

    status = agent_pb2.NodeStatus(node_id="fence-node", address="127.0.0.1:9", inventory=P.NodeInventory(
        source=P.INVENTORY_SOURCE_DECLARED, gpus=[P.Gpu(index=0, uuid="GPU-fence-0", model="A10-24GB", memory_bytes=24 << 30)]))
    try:
        with node_channel(ctl, "fence-node") as ch:
            resp = agent_pb2_grpc.AgentRegistryStub(ch).Register(
                agent_pb2.RegisterRequest(request_id="r-fence", status=status), timeout=10)
    finally:
        ctl.stop()
    assert (resp.lease_seconds, resp.heartbeat_interval_seconds, resp.fence_seconds) == (3.0, 0.5, 2.5)
    assert resp.fence_grace_seconds == 2.0  # keepers kill a fenced worker within the controller's grace


def test_cost_objective_needs_prices_and_a_valid_slo(client: Client) -> None:
    before = len(client.list())
    s = spec(objective=P.OBJECTIVE_COST)
    s.slo.iterations_within_seconds = 3600
    err = code_of(lambda: client.submit(s))  # this controller has no --prices
    assert err.code == "FAILED_PRECONDITION" and "--prices" in err.message
    s.slo.iterations_within_seconds = -5
    err = code_of(lambda: client.submit(s))
    assert err.code == "INVALID_ARGUMENT" and err.message.startswith(
        "slo.iterations_within_seconds: must be a finite number of seconds from 0 (none) to 10 years")
    s = spec()
    s.slo.deadline = 1e9  # an SLO without the cost objective: nothing reads it
    assert code_of(lambda: client.submit(s)).message.startswith("slo: only the cost objective")
    assert len(client.list()) == before


def test_gpus_left_out_reach_the_node_and_survive_a_restart(tmp_path: Path) -> None:
    """A node's GPUs in MIG mode (NodeInventory.left_out) are shown with the node, from its Register
    and from the store after a restart, and offer nothing to schedule."""
    from tessera.common.localcluster import node_channel
    from tessera.v1 import agent_pb2, agent_pb2_grpc

    inv = P.NodeInventory(source=P.INVENTORY_SOURCE_DECLARED,
                          gpus=[P.Gpu(index=0, uuid="GPU-mig-0", model="A100-80GB", memory_bytes=80 << 30)],
                          left_out=[P.LeftOutGpu(index=1, uuid="GPU-mig-1", model="A100-80GB", reason="MIG mode is on")])
    status = agent_pb2.NodeStatus(node_id="mig-node", address="127.0.0.1:9", inventory=inv)
    ctl = start_controller(tmp_path / "state")
    try:
        with node_channel(ctl, "mig-node") as ch:
            agent_pb2_grpc.AgentRegistryStub(ch).Register(agent_pb2.RegisterRequest(request_id="r-mig", status=status),
                                                          timeout=10)
        with Client(ctl.address, token=ctl.token) as c:
            assert c.node("mig-node").inventory == inv
        ctl.kill9()
        ctl = start_controller(tmp_path / "state")
        with Client(ctl.address, token=ctl.token) as c:
            node = c.node("mig-node")
        assert list(node.inventory.left_out) == list(inv.left_out) and len(node.inventory.gpus) == 1
    finally:
        ctl.stop()
