"""Forecasts in a live cluster (docs/forecasts.md): a real controller and one agent with two declared
A40s. A job that reports progress (the trainer SDK, 60 s per step claimed) holds both GPUs; a second
job waits for them. `describe` of the waiting job shows its forecast start at the first one's end.
Synchronised on job states and on the forecast appearing, never on sleeps."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest

from tessera.v1 import common_pb2 as P
from tests.e2e.cluster import Cluster
from tests.procs import tessctl, wait_for

pytestmark = pytest.mark.slow

# Reports iteration i with a 60 s step time every 0.2 s until the file argv[1] exists or a stop.
REPORTER = """\
import os, sys, time
from tessera.clients.trainer import TrainerContext
ctx = TrainerContext.from_env()
ctx.install_signal_handlers()
i = 0
while not ctx.stop_requested and not os.path.exists(sys.argv[1]):
    i += 1
    ctx.report(i, 1.0, 4.0, 60.0, force=True)
    time.sleep(0.2)
"""


def one_job(addr: str, job_id: str) -> dict:  # type: ignore[type-arg]
    doc = json.loads(tessctl(addr, "-o", "json", "get", "job", job_id).stdout)
    return doc["jobs"][0] if "jobs" in doc else doc  # type: ignore[no-any-return]


def when(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


def test_describe_shows_the_forecast_of_a_pending_job(cluster_factory, worker_dir: Path) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([("node-a", "a40-node.yaml")], controller_args=("--round-interval", "1"))
    addr = cl.controller.address
    script = worker_dir / "reporter.py"
    script.write_text(REPORTER)
    go = worker_dir / "go"
    with cl.client() as c:
        first = c.submit(P.JobSpec(name="holder", entrypoint=["{python}", str(script), str(go)], iterations=1000,
                                   hint=P.ResourceHint(gpus=2), workdir=str(worker_dir)))
        c.wait(first.id, {"RUNNING"}, timeout=60)
        second = c.submit(P.JobSpec(name="waiter", entrypoint=["{python}", "-c", "print(1)"],
                                    hint=P.ResourceHint(gpus=2), workdir=str(worker_dir)))

        def described() -> str | None:
            out = tessctl(addr, "describe", "job", second.id, check=False).stdout
            return out if "Forecast:" in out and "starts ~" in out else None

        text = wait_for(described, 60, "a forecast in describe")
        line = next(ln for ln in text.splitlines() if ln.startswith("Forecast:"))
        # The holder reports 60 s per step with ~1000 steps left: the waiter starts hours from now.
        assert "STATE" not in line and "no forecast: opaque job without progress" in line, line
        got = one_job(addr, second.id)
        start = when(got["forecast"]["start_time"])
        now = dt.datetime.now(dt.UTC).timestamp()
        assert 10 * 3600 < start - now < 17 * 3600, (start - now, got["forecast"])
        assert re.search(r"starts ~\d\d", line)
        # One answer holds both (the holder's forecast end moves 60 s per report): the waiter starts
        # at the holder's end, in the round its end kicks.
        both = {j["id"]: j["forecast"] for j in json.loads(tessctl(addr, "-o", "json", "get", "jobs").stdout)["jobs"]}
        assert abs(when(both[first.id]["end_time"]) - when(both[second.id]["start_time"])) < 1.0, both
        fc = c.forecast(second.id)  # the SDK
        assert fc is not None and fc.start_time > 0 and fc.start_low <= fc.start_time <= fc.start_high
        wide = tessctl(addr, "-o", "wide", "get", "jobs").stdout
        assert "START~" in wide.splitlines()[0]
        go.write_text("")
        c.cancel(first.id)
        c.cancel(second.id)
