"""kill -9 of an agent and of the controller while jobs run."""

from __future__ import annotations

import collections
import time

import pytest

from tessera.clients.sdk import Client
from tessera.v1 import common_pb2 as P
from tests.e2e.cluster import Cluster
from tests.procs import tessctl, wait_for

pytestmark = pytest.mark.slow


def long_job(name: str, iterations: int = 200, **env: str) -> P.JobSpec:
    spec = P.JobSpec(name=name, model=P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256,
                                                  seq_length=64),
                     global_batch_size=16, iterations=iterations, checkpoint_every=10)
    # Orphaned workers of a killed agent stop themselves quickly (self-fencing), and steps are padded
    # so the job is still running when the test strikes.
    spec.env.update({"TESSERA_AGENT_LOSS_TIMEOUT": "3", "TESSERA_TRAINER_MIN_STEP_SECONDS": "0.05", **env})
    return spec


def node_state(c: Client, node_id: str) -> int:
    return next(n.state for n in c.nodes() if n.id == node_id)


def test_agent_killed_job_requeued_and_finishes_elsewhere_from_checkpoint(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([("node-a10", "a10-node.yaml"), ("node-a40", "a40-node.yaml")])
    with cl.client() as c:
        job = c.submit(long_job("victim"))
        wait_for(lambda: c.get(job.id).progress.checkpoint_iteration >= 10, 120, "a first checkpoint")
        first = c.get(job.id)
        assert first.state == P.JOB_STATE_RUNNING and first.placement.slices[0].node_id == "node-a10"

        t0 = time.monotonic()
        cl.agents["node-a10"].kill9()
        wait_for(lambda: node_state(c, "node-a10") == P.NODE_STATE_UNREACHABLE, 15, "node UNREACHABLE")
        lapse = time.monotonic() - t0
        assert lapse <= 3.0 + 2.0, f"UNREACHABLE after {lapse:.1f}s with a 3s lease"

        done = c.wait(job.id, {"SUCCEEDED", "FAILED"}, timeout=240)
        assert done.state == P.JOB_STATE_SUCCEEDED, done.reason
        assert done.attempt == 2 and done.placement.slices[0].node_id == "node-a40"
        kinds = [e.kind for e in c.get(job.id, with_events=True).events]
        assert kinds.index("NODE_LOST") < len(kinds) - 1 - kinds[::-1].index("PLACED")
        log = tessctl(cl.controller.address, "logs", job.id, "--tail", "1000000").stdout
        assert "resumed from step" in log, log[:500]
        resumed = int(log.split("resumed from step", 1)[1].split()[0])
        assert resumed >= 10


def test_controller_killed_mid_round_restarts_and_reconciles(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([("node-a10", "a10-node.yaml"), ("node-a40", "a40-node.yaml")])
    with cl.client() as c:
        ids = [c.submit(long_job(f"job{i}", iterations=60)).id for i in range(3)]
    # Strike while the round is applying its decisions: right after its first placement is stored.
    cl.controller.wait_event("job_event", 60, kind="PLACED")
    cl.controller.kill9()
    states_before = {}
    cl.restart_controller()
    with cl.client() as c:
        for i in ids:
            states_before[i] = c.get(i).state  # every job is still there
        # Agents learn of the new epoch on their next heartbeat and register again with their workers.
        for node in ("node-a10", "node-a40"):
            cl.controller.wait_event("node_registered", 30, node_id=node)
        for i in ids:
            j = c.wait(i, {"SUCCEEDED", "FAILED"}, timeout=240)
            assert j.state == P.JOB_STATE_SUCCEEDED, (i, j.reason)
    assert set(states_before) == set(ids)
    # No (job, attempt) was launched twice on any agent.
    launches = collections.Counter()
    for a in cl.agents.values():
        for e in a.events():
            if e.get("event") == "attempt launched":
                launches[(e["job_id"], e["attempt"])] += 1
    assert launches and max(launches.values()) == 1, launches
    epochs = [e["epoch"] for e in cl.controller.events() if e.get("event") == "controller_started"]
    assert epochs == sorted(epochs) and len(set(epochs)) == 2
