"""The dashboard's HTTP server against peers that hold connections, over real sockets
(controller/dashboard/http.py, docs/dashboard.md "Security").

Over HTTPS the connection limits used to apply after asyncio's TLS handshake (60 s to finish), so
connections that never sent a ClientHello escaped them: one client held ~9,000 descriptors, and out
of descriptors asyncio logged its accept error hundreds of thousands of times a minute. Now a
connection takes its slot at the accept, is refused at once past the caps, and is closed when its
handshake does not finish within the (here shortened) handshake timeout; the accept error is
logged once a minute.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tessera.common import identity, tls
from tessera.common.pki import CertificateAuthority
from tessera.controller.dashboard.http import (
    ACCEPT_ERROR,
    MAX_CONNECTIONS,
    MAX_PER_PEER,
    AcceptLogLimit,
    HttpServer,
    Request,
    Response,
)
from tessera.controller.dashboard.server import ssl_context

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@pytest.fixture
def contexts(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The dashboard's TLS context (the controller's certificate), and a client's that trusts it."""
    cert_dir = CertificateAuthority.init(tmp_path / "pki").issue(identity.CONTROLLER)
    return ssl_context(tls.load_dir(cert_dir)), ssl.create_default_context(cafile=str(cert_dir / "ca.pem"))


async def ok(req: Request) -> Response:
    return Response(200, b"ok")


async def silent(port: int, source: str) -> Conn:
    """A TCP connection from `source` (an address of 127/8) that never sends a byte: no ClientHello."""
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def closed_within(conn: Conn, seconds: float) -> bool:
    """Whether the server closes the connection (end of stream, or a reset) within `seconds`."""
    try:
        return await asyncio.wait_for(conn[0].read(), seconds) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


async def https_get(port: int, client: ssl.SSLContext, source: str) -> bytes:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(
        "127.0.0.1", port, ssl=client, server_hostname="localhost", local_addr=(source, 0)), 10)
    writer.write(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    await writer.drain()
    out = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return out


def close_all(conns: list[Conn]) -> None:
    for _, w in conns:
        w.close()


async def test_connections_without_a_handshake_take_slots_and_are_refused_past_the_caps(
        contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server_ctx, client = contexts
    server = HttpServer(ok, server_ctx, handshake_timeout=60.0)  # so a close below is a refusal
    port = await server.start("127.0.0.1", 0)
    held: list[Conn] = []
    try:
        held += [await silent(port, "127.0.0.1") for _ in range(MAX_PER_PEER)]
        # One address's share is taken by connections that never said a word: the next is closed
        # at once (the server accepts in order, so the 16 were counted first).
        past_share = await silent(port, "127.0.0.1")
        assert await closed_within(past_share, 5.0)
        # Another address is served meanwhile, over TLS.
        assert (await https_get(port, client, "127.0.0.2")).startswith(b"HTTP/1.1 200")
        # Every slot taken (16 from each of 4 addresses): anyone else is closed at once.
        for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
            held += [await silent(port, source) for _ in range(MAX_PER_PEER)]
        assert len(held) == MAX_CONNECTIONS
        assert await closed_within(await silent(port, "127.0.0.5"), 5.0)
        with pytest.raises((ConnectionError, ssl.SSLError, asyncio.IncompleteReadError)):
            await https_get(port, client, "127.0.0.5")
        # A peer that gives up (end of stream mid-handshake) frees its slot: the server closes its
        # side after releasing the slot, so once we see the close, 127.0.0.1 is served again.
        for conn in held[:MAX_PER_PEER]:
            conn[1].write_eof()
            assert await closed_within(conn, 5.0)
        assert (await https_get(port, client, "127.0.0.1")).startswith(b"HTTP/1.1 200")
    finally:
        close_all(held)
        await server.close()


async def test_a_handshake_not_finished_in_time_is_closed_and_its_slot_freed(
        contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server_ctx, client = contexts
    timeout = 0.5
    server = HttpServer(ok, server_ctx, handshake_timeout=timeout)
    port = await server.start("127.0.0.1", 0)
    held: list[tuple[float, Conn]] = []
    try:
        for _ in range(MAX_PER_PEER):  # this address's whole share
            held.append((time.monotonic(), await silent(port, "127.0.0.1")))
        for opened, conn in held:
            assert await closed_within(conn, 10.0), "a connection without a handshake was left open"
            assert time.monotonic() - opened >= timeout - 0.01  # by the timeout, not at once
        assert (await https_get(port, client, "127.0.0.1")).startswith(b"HTTP/1.1 200")
    finally:
        close_all([c for _, c in held])
        await server.close()


async def test_plain_http_answers_503_when_every_slot_is_taken() -> None:
    server = HttpServer(ok, max_connections=2)
    port = await server.start("127.0.0.1", 0)
    held = []
    try:
        for source in ("127.0.0.1", "127.0.0.2"):  # heads never finished
            conn = await silent(port, source)
            conn[1].write(b"GET / HTTP/1.1\r\n")
            held.append(conn)
        reader, writer = await silent(port, "127.0.0.3")
        writer.write(b"GET / HTTP/1.1\r\n\r\n")
        refused = await asyncio.wait_for(reader.read(), 5.0)
        writer.close()
        assert refused.startswith(b"HTTP/1.1 503") and refused.endswith(b"too many connections\n")
    finally:
        close_all(held)
        await server.close()


def test_the_accept_error_passes_once_per_interval_with_the_count_it_held() -> None:
    clock = [1000.0]
    limit = AcceptLogLimit(every_s=60.0, clock=lambda: clock[0])

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)

    first = record(f"{ACCEPT_ERROR}\nsocket: <...>")
    assert limit.filter(first) and first.getMessage().startswith(ACCEPT_ERROR + "\n")
    assert not any(limit.filter(record(f"{ACCEPT_ERROR}\nsocket: <...>")) for _ in range(1000))
    assert limit.filter(record("Task exception was never retrieved"))  # other messages pass
    clock[0] += 60.0
    later = record(f"{ACCEPT_ERROR}\nsocket: <...>")
    assert limit.filter(later) and "(and 1000 more not logged in the last 60 s)" in later.getMessage()


CHILD = """
import asyncio, logging, os, resource, sys
from tessera.controller.dashboard.http import HttpServer, Response
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s: %(message)s")

async def ok(req):
    return Response(200, b"ok")

async def main():
    server = HttpServer(ok)
    port = await server.start("127.0.0.1", 0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))
    held = []
    try:
        while True:  # every descriptor taken
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    print(port, flush=True)
    await asyncio.sleep(float(sys.argv[1]))  # asyncio retries the accept every second meanwhile

asyncio.run(main())
"""


def test_out_of_descriptors_the_accept_error_is_logged_once() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, "2.5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    socks = []
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())  # its descriptors are all taken now
        socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]  # wait in the backlog
        _, err = child.communicate(timeout=60)
    finally:
        for s in socks:
            s.close()
        if child.poll() is None:
            child.kill()
            child.wait()
    log = err.decode(errors="replace")
    assert child.returncode == 0, log[-2000:]
    # asyncio's accept loop logs it on every try, about 100 a second and growing (python/cpython#151615)
    assert log.count(ACCEPT_ERROR) == 1, log[-2000:]
