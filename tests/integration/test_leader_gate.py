"""A standby controller's answers (controller/leader_gate.py) and how the SDK and the agent follow
them, over real gRPC on loopback."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc
import pytest

from tessera.clients.sdk import Client, RpcError
from tessera.common import rpc
from tessera.common.identity import CONTROLLER
from tessera.common.localcluster import ca_only, tls_config
from tessera.controller.leader_gate import LeaderSwitch
from tessera.nodeagent.controllers import ControllerSet, split_addresses
from tessera.v1 import agent_pb2, controller_pb2, controller_pb2_grpc
from tests.fake_controller import FakeController, FakeServer, seeded
from tests.procs import tessctl

SERVICES = [controller_pb2.DESCRIPTOR.services_by_name["Controller"], agent_pb2.DESCRIPTOR.services_by_name["AgentRegistry"]]


class Standby:
    """A server with only the LeaderSwitch, naming `hint` as the leader; counts the lookups."""

    def __init__(self, hint: str, leading: Any = lambda: True) -> None:
        self.hint, self.asked = hint, 0
        self.switch = LeaderSwitch(SERVICES, self._leader, leading)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server, port = self.run(self._start())
        self.address = f"127.0.0.1:{port}"

    def _leader(self) -> str:
        self.asked += 1
        return self.hint

    async def _start(self) -> tuple[Any, int]:
        server, port = rpc.aio_server("127.0.0.1:0", [(lambda s, srv: srv.add_generic_rpc_handlers((s,)), self.switch)],
                                       tls=tls_config(CONTROLLER), client_cert=False)
        await server.start()
        return server, port

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    def stop(self) -> None:
        self.run(rpc.stop_server(self.server, grace=0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


@pytest.fixture
def leader() -> Any:
    srv = seeded()
    yield srv
    srv.stop()


def test_a_standby_answers_unavailable_with_the_leader_once(leader: FakeServer) -> None:
    sb = Standby(leader.address)
    try:
        with rpc.sync_channel(sb.address, tls=ca_only()) as ch:  # no retries here
            with pytest.raises(grpc.RpcError) as err:
                controller_pb2_grpc.ControllerStub(ch).ListJobs(controller_pb2.ListJobsRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert err.value.details() == f"not the leader; leader at {leader.address}"
            assert rpc.leader_hint(err.value) == leader.address
        with rpc.sync_channel(sb.address, tls=ca_only()) as ch:  # Tessera's channel retries UNAVAILABLE, but not this one
            before = sb.asked
            with pytest.raises(grpc.RpcError):
                controller_pb2_grpc.ControllerStub(ch).ListNodes(controller_pb2.ListNodesRequest(), timeout=5)
            assert sb.asked - before == 1
            with pytest.raises(grpc.RpcError) as err:
                for _ in controller_pb2_grpc.ControllerStub(ch).WatchJobEvents(
                        controller_pb2.WatchJobEventsRequest(job_id="j-run"), timeout=5):
                    pass
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE and rpc.leader_hint(err.value) == leader.address
            unknown = ch.unary_unary("/tessera.v1.Controller/NoSuchMethod")
            with pytest.raises(grpc.RpcError) as err:
                unknown(b"", timeout=5)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        sb.stop()


def test_the_sdk_follows_the_hint_and_keeps_its_request_id(leader: FakeServer) -> None:
    sb = Standby(leader.address)
    try:
        with Client(f"{sb.address},{leader.address}", timeout=5) as c:
            assert c.target == sb.address
            assert [n.id for n in c.nodes()] == ["node-a", "node-b"]
            assert c.target == leader.address
            spec = c.get("j-run").spec
        with Client([sb.address, leader.address], timeout=5) as c:
            first = c.submit_ex(spec, request_id="rid-1")
            assert first.created and c.get(first.job.id).id == first.job.id
            again = c.submit_ex(spec, request_id="rid-1")
            assert not again.created and again.job.id == first.job.id
    finally:
        sb.stop()


def test_a_hint_outside_the_configured_addresses_is_not_followed(leader: FakeServer) -> None:
    sb = Standby("10.66.6.6:50051")  # a hostile or confused peer names an address of its choosing
    other = Standby("10.66.6.6:50051")
    try:
        with Client([sb.address, other.address], timeout=2) as c:
            with pytest.raises(RpcError) as err:
                c.nodes()
            assert err.value.code == "UNAVAILABLE" and c.target in (sb.address, other.address)
        with Client([sb.address, leader.address], timeout=5) as c:
            assert len(c.nodes()) == 2 and c.target == leader.address  # the next address instead
    finally:
        sb.stop()
        other.stop()


def test_the_switch_serves_the_leaders_servicers_once_it_leads(leader: FakeServer) -> None:
    sb = Standby(leader.address)
    try:
        fake = FakeController()
        sb.switch.lead([(controller_pb2_grpc.add_ControllerServicer_to_server, fake)])
        with Client(sb.address, timeout=5) as c:
            assert c.nodes() == []  # the (empty) servicer now behind the switch answered
        sb.switch.standby()
        with Client(sb.address, timeout=5) as c, pytest.raises(RpcError) as err:
            c.nodes()
        assert err.value.code == "UNAVAILABLE"
    finally:
        sb.stop()


def test_a_leader_past_its_lease_answers_nothing_more(leader: FakeServer) -> None:
    """docs/fencing.md: once its lease may have lapsed, a leader acknowledges nothing, not even a call
    it had begun serving before the deadline passed (its answer is withheld), though its servicers
    are still registered (the lost-lease handling has not switched it to standby yet)."""
    lease = {"valid": True, "calls": 0}

    class Lapsing(FakeController):
        async def ListNodes(self, request: Any, context: Any) -> Any:
            lease["calls"] += 1
            if lease["calls"] == 1:
                lease["valid"] = False  # the deadline passes while the first call is being served
            return await super().ListNodes(request, context)

    sb = Standby(leader.address, leading=lambda: lease["valid"])
    try:
        sb.switch.lead([(controller_pb2_grpc.add_ControllerServicer_to_server, Lapsing())])
        with Client(sb.address, timeout=5) as c:
            with pytest.raises(RpcError) as err:
                c.nodes()
            assert err.value.code == "UNAVAILABLE" and err.value.message == f"not the leader; leader at {leader.address}"
            with pytest.raises(RpcError) as err:  # and nothing reaches the servicers any more
                list(c.watch("j-run"))
            assert err.value.code == "UNAVAILABLE"
            assert lease["calls"] == 1
            lease["valid"] = True
            assert c.nodes() == []
    finally:
        sb.stop()


class _Refused(grpc.RpcError):
    def __init__(self, hint: str = "") -> None:
        self.hint = hint

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((rpc.LEADER_HINT_KEY, self.hint),) if self.hint else ()


async def test_the_agent_moves_to_the_hint_only_when_it_is_one_of_its_addresses() -> None:
    cs = ControllerSet(split_addresses("a:1, b:2,c:3,a:1"))
    try:
        assert cs.addresses == ["a:1", "b:2", "c:3"] and cs.current == "a:1"
        cs.failed(_Refused("c:3"))
        assert cs.current == "c:3"
        cs.failed(_Refused("evil:6"))  # not ours: the next address instead
        assert cs.current == "a:1"
        cs.failed(_Refused())
        assert cs.current == "b:2"
    finally:
        await cs.close()
    one = ControllerSet(["a:1"])
    one.failed(_Refused("b:2"))
    assert one.current == "a:1"
    await one.close()


def test_tessctl_takes_a_list_of_controllers(leader: FakeServer) -> None:
    sb = Standby(leader.address)
    try:
        out = tessctl(f"{sb.address},{leader.address}", "get", "nodes").stdout
        assert "node-a" in out and "node-b" in out
        refused = tessctl(sb.address, "get", "nodes", check=False)  # the standby alone: its answer, one line
        assert refused.returncode != 0
        assert f"UNAVAILABLE: not the leader; leader at {leader.address}" in refused.stderr
    finally:
        sb.stop()
