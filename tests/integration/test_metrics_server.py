"""The daemons' /metrics server (tessera.common.metrics) over real sockets on loopback: what it serves,
its bearer token, the loopback rule, the timeout on a slow client and the cap on connections; and the
three daemons' --metrics-listen / --metrics-token-file checks (docs/observability.md, "Metrics")."""

from __future__ import annotations

import http.client
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CONTENT_TYPE_LATEST

import tessera.common.tls  # noqa: F401 (registers tessera_transport_insecure, a tessera metric to find)
from tessera.common import metrics
from tessera.common.metrics import MetricsConfigError, MetricsServer

TOKEN = "s3cret-token-0123456789"

Start = Callable[..., MetricsServer]


@pytest.fixture
def start() -> Iterator[Start]:
    servers: list[MetricsServer] = []

    def _start(token: bytes | None = None, timeout: float = 5.0, max_connections: int = 16) -> MetricsServer:
        server = MetricsServer("127.0.0.1", 0, token, timeout=timeout, max_connections=max_connections)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield _start
    for server in servers:
        server.shutdown()
        server.server_close()


def request(port: int, path: str = "/metrics", method: str = "GET",
            headers: dict[str, str] | None = None) -> tuple[int, http.client.HTTPResponse, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp, resp.read()
    finally:
        conn.close()


def token_file(tmp_path: Path, text: str = TOKEN + "\n", mode: int = 0o600) -> str:
    path = tmp_path / "metrics.token"
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def closed_by_peer(sock: socket.socket, within: float) -> bool:
    """True once the server closed `sock` (EOF or reset), False if it stayed open `within` seconds."""
    sock.settimeout(within)
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def until(cond: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_metrics_answers_with_the_tessera_metrics(start: Start) -> None:
    port = start().port
    status, resp, body = request(port)
    assert status == 200 and resp.getheader("Content-Type") == CONTENT_TYPE_LATEST
    assert b"tessera_transport_insecure" in body
    assert request(port, "/metrics?x=1")[0] == 200
    status, resp, body = request(port, method="HEAD")
    assert status == 200 and body == b"" and int(resp.getheader("Content-Length") or 0) > 0


def test_only_get_and_head_of_metrics(start: Start) -> None:
    port = start().port
    for path in ("/", "/metrics/", "/metricsx", "/debug", "/../metrics"):
        status, _, body = request(port, path)
        assert status == 404, path
        assert b"tessera_" not in body
    for method in ("POST", "PUT", "DELETE", "OPTIONS", "BREW"):
        status, resp, body = request(port, method=method)
        assert status == 405 and resp.getheader("Allow") == "GET, HEAD", method
        assert b"tessera_" not in body


def test_the_bearer_token(start: Start, tmp_path: Path) -> None:
    _, _, token = metrics.settings("127.0.0.1:0", token_file(tmp_path, f"  {TOKEN}\n\n"))
    assert token == TOKEN.encode()
    port = start(token=token).port
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {TOKEN}x"},
                    {"Authorization": f"Basic {TOKEN}"}, {"Authorization": TOKEN}, {"Authorization": "Bearer "}):
        status, resp, body = request(port, headers=headers)
        assert status == 401, headers
        assert (resp.getheader("WWW-Authenticate") or "").startswith("Bearer")
        assert b"tessera_" not in body
    assert request(port, "/elsewhere")[0] == 401  # nothing said about paths without the token
    status, _, body = request(port, headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and b"tessera_transport_insecure" in body
    assert request(port, headers={"Authorization": f"bearer {TOKEN}"})[0] == 200  # the scheme is case-blind
    assert request(port, "/elsewhere", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 404


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0", "10.1.2.3:9451", "gpu-07.rack2:9451"])
def test_a_host_other_than_loopback_needs_a_token(listen: str, tmp_path: Path) -> None:
    with pytest.raises(MetricsConfigError, match="--metrics-listen: .* give --metrics-token-file"):
        metrics.serve(listen)  # refused before binding anything
    assert metrics.settings(listen, token_file(tmp_path))[2] == TOKEN.encode()


@pytest.mark.parametrize("listen", ["127.0.0.1:9451", "127.0.0.2:9451", "[::1]:9451", "localhost:9451", ":9451"])
def test_loopback_needs_no_token(listen: str) -> None:
    assert metrics.settings(listen, None)[2] is None


def test_the_token_file_is_checked(tmp_path: Path) -> None:
    def refused(path: str) -> str:
        with pytest.raises(MetricsConfigError) as err:
            metrics.check("0.0.0.0:9451", path)
        assert err.value.flag == "--metrics-token-file"
        return str(err.value)

    assert "cannot read" in refused(str(tmp_path / "missing"))
    assert "empty" in refused(token_file(tmp_path, " \n"))
    assert "mode 0644" in refused(token_file(tmp_path, mode=0o644))
    assert "mode 0620" in refused(token_file(tmp_path, mode=0o620))
    assert "one word" in refused(token_file(tmp_path, "two words\n"))
    metrics.check("0.0.0.0:9451", token_file(tmp_path, mode=0o640))  # a group the scraper is in may read it
    with pytest.raises(MetricsConfigError, match="needs --metrics-listen"):
        metrics.check("", token_file(tmp_path))
    with pytest.raises(MetricsConfigError, match="is not HOST:PORT"):
        metrics.check("nope", None)


def test_a_partial_request_is_dropped_after_the_timeout(start: Start) -> None:
    server = start(timeout=0.5)
    t0 = time.monotonic()  # before the server can start its clock
    with socket.create_connection(("127.0.0.1", server.port)) as silent:
        silent.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")  # a head never finished (the audit's flood)
        assert closed_by_peer(silent, within=10)
        assert 0.5 <= time.monotonic() - t0 < 5
    # Trickling a byte at a time does not extend it: the timeout bounds the whole head.
    with socket.create_connection(("127.0.0.1", server.port)) as trickle:
        t0, closed = time.monotonic(), False
        while not closed and time.monotonic() - t0 < 10:
            try:
                trickle.send(b"X")
            except OSError:  # reset or broken pipe: closed
                break
            readable, _, _ = select.select([trickle], [], [], 0.1)
            closed = bool(readable) and closed_by_peer(trickle, within=1)
        assert time.monotonic() - t0 < 5
    until(lambda: server.active == 0)


def test_connections_past_the_cap_are_closed_at_once(start: Start) -> None:
    server = start(timeout=30, max_connections=3)
    held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
    try:
        until(lambda: server.active == 3)
        with socket.create_connection(("127.0.0.1", server.port)) as extra:
            assert closed_by_peer(extra, within=3)  # not the 30 s timeout: at once
        held.pop().close()
        until(lambda: server.active == 2)
        assert request(server.port)[0] == 200  # room again
    finally:
        for s in held:
            s.close()


# The daemons refuse a bad --metrics-listen / --metrics-token-file with their one-line usage error.

Parse = Callable[[list[str], Path], None]


def _controller(argv: list[str], tmp: Path) -> None:
    from tessera.controller.main import parse_args
    parse_args(["--insecure", "--state-dir", str(tmp / "state"), *argv])


def _estimator(argv: list[str], tmp: Path) -> None:
    from tessera.estimator.service.main import parse_args
    parse_args(["--insecure", *argv])


def _agent(argv: list[str], tmp: Path) -> None:
    from tessera.nodeagent.main import parse_config
    parse_config(["--controller", "ctl:50051", "--node-id", "n1", "--work-dir", str(tmp / "work"), "--insecure",
                  *argv])


def _usage_error(parse: Parse, argv: list[str], tmp: Path, capsys: pytest.CaptureFixture[str]) -> str:
    from tessera.nodeagent.main import AgentUsageError
    try:
        parse(argv, tmp)
    except SystemExit as exc:
        assert exc.code == 2
        return capsys.readouterr().err.strip().splitlines()[-1]
    except AgentUsageError as exc:
        return str(exc)
    raise AssertionError(f"{argv} accepted")


@pytest.mark.parametrize("parse", [_controller, _estimator, _agent], ids=["controller", "estimator", "agent"])
def test_the_daemons_check_the_flags(parse: Parse, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    public = ["--metrics-listen", "0.0.0.0:9451"]
    assert "--metrics-listen: 0.0.0.0 is reachable from other machines" in _usage_error(parse, public, tmp_path,
                                                                                         capsys)
    missing = str(tmp_path / "missing")
    assert f"--metrics-token-file: {missing}: cannot read" in _usage_error(
        parse, [*public, "--metrics-token-file", missing], tmp_path, capsys)
    loose = token_file(tmp_path, mode=0o644)
    assert "mode 0644" in _usage_error(parse, [*public, "--metrics-token-file", loose], tmp_path, capsys)
    os.chmod(loose, 0o600)
    parse([*public, "--metrics-token-file", loose], tmp_path)
    parse(["--metrics-listen", "127.0.0.1:9451"], tmp_path)
