"""The live controller under the Crius policy: Cells in describe, and a round that scales a running
job down to make room for an arrival (Crius Fig. 3, homogeneous GPUs between jobs): stop with a
checkpoint, relaunch on the smaller Cell, resume, finish with the right number of steps."""

from __future__ import annotations

import pytest

from tessera.v1 import common_pb2 as P
from tests.chaos.test_kill9 import long_job
from tests.e2e.cluster import Cluster
from tests.procs import tessctl, tessctl_json, wait_for

pytestmark = pytest.mark.slow


def test_crius_scales_a_running_job_down_for_an_arrival(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    # One node: with idle A10s beside it, crius (at the live --min-gain 0.2) rightly places the arrival
    # there rather than halve the blocker for a few percent (docs/scheduler.md, crius).
    cl: Cluster = cluster_factory([("node-a100", "a100-node.yaml")], policy="crius")
    addr = cl.controller.address
    with cl.client() as c:
        blocker = long_job("blocker", iterations=80)
        blocker.hint.gpus = 8  # Cells of 4, 8 or 16 GPUs: 4 x A100 is the best that exists
        b = c.submit(blocker)
        c.wait(b.id, {"RUNNING"}, timeout=120)
        assert c.get(b.id).cell == "4 x A100-80GB, 1 stage"
        wait_for(lambda: c.get(b.id).progress.checkpoint_iteration >= 10, 120, "blocker's first checkpoint")
        mover = c.submit(long_job("arrival", iterations=40))
        done = c.wait(b.id, {"SUCCEEDED", "FAILED"}, timeout=240)
        assert done.state == P.JOB_STATE_SUCCEEDED, done.reason
        assert done.progress.iteration == 80 and done.attempt == 2
        assert done.cell == "2 x A100-80GB, 1 stage"
        events = c.get(b.id, with_events=True).events
        kinds = [e.kind for e in events]
        assert kinds.index("MIGRATING") < kinds.index("MIGRATED") < kinds.index("RESUMED"), kinds
        moving = next(e.message for e in events if e.kind == "MIGRATING")
        assert moving.startswith("scale-down 4 x A100-80GB, 1 stage -> 2 x A100-80GB, 1 stage")
        assert "migration cost" in next(e.message for e in events if e.kind == "RESUMED")
        arrival = c.wait(mover.id, {"SUCCEEDED", "FAILED"}, timeout=240)
        assert arrival.state == P.JOB_STATE_SUCCEEDED and arrival.progress.iteration == 40
    d = tessctl_json(addr, "describe", "job", b.id)
    assert d["cell"] == "2 x A100-80GB, 1 stage" and d["reason"].startswith("all 2 ranks exited 0")
    log = tessctl(addr, "logs", b.id, "--tail", "1000000").stdout
    assert "resumed from step" in log
    assert "rendezvous=sealed" in log  # the attempt's key reached the ranks (docs/security.md, "Rendezvous")
