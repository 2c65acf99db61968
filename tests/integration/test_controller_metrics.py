"""The controller serves Prometheus metrics, without job ids as labels."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from tessera.clients.sdk import Client
from tessera.v1 import common_pb2 as P
from tests.procs import start_controller, wait_for


def test_metrics_endpoint(tmp_path: Path) -> None:
    d = start_controller(tmp_path / "state", "--metrics-listen", "127.0.0.1:0")
    try:
        port = d.wait_event("controller_started")["metrics_port"]
        with Client(d.address, token=d.token) as c:
            c.submit(P.JobSpec(name="m", model=P.ModelSpec(name="gpt2-small"), global_batch_size=8, iterations=1))

        def scrape() -> str:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()

        def pending_counted() -> str | None:
            t = scrape()
            return t if 'tessera_jobs{state="pending"} 1.0' in t else None

        text = wait_for(pending_counted, 30, "the jobs gauge to count the pending job")
        assert "tessera_jobs_submitted_total 1.0" in text
        assert "tessera_round_seconds_count" in text and "tessera_queue_length 1.0" in text
        assert "j-" not in text
    finally:
        d.stop()
