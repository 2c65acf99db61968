"""LLaMA-style and Mixtral-style jobs through the whole path with real processes: tessctl -> controller
(Cells from the estimator's memory and time for gated and MoE models) -> agents -> the reference
trainer's LLaMA and MoE models on CPU (examples/jobs/llama-tiny.yaml, moe-tiny.yaml). Before, the
scheduler placed such jobs and the trainer refused them (exit 3: GPT-2-style decoders only); then the
controller sent the workers the six dimensions only, and they trained a GPT-2 of them."""

from __future__ import annotations

import pytest

from tessera.v1 import common_pb2 as P
from tests.e2e.cluster import Cluster
from tests.e2e.test_local_cluster import losses
from tests.procs import REPO, tessctl, tessctl_json

pytestmark = pytest.mark.slow
JOBS = REPO / "examples" / "jobs"
# What the trainer's start line says it built (architecture.Arch.describe): a GPT-2 of the same
# dimensions is what ran before the controller passed the family fields on (a live audit).
want = {"llama-tiny": "llama-kv2-d16-f96-untied ", "moe-tiny": "llama-kv2-d16-f96-untied-moe4x2/1 "}


def test_llama_and_moe_jobs_train_to_success(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([("node-a40", "a40-node.yaml"), ("node-a10", "a10-node.yaml")])
    addr = cl.controller.address
    ids = {name: tessctl_json(addr, "submit", "-f", str(JOBS / f"{name}.yaml"))["id"]
           for name in ("llama-tiny", "moe-tiny")}
    with cl.client() as c:
        for name, jid in ids.items():
            job = c.wait(jid, {"SUCCEEDED", "FAILED"}, timeout=300)
            assert job.state == P.JOB_STATE_SUCCEEDED, (name, job.reason)
            assert job.progress.iteration == job.spec.iterations
    for name, jid in ids.items():
        log = tessctl(addr, "logs", jid, "--tail", "1000000").stdout
        assert f"arch={want[name]}" in log, log[:2000]
        ls = losses(log)
        assert len(ls) == 40 and ls[-1] < 0.8 * ls[0], (name, ls[:3], ls[-3:])
        d = tessctl_json(addr, "describe", "job", jid)
        assert int(d["plan"]["memory_per_gpu_bytes"]) > 0
