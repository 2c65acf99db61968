"""The web dashboard in a real browser: Debian's headless Chromium driven by Playwright (no browser
download: `executable_path` is the system's), against a real controller with a declared agent and
a submitted job. Pages load, the job list shows the job, its page shows its events, and nothing is
logged to the browser's console as an error (the CSP, scripts, resources) (docs/dashboard.md).

Without a browser the test is skipped, saying why, except under CI=true, where it fails: CI must
run it (scripts/setup.sh installs chromium and the dev extra Playwright).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.v1 import common_pb2 as P
from tests.e2e.cluster import Cluster

pytestmark = pytest.mark.slow

TIMEOUT_MS = 30_000  # generous: two loaded cores, a browser and a cluster at once


def chromium() -> str:
    return os.environ.get("TESSERA_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser") or ""


@pytest.fixture
def browser() -> Iterator[Any]:
    why = ""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        why = "Playwright is not installed (the dev extra has it: pip install -e '.[dev]')"
    if not why and not chromium():
        why = "no chromium on PATH (scripts/setup.sh installs Debian's chromium; or set TESSERA_CHROMIUM)"
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the dashboard's browser test must run under CI: {why}")
        pytest.skip(why)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


def test_dashboard_pages_in_chromium(cluster_factory, browser, worker_dir: Path) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([("node-a", "a40-node.yaml")], controller_args=("--dashboard-addr", "127.0.0.1:0"))
    started = cl.controller.wait_event("dashboard_started")
    base = f"{started['scheme']}://127.0.0.1:{started['port']}"
    with cl.client() as c:
        spec = P.JobSpec(name="hello-dashboard", entrypoint=["{python}", "-c", "print('hello from the job')"])
        job = c.submit(spec)
        c.wait(job.id, {"SUCCEEDED"}, timeout=120)

    # The controller's certificate is of the dev PKI (localcluster): not one the browser knows.
    ctx = browser.new_context(ignore_https_errors=True)
    ctx.set_default_timeout(TIMEOUT_MS)
    page = ctx.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning")
            else None)
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))

    # Sign in with the admin token through the page's own form (the cookie it sets carries it).
    resp = page.goto(f"{base}/login")
    assert resp is not None and resp.status == 200
    page.fill("#token", cl.controller.token or "")
    page.click("#signin")
    page.wait_for_url(f"{base}/")
    page.evaluate("sessionStorage.setItem('tessera-autorefresh', 'off')")  # no reload in the middle of a step
    page.wait_for_selector("#summary")
    assert page.inner_text("#summary") == "1 node (ready 1)."
    page.wait_for_selector("table.gpus")
    assert "A40" in page.inner_text("table.gpus")

    page.goto(f"{base}/nodes")
    page.wait_for_selector("#node-node-a")
    assert "ready" in page.inner_text("table.nodes")

    page.goto(f"{base}/jobs")
    link = page.wait_for_selector(f'a.job[href="/jobs/{job.id}"]')
    assert "hello-dashboard" in page.inner_text("table.jobs")
    page.wait_for_selector("#gantt svg")
    assert link is not None
    link.click()
    page.wait_for_url(f"{base}/jobs/{job.id}")
    page.wait_for_selector("table.events")
    events = page.inner_text("table.events")
    for kind in ("SUBMITTED", "PLACED", "SUCCEEDED"):
        assert kind in events, events
    assert page.inner_text("#state") == "succeeded"

    # The JSON API answers the same job, with the signed-in cookie.
    api = page.request.get(f"{base}/api/jobs/{job.id}")
    assert api.status == 200 and api.json()["job"]["spec"]["name"] == "hello-dashboard"
    assert not problems, problems

    # Another browser without the token is refused and shown the sign-in form, on every page.
    anon = browser.new_context(ignore_https_errors=True).new_page()
    for path in ("/", "/nodes", "/jobs", f"/jobs/{job.id}"):
        r = anon.goto(base + path)
        assert r is not None and r.status == 401
        assert anon.query_selector("#token") is not None and "hello-dashboard" not in anon.content()
    anon.context.close()
    ctx.close()

