"""Prometheus exposition for the daemons: `--metrics-listen HOST:PORT` and `--metrics-token-file FILE`.

A small HTTP server of our own rather than prometheus_client's start_http_server (docs/observability.md,
"Metrics"): GET and HEAD of /metrics only (404 for another path, 405 for another method); a bearer
token when a token file is given, required for a host other than loopback (the metrics name every
tenant and its GPU usage); a client has `timeout` seconds to send its request head, all of it, and
to take the answer; at most `max_connections` connections at once, a further one closed at accept,
without a thread. HTTP/1.0: one request per connection.
"""

from __future__ import annotations

import hmac
import http.server
import io
import os
import socket
import socketserver
import stat
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.registry import CollectorRegistry

from tessera.common.errors import InvalidInput
from tessera.common.netaddr import is_loopback

log = structlog.get_logger("metrics")

LISTEN_FLAG = "--metrics-listen"
TOKEN_FLAG = "--metrics-token-file"
DEFAULT_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 16
MAX_HEAD_BYTES = 16 * 1024  # request line and headers; a longer head is dropped
MAX_TOKEN_BYTES = 4096
PATH = "/metrics"


class MetricsConfigError(InvalidInput):
    """A --metrics-listen or --metrics-token-file the daemon must refuse; `flag` names which."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag


def split_listen(listen: str) -> tuple[str, int]:
    """HOST:PORT (port 0..65535; an empty host is 127.0.0.1) as (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise MetricsConfigError(LISTEN_FLAG, f"{listen!r} is not HOST:PORT (e.g. 127.0.0.1:9451; port 0 = any "
                                              "free port)")
    return host.strip("[]") or "127.0.0.1", int(port)


def read_token(path: str) -> bytes:
    """The token in `path`: one word of printable ASCII, surrounding whitespace stripped. Refused: an
    empty file, and one that others may read or write, or the group write (chmod 600, or 640 for a
    group the scraper is in)."""
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            raw = f.read(MAX_TOKEN_BYTES + 1)
    except OSError as exc:
        raise MetricsConfigError(TOKEN_FLAG, f"{path}: cannot read: {exc.strerror or exc}") from None
    if mode & (stat.S_IROTH | stat.S_IWOTH | stat.S_IWGRP):
        raise MetricsConfigError(TOKEN_FLAG, f"{path}: readable or writable by others, or writable by group "
                                             f"(mode {stat.S_IMODE(mode):04o}); chmod 600 it")
    token = raw.strip()
    if not token:
        raise MetricsConfigError(TOKEN_FLAG, f"{path}: empty; put a random token in it (e.g. openssl rand -hex 32)")
    if len(raw) > MAX_TOKEN_BYTES or any(b < 0x21 or b > 0x7E for b in token):
        raise MetricsConfigError(TOKEN_FLAG, f"{path}: the token must be one word of printable ASCII, at most "
                                             f"{MAX_TOKEN_BYTES} bytes")
    return token


def settings(listen: str, token_file: str | None) -> tuple[str, int, bytes | None]:
    """(host, port, token) of a metrics server; MetricsConfigError for a malformed address, an unusable
    token file, or a host other than loopback without one (anyone could read every tenant's usage)."""
    host, port = split_listen(listen)
    if not token_file and not is_loopback(host):
        raise MetricsConfigError(LISTEN_FLAG, f"{host} is reachable from other machines, and the metrics name "
                                              f"every tenant and its GPU usage: give {TOKEN_FLAG}, or a loopback "
                                              "host (127.0.0.1)")
    return host, port, read_token(token_file) if token_file else None


def check(listen: str | None, token_file: str | None) -> None:
    """The mains' argument check: what `serve` would refuse, refused before anything starts."""
    if listen:
        settings(listen, token_file)
    elif token_file:
        raise MetricsConfigError(TOKEN_FLAG, f"needs {LISTEN_FLAG}")


def serve(listen: str | None, token_file: str | None = None) -> int | None:
    """Serve /metrics on host:port from a daemon thread; returns the bound port, or None when listen is
    empty. MetricsConfigError as `check`; OSError when the address cannot be bound."""
    if not listen:
        return None
    host, port, token = settings(listen, token_file)
    server = MetricsServer(host, port, token)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server.port


_Request = socket.socket | tuple[bytes, socket.socket]


class MetricsServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """The server; `serve_forever` in a thread of the caller's, `shutdown` and `server_close` to stop."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, host: str, port: int, token: bytes | None, *, timeout: float = DEFAULT_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS, registry: CollectorRegistry = REGISTRY) -> None:
        self.token = token
        self.client_timeout = timeout
        self.max_connections = max_connections
        self.registry = registry
        self.active = 0
        self._lock = threading.Lock()
        self.address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        super().__init__((host, port), _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def process_request(self, request: _Request, client_address: Any) -> None:
        with self._lock:
            full = self.active >= self.max_connections
            if not full:
                self.active += 1
        if full:
            self.shutdown_request(request)  # closed at once: no thread, no read
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release()
            raise

    def process_request_thread(self, request: _Request, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release()

    def _release(self) -> None:
        with self._lock:
            self.active -= 1

    def handle_error(self, request: _Request, client_address: Any) -> None:
        # Not BaseServer's traceback on stderr, where the daemons write JSON logs; a client gone
        # (reset, broken pipe, its timeout) is no news.
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            log.debug("metrics_client_gone", client=str(client_address), error=str(exc))
        else:
            log.warning("metrics_request_failed", client=str(client_address), error=repr(exc))


def _read_head(conn: socket.socket, timeout: float) -> bytes:
    """The request line and headers, read within `timeout` seconds in all (a client that trickles a
    byte at a time is dropped as one that sends nothing); b"" to drop the connection."""
    deadline = time.monotonic() + timeout
    head = b""
    while b"\r\n\r\n" not in head and b"\n\n" not in head:
        left = deadline - time.monotonic()
        if left <= 0 or len(head) > MAX_HEAD_BYTES:
            return b""
        conn.settimeout(left)
        try:
            chunk = conn.recv(4096)
        except OSError:  # the timeout, or a reset
            return b""
        if not chunk:
            return b""
        head += chunk
    conn.settimeout(timeout)  # for sending the answer: sendall's timeout bounds the whole answer
    return head


class _Handler(http.server.BaseHTTPRequestHandler):
    server: MetricsServer
    server_version = "tessera-metrics"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # never read: the head comes from _read_head, under its deadline
        self.rfile = io.BytesIO(_read_head(self.connection, self.server.client_timeout))

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        if not self._authorized():
            self._reply(401, b"401 unauthorized: Authorization: Bearer <token> required\n",
                        {"WWW-Authenticate": 'Bearer realm="tessera-metrics"'})
            return False
        if self.command not in ("GET", "HEAD"):
            self._reply(405, b"405 method not allowed\n", {"Allow": "GET, HEAD"})
            return False
        return True

    def _authorized(self) -> bool:
        token = self.server.token
        if token is None:
            return True
        scheme, _, given = (self.headers.get("Authorization") or "").strip().partition(" ")
        try:
            raw = given.strip().encode("latin-1")
        except UnicodeEncodeError:
            return False
        return scheme.lower() == "bearer" and hmac.compare_digest(raw, token)

    def do_GET(self) -> None:
        if urlsplit(self.path).path != PATH:
            self._reply(404, b"404 not found: only /metrics is served\n")
            return
        self._reply(200, generate_latest(self.server.registry), {"Content-Type": CONTENT_TYPE_LATEST})

    do_HEAD = do_GET

    def _reply(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for name, value in {"Content-Type": "text/plain; charset=utf-8", **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no lines on stderr, where the daemons write JSON logs
