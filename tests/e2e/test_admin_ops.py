"""Admin operations on a live cluster: drain moves a running job, cancel stops one."""

from __future__ import annotations

import pytest

from tessera.v1 import common_pb2 as P
from tests.chaos.test_kill9 import long_job, node_state
from tests.e2e.cluster import Cluster
from tests.procs import tessctl, tessctl_json, wait_for

pytestmark = pytest.mark.slow


def test_drain_migrates_running_job_then_node_is_drained(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([("node-a10", "a10-node.yaml"), ("node-a40", "a40-node.yaml")])
    addr = cl.controller.address
    with cl.client() as c:
        job = c.submit(long_job("mover", iterations=120))
        wait_for(lambda: c.get(job.id).progress.checkpoint_iteration >= 10, 120, "a first checkpoint")
        assert c.get(job.id).placement.slices[0].node_id == "node-a10"
        out = tessctl_json(addr, "drain", "node-a10", "--reason", "maintenance")
        assert out["state"] in ("NODE_STATE_DRAINING", "NODE_STATE_DRAINED")
        done = c.wait(job.id, {"SUCCEEDED", "FAILED"}, timeout=240)
        assert done.state == P.JOB_STATE_SUCCEEDED, done.reason
        assert done.placement.slices[0].node_id == "node-a40" and done.attempt == 2
        kinds = [e.kind for e in c.get(job.id, with_events=True).events]
        assert "MIGRATING" in kinds and "STOPPED" in kinds
        wait_for(lambda: node_state(c, "node-a10") == P.NODE_STATE_DRAINED, 30, "node DRAINED")
        # A drained node gets no new work; undrain gives it back.
        tessctl(addr, "undrain", "node-a10")
        wait_for(lambda: node_state(c, "node-a10") == P.NODE_STATE_READY, 30, "node READY")
        log = tessctl(addr, "logs", job.id, "--tail", "1000000").stdout
        assert "resumed from step" in log


def test_cancel_running_job_stops_its_workers(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([("node-a10", "a10-node.yaml")])
    addr = cl.controller.address
    with cl.client() as c:
        job = c.submit(long_job("doomed", iterations=500))
        c.wait(job.id, {"RUNNING"}, timeout=120)
        out = tessctl_json(addr, "cancel", job.id)
        assert out["state"] == "JOB_STATE_CANCELLED"
        agent = cl.agents["node-a10"]
        agent.wait_event("worker exited", 60, job_id=job.id)
        # The GPU is free again once the agent reports the worker gone.
        wait_for(lambda: not next(n for n in c.nodes() if n.id == "node-a10").busy_gpus, 30, "GPU released")
        assert c.get(job.id).state == P.JOB_STATE_CANCELLED
