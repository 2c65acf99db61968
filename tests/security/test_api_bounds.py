"""What a caller can make the controller's gRPC server hold (controller/auth.py, controller/main.py).

An audit sent 64 calls at once of SubmitJob without a token, each with a 15 MiB request_id: every
one was UNAUTHENTICATED, but only after gRPC had received and parsed it, and the controller went
from 88 MB to 2.5 GB. Here the server is the controller's own (`controller_server`: its ports, its
limits, its interceptors) on loopback over TLS, with servicers that count their calls and
deserializers that count what they parse: a call refused on its metadata is answered without its
request ever being parsed, and what is read is bounded in size.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tessera.common import identity, rpc
from tessera.common.hooks import Hooks
from tessera.common.localcluster import ca_only, local_tokens, tls_config
from tessera.common.opencalls import OpenCallBounds
from tessera.controller import main
from tessera.controller.auth import NO_CERTIFICATE, TokenAuthenticator, bearer_token, principal_of
from tessera.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    common_pb2,
    controller_pb2,
    controller_pb2_grpc,
    info_pb2,
    info_pb2_grpc,
)

MIB = 1024 * 1024
BIG = 3 * MIB  # under the controller's limit: only the early refusal keeps it from being parsed
HUGE = 15 * MIB  # the audit's size: over the limit
USER_BIG = 240 * 1024  # under the users' port's limit (main.CLIENT_MESSAGE_BYTES)


class Controller(controller_pb2_grpc.ControllerServicer):
    def __init__(self, ran: Counter[str]) -> None:
        self.ran = ran
        self.release = asyncio.Event()

    async def SubmitJob(self, request: Any, context: Any) -> Any:
        self.ran["SubmitJob"] += 1
        return controller_pb2.SubmitJobResponse(job=controller_pb2.Job(id="j-000000000001"))

    async def WhoAmI(self, request: Any, context: Any) -> Any:
        self.ran["WhoAmI"] += 1
        who = principal_of(context)
        return controller_pb2.WhoAmIResponse(principal=who.name, tenant=who.tenant, role=who.role)

    async def DrainNode(self, request: Any, context: Any) -> Any:
        self.ran["DrainNode"] += 1
        return controller_pb2.Node(id=request.node_id)

    async def WatchJobEvents(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self.ran["WatchJobEvents"] += 1
        yield common_pb2.JobEvent(kind="SUBMITTED")
        await self.release.wait()


class Registry(agent_pb2_grpc.AgentRegistryServicer):
    def __init__(self, ran: Counter[str]) -> None:
        self.ran = ran

    async def Heartbeat(self, request: Any, context: Any) -> Any:
        self.ran["Heartbeat"] += 1
        return agent_pb2.HeartbeatResponse(controller_epoch=1)


def counting(add: Callable[[Any, Any], None], parsed: Counter[str]) -> Callable[[Any, Any], None]:
    """`add` (a generated add_XServicer_to_server) registering handlers whose deserializers count
    the requests they parse, by method."""

    def wrap(name: str, h: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        parse = h.request_deserializer

        def counted(data: bytes) -> Any:
            parsed[name] += 1
            return parse(data)

        kind = ("stream_" if h.request_streaming else "unary_") + ("stream" if h.response_streaming else "unary")
        make = getattr(grpc, f"{kind}_rpc_method_handler")
        return make(getattr(h, kind), request_deserializer=counted, response_serializer=h.response_serializer)

    def register(servicer: Any, server: Any) -> None:
        class Capture:
            def add_generic_rpc_handlers(self, handlers: Any) -> None:
                pass  # the same handlers come again below, by name

            def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
                wrapped = {name: wrap(name, h) for name, h in handlers.items()}
                server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, wrapped),))
                server.add_registered_method_handlers(service, wrapped)

        add(servicer, Capture())

    return register


class Harness:
    def __init__(self, tmp_path: Path) -> None:
        self.parsed: Counter[str] = Counter()
        self.ran: Counter[str] = Counter()
        tokens_file, self.tokens = local_tokens(tmp_path / "state")
        self.controller = Controller(self.ran)
        args = argparse.Namespace(listen="127.0.0.1:0", agent_listen="127.0.0.1:0",
                                  tls=tls_config(identity.CONTROLLER))
        self.server, self.port, self.agent_port = main.controller_server(args, TokenAuthenticator(tokens_file), [
            (counting(controller_pb2_grpc.add_ControllerServicer_to_server, self.parsed), self.controller),
            (counting(agent_pb2_grpc.add_AgentRegistryServicer_to_server, self.parsed), Registry(self.ran)),
        ], Hooks("tessera-controller"))

    def user_channel(self) -> grpc.aio.Channel:
        return rpc.aio_channel(f"127.0.0.1:{self.port}", tls=ca_only())

    def node_channel(self) -> grpc.aio.Channel:
        return rpc.aio_channel(f"127.0.0.1:{self.agent_port}", tls=tls_config(identity.node("node-a")),
                               peer=identity.CONTROLLER)

    def bearer(self, name: str) -> tuple[tuple[str, str]]:
        return (("authorization", f"Bearer {self.tokens[name]}"),)


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    harness = Harness(tmp_path)
    await harness.server.start()
    try:
        yield harness
    finally:
        harness.controller.release.set()
        await harness.server.stop(None)


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await call
    return ei.value


def no_credentials_message() -> str:
    with pytest.raises(Exception) as ei:
        bearer_token(())
    return str(ei.value.message)  # type: ignore[attr-defined]


async def test_calls_refused_on_their_metadata_never_have_their_request_parsed(h: Harness) -> None:
    async with h.user_channel() as ch:
        stub = controller_pb2_grpc.ControllerStub(ch)
        for size in (USER_BIG, BIG, HUGE):
            big = controller_pb2.SubmitJobRequest(request_id="x" * size)
            err = await refused(stub.SubmitJob(big, timeout=60))
            assert (err.code(), err.details()) == (grpc.StatusCode.UNAUTHENTICATED, no_credentials_message())
            for md, why in (((("authorization", "Basic abc"),), "malformed authorization: expected 'Bearer <token>'"),
                            ((("authorization", "Bearer tsr_unknown"),), "unknown token"),
                            (h.bearer("alice") + h.bearer("bob"), "more than one authorization entry")):
                err = await refused(stub.SubmitJob(big, metadata=md, timeout=60))
                assert (err.code(), err.details()) == (grpc.StatusCode.UNAUTHENTICATED, why)
        # A stream's request too; and a role that may not call the method, on the metadata alone.
        watch = stub.WatchJobEvents(controller_pb2.WatchJobEventsRequest(job_id="j" * BIG), timeout=60)
        err = await refused(watch.read())
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        drain = controller_pb2.DrainNodeRequest(node_id="n" * USER_BIG)
        err = await refused(stub.DrainNode(drain, metadata=h.bearer("alice"), timeout=60))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "needs role admin" in err.details()
        assert h.parsed == Counter() and h.ran == Counter(), "no refused request was parsed or served"

        # The same requests with a token that may make them are parsed and served as ever.
        ok = await stub.SubmitJob(controller_pb2.SubmitJobRequest(request_id="x" * USER_BIG),
                                  metadata=h.bearer("alice"), timeout=60)
        assert ok.job.id == "j-000000000001"
        assert (await stub.DrainNode(drain, metadata=h.bearer("admin"), timeout=60)).id == drain.node_id
        me = await stub.WhoAmI(controller_pb2.WhoAmIRequest(), metadata=h.bearer("bob"), timeout=60)
        assert (me.principal, me.tenant, me.role) == ("bob", "team-b", "user")
        assert h.parsed == Counter(SubmitJob=1, DrainNode=1, WhoAmI=1) == h.ran


async def test_an_authenticated_request_over_the_limit_is_resource_exhausted(h: Harness) -> None:
    async with h.user_channel() as ch:
        stub = controller_pb2_grpc.ControllerStub(ch)
        # The users' port takes at most CLIENT_MESSAGE_BYTES, not the agents' 8 MiB: 150 calls at
        # once of 7 MiB each, under a user's token, took the controller to 3.1 GB.
        for size in (main.CLIENT_MESSAGE_BYTES, 7 << 20):
            over = controller_pb2.SubmitJobRequest(request_id="x" * size)
            err = await refused(stub.SubmitJob(over, metadata=h.bearer("admin"), timeout=60))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert h.parsed == Counter() and h.ran == Counter()
        # The biggest spec SubmitJob takes (64 KiB, common/jobspec.py) is far under it.
        under = controller_pb2.SubmitJobRequest(request_id="x" * (main.CLIENT_MESSAGE_BYTES - 1024))
        assert (await stub.SubmitJob(under, metadata=h.bearer("admin"), timeout=60)).job.id
        assert h.ran == Counter(SubmitJob=1)


async def test_agent_registry_reads_a_request_only_from_a_certificate(h: Harness) -> None:
    beat = agent_pb2.HeartbeatRequest(status=agent_pb2.NodeStatus(node_id="node-a", address="x" * BIG))
    async with h.user_channel() as ch:  # the users' port asks for no certificate
        for size in (BIG, HUGE):
            req = agent_pb2.HeartbeatRequest(status=agent_pb2.NodeStatus(node_id="node-a", address="x" * size))
            err = await refused(agent_pb2_grpc.AgentRegistryStub(ch).Heartbeat(req, timeout=60))
            assert (err.code(), err.details()) == (grpc.StatusCode.UNAUTHENTICATED, NO_CERTIFICATE)
    assert h.parsed == Counter() and h.ran == Counter()
    async with h.node_channel() as ch:
        stub = agent_pb2_grpc.AgentRegistryStub(ch)
        assert (await stub.Heartbeat(beat, timeout=60)).controller_epoch == 1
        assert h.parsed == Counter(Heartbeat=1) == h.ran
        # Read after the check, the request is still parsed as every server's are: corrupt bytes
        # are INVALID_ARGUMENT, one over the limit RESOURCE_EXHAUSTED.
        raw = ch.unary_unary("/tessera.v1.AgentRegistry/Heartbeat")
        err = await refused(raw(b"\xff\xff\xff", timeout=60))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith("request:")
        over = agent_pb2.HeartbeatRequest(status=agent_pb2.NodeStatus(node_id="node-a",
                                                                      address="x" * main.API_MESSAGE_BYTES))
        err = await refused(stub.Heartbeat(over, timeout=60))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert h.ran == Counter(Heartbeat=1)


# -- health, reflection and Info: no credentials, so bounded (tessera.common.opencalls) ------------


async def watching(stub: health_pb2_grpc.HealthStub, n: int) -> list[Any]:
    """`n` health Watch streams, each open on the server: its first status has arrived."""
    calls = [stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60) for _ in range(n)]
    for call in calls:
        assert (await call.read()).status == health_pb2.HealthCheckResponse.SERVING
    return calls


async def until_admitted(call: Callable[[], Any]) -> Any:
    """`call()` again until the server admits it: a cancelled call's place is given back by the
    server's done-callback, which runs after the client's cancel returns."""
    async def again() -> Any:
        while True:
            try:
                return await call()
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                await asyncio.sleep(0.05)
    return await asyncio.wait_for(again(), 30)


async def test_open_calls_from_one_host_are_bounded_and_calls_with_credentials_are_not(h: Harness) -> None:
    share = OpenCallBounds().per_peer
    check = health_pb2.HealthCheckRequest(service="")
    async with h.user_channel() as ch:
        health = health_pb2_grpc.HealthStub(ch)
        watches = await watching(health, share)
        err = await refused(health.Check(check, timeout=60))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert err.details() == f"ipv4:127.0.0.1 already has {share} calls of health, reflection and Info open " \
                                "on this server; end one first"
        err = await refused(info_pb2_grpc.InfoStub(ch).GetVersion(info_pb2.GetVersionRequest(), timeout=60))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # A user's and an agent's calls are not counted.
        me = await controller_pb2_grpc.ControllerStub(ch).WhoAmI(controller_pb2.WhoAmIRequest(),
                                                                  metadata=h.bearer("bob"), timeout=60)
        assert me.principal == "bob"
        async with h.node_channel() as node:
            beat = agent_pb2.HeartbeatRequest(status=agent_pb2.NodeStatus(node_id="node-a"))
            assert (await agent_pb2_grpc.AgentRegistryStub(node).Heartbeat(beat, timeout=60)).controller_epoch == 1
        watches[0].cancel()
        answer = await until_admitted(lambda: health.Check(check, timeout=60))
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        for w in watches[1:]:
            w.cancel()


async def test_short_and_stream_calls_have_their_own_bounds_and_a_slow_request_ends() -> None:
    # No reserve for this machine's callers: the test's calls come from loopback.
    bounds = OpenCallBounds(max_unary=1, max_streams=2, per_peer=10, read_within_s=0.5, local_reserve=0)
    server, port = rpc.aio_server("127.0.0.1:0", [], insecure=True, open_calls=bounds)
    await server.start()
    try:
        async with rpc.aio_channel(f"127.0.0.1:{port}", insecure=True) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            check = health_pb2.HealthCheckRequest(service="")
            watches = await watching(health, 2)
            err = await refused(watching(health, 1))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "limit of 2 open streams" in err.details()
            assert (await health.Check(check, timeout=60)).status == health_pb2.HealthCheckResponse.SERVING

            # A Check whose request never comes holds the one short-call place until read_within_s.
            never = asyncio.Event()

            async def nothing() -> AsyncIterator[bytes]:
                await never.wait()
                yield b""

            slow = ch.stream_unary("/grpc.health.v1.Health/Check")(nothing(), timeout=60)
            await until_taken(health, check)
            err = await refused(slow)
            assert (err.code(), err.details()) == (grpc.StatusCode.DEADLINE_EXCEEDED,
                                                   "the request did not arrive within 0.5 s")
            answer = await until_admitted(lambda: health.Check(check, timeout=60))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            for w in watches:
                w.cancel()
    finally:
        await server.stop(None)


async def until_taken(health: health_pb2_grpc.HealthStub, check: Any) -> None:
    """Until a Check is refused for the short-call bound: the slow call holds the place."""
    async def again() -> None:
        while True:
            try:
                await health.Check(check, timeout=60)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "limit of 1 short calls" in exc.details()
                return
            await asyncio.sleep(0.01)
    await asyncio.wait_for(again(), 30)
