"""Screenshots of every dashboard page for docs/dashboard.md, taken with the browser the tests use
(Debian's chromium, driven by Playwright).

A local cluster (the demo's four nodes with declared GPUs: A100, A40, two A10) runs the example
jobs for real on CPU; once the first ones have finished and one waits for GPUs the cluster lacks,
each page is captured into docs/images/dashboard-*.png.

    .venv/bin/python scripts/dashboard_screenshots.py [--out docs/images] [--state DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import ssl
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tessera.clients.jobfile import load_job_file
from tessera.clients.sdk import Client
from tessera.common.localcluster import REPO, kill_strays, start_agent, start_controller, use_pki, wait_for
from tessera.common.workerusers import worker_python
from tessera.v1 import common_pb2 as P

NODES = [("node-a100", "a100-node.yaml"), ("node-a40", "a40-node.yaml"), ("node-a10", "a10-node.yaml"),
         ("node-a10b", "a10-node.yaml")]
JOBS = ["tiny", "small", "medium", "huge"]
# Jobs of 4 GPUs each, more than the cluster holds at once: some wait, with forecasts of their start.
QUEUED = 5
VIEWPORT = {"width": 1280, "height": 860}


def chromium() -> str:
    return os.environ.get("TESSERA_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser") or ""


def api(base: str, path: str, token: str) -> dict:  # type: ignore[type-arg]
    req = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"})
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # the dev PKI's certificate; loopback only
    with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(REPO / "docs" / "images"), help="where the PNG files go")
    p.add_argument("--state", default="", help="the cluster's state and logs (default: a temporary folder)")
    p.add_argument("--timeout", type=float, default=300, help="seconds to wait for the jobs")
    args = p.parse_args()
    if not chromium():
        print("dashboard_screenshots: no chromium (apt-get install chromium, or set TESSERA_CHROMIUM)", file=sys.stderr)
        return 1
    from playwright.sync_api import sync_playwright

    root = Path(args.state or tempfile.mkdtemp(prefix="tessera-shots-")).resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    root.chmod(0o755)  # agents run workers as nobody when started as root
    use_pki(root / "pki")
    daemons = []
    try:
        ctl = start_controller(root / "state", "--policy", "frenzy", "--dashboard-addr", "127.0.0.1:0")
        daemons.append(ctl)
        for node_id, inv in NODES:
            daemons.append(start_agent(ctl, node_id, REPO / "examples" / "inventories" / inv, root / node_id,
                                       "--worker-python", worker_python()))
        started = ctl.wait_event("dashboard_started")
        base = f"{started['scheme']}://127.0.0.1:{started['port']}"
        token = ctl.token or ""
        with Client(ctl.address, token=token) as c:
            wait_for(lambda: sum(n.state == P.NODE_STATE_READY for n in c.nodes()) == len(NODES), 60, "nodes READY")
            ids = {}
            for name in JOBS:
                ids[name] = c.submit(load_job_file(REPO / "examples" / "jobs" / f"{name}.yaml")).id
            tiny = load_job_file(REPO / "examples" / "jobs" / "tiny.yaml")
            for i in range(QUEUED):
                spec = P.JobSpec()
                spec.CopyFrom(tiny)
                spec.name, spec.iterations = f"queued-{i + 1}", 300
                spec.hint.gpus = 4
                c.submit(spec)
            for name in ("tiny", "small"):
                c.wait(ids[name], {"SUCCEEDED"}, timeout=args.timeout)

        def forecast_shown() -> bool:
            jobs = api(base, "/api/jobs?state=pending", token)["jobs"]
            return any(j.get("forecast", {}).get("start_time") for j in jobs)

        try:
            wait_for(forecast_shown, 120, "a pending job with a forecast start", interval=1.0)
        except TimeoutError as exc:  # a build without forecasts: the pages say so
            print(f"dashboard_screenshots: {exc}", file=sys.stderr)
        # The job page of the finished job with the longest loss curve the dashboard sampled.
        curves = {n: len(api(base, f"/api/jobs/{ids[n]}", token)["progress_history"]) for n in ("tiny", "small")}
        shown = max(curves, key=lambda n: curves[n])
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_context(ignore_https_errors=True, viewport=VIEWPORT).new_page()
            page.set_default_timeout(30_000)
            page.goto(f"{base}/login")
            page.fill("#token", token)
            page.click("#signin")
            page.wait_for_url(f"{base}/")
            page.evaluate("sessionStorage.setItem('tessera-autorefresh', 'off')")
            for name, path, ready in (("cluster", "/", "table.gpus"), ("nodes", "/nodes", "table.nodes"),
                                      ("jobs", "/jobs", "table.jobs"), ("job", f"/jobs/{ids[shown]}", "table.events")):
                page.goto(base + path)
                page.wait_for_selector(ready)
                page.screenshot(path=str(out / f"dashboard-{name}.png"), full_page=True)
                print(f"{out / f'dashboard-{name}.png'}: {base}{path}")
            browser.close()
    finally:
        for d in reversed(daemons):
            d.stop()
        kill_strays(root)
        if not args.state:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
