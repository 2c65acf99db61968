"""A small read-only HTTP/1.1 server on asyncio streams, for the dashboard (docs/dashboard.md).

No web framework is a dependency of the controller, and the dashboard needs little: GET and HEAD,
one request per connection (`Connection: close`), no request bodies. Every peer is hostile: the
request head is bounded in size and time, connections are bounded in number, anything but GET/HEAD
is refused, and every answer carries headers that keep a browser from running or framing anything
that is not the dashboard's own (a Content-Security-Policy without inline scripts).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qsl, unquote, urlsplit

import structlog

log = structlog.get_logger("tessera.controller.dashboard")

MAX_HEAD = 16 * 1024  # request line and headers, bytes
HEAD_TIMEOUT_S = 10.0  # a peer that trickles its request head is cut off after this
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
    if not target.startswith("/"):
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
    """Serves `handler` on host:port (TLS when `ssl_context` is given); `port` once started."""

    def __init__(self, handler: Handler, ssl_context: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.ssl_context = ssl_context
        self.port = 0
        self._server: asyncio.Server | None = None
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self._per_peer: dict[str, int] = {}

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._connection, host or "127.0.0.1", port,
                                                  ssl=self.ssl_context, limit=MAX_HEAD)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        addr = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self._per_peer[addr] = self._per_peer.get(addr, 0) + 1
        try:
            if self._per_peer[addr] > MAX_PER_PEER:
                await self._send(writer, Response(503, b"too many connections from this address\n"), False)
                return
            if self._slots.locked():
                await self._send(writer, Response(503, b"too many connections\n"), False)
                return
            async with self._slots:
                await self._serve_one(reader, writer)
        except (ConnectionError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the peer went away or stalled: nothing to answer
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
