"""The cost objective with real processes (docs/cost-objective.md): a controller with --prices, three
declared agents of three GPU types, a job with `objective: cost` and an SLO. Each agent declares
one GPU whose memory (1.63 GB, as an inventory may declare it) holds the model only split in two:
the cheapest allocation that meets the SLO is a pipeline of an A10 stage and an A40 stage with an
uneven layer split, which trains on CPU/gloo (loss falls) and succeeds, its prediction in describe.
A second job whose SLO no plan can meet stays PENDING with the best time a plan reaches."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tessera.v1 import common_pb2 as P
from tests.e2e.cluster import Cluster
from tests.e2e.test_local_cluster import losses
from tests.procs import tessctl, tessctl_json, wait_for

pytestmark = pytest.mark.slow

TYPES = (("node-a10", "A10-24GB"), ("node-a40", "A40-48GB"), ("node-a100", "A100-80GB"))
JOB = """\
name: {name}
model: {{hidden_size: 128, num_layers: 6, num_heads: 4, vocab_size: 4096, seq_length: 128}}
global_batch_size: 16
iterations: {iterations}
checkpoint_every: 10
objective: cost
slo: {{iterations_within: {slo}}}
"""


def test_cost_job_gets_a_mixed_type_pipeline_and_an_impossible_slo_waits(cluster_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    nodes = []
    for node_id, model in TYPES:
        inv = tmp_path / f"{node_id}.yaml"
        inv.write_text(f"gpus:\n  - model: {model}\n    count: 1\n    memory_gb: 1.63\n")
        nodes.append((node_id, str(inv)))
    prices = tmp_path / "prices.yaml"
    prices.write_text("A10-24GB: 1.0\nA40-48GB: 2.0\nA100-80GB: 4.0\n")
    # Crius, the controller's default policy: the cost objective places these jobs whatever the policy.
    cl: Cluster = cluster_factory(nodes, policy="crius", controller_args=("--prices", str(prices)))
    addr = cl.controller.address
    (tmp_path / "cheap.yaml").write_text(JOB.format(name="cheap", iterations=30, slo="1h"))
    (tmp_path / "never.yaml").write_text(JOB.format(name="never", iterations=100000, slo="60s"))
    cheap = tessctl_json(addr, "submit", "-f", str(tmp_path / "cheap.yaml"))["id"]
    with cl.client() as c:
        done = c.wait(cheap, {"SUCCEEDED", "FAILED"}, timeout=300)
        assert done.state == P.JOB_STATE_SUCCEEDED, done.reason
        assert done.progress.iteration == 30
        # Two stages of two GPU types, each on its agent, the layers split unevenly.
        plan = done.plan
        assert (plan.dp, plan.pp) == (1, 2) and len({s.gpu_model for s in plan.stages}) == 2
        assert [s.layer_start for s in plan.stages] == [0, plan.stages[0].layer_end]
        assert plan.stages[-1].layer_end == 6 and plan.stages[0].layer_end != 3
        by_node = dict(TYPES)
        assert [by_node[s.node_id] for s in done.placement.slices] == [s.gpu_model for s in plan.stages]
        assert done.predicted_seconds > 0 and done.predicted_cost > 0 and " | " in done.allocation
    d = tessctl_json(addr, "describe", "job", cheap)
    assert d["allocation"] == done.allocation and float(d["predicted_cost"]) == pytest.approx(done.predicted_cost)
    text = tessctl(addr, "describe", "job", cheap).stdout
    for key in ("Objective:", "SLO:", "iterations within 1h", "Allocation:", "Predicted time:", "Predicted cost:"):
        assert key in text, text
    log = tessctl(addr, "logs", cheap, "--tail", "1000000").stdout
    ls = losses(log)
    assert len(ls) == 30 and ls[-1] < 0.9 * ls[0], (ls[:3], ls[-3:])  # from ln(4096) = 8.3
    assert "pipeline stages of the plan: 0: layers 0-" in log

    never = tessctl_json(addr, "submit", "-f", str(tmp_path / "never.yaml"))["id"]
    with cl.client() as c:
        wait_for(lambda: "no plan meets the SLO" in c.get(never).reason, 60, "the SLO's pending reason")
        job = c.get(never)
        assert job.state == P.JOB_STATE_PENDING
        best = re.search(r"the best any plan reaches is ([0-9,]+) s", job.reason)
        assert best is not None and int(best.group(1).replace(",", "")) > 60, job.reason
