"""The dashboard without a browser: its HTTP handlers' authorization (the Controller API's tokens,
roles and tenant rules), the HTTP layer's refusals over a real socket, the history it samples, and
the --dashboard-addr checks. tests/e2e/test_dashboard_browser.py drives it in Chromium."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tessera.common.tokens import ADMIN, ANONYMOUS, USER, TokenEntry, hash_token, write_tokens_file
from tessera.controller.auth import InsecureAuthenticator, TokenAuthenticator
from tessera.controller.dashboard import charts, options, pages
from tessera.controller.dashboard.data import Forecast, forecast_fields, forecast_of
from tessera.controller.dashboard.history import History, ProgressHistory
from tessera.controller.dashboard.http import MAX_PER_PEER, Request, Response
from tessera.controller.dashboard.server import Dashboard
from tessera.controller.main import parse_args
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2
from tests.unit.test_engine import Harness, tiny

TOKENS = {"root": ("admin-token", "default", ADMIN), "alice": ("alice-token", "team-a", USER),
          "bob": ("bob-token", "team-b", USER)}


def get(path: str, token: str = "", cookie: str = "") -> Request:
    path, _, q = path.partition("?")
    query = dict(kv.split("=", 1) for kv in q.split("&") if kv)
    headers: list[tuple[str, str]] = []
    if token:
        headers.append(("authorization", f"Bearer {token}"))
    if cookie:
        headers.append(("cookie", f"theme=dark; tessera_token={cookie}"))
    return Request("GET", path, query, tuple(headers))


async def cluster(tmp_path: Path, secure: bool = True) -> tuple[Harness, Dashboard, dict[str, str]]:
    """Two nodes, a job of team-a running and one of team-b pending."""
    h = Harness()
    await h.register("a", "b")
    tokens = tmp_path / "tokens.yaml"
    write_tokens_file(tokens, [TokenEntry(n, t, r, hash_token(tok)) for n, (tok, t, r) in TOKENS.items()])
    d = Dashboard(TokenAuthenticator(tokens) if secure else InsecureAuthenticator())
    d.engine = h.engine
    ids = {}
    spec = tiny("mine")
    spec.tenant = "team-a"
    ids["a"] = await h.submit(spec)
    await h.round()
    other = tiny("theirs", gpus=64)  # more GPUs than the cluster has: stays pending
    other.tenant = "team-b"
    ids["b"] = await h.submit(other)
    return h, d, ids


async def test_every_page_and_api_refuses_a_caller_without_a_valid_token(tmp_path: Path) -> None:
    _, d, ids = await cluster(tmp_path)
    for path in ("/", "/nodes", "/jobs", f"/jobs/{ids['a']}", "/api/capacity", "/api/nodes", "/api/jobs",
                 f"/api/jobs/{ids['a']}"):
        for req in (get(path), get(path, token="not-a-token"), get(path, cookie="not-a-token")):
            resp = await d.handle(req)
            assert resp.status == 401, (path, resp.status)
            assert ids["a"].encode() not in resp.body and b"mine" not in resp.body
            if path.startswith("/api/"):
                assert json.loads(resp.body)["code"] == "UNAUTHENTICATED"
            else:
                assert b'id="token"' in resp.body  # the sign-in form
    # Only the sign-in page and the static files answer without a token.
    for path in ("/login", "/static/app.js", "/static/style.css"):
        assert (await d.handle(get(path))).status == 200
    assert (await d.handle(get("/static/../server.py"))).status == 404


async def test_tokens_roles_and_tenants_are_the_apis(tmp_path: Path) -> None:
    _, d, ids = await cluster(tmp_path)
    # Admin, by header or by the sign-in cookie: everything.
    for req in (get("/api/jobs", token="admin-token"), get("/api/jobs", cookie="admin-token")):
        resp = await d.handle(req)
        assert resp.status == 200 and {j["id"] for j in json.loads(resp.body)["jobs"]} == set(ids.values())
    # A user sees its tenant's jobs only; another tenant's job is 404, word for word a missing one.
    resp = await d.handle(get("/api/jobs", token="alice-token"))
    assert [j["id"] for j in json.loads(resp.body)["jobs"]] == [ids["a"]]
    page = await d.handle(get("/jobs", token="alice-token"))
    assert page.status == 200 and ids["a"].encode() in page.body and ids["b"].encode() not in page.body
    hidden = await d.handle(get(f"/api/jobs/{ids['b']}", token="alice-token"))
    missing = await d.handle(get("/api/jobs/j-doesnotexist", token="alice-token"))
    assert hidden.status == missing.status == 404
    assert json.loads(hidden.body)["error"].replace(ids["b"], "ID") == \
        json.loads(missing.body)["error"].replace("j-doesnotexist", "ID")
    assert (await d.handle(get(f"/jobs/{ids['b']}", token="alice-token"))).status == 404
    # Naming another tenant is refused, as ListJobs refuses it.
    assert (await d.handle(get("/api/jobs?tenant=team-b", token="alice-token"))).status == 403
    # Nodes are shared: a user reads them (ListNodes is a USER method).
    nodes = json.loads((await d.handle(get("/api/nodes", token="bob-token"))).body)["nodes"]
    assert {n["id"] for n in nodes} == {"a", "b"}
    # The job page: its events, Cell and placement.
    job = await d.handle(get(f"/jobs/{ids['a']}", token="alice-token"))
    assert job.status == 200
    for text in (b"SUBMITTED", b"PLACED", b"Placement", b"A10"):
        assert text in job.body, text
    # A diverged job's NaN loss is null in the JSON (which has no NaN), not an error.
    d.history.progress.add(ids["a"], P.Progress(iteration=3, loss=float("nan"), time=5.0))
    curve = await d.handle(get(f"/api/jobs/{ids['a']}", token="alice-token"))
    assert curve.status == 200 and json.loads(curve.body)["progress_history"][-1]["loss"] is None
    # Bad input: a clear 400 naming the field.
    bad = await d.handle(get("/api/jobs?state=sleeping", token="admin-token"))
    assert bad.status == 400 and "state" in json.loads(bad.body)["error"]
    assert (await d.handle(get("/api/jobs/x%2F..", token="admin-token"))).status in (400, 404)


async def test_without_tokens_the_dashboard_is_open_as_the_api_is(tmp_path: Path) -> None:
    _, d, _ids = await cluster(tmp_path, secure=False)
    resp = await d.handle(get("/api/jobs"))
    assert resp.status == 200 and len(json.loads(resp.body)["jobs"]) == 2


async def test_a_standby_answers_503(tmp_path: Path) -> None:
    d = Dashboard(InsecureAuthenticator(), standby_reason="standby")
    assert (await d.handle(get("/jobs"))).status == 503


async def raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    writer.write_eof()  # a peer that sends nothing more (the server must not wait for more)
    await writer.drain()
    out = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return out


async def test_the_http_layer_refuses_what_is_not_a_plain_get() -> None:
    async def handler(req: Request) -> Response:
        return Response(200, f"path={req.path}".encode())

    d = Dashboard(InsecureAuthenticator())
    d.server.handler = handler
    port = await d.start("127.0.0.1:0")
    try:
        ok = await raw(port, b"GET /x?a=1 HTTP/1.1\r\nHost: h\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200") and ok.endswith(b"path=/x")
        assert b"Content-Security-Policy: default-src 'none'; script-src 'self'" in ok
        head = await raw(port, b"HEAD /x HTTP/1.1\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")
        post = await raw(port, b"POST /x HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi")
        assert post.startswith(b"HTTP/1.1 405") and b"Allow: GET, HEAD" in post
        assert (await raw(port, b"GET /x HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")).startswith(b"HTTP/1.1 400")
        assert (await raw(port, b"GET /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")).startswith(b"HTTP/1.1 400")
        assert (await raw(port, b"GET x HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 400")
        # urlsplit reads "//x/nodes" as the host x and the path /nodes: a target is one "/" and a path
        for target in (b"//x/nodes", b"//x", b"///nodes"):
            assert (await raw(port, b"GET " + target + b" HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 400"), target
        assert (await raw(port, b"GET /x//y HTTP/1.1\r\n\r\n")).endswith(b"path=/x//y")
        assert (await raw(port, b"nonsense\r\n\r\n")).startswith(b"HTTP/1.1 400")
        assert (await raw(port, b"GET /%ff HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 400")
        big = b"GET / HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n"
        assert (await raw(port, big)).startswith(b"HTTP/1.1 431")
        assert await raw(port, b"GET / HTTP/1.1\r\n") == b""  # closed before the head ended: no answer
    finally:
        await d.close()


def test_progress_history_is_bounded_and_keeps_the_whole_curve() -> None:
    h = ProgressHistory(max_points=10, max_jobs=2)
    for i in range(1, 101):
        h.add("j1", P.Progress(iteration=i, loss=1.0 / i, time=float(i)))
    pts = h.points("j1")
    assert len(pts) <= 10 and pts[0].iteration == 1 and pts[-1].iteration == 100
    assert [p.iteration for p in pts] == sorted(p.iteration for p in pts)
    # A resumed attempt (from an older checkpoint) continues the curve from there.
    h.add("j1", P.Progress(iteration=95, loss=0.5, time=200.0))
    assert h.points("j1")[-1].iteration == 95 and all(p.iteration <= 95 for p in h.points("j1"))
    h.add("j2", P.Progress(iteration=1, time=1.0))
    h.add("j3", P.Progress(iteration=1, time=1.0))
    assert h.points("j1") == [] and h.points("j3")  # the least recently reported job forgotten


def test_capacity_is_sampled_per_round_and_at_least_every_floor() -> None:
    hist = History(floor_s=120)
    calls = []

    def tally() -> dict[tuple[str, str], int]:
        calls.append(1)
        return {("A100", "allocated"): 2, ("A100", "free"): 6}

    hist.observe(1000, 1, tally, {})
    hist.observe(1010, 1, tally, {})  # same round, within the floor: no sample
    hist.observe(1020, 2, tally, {})  # a new round
    hist.observe(1200, 2, tally, {})  # the floor passed
    assert [s.time for s in hist.capacity.samples] == [1000, 1020, 1200] and len(calls) == 3
    assert hist.capacity.samples[-1].gpus == {"A100": {"allocated": 2, "free": 6, "unavailable": 0}}


def test_a_forecast_is_read_when_the_proto_has_one() -> None:
    job = controller_pb2.Job(id="j")
    assert forecast_of(job) == Forecast() and not forecast_of(job).known
    if "forecast" not in forecast_fields():  # a build without forecasts: nothing to read, nothing shown
        assert forecast_fields() == []
        return
    fc = job.forecast
    fc.start_time, fc.end_time, fc.end_low, fc.end_high, fc.note = 1000.0, 2000.0, 1800.0, 2400.0, "replayed"
    assert forecast_of(job) == Forecast(start=1000.0, end=2000.0, end_low=1800.0, end_high=2400.0, note="replayed")
    fc.end_time = float("nan")  # hostile or broken values are no forecast, never an error
    assert forecast_of(job).end == 0.0


@pytest.mark.parametrize(("argv", "problem"), [
    (["--dashboard-addr", "0.0.0.0:8080"], "without --tokens"),
    (["--dashboard-addr", "nonsense"], "not HOST:PORT"),
    (["--dashboard-addr", "127.0.0.1:99999"], "not HOST:PORT"),
])
def test_dashboard_addr_checks(argv: list[str], problem: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--state-dir", "/tmp/x", *argv])
    assert problem in capsys.readouterr().err


def test_dashboard_addr_defaults_off_and_allows_loopback(tmp_path: Path) -> None:
    assert parse_args(["--state-dir", "/tmp/x", "--insecure"]).dashboard_addr == ""
    assert parse_args(["--state-dir", "/tmp/x", "--insecure", "--dashboard-addr", "127.0.0.1:0"]).dashboard_addr
    assert options.is_loopback("[::1]") and options.is_loopback("localhost") and not options.is_loopback("10.0.0.1")
    tokens = tmp_path / "t.yaml"
    tokens.write_text("tokens: []\n")
    assert parse_args(["--state-dir", "/tmp/x", "--insecure", "--tokens", str(tokens), "--dashboard-addr", "0.0.0.0:8080"])


def test_pages_escape_what_jobs_carry_and_draw_forecasts_apart_from_what_happened() -> None:
    now = 2000.0
    running = controller_pb2.Job(id="j-1", state=P.JOB_STATE_RUNNING, start_time=1000, spec=P.JobSpec(name="r"))
    pending = controller_pb2.Job(id="j-2", state=P.JOB_STATE_PENDING, submit_time=900, spec=P.JobSpec(name="p"))
    done = controller_pb2.Job(id="j-3", state=P.JOB_STATE_SUCCEEDED, start_time=900, end_time=1500,
                              reason="<script>alert(1)</script>", spec=P.JobSpec(name="<b>x</b>"))
    if "forecast" in forecast_fields():
        running.forecast.end_time, running.forecast.end_low, running.forecast.end_high = 2500, 2400, 2700
        pending.forecast.start_time, pending.forecast.end_time = 2500, 3000
    html = pages.jobs_page(ANONYMOUS, [running, pending, done], "", now)
    assert "<b>x" not in html and "<script>alert" not in html and "&lt;script&gt;alert(1)" in html
    assert html.count('class="bar done"') == 1
    if "forecast" in forecast_fields():
        # The running job: solid up to now, pale and dashed after; the pending one: forecast only.
        assert html.count('class="bar running"') == 1 and html.count('class="bar running forecast"') == 1
        assert html.count('class="bar pending') == 1 and 'class="bar pending forecast"' in html
        assert html.count('class="band"') == 3  # the running job's end band: a line and two ticks
    if "forecast" in forecast_fields():
        page = pages.job_page(ANONYMOUS, pending, [], now)
        assert "starts ~" in page and "ends ~" in page


BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def test_direction_controls_from_jobs_and_nodes_cannot_reorder_the_page() -> None:
    # U+202E (right-to-left override) reverses what follows it up to the end of the paragraph: a
    # reason "\u202eexe.gnp" reads as "png.exe", and a name could turn its row's other cells around.
    evil = "ok \u202eexe.gnp"
    job = controller_pb2.Job(id="j-1", state=P.JOB_STATE_RUNNING, start_time=1000, reason=evil, cell="c\u2067",
                             spec=P.JobSpec(name=evil, tenant="team\u202d"))
    job.events.add(time=1000, kind="FAILED\u202e", message=evil)
    node = controller_pb2.Node(id="n1", address="10.0.0.1\u202e", reason=evil, agent_version="1\u2066",
                               state=P.NODE_STATE_READY)
    for page in (pages.jobs_page(ANONYMOUS, [job], "", 2000.0), pages.job_page(ANONYMOUS, job, [], 2000.0),
                 pages.nodes_page(ANONYMOUS, [node], {"n1": [("j-1", evil, (0,))]}, 2000.0)):
        assert not any(c in page for c in BIDI)  # shown, not obeyed; in cells, titles and the SVG alike
        assert "<bdi>ok [U+202E]exe.gnp</bdi>" in page  # and isolated from its neighbours
    assert "<bdi>FAILED[U+202E]</bdi>" in pages.job_page(ANONYMOUS, job, [], 2000.0)
    assert pages.e("\u200fHebrew \u05d0") == "\u200fHebrew \u05d0"  # marks and right-to-left letters stay


def test_a_loss_curve_spanning_every_float_is_said_not_drawn() -> None:
    # a worker reported 1e308, then -1e308: the chart's span overflowed and the job page was a 500
    html = charts.line_chart("Loss", [0.0, 1.0, 2.0], [1e308, -1e308, 1.0], "iteration", "loss")
    assert "span more than a chart can show" in html
    assert "<polyline" in charts.line_chart("Loss", [0.0, 1.0], [2.0, 1.0], "iteration", "loss")


async def test_open_mode_answers_only_requests_for_localhost(tmp_path: Path) -> None:
    _, d, _ids = await cluster(tmp_path, secure=False)
    for host in ("localhost:8080", "127.0.0.1:8080", "[::1]:8080"):
        req = get("/api/jobs")
        assert (await d.handle(Request(req.method, req.path, req.query, (("host", host),)))).status == 200
    for host in ("attacker.example:8080", "127.0.0.1.attacker.example"):  # DNS rebinding
        req = get("/api/jobs")
        assert (await d.handle(Request(req.method, req.path, req.query, (("host", host),)))).status == 421
    (tmp_path / "s").mkdir()
    _, secure, _ = await cluster(tmp_path / "s")  # with tokens the Host is the operator's to choose
    req = get("/api/nodes", token="admin-token")
    assert (await secure.handle(Request(req.method, req.path, req.query,
                                        (*req.headers, ("host", "ctl.example.com:8443"))))).status == 200


async def test_one_address_holds_at_most_its_share_of_connections() -> None:
    async def handler(req: Request) -> Response:
        return Response(200, b"ok", headers=[("Cache-Control", "max-age=300")])

    d = Dashboard(InsecureAuthenticator())
    d.server.handler = handler
    port = await d.start("127.0.0.1:0")
    held = []
    try:
        for _ in range(MAX_PER_PEER):  # heads never finished
            _r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET / HTTP/1.1\r\n")
            await w.drain()
            held.append(w)
        refused = await raw(port, b"GET / HTTP/1.1\r\n\r\n")
        assert refused.startswith(b"HTTP/1.1 503") and refused.endswith(b"too many connections from this address\n")
        for w in held:
            w.close()
        for _ in range(100):  # the server sees the closes; then the address has its slots back
            ok = await raw(port, b"GET / HTTP/1.1\r\n\r\n")
            if ok.startswith(b"HTTP/1.1 200"):
                break
            await asyncio.sleep(0.05)
        assert ok.startswith(b"HTTP/1.1 200")
        assert ok.count(b"Cache-Control:") == 1 and b"Cache-Control: max-age=300" in ok  # the response's own
    finally:
        await d.close()


def test_a_time_no_calendar_shows_is_a_dash_not_a_500() -> None:
    """A forecast end of 5e18 (an opaque job's own step time) made /jobs answer 500 (gmtime's
    OverflowError); the forecast now stops at 10 years, and the pages show '-' for such a time."""
    from tessera.controller.dashboard import charts, pages

    for t in (5e18, float("inf"), float("nan")):
        assert pages.when(t) == "-" and charts.clock(t) == "-"


def test_the_loop_budget_refuses_once_renders_took_their_share() -> None:
    from tessera.controller.dashboard.budget import LoopBudget

    now = [100.0]
    b = LoopBudget(share=0.25, window_s=1.0, clock=lambda: now[0])
    for _ in range(4):  # four renders of 0.05 s within the second: 0.2 s, under 0.25 s
        assert not b.exhausted()
        start = now[0]
        now[0] += 0.05
        b.spend(start)
    start = now[0]
    now[0] += 0.1
    b.spend(start)
    assert b.exhausted()  # 0.3 s of the last second
    now[0] += 0.95  # the first renders leave the window
    assert not b.exhausted()


async def test_a_dashboard_over_its_loop_budget_answers_503_at_once(tmp_path: Path) -> None:
    """16 connections pulling /api/jobs back to back took the controller's loop (ListNodes 1 ms ->
    721 ms); past its share a request gets 503 with Retry-After, before any render."""
    from tessera.controller.dashboard.budget import LoopBudget

    _, d, _ = await cluster(tmp_path, secure=False)
    now = [0.0]
    d.budget = LoopBudget(share=0.25, window_s=1.0, clock=lambda: now[0])
    d.budget.spend(-0.3)  # a render of 0.3 s just ended
    busy = await d.handle(get("/api/jobs"))
    assert busy.status == 503 and ("Retry-After", "1") in busy.headers
    assert (await d.handle(get("/static/app.js"))).status == 200  # static files cost nothing
    now[0] = 2.0
    assert (await d.handle(get("/api/jobs"))).status == 200


def test_the_nodes_page_says_how_each_node_isolates_gpus() -> None:
    nodes = [controller_pb2.Node(id="n1", gpu_isolation=P.GPU_ISOLATION_DEVICE_CGROUPS),
             controller_pb2.Node(id="n2")]
    html = pages.nodes_page(ANONYMOUS, nodes, {}, 2000.0)
    assert "GPU isolation</th>" in html
    assert "<td>cgroups</td>" in html and html.count("<td>-</td>") >= 1


def test_the_nodes_page_shows_gpus_left_out_struck_out_with_why() -> None:
    inv = P.NodeInventory(gpus=[P.Gpu(index=0, model="A100-80GB", memory_bytes=80 * 2**30)],
                          left_out=[P.LeftOutGpu(index=1, uuid="GPU-1", model="A100-80GB", reason="MIG mode is on: <b>")])
    html = pages.nodes_page(ANONYMOUS, [controller_pb2.Node(id="n1", inventory=inv)], {}, 2000.0)
    assert '<span class="gpu idle"' in html
    assert '<span class="gpu out" title="left out: MIG mode is on: &lt;b&gt;">1: <bdi>A100-80GB</bdi></span>' in html
