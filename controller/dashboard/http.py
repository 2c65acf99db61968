"""A small read-only HTTP/1.1 server on asyncio streams, for the dashboard (docs/dashboard.md).

No web framework is a dependency of the controller, and the dashboard needs little: GET and HEAD,
one request per connection (`Connection: close`), no request bodies. Every peer is hostile: the
request head is bounded in size and time, connections are bounded in number, anything but GET/HEAD
is refused, and every answer carries headers that keep a browser from running or framing anything
that is not the dashboard's own (a Content-Security-Policy without inline scripts).

With TLS, the server accepts plain TCP and takes a connection's slot before the TLS handshake, which
then has HANDSHAKE_TIMEOUT_S: when the slots were taken after asyncio's own handshake (60 s to
finish), peers that never sent a ClientHello held thousands of descriptors, none of them counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qsl, unquote, urlsplit

import structlog

log = structlog.get_logger("tessera.controller.dashboard")

MAX_HEAD = 16 * 1024  # request line and headers, bytes
HEAD_TIMEOUT_S = 10.0  # a peer that trickles its request head is cut off after this
HANDSHAKE_TIMEOUT_S = 10.0  # and one that does not finish its TLS handshake, after this
WRITE_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 64
MAX_PER_PEER = 16  # one address may not hold every slot (64 trickled heads kept everyone out)

# No inline script or style: the pages load /static/app.js and /static/style.css only, so an
# escaping mistake in a page cannot become script. SVG presentation attributes are not styles.
SECURITY_HEADERS = (
    ("Content-Security-Policy", ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # percent-decoded
    query: dict[str, str]
    headers: tuple[tuple[str, str], ...]  # names lower-cased, in the order sent

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name]


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)


Handler = Callable[[Request], Awaitable[Response]]


class BadRequest(Exception):
    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


def parse_head(head: bytes) -> Request:
    """The request of a head (request line and headers, CRLF-separated, no final blank line);
    BadRequest for anything malformed or not GET/HEAD."""
    text = head.decode("latin-1")  # every byte decodes; header values are ASCII in practice
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(400, "malformed request line")
    method, target, _ = parts
    if method not in ("GET", "HEAD"):
        raise BadRequest(405, f"{method[:16]!r}: the dashboard is read-only (GET, HEAD)")
    if not target.startswith("/") or target.startswith("//"):  # urlsplit reads "//x/nodes" as host x, path /nodes
        raise BadRequest(400, "the request target must be a path")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or any(c in name for c in " \t"):
            raise BadRequest(400, "malformed header line")
        headers.append((name.lower(), value.strip()))
    for name, value in headers:
        if name == "transfer-encoding" or (name == "content-length" and value != "0"):
            raise BadRequest(400, "a GET has no body")
    url = urlsplit(target)
    try:
        path = unquote(url.path, errors="strict")
    except UnicodeDecodeError:
        raise BadRequest(400, "the path is not UTF-8") from None
    if "\x00" in path or "/../" in f"{path}/":
        raise BadRequest(400, "malformed path")
    try:
        query = dict(parse_qsl(url.query, keep_blank_values=True, strict_parsing=False, max_num_fields=32))
    except ValueError:
        raise BadRequest(400, "too many query parameters") from None
    return Request(method, path, query, tuple(headers))


def render(resp: Response, head_only: bool) -> bytes:
    try:
        reason = HTTPStatus(resp.status).phrase
    except ValueError:
        reason = ""
    lines = [f"HTTP/1.1 {resp.status} {reason}", f"Content-Type: {resp.content_type}",
             f"Content-Length: {len(resp.body)}", "Connection: close"]
    own = {k.lower() for k, _ in resp.headers}  # a response's own header replaces the default (Cache-Control)
    lines += [f"{k}: {v}" for k, v in (*(h for h in SECURITY_HEADERS if h[0].lower() not in own), *resp.headers)]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + resp.body


class HttpServer:
    """Serves `handler` on host:port (TLS when `ssl_context` is given); `port` once started.

    At most `max_connections` at once and `max_per_peer` from one address, counted from the accept
    (before any TLS handshake); beyond, a connection is refused at once (plain HTTP: a 503; TLS:
    closed). A TLS handshake not finished within `handshake_timeout` closes its connection."""

    def __init__(self, handler: Handler, ssl_context: ssl.SSLContext | None = None, *,
                 max_connections: int = MAX_CONNECTIONS, max_per_peer: int = MAX_PER_PEER,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT_S) -> None:
        self.handler = handler
        self.ssl_context = ssl_context
        self.port = 0
        self.max_per_peer = max_per_peer
        self.handshake_timeout = handshake_timeout
        self._server: asyncio.Server | None = None
        self._slots = asyncio.Semaphore(max_connections)
        self._per_peer: dict[str, int] = {}

    async def start(self, host: str, port: int) -> int:
        install_accept_log_limit()
        # Plain TCP here even with TLS: _connection counts the connection, then upgrades it.
        self._server = await asyncio.start_server(self._connection, host or "127.0.0.1", port, limit=MAX_HEAD)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # With TLS, nothing may yield to the loop before start_tls pauses the socket's reading: this
        # task's first step runs before the stream's first read (asyncio schedules that read after
        # it), and a ClientHello the stream had read would be lost to TLS (the handshake then times
        # out). Hence asyncio.timeout there, not wait_for, which would start it in a task of its own.
        if self.ssl_context is not None and isinstance(writer.transport, asyncio.ReadTransport):
            writer.transport.pause_reading()
        peer = writer.get_extra_info("peername")
        addr = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self._per_peer[addr] = self._per_peer.get(addr, 0) + 1
        try:
            refusal = (b"too many connections from this address\n" if self._per_peer[addr] > self.max_per_peer
                       else b"too many connections\n" if self._slots.locked() else b"")
            if refusal:
                if self.ssl_context is None:  # over TLS no answer without a handshake: closed at once
                    await self._send(writer, Response(503, refusal), False)
                return
            async with self._slots:
                if self.ssl_context is not None:
                    async with asyncio.timeout(self.handshake_timeout + 1.0):  # asyncio's own should do
                        await writer.start_tls(self.ssl_context, ssl_handshake_timeout=self.handshake_timeout)
                await self._serve_one(reader, writer)
        except (ConnectionError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the peer went away, stalled or failed its handshake: nothing to answer
        finally:
            self._per_peer[addr] -= 1
            if not self._per_peer[addr]:
                del self._per_peer[addr]
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 2.0)

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            await self._send(writer, Response(431, b"request head too large\n"), False)
            return
        except asyncio.IncompleteReadError:
            return
        try:
            req = parse_head(head[:-4])
        except BadRequest as e:
            extra = [("Allow", "GET, HEAD")] if e.status == 405 else []
            await self._send(writer, Response(e.status, f"{e}\n".encode(), headers=extra), False)
            return
        try:
            resp = await self.handler(req)
        except Exception:
            log.exception("dashboard_handler_failed", path=req.path[:200])
            resp = Response(500, b"internal error (see the controller log)\n")
        await self._send(writer, resp, req.method == "HEAD")

    async def _send(self, writer: asyncio.StreamWriter, resp: Response, head_only: bool) -> None:
        writer.write(render(resp, head_only))
        await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)


ACCEPT_ERROR = "socket.accept() out of system resource"


class AcceptLogLimit(logging.Filter):
    """Lets asyncio's ACCEPT_ERROR through once per `every_s`, saying how many it held back.

    Out of descriptors, asyncio's accept loop logs that error (with a traceback) on every try and
    reschedules itself once per try (python/cpython#151615): an audit counted 274,560 of them, 111
    MB of log, in a minute. The other messages of the "asyncio" logger pass untouched."""

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s, self.clock = every_s, clock
        self.next_at = -float("inf")
        self.held = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not isinstance(record.msg, str) or not record.msg.startswith(ACCEPT_ERROR):
            return True
        now = self.clock()
        if now < self.next_at:
            self.held += 1
            return False
        self.next_at = now + self.every_s
        if self.held:
            said = f"{ACCEPT_ERROR} (and {self.held} more not logged in the last {self.every_s:.0f} s)"
            record.msg = record.msg.replace(ACCEPT_ERROR, said, 1)
            self.held = 0
        return True


def install_accept_log_limit() -> None:
    logger = logging.getLogger("asyncio")
    if not any(isinstance(f, AcceptLogLimit) for f in logger.filters):
        logger.addFilter(AcceptLogLimit())
