"""Machine identities over real sockets, against real daemons (issue 13, findings 2 and 3).

- A node certificate cannot Register or Heartbeat as another node: re-registering node A with node
  B's certificate and another address, and heartbeats claiming A's ranks exited 0 at the last
  iteration, are refused, and the job keeps running on A (finding 3).
- Launch, Stop and Drain straight to an agent with a forged epoch, from anything but the controller's
  certificate (a node's, another CA's, none, plaintext, the workers' socket), are refused and the
  agent's persisted epoch floor does not move; the real controller still drains the node (finding 2).
- A worker's ReportProgress without its attempt's secret is refused.
- Plaintext is only with --insecure, which is logged loudly.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from tessera.common import identity, rpc, tls
from tessera.common.localcluster import ca_only, pki, start_controller, tls_config
from tessera.common.pki import CertificateAuthority
from tessera.common.tls import TlsConfig
from tessera.nodeagent.server import WorkerTokens
from tessera.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from tessera.v1 import common_pb2 as P
from tests.chaos.test_kill9 import long_job
from tests.e2e.cluster import Cluster
from tests.procs import tessctl, tessctl_json, wait_for

pytestmark = pytest.mark.slow

FORGED_EPOCH = 10**12


def refused(call: Callable[[], Any]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call()
    code: grpc.StatusCode = err.value.code()  # type: ignore[attr-defined]
    return code


def running_job(cl: Cluster) -> P.Job:
    with cl.client() as c:
        job = c.submit(long_job("victim", iterations=100_000))
        c.wait(job.id, {"RUNNING"}, timeout=120)
        wait_for(lambda: c.get(job.id).progress.iteration >= 3, 60, "progress")
        return c.get(job.id)


def test_a_node_certificate_cannot_speak_for_another_node(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([("node-a10", "a10-node.yaml")])
    job = running_job(cl)
    with cl.client() as c:
        real = next(n for n in c.nodes() if n.id == "node-a10")
    # Everything a hijacker needs but the key: A's id, A's inventory, the job's ranks at the end.
    forged = agent_pb2.NodeStatus(node_id="node-a10", address="127.0.0.1:1", inventory=real.inventory,
                                  agent_version="evil")
    for r in range(job.plan.dp * job.plan.tp * job.plan.pp):
        forged.workers.append(agent_pb2.WorkerStatus(
            job_id=job.id, attempt=job.attempt, rank=r, state=P.WORKER_STATE_EXITED, exit_code=0, pid=4242,
            progress=common_pb2.Progress(iteration=job.spec.iterations, checkpoint_iteration=-1)))
    register = agent_pb2.RegisterRequest(request_id="hijack", status=forged)
    epoch = json.loads(next(line for line in cl.controller.log_path.read_text().splitlines()
                            if '"controller_started"' in line))["epoch"]
    heartbeat = agent_pb2.HeartbeatRequest(status=forged, controller_epoch=epoch)

    def stub(target: str, **security: Any) -> agent_pb2_grpc.AgentRegistryStub:
        return agent_pb2_grpc.AgentRegistryStub(rpc.sync_channel(target, **security))

    node_b = stub(cl.controller.agent_address, tls=tls_config(identity.node("node-b")), peer=identity.CONTROLLER)
    assert refused(lambda: node_b.Register(register, timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
    assert refused(lambda: node_b.Heartbeat(heartbeat, timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
    # A certificate that names no node (the estimator's) may not speak for one either.
    est = stub(cl.controller.agent_address, tls=tls_config(identity.ESTIMATOR), peer=identity.CONTROLLER)
    assert refused(lambda: est.Heartbeat(heartbeat, timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
    # The users' port asks for no certificate: the registry finds no identity there.
    anon = stub(cl.controller.address, tls=ca_only())
    assert refused(lambda: anon.Register(register, timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
    assert refused(lambda: anon.Heartbeat(heartbeat, timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
    # Plaintext does not even reach a handler.
    plain = stub(cl.controller.agent_address, insecure=True)
    assert refused(lambda: plain.Register(register, timeout=5)) == grpc.StatusCode.UNAVAILABLE

    with cl.client() as c:
        before = c.get(job.id).progress.iteration
        wait_for(lambda: c.get(job.id).progress.iteration > before + 3, 60, "the job training on")
        now = c.get(job.id)
        assert (now.state, now.attempt) == (P.JOB_STATE_RUNNING, job.attempt), now.reason
        node = next(n for n in c.nodes() if n.id == "node-a10")
        assert node.address == real.address and node.state == P.NODE_STATE_READY
    assert not any(e.get("address") == "127.0.0.1:1" for e in cl.controller.events())


def _stubs(agent_address: str, root: Path) -> dict[str, agent_pb2_grpc.NodeAgentStub]:
    """Callers that are not the controller, each dialling the agent as the controller would."""
    real_ca = pki().ca_file.read_bytes()
    other = tls_config_of(CertificateAuthority.init(root / "other-ca").issue(identity.CONTROLLER))
    peer = identity.node("node-a10")
    channels = {
        "node certificate": rpc.sync_channel(agent_address, tls=tls_config(identity.node("node-b")), peer=peer),
        "estimator certificate": rpc.sync_channel(agent_address, tls=tls_config(identity.ESTIMATOR), peer=peer),
        "controller of another CA": rpc.sync_channel(
            agent_address, tls=TlsConfig(ca=real_ca, cert=other.cert, key=other.key), peer=peer),
        "no certificate": rpc.sync_channel(agent_address, tls=TlsConfig(ca=real_ca), peer=peer),
        "plaintext": rpc.sync_channel(agent_address, insecure=True),
        "workers' socket": rpc.sync_channel(f"unix:{root / 'node-a10' / 'agent.sock'}", insecure=True),
    }
    return {name: agent_pb2_grpc.NodeAgentStub(ch) for name, ch in channels.items()}


def tls_config_of(directory: Path) -> TlsConfig:
    return tls.load_dir(directory)


def test_only_the_controller_commands_an_agent(cluster_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([("node-a10", "a10-node.yaml")])
    state_file = cl.root / "node-a10" / "agent-state.json"

    def floor_now() -> int:
        return int(json.loads(state_file.read_text())["controller_epoch"]) if state_file.exists() else 0

    # The controller lists the node READY once it has handled the Register; the agent records the
    # epoch of the answer just after: wait for that write, not for a time.
    wait_for(lambda: floor_now() > 0, 30, "the agent's recorded controller epoch")
    floor = floor_now()
    assert 0 < floor < FORGED_EPOCH
    with cl.client() as c:
        address = next(n for n in c.nodes() if n.id == "node-a10").address
    launch = agent_pb2.LaunchRequest(
        request_id="evil", controller_epoch=FORGED_EPOCH, job_id="evil", attempt=1, world_size=1,
        ranks=[agent_pb2.RankAssignment(rank=0, local_rank=0, gpu_indices=[0])], rendezvous="127.0.0.1:29999",
        argv=["sh", "-c", "id > pwned"], iterations=1, global_batch_size=1,
        plan=common_pb2.Plan(dp=1, tp=1, pp=1, micro_batch=1, grad_accum=1, gpu_model="A10-24GB"))
    stop = agent_pb2.StopRequest(request_id="evil", controller_epoch=FORGED_EPOCH, job_id="evil", attempt=1)
    drain = agent_pb2.DrainRequest(request_id="evil", controller_epoch=FORGED_EPOCH, drain=True)
    read = agent_pb2.ReadLogRequest(controller_epoch=FORGED_EPOCH, job_id="evil", attempt=1, rank=0)
    handshake_fails = {"controller of another CA", "no certificate", "plaintext"}
    for name, stub in _stubs(address, cl.root).items():
        want = {grpc.StatusCode.UNAVAILABLE} if name in handshake_fails else {grpc.StatusCode.PERMISSION_DENIED}
        for method, request in (("Launch", launch), ("Stop", stop), ("Drain", drain), ("ReadLog", read)):
            assert refused(lambda: getattr(stub, method)(request, timeout=5)) in want, (name, method)  # noqa: B023
    assert json.loads(state_file.read_text())["controller_epoch"] == floor
    assert not list(cl.root.rglob("pwned"))
    # Refused before its request is read (rpc.Authorize): a corrupt body is PERMISSION_DENIED, not the
    # parser's INVALID_ARGUMENT (before, 48 refused 15 MiB Launches held 720 MB of the agent; a live audit).
    node_b = rpc.sync_channel(address, tls=tls_config(identity.node("node-b")), peer=identity.node("node-a10"))
    raw = node_b.unary_unary("/tessera.v1.NodeAgent/Launch", request_serializer=None, response_deserializer=None)
    assert refused(lambda: raw(b"\xff\xff\xff", timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
    node_b.close()
    # The real controller is not locked out: a drain reaches the agent.
    tessctl_json(cl.controller.address, "drain", "node-a10", "--reason", "after the attack")
    cl.agents["node-a10"].wait_event("drain changed", 30, draining=True)
    assert json.loads(state_file.read_text())["controller_epoch"] == floor


def test_progress_needs_the_attempts_secret(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([("node-a10", "a10-node.yaml")])
    job = running_job(cl)
    work = cl.root / "node-a10"
    tokens = WorkerTokens.load_or_create(work)
    worker = agent_pb2_grpc.NodeAgentStub(rpc.sync_channel(f"unix:{work / 'agent.sock'}", insecure=True))
    ask = agent_pb2.ReportProgressRequest(job_id=job.id, attempt=job.attempt, rank=0)

    def report(token: str | None) -> agent_pb2.ReportProgressResponse:
        meta = (("tessera-worker-token", token),) if token is not None else ()
        resp: agent_pb2.ReportProgressResponse = worker.ReportProgress(ask, timeout=5, metadata=meta)
        return resp

    assert refused(lambda: report(None)) == grpc.StatusCode.UNAUTHENTICATED
    assert refused(lambda: report("0" * 64)) == grpc.StatusCode.PERMISSION_DENIED
    assert refused(lambda: report(tokens.token(job.id, job.attempt + 1))) == grpc.StatusCode.PERMISSION_DENIED
    assert refused(lambda: report(tokens.token("other-job", job.attempt))) == grpc.StatusCode.PERMISSION_DENIED
    assert not report(tokens.token(job.id, job.attempt)).stop_requested
    # Over TCP nobody reports progress, not even the controller.
    with cl.client() as c:
        address = next(n for n in c.nodes() if n.id == "node-a10").address
    tcp = agent_pb2_grpc.NodeAgentStub(rpc.sync_channel(address, tls=tls_config(identity.CONTROLLER),
                                                        peer=identity.node("node-a10")))
    assert refused(lambda: tcp.ReportProgress(ask, timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
    # The worker itself holds its attempt's secret and its reports go through.
    with cl.client() as c:
        before = c.get(job.id).progress.iteration
        wait_for(lambda: c.get(job.id).progress.iteration > before, 60, "progress still reported")


def test_insecure_is_explicit_and_loud(tmp_path: Path) -> None:
    ctl = start_controller(tmp_path / "state", "--metrics-listen", "127.0.0.1:0", insecure=True)
    try:
        warning = ctl.wait_event("insecure_transport", 10)
        assert warning["level"] == "warning" and "--insecure" in warning["message"]
        started = ctl.wait_event("controller_started", 10)
        assert started["transport"] == "insecure"
        with urllib.request.urlopen(f"http://127.0.0.1:{started['metrics_port']}/metrics", timeout=10) as resp:
            assert "tessera_transport_insecure 1.0" in resp.read().decode()
        assert tessctl(ctl.address, "get", "nodes", "--insecure").returncode == 0
        # Without --insecure tessctl speaks TLS, which a plaintext controller cannot answer.
        cp = tessctl(ctl.address, "get", "nodes", "--timeout", "3", check=False)
        assert cp.returncode == 1 and cp.stderr.count("\n") == 1, cp.stderr
        assert cp.stderr.startswith(f"tessctl: error: cannot reach controller at {ctl.address} (TLS handshake failed")
    finally:
        ctl.stop()
