"""Finding 2 of issue 13, with real processes: an agent whose epoch floor was raised above the
controller's refuses every Launch and Drain. The job pinned to it used to loop PLACED ->
LAUNCH_FAILED about once a second forever, and `tessctl drain` answered DRAINING with exit 0.

The floor is raised the way it persists in the field: the agent's own state file holds an epoch
from elsewhere (a Launch sent straight to the agent by anyone who could reach it, as in the
finding, or a work dir restored from another cluster), so every call of this controller is "stale".
"""

from __future__ import annotations

import itertools
import json

import pytest

from tessera.v1 import common_pb2 as P
from tests.chaos.test_kill9 import long_job
from tests.e2e.cluster import Cluster
from tests.procs import tessctl, wait_for

pytestmark = pytest.mark.slow


def launch_failures(c, job_id: str) -> list[float]:  # type: ignore[no-untyped-def]
    return [e.time for e in c.get(job_id, with_events=True).events if e.kind == "LAUNCH_FAILED"]


def test_refused_launches_back_off_and_the_node_turns_unhealthy(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([])
    work = cl.root / "node-a10"  # the agent's work dir, where it keeps its epoch floor
    work.mkdir()
    (work / "agent-state.json").write_text(json.dumps({"version": 1, "controller_epoch": 10**12}))
    cl.add_agent("node-a10", "a10-node.yaml")
    cl.wait_ready(1)
    addr = cl.controller.address
    with cl.client() as c:
        job = c.submit(long_job("pinned", iterations=50))
        wait_for(lambda: len(launch_failures(c, job.id)) >= 3, 60, "three refused launches")
        node = next(n for n in c.nodes() if n.id == "node-a10")
        assert node.launch_failures >= 3 and node.unhealthy_until > 0  # 30 s without placements
        # No tight loop: each retry waited at least the doubled backoff (1 s, then 2 s), and nothing
        # more is tried while the node is unhealthy.
        times = launch_failures(c, job.id)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert gaps[0] >= 1.0 and gaps[1] >= 2.0, gaps
        count = len(times)
        got = c.get(job.id)
        assert got.state == P.JOB_STATE_PENDING and got.launch_failures == count
        refused = [e.message for e in c.get(job.id, with_events=True).events if e.kind == "LAUNCH_FAILED"]
        assert all("FAILED_PRECONDITION: stale controller epoch 1 < 1000000000000" in m for m in refused)

        described = tessctl(addr, "describe", "job", job.id).stdout
        line = next(ln for ln in described.splitlines() if ln.startswith("Launch failures:"))
        assert line.split()[2] == str(count) and "next try" in line
        nodes = tessctl(addr, "get", "nodes").stdout.splitlines()
        assert nodes[1].split()[:2] == ["node-a10", "READY,UNHEALTHY"]

        # drain: the controller drains in its own state, but says the agent refused, exit 3
        proc = tessctl(addr, "drain", "node-a10", check=False)
        assert proc.returncode == 3, proc.stderr
        assert "not confirmed by its agent" in proc.stderr and "stale controller epoch" in proc.stderr
        assert len(launch_failures(c, job.id)) == count  # still nothing tried on the unhealthy node
