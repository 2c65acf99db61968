"""A job started through a launcher template, one launcher process per node, across two agents:
torchrun, and DeepSpeed's per-node launcher (deepspeed.launcher.launch) when DeepSpeed is importable
by the agents' interpreter (scripts/setup.sh installs it)."""

from __future__ import annotations

import pytest

from tessera.v1 import common_pb2 as P
from tests.e2e.cluster import Cluster
from tests.procs import tessctl

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("launcher, timeout", [("torchrun", 240), ("deepspeed", 300)])
def test_launcher_across_two_nodes(cluster_factory, launcher: str, timeout: float) -> None:  # type: ignore[no-untyped-def]
    if launcher == "deepspeed":
        pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (scripts/setup.sh installs it)")
    cl: Cluster = cluster_factory([("node-a", "a40-node.yaml"), ("node-b", "a40-node.yaml")])
    spec = P.JobSpec(name=f"via-{launcher}", model=P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4,
                                                               vocab_size=256, seq_length=64),
                     global_batch_size=16, iterations=20, hint=P.ResourceHint(gpus=4),
                     launcher=P.Launcher(name=launcher))
    with cl.client() as c:
        job = c.submit(spec)
        done = c.wait(job.id, {"SUCCEEDED", "FAILED"}, timeout=timeout)
        log = tessctl(cl.controller.address, "logs", job.id, "--tail", "1000000").stdout
        assert done.state == P.JOB_STATE_SUCCEEDED, f"{done.reason}\n{log[-3000:]}"
        assert sorted(len(s.gpu_indices) for s in done.placement.slices) == [2, 2]
        assert done.progress.iteration == 20
    launched = [e for a in cl.agents.values() for e in a.events() if e.get("event") == "attempt launched"]
    assert len(launched) == 2 and all(len(e["ranks"]) == 1 for e in launched)  # one launcher per node
    assert "rank=0/4" in log and "done iteration=20" in log
