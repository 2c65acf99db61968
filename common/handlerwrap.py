"""gRPC method handlers wrapped: their behaviour (`rewrap`, for interceptors), or served so that a
check on the call's metadata and peer runs before its request is read (`read_after`, `refusal`).

A unary request is received and parsed by gRPC before a unary-request handler starts, whatever
its size; a stream-request handler starts at once and reads when it asks. So a server that wants
to refuse a caller on its metadata (controller/auth.py) or count it in first (common/opencalls.py)
serves the method as a stream-request one and reads the one request after the check.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from tessera.common.errors import DeadlineExceeded, InvalidArgument


class Undecodable:
    """A request whose bytes are not the method's message: gRPC would answer UNKNOWN with the
    parser's exception; the handler wrapper answers INVALID_ARGUMENT instead."""

    def __init__(self, error: str) -> None:
        self.error = error


def tolerant_parser(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError, or anything a parser raises
            return Undecodable(type(exc).__name__)

    return parse


def refuse_undecodable(request: Any) -> None:
    if isinstance(request, Undecodable):
        raise InvalidArgument("request", "not a valid message of the method's request type (corrupt wire format)")


Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


def rewrap(handler: Any, unary: Wrap, stream: Wrap, tolerant: bool = False) -> Any:
    """`handler` (a grpc.RpcMethodHandler) with its behavior wrapped: by `unary` for calls that
    answer once, by `stream` for calls that answer with a stream (which must wrap an async
    generator function in one, so outer interceptors still see a stream). `tolerant`: a unary
    request is parsed before the handler runs, so a corrupt one reaches the wrapper as
    Undecodable, to be refused there with a status of ours."""
    wrap = {"unary_unary": (unary, grpc.unary_unary_rpc_method_handler),
            "stream_unary": (unary, grpc.stream_unary_rpc_method_handler),
            "unary_stream": (stream, grpc.unary_stream_rpc_method_handler),
            "stream_stream": (stream, grpc.stream_stream_rpc_method_handler)}
    for kind, (wrapper, make) in wrap.items():
        behavior = getattr(handler, kind)
        if behavior is not None:
            parse = handler.request_deserializer
            if tolerant and kind.startswith("unary"):
                parse = tolerant_parser(parse)
            return make(wrapper(behavior), request_deserializer=parse,
                        response_serializer=handler.response_serializer)
    return handler


async def one_request(requests: Any, within_s: float | None) -> Any:
    """The one request of a unary call served by a stream-request handler (read_after)."""
    try:
        request = await asyncio.wait_for(requests.__anext__(), within_s)
    except StopAsyncIteration:
        raise InvalidArgument("request", "the call carried no request message") from None
    except TimeoutError:
        raise DeadlineExceeded(f"the request did not arrive within {within_s:g} s") from None
    refuse_undecodable(request)
    return request


def read_after(handler: Any, check: Callable[[Any], None], read_within_s: float | None = None) -> Any:
    """`handler` with `check(context)` run before anything of the request is read: what it raises is
    the call's answer (through the ErrorInterceptor), and the request is then never received nor
    parsed, whatever its size. gRPC receives a unary request before the handler starts, so a
    unary-request handler becomes a stream-request one here (the wire does not tell them apart: a
    unary call is a stream of one message), which starts at once and reads its one request after
    the check, parsed as ErrorInterceptor's `tolerant` (a corrupt one is INVALID_ARGUMENT).
    `read_within_s`: a unary request that has not arrived that long after the check is
    DEADLINE_EXCEEDED (a caller that sends slowly does not hold the call's place for ever)."""
    kind = ("stream_" if handler.request_streaming else "unary_") + ("stream" if handler.response_streaming else "unary")
    behavior = getattr(handler, kind)
    parse = handler.request_deserializer if handler.request_streaming else tolerant_parser(handler.request_deserializer)

    async def start(requests: Any, context: Any) -> Any:
        """The behavior's result (a value, a coroutine or an async generator), once `check` passed."""
        check(context)
        return behavior(requests if handler.request_streaming else await one_request(requests, read_within_s), context)

    if handler.response_streaming:
        async def stream(requests: Any, context: Any) -> AsyncIterator[Any]:
            result = await start(requests, context)
            if inspect.isasyncgen(result):
                async for response in result:
                    yield response
            elif inspect.isawaitable(result):
                await result  # a coroutine that writes with context.write

        return grpc.stream_stream_rpc_method_handler(stream, request_deserializer=parse,
                                                     response_serializer=handler.response_serializer)

    async def unary(requests: Any, context: Any) -> Any:
        result = await start(requests, context)
        return await result if inspect.isawaitable(result) else result

    return grpc.stream_unary_rpc_method_handler(unary, request_deserializer=parse,
                                                response_serializer=handler.response_serializer)


def refusal(handler: Any, error: BaseException) -> Any:
    """A handler for `handler`'s method that answers `error` (through the ErrorInterceptor) at once,
    without receiving or parsing the request (read_after): a caller refused on its metadata alone
    makes the server hold nothing of what it sent."""
    def refuse(context: Any) -> None:
        raise error

    return read_after(handler, refuse)
