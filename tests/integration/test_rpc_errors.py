"""rpc.ErrorInterceptor on a real grpc.aio server: each error kind -> its status code and details,
for unary and streaming RPCs; an unknown exception -> INTERNAL without its text, logged instead."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from structlog.testing import capture_logs

from tessera.common import rpc
from tessera.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    InvalidInput,
    NotFound,
    TesseraError,
    Unavailable,
)
from tessera.estimator.plans import PlanInputError

SERVICE = "tessera.test.Errors"


class Foreign(Exception):
    """An error defined outside tessera.common, mapped by the server's `translate`."""


ERRORS: dict[str, Exception] = {
    "invalid": InvalidArgument("plan.tp", "must be >= 1, got 0"),
    "library": PlanInputError("model.num_heads", "12 heads do not divide hidden_size 1000"),
    "input": InvalidInput("jobs.yaml line 3: not a mapping"),
    "missing": NotFound("job j-1 not found"),
    "exists": AlreadyExists("request_id: r-1 was already used for a different job spec"),
    "refused": FailedPrecondition("node is draining: no new launches"),
    "down": Unavailable("node n-1 holding the log is not reachable"),
    "root": TesseraError("a bug we meant to report"),
    "multiline": InvalidArgument("plan", "two\n   lines"),
    "foreign": Foreign("j-9"),
    "bug": RuntimeError("secret: /var/lib/tessera/key at 0xdeadbeef"),
}

EXPECTED: dict[str, tuple[grpc.StatusCode, str]] = {
    "invalid": (grpc.StatusCode.INVALID_ARGUMENT, "plan.tp: must be >= 1, got 0"),
    "library": (grpc.StatusCode.INVALID_ARGUMENT, "model.num_heads: 12 heads do not divide hidden_size 1000"),
    "input": (grpc.StatusCode.INVALID_ARGUMENT, "jobs.yaml line 3: not a mapping"),
    "missing": (grpc.StatusCode.NOT_FOUND, "job j-1 not found"),
    "exists": (grpc.StatusCode.ALREADY_EXISTS, "request_id: r-1 was already used for a different job spec"),
    "refused": (grpc.StatusCode.FAILED_PRECONDITION, "node is draining: no new launches"),
    "down": (grpc.StatusCode.UNAVAILABLE, "node n-1 holding the log is not reachable"),
    "root": (grpc.StatusCode.INTERNAL, "a bug we meant to report"),
    "multiline": (grpc.StatusCode.INVALID_ARGUMENT, "plan: two lines"),
    "foreign": (grpc.StatusCode.NOT_FOUND, "job j-9 not found"),
}


def _raise(request: bytes) -> None:
    name = request.decode()
    if name in ERRORS:
        raise ERRORS[name]


async def _unary(request: bytes, context: Any) -> bytes:
    if request == b"abort":  # a handler that aborts by itself keeps its own status
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, "aborted by the handler")
    _raise(request)
    return b"ok:" + request


def _sync(request: bytes, context: Any) -> bytes:
    _raise(request)
    return b"sync:" + request


async def _server_stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
    yield b"first"
    yield b"second"
    _raise(request)


async def _bidi(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    async for r in requests:
        _raise(r)
        yield b"echo:" + r


def _add(servicer: object, server: grpc.aio.Server) -> None:
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(_unary),
        "Sync": grpc.unary_unary_rpc_method_handler(_sync),
        "ServerStream": grpc.unary_stream_rpc_method_handler(_server_stream),
        "Bidi": grpc.stream_stream_rpc_method_handler(_bidi),
    }),))


Call = Callable[..., Awaitable[Any]]


@pytest.fixture
async def channel() -> AsyncIterator[grpc.aio.Channel]:
    translate = {Foreign: lambda e: NotFound(f"job {e.args[0]} not found")}
    # Plaintext: the error mapping is the same whatever the transport (tests/security covers TLS).
    server, port = rpc.aio_server("127.0.0.1:0", [(_add, None)], name="test", translate=translate, insecure=True)
    await server.start()
    ch = rpc.aio_channel(f"127.0.0.1:{port}", insecure=True)
    try:
        yield ch
    finally:
        await ch.close()
        await rpc.stop_server(server, grace=0)


async def _status(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value.code(), err.value.details() or ""


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_unary_errors_map_to_their_status(channel: grpc.aio.Channel, name: str) -> None:
    unary = channel.unary_unary(f"/{SERVICE}/Unary")
    assert await _status(unary(name.encode(), timeout=5)) == EXPECTED[name]


@pytest.mark.parametrize("name", ["invalid", "missing", "refused", "foreign"])
async def test_a_streaming_error_ends_the_stream_with_its_status(channel: grpc.aio.Channel, name: str) -> None:
    stream = channel.unary_stream(f"/{SERVICE}/ServerStream")(name.encode(), timeout=5)
    got = []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for item in stream:
            got.append(item)
    assert got == [b"first", b"second"]  # what was sent before the error arrives
    assert (err.value.code(), err.value.details()) == EXPECTED[name]


async def test_a_bidi_stream_maps_the_error_after_its_answers(channel: grpc.aio.Channel) -> None:
    call = channel.stream_stream(f"/{SERVICE}/Bidi")(iter([b"a", b"missing", b"c"]), timeout=5)
    got = []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for item in call:
            got.append(item)
    assert got == [b"echo:a"]
    assert (err.value.code(), err.value.details()) == EXPECTED["missing"]


@pytest.mark.parametrize(("method", "kind"), [("Unary", "unary_unary"), ("ServerStream", "unary_stream"),
                                              ("Bidi", "stream_stream")])
async def test_an_unknown_exception_is_internal_without_its_text(
    channel: grpc.aio.Channel, method: str, kind: str
) -> None:
    multi = getattr(channel, kind)(f"/{SERVICE}/{method}")
    with capture_logs() as logs:
        if kind == "unary_unary":
            code, details = await _status(multi(b"bug", timeout=5))
        else:
            call = multi(b"bug" if kind == "unary_stream" else iter([b"bug"]), timeout=5)

            async def drain() -> None:
                async for _ in call:
                    pass

            code, details = await _status(drain())
    assert (code, details) == (grpc.StatusCode.INTERNAL, f"{method} failed; see the test log")
    assert "secret" not in details and "RuntimeError" not in details
    failed = [e for e in logs if e["event"] == "rpc_failed"]
    assert len(failed) == 1 and failed[0]["log_level"] == "error" and failed[0]["method"] == method
    assert isinstance(failed[0]["exc_info"], RuntimeError)  # the traceback goes to the server's log


async def test_refusals_log_one_info_line_and_successes_pass_through(channel: grpc.aio.Channel) -> None:
    unary = channel.unary_unary(f"/{SERVICE}/Unary")
    with capture_logs() as logs:
        assert await unary(b"fine", timeout=5) == b"ok:fine"
        await _status(unary(b"refused", timeout=5))
    assert [(e["event"], e["log_level"], e["code"]) for e in logs] == [("rpc_refused", "info", "FAILED_PRECONDITION")]


async def test_an_internal_tessera_error_is_sent_and_logged_as_a_failure(channel: grpc.aio.Channel) -> None:
    unary = channel.unary_unary(f"/{SERVICE}/Unary")
    with capture_logs() as logs:
        assert await _status(unary(b"root", timeout=5)) == EXPECTED["root"]
    assert [(e["event"], e["log_level"]) for e in logs] == [("rpc_failed", "error")]


async def test_a_plain_function_handler_is_mapped_too(channel: grpc.aio.Channel) -> None:
    sync = channel.unary_unary(f"/{SERVICE}/Sync")
    assert await sync(b"fine", timeout=5) == b"sync:fine"
    assert await _status(sync(b"missing", timeout=5)) == EXPECTED["missing"]


async def test_a_handler_that_aborts_keeps_its_own_status(channel: grpc.aio.Channel) -> None:
    unary = channel.unary_unary(f"/{SERVICE}/Unary")
    assert await _status(unary(b"abort", timeout=5)) == (grpc.StatusCode.PERMISSION_DENIED, "aborted by the handler")


async def test_an_unknown_method_is_still_unimplemented(channel: grpc.aio.Channel) -> None:
    code, _ = await _status(channel.unary_unary(f"/{SERVICE}/Nope")(b"", timeout=5))
    assert code == grpc.StatusCode.UNIMPLEMENTED


def test_status_of_is_the_same_mapping_without_a_server() -> None:
    assert rpc.status_of(NotFound("job j not found"), "GetJob", "controller") == (
        grpc.StatusCode.NOT_FOUND, "job j not found")
    assert rpc.status_of(KeyError("x"), "GetJob", "controller") == (
        grpc.StatusCode.INTERNAL, "GetJob failed; see the controller log")
    translate = {KeyError: lambda e: NotFound(f"node {e.args[0]} not found")}
    assert rpc.status_of(KeyError("n"), "GetNode", "controller", translate) == (
        grpc.StatusCode.NOT_FOUND, "node n not found")
