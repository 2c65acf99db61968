"""What a highly available controller serves while it does not lead (docs/ha.md).

The gRPC server of a controller with `--store etcd` starts before the election is decided and has
one generic handler, `LeaderSwitch`. While this controller is a standby (or once it has lost its
lease), every method of the Controller and AgentRegistry services answers UNAVAILABLE
"not the leader; leader at ADDR", with ADDR also in the trailing metadata `tessera-leader`, so
agents and clients move to the leader. Once it leads, the switch hands each call to the real
servicers (registered through `lead`, exactly as on a plain server).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc

from tessera.common.rpc import LEADER_HINT_KEY
from tessera.controller.election import NotLeader


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

    def __init__(self, services: Sequence[Any], leader: Callable[[], str]) -> None:
        """`leader()` names the leader's address ("" when unknown) without I/O: it runs on the
        server's loop for every refused call."""
        self._streams = {f"/{s.full_name}/{m.name}": m.server_streaming for s in services for m in s.methods}
        self._leader = leader
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
        for h in self._handlers:
            found = h.service(details)
            if found is not None:
                return found
        streaming = self._streams.get(details.method)
        if self._handlers or streaming is None:
            return None  # unknown method: UNIMPLEMENTED

        def refuse(context: Any) -> NotLeader:
            addr = self._leader()
            # A negative pushback tells gRPC's own retry policy not to ask this standby again: the
            # caller moves to the leader instead.
            md = [("grpc-retry-pushback-ms", "-1")] + ([(LEADER_HINT_KEY, addr)] if addr else [])
            context.set_trailing_metadata(tuple(md))
            return NotLeader(f"not the leader; leader at {addr}" if addr else "not the leader; no leader elected yet")

        async def unary(request: bytes, context: Any) -> Any:
            raise refuse(context)

        async def stream(request: bytes, context: Any) -> Any:
            raise refuse(context)
            yield  # an async generator, as the ErrorInterceptor expects of a stream

        if streaming:
            return grpc.unary_stream_rpc_method_handler(stream)
        return grpc.unary_unary_rpc_method_handler(unary)
