"""What a highly available controller serves while it does not lead (docs/ha.md).

The gRPC server of a controller with `--store etcd` starts before the election is decided and has
one generic handler, `LeaderSwitch`. While this controller is a standby (or once it has lost its
lease), every method of the Controller and AgentRegistry services answers UNAVAILABLE
"not the leader; leader at ADDR", with ADDR also in the trailing metadata `tessera-leader`, so
agents and clients move to the leader. Once it leads, the switch hands each call to the real
servicers (registered through `lead`, exactly as on a plain server).

Leading is asked again at every call, twice: before the call reaches the servicer and after it
answered, before the answer goes out (`leading()`, the election's local lease deadline). So a
leader whose lease may have lapsed acknowledges nothing more, a heartbeat or a registration above
all (docs/fencing.md, "Several controllers"), even before its lost-lease handling has switched the
server to standby: a heartbeat that arrives after the deadline, or whose handling outlasted it, is
answered UNAVAILABLE, which the agent does not count as an acknowledgement.

A call refused before it reached a servicer also carries `tessera-unserved: 1` in its trailing
metadata: nothing of it was done, so a client need not wonder whether its submit was stored (a
call refused after it was served, its answer withheld, carries no such word).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc

from tessera.common.rpc import LEADER_HINT_KEY
from tessera.controller.election import NotLeader

# Trailing metadata of a refusal before any servicer ran (clients/sdk.py reads it by this name).
UNSERVED_KEY = "tessera-unserved"


class _Collector:
    """Stands in for a grpc server while the generated add_*Servicer_to_server functions register."""

    def __init__(self) -> None:
        self.handlers: list[grpc.GenericRpcHandler] = []

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self.handlers.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: object) -> None:
        pass  # the generic handlers above serve the same methods


class LeaderSwitch(grpc.GenericRpcHandler):
    """Routes calls to the leader's servicers, or refuses them with the leader's address."""

    def __init__(self, services: Sequence[Any], leader: Callable[[], str],
                 leading: Callable[[], bool] = lambda: True) -> None:
        """`leader()` names the leader's address ("" when unknown) without I/O: it runs on the
        server's loop for every refused call. `leading()` (no I/O either) says whether this
        controller may still act as the leader: checked before and after every call it serves."""
        self._streams = {f"/{s.full_name}/{m.name}": m.server_streaming for s in services for m in s.methods}
        self._leader = leader
        self._leading = leading
        self._handlers: list[grpc.GenericRpcHandler] = []

    @property
    def leading(self) -> bool:
        return bool(self._handlers)

    def lead(self, registrations: Sequence[tuple[Callable[[Any, Any], None], Any]]) -> None:
        c = _Collector()
        for add, servicer in registrations:
            add(servicer, c)
        self._handlers = c.handlers

    def standby(self) -> None:
        self._handlers = []

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        streaming = self._streams.get(details.method)
        handlers = self._handlers
        if handlers and (streaming is None or self._leading()):
            for h in handlers:
                found = h.service(details)
                if found is not None:
                    return found if streaming is None else self._guarded(found)
            return None  # unknown method: UNIMPLEMENTED
        if streaming is None:
            return None
        return self._refusal(streaming)

    def _refuse(self, context: Any, served: bool = False) -> NotLeader:
        addr = self._leader()
        # A negative pushback tells gRPC's own retry policy not to ask this standby again: the
        # caller moves to the leader instead.
        md = [("grpc-retry-pushback-ms", "-1")] + ([(LEADER_HINT_KEY, addr)] if addr else [])
        md += [] if served else [(UNSERVED_KEY, "1")]
        context.set_trailing_metadata(tuple(md))
        return NotLeader(f"not the leader; leader at {addr}" if addr else "not the leader; no leader elected yet")

    def _guarded(self, h: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """`h`, whose answers (each message of a stream) go out only while `leading()` still holds."""
        if h.request_streaming:
            return h  # the Controller and AgentRegistry services have no client streams
        if h.response_streaming:
            inner_stream = h.unary_stream

            async def stream(request: Any, context: Any) -> Any:
                async for msg in inner_stream(request, context):
                    if not self._leading():
                        raise self._refuse(context, served=True)
                    yield msg

            return grpc.unary_stream_rpc_method_handler(stream, h.request_deserializer, h.response_serializer)
        inner = h.unary_unary

        async def unary(request: Any, context: Any) -> Any:
            answer = await inner(request, context)
            if not self._leading():
                raise self._refuse(context, served=True)
            return answer

        return grpc.unary_unary_rpc_method_handler(unary, h.request_deserializer, h.response_serializer)

    def _refusal(self, streaming: bool) -> grpc.RpcMethodHandler:
        refuse = self._refuse

        async def unary(request: bytes, context: Any) -> Any:
            raise refuse(context)

        async def stream(request: bytes, context: Any) -> Any:
            raise refuse(context)
            yield  # an async generator, as the ErrorInterceptor expects of a stream

        if streaming:
            return grpc.unary_stream_rpc_method_handler(stream)
        return grpc.unary_unary_rpc_method_handler(unary)
