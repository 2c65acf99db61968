"""grpc.health.v1 (Check and Watch), server reflection and tessera.v1.Info on every daemon, over real
gRPC on loopback with the TLS the harness sets up, as grpc_health_probe and grpcurl would use them
(the clients of grpcio-health-checking and grpcio-reflection)."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from tessera.common import identity, rpc
from tessera.common.buildinfo import build_info
from tessera.common.hooks import LIVE
from tessera.common.localcluster import ca_only, start_estimator, tls_config
from tessera.nodeagent.agent import Agent, AgentConfig
from tessera.nodeagent.inventory import host_facts, parse_declared
from tessera.nodeagent.testing import FakeRegistry, wait_until
from tessera.v1 import agent_pb2_grpc, controller_pb2, controller_pb2_grpc, info_pb2, info_pb2_grpc
from tests.procs import Daemon, node_channel, start_controller, tessctl

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
HOOKS = {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection", "tessera.v1.Info"}


def check(channel: grpc.Channel, service: str = "") -> int:
    req = health_pb2.HealthCheckRequest(service=service)
    return int(health_pb2_grpc.HealthStub(channel).Check(req, timeout=10).status)


def services(channel: grpc.Channel) -> set[str]:
    return set(ProtoReflectionDescriptorDatabase(channel).get_services())


def methods(channel: grpc.Channel, service: str) -> set[str]:
    """The methods of `service` read from the server's own descriptors (what grpcurl describes)."""
    pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
    return set(pool.FindServiceByName(service).methods_by_name)


def version(channel: grpc.Channel) -> info_pb2.VersionInfo:
    return info_pb2_grpc.InfoStub(channel).GetVersion(info_pb2.GetVersionRequest(), timeout=10)


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_controller(tmp_path_factory.mktemp("hooks") / "state")
    yield d
    d.stop()


def test_controller_health_reflection_and_version_answer_without_a_token(ctl: Daemon) -> None:
    with rpc.sync_channel(ctl.address, tls=ca_only()) as ch:  # TLS, no token: what a probe has
        assert check(ch) == SERVING
        assert check(ch, "tessera.v1.Controller") == SERVING and check(ch, "tessera.v1.AgentRegistry") == SERVING
        assert check(ch, LIVE) == SERVING
        with pytest.raises(grpc.RpcError) as unknown:
            check(ch, "no.such.Service")
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert next(watch).status == SERVING
        watch.cancel()
        assert services(ch) >= {"tessera.v1.Controller", "tessera.v1.AgentRegistry", *HOOKS}
        assert {"SubmitJob", "ListJobs", "WatchJobEvents"} <= methods(ch, "tessera.v1.Controller")
        v = version(ch)
        assert v.component == "tessera-controller" and v.version == build_info().version
        assert v.grpc_version == grpc.__version__ and v.start_time > 0
        # The hooks opened nothing else: the API itself still wants a token.
        with pytest.raises(grpc.RpcError) as denied:
            controller_pb2_grpc.ControllerStub(ch).ListJobs(controller_pb2.ListJobsRequest(), timeout=10)
        assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_controller_agent_port_serves_the_hooks_to_node_certificates(ctl: Daemon) -> None:
    with node_channel(ctl, "probe-node") as ch:
        assert check(ch) == SERVING
        assert "tessera.v1.AgentRegistry" in services(ch)
    # That port requires a client certificate: a caller without one never reaches the hooks.
    with rpc.sync_channel(ctl.agent_address, tls=ca_only(), peer=identity.CONTROLLER) as ch:
        with pytest.raises(grpc.RpcError) as refused:
            check(ch)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_tessctl_version_shows_client_and_server(ctl: Daemon) -> None:
    out = tessctl(ctl.address, "version").stdout.splitlines()
    assert out[0].startswith(f"Client: tessctl {build_info().version} (commit ")
    assert out[1].startswith(f"Server: tessera-controller {build_info().version} (commit ")
    assert out[1].endswith(f"at {ctl.address}")
    doc = tessctl(ctl.address, "version", "-o", "yaml").stdout
    assert "client:" in doc and "server:" in doc and "component: tessera-controller" in doc
    alone = tessctl("127.0.0.1:9", "version", "--client").stdout  # nothing listens there: no call made
    assert alone.startswith("Client: tessctl ") and "Server" not in alone


def test_estimator_hooks_and_not_serving_from_the_start_of_a_shutdown(tmp_path: Path) -> None:
    est = start_estimator(tmp_path / "estimator.log")
    try:
        with rpc.sync_channel(est.address, tls=tls_config(identity.CONTROLLER), peer=identity.ESTIMATOR) as ch:
            assert check(ch) == SERVING and check(ch, "tessera.v1.Estimator") == SERVING
            assert services(ch) >= {"tessera.v1.Estimator", *HOOKS}
            assert version(ch).component == "tessera-estimator"
            watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
            assert next(watch).status == SERVING
            seen: list[int] = []
            reader = threading.Thread(target=lambda: seen.extend(r.status for r in _until_end(watch)))
            reader.start()
            est.proc.send_signal(signal.SIGTERM)
            reader.join(30)
            assert seen[:1] == [NOT_SERVING]
    finally:
        est.stop()


def _until_end(stream: Iterator[health_pb2.HealthCheckResponse]) -> Iterator[health_pb2.HealthCheckResponse]:
    try:
        yield from stream
    except grpc.RpcError:
        return  # the server went away after saying NOT_SERVING


# -- the agent, in process, against a registry that refuses it first ------------------------------


@pytest.fixture
async def registry() -> AsyncIterator[tuple[FakeRegistry, str]]:
    fake = FakeRegistry(epoch=3, interval=0.2, lease=30.0)
    fake.fail_with = grpc.StatusCode.UNAVAILABLE
    server, port = rpc.aio_server("127.0.0.1:0", [(agent_pb2_grpc.add_AgentRegistryServicer_to_server, fake)],
                                  tls=tls_config(identity.CONTROLLER))
    await server.start()
    yield fake, f"127.0.0.1:{port}"
    await rpc.stop_server(server, grace=0)


async def test_agent_is_not_serving_until_a_controller_acknowledges_it(
        registry: tuple[FakeRegistry, str], tmp_path: Path) -> None:
    fake, address = registry
    inv = parse_declared({"gpus": [{"model": "A100-80GB", "count": 1}]}, "node-h", host_facts())
    agent = Agent(AgentConfig(controller=address, node_id="node-h", work_dir=tmp_path, max_backoff=0.2,
                              rpc_deadline=2.0, tls=tls_config(identity.node("node-h"))), inv)
    await agent.start()
    try:
        channel = rpc.aio_channel(agent.address, tls=tls_config(identity.CONTROLLER), peer=identity.node("node-h"))
        stub = health_pb2_grpc.HealthStub(channel)
        await wait_until(lambda: fake.refused > 0, 10, "a refused registration")
        assert (await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)).status == NOT_SERVING
        assert (await stub.Check(health_pb2.HealthCheckRequest(service=LIVE), timeout=10)).status == SERVING
        watch = stub.Watch(health_pb2.HealthCheckRequest(service="tessera.v1.NodeAgent"), timeout=30)
        assert (await watch.read()).status == NOT_SERVING
        fake.fail_with = None  # the controller answers from now on
        assert (await asyncio.wait_for(watch.read(), 20)).status == SERVING
        watch.cancel()
        db_services = await asyncio.to_thread(_sync_services, agent.address)
        assert db_services >= {"tessera.v1.NodeAgent", *HOOKS}
        v = await info_pb2_grpc.InfoStub(channel).GetVersion(info_pb2.GetVersionRequest(), timeout=10)
        assert v.component == "tessera-agent"
        # Its build reaches the controller in every status (get nodes -o wide, describe node).
        assert (fake.received[-1].agent_version, fake.received[-1].agent_commit) == (v.version, v.git_commit)
        await channel.close()
    finally:
        await agent.close(grace=0)


def _sync_services(address: str) -> set[str]:
    with rpc.sync_channel(address, tls=tls_config(identity.CONTROLLER), peer=identity.node("node-h")) as ch:
        return services(ch)


# -- a highly available pair: only the leader is ready --------------------------------------------


@pytest.mark.slow
def test_a_standby_controller_is_live_but_not_serving_until_it_leads(tmp_path: Path) -> None:
    from tests.etcd_server import cluster_tokens, etcd_server

    with etcd_server(tmp_path) as etcd:
        auth, _ = cluster_tokens(tmp_path)
        ha = ["--checkpoint-root", str(tmp_path / "shared-ckpt"),
              "--store", "etcd", "--etcd-endpoints", etcd.address, "--etcd-lease-ttl", "2", *auth]
        a = start_controller(tmp_path / "a", *ha)
        b: Daemon | None = None
        try:
            a.wait_event("controller_leading", 30)
            b = start_controller(tmp_path / "b", *ha)
            with rpc.sync_channel(a.address, tls=ca_only()) as ca_, rpc.sync_channel(b.address, tls=ca_only()) as cb:
                assert check(ca_) == SERVING and check(ca_, "tessera.v1.Controller") == SERVING
                assert check(cb) == NOT_SERVING and check(cb, "tessera.v1.AgentRegistry") == NOT_SERVING
                assert check(cb, LIVE) == SERVING  # a liveness probe must not restart a standby
                assert version(cb).component == "tessera-controller"  # Info answers on a standby too
                watch = health_pb2_grpc.HealthStub(cb).Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
                assert next(watch).status == NOT_SERVING
                a.stop()  # SIGTERM: a resigns, b leads at once
                assert next(watch).status == SERVING
                watch.cancel()
                b.wait_event("controller_leading", 30)
        finally:
            a.stop()
            if b is not None:
                b.stop()
