"""A guaranteed job preempts a best-effort job of the cost objective on a live cluster
(docs/cost-objective.md, "Tenants"): real controller and agent processes, the reference trainer on
CPU (torch + gloo).

Two declared agents, one A10 and one A40, each GPU declared with 1.63 GB: the cost job's model
fits only split in two, so its cheapest allocation is a pipeline over both types (as in
test_cost_objective_e2e.py). team-a (alice) holds one guaranteed A40, team-b (bob) none. Bob's cost
job trains on the pipeline with checkpoints; alice's guaranteed job within quota is submitted; the
whole pipeline is stopped with a checkpoint and requeued, the guaranteed job starts on the A40 and
succeeds, then the cost job is planned again, resumes from its checkpoint and succeeds.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tessera.clients.jobfile import load_job_file
from tessera.v1 import common_pb2 as P
from tests.chaos.test_kill9 import long_job
from tests.e2e.cluster import Cluster
from tests.e2e.test_cost_objective_e2e import JOB
from tests.procs import wait_for

pytestmark = pytest.mark.slow

TENANTS = "tenants:\n  team-a:\n    quota: {A40-48GB: 1}\n  team-b: {}\n"


def test_guaranteed_job_preempts_a_cost_pipeline_which_resumes(cluster_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    nodes = []
    for node_id, model in (("node-a10", "A10-24GB"), ("node-a40", "A40-48GB")):
        inv = tmp_path / f"{node_id}.yaml"
        inv.write_text(f"gpus:\n  - model: {model}\n    count: 1\n    memory_gb: 1.63\n")
        nodes.append((node_id, str(inv)))
    (tmp_path / "prices.yaml").write_text("A10-24GB: 1.0\nA40-48GB: 2.0\n")
    (tmp_path / "tenants.yaml").write_text(TENANTS)
    cl: Cluster = cluster_factory(nodes, policy="crius", controller_args=(
        "--prices", str(tmp_path / "prices.yaml"), "--tenants", str(tmp_path / "tenants.yaml")))
    (tmp_path / "cost.yaml").write_text(JOB.format(name="cheap", iterations=50, slo="1h"))
    cost = load_job_file(str(tmp_path / "cost.yaml"))
    # Steps padded to 0.2 s: after its first checkpoint the pipeline still has 8 s of work.
    cost.env["TESSERA_TRAINER_MIN_STEP_SECONDS"] = "0.2"
    urgent = long_job("urgent", iterations=20)
    urgent.hint.gpus, urgent.priority = 1, P.PRIORITY_GUARANTEED
    urgent.hint.gpu_types.append("A40-48GB")  # promised 1 x A40
    with cl.client_as("bob") as bob, cl.client_as("alice") as alice:
        c = bob.submit(cost)
        bob.wait(c.id, {"RUNNING"}, timeout=120)
        wait_for(lambda: bob.get(c.id).progress.checkpoint_iteration >= 10, 120, "the pipeline's first checkpoint")
        first = bob.get(c.id)
        assert first.plan.pp == 2 and len({s.gpu_model for s in first.plan.stages}) == 2

        g = alice.submit(urgent)
        done = alice.wait(g.id, {"SUCCEEDED", "FAILED"}, timeout=240)
        assert done.state == P.JOB_STATE_SUCCEEDED, done.reason
        assert [s.node_id for s in done.placement.slices] == ["node-a40"]
        placed = next(e.message for e in alice.get(g.id, with_events=True).events if e.kind == "PLACED")
        assert "guaranteed (tenant team-a)" in placed

        finished = bob.wait(c.id, {"SUCCEEDED", "FAILED"}, timeout=300)
        assert finished.state == P.JOB_STATE_SUCCEEDED, finished.reason
        assert finished.progress.iteration == 50 and finished.attempt >= 2
        assert finished.plan.pp == 2 and finished.predicted_cost > 0
        events = bob.get(c.id, with_events=True).events
        kinds = [e.kind for e in events]
        assert kinds.index("MIGRATING") < kinds.index("STOPPED") < max(i for i, k in enumerate(kinds) if k == "PLACED")
        preempted = next(e.message for e in events if e.kind == "MIGRATING")
        assert "preempted: guaranteed job (another tenant's) of tenant team-a reclaims 1 x A40-48GB" in preempted
        log = bob.logs(c.id, tail_bytes=1_000_000).data.decode(errors="replace")
        resumed = re.search(r"resumed from step (\d+)", log)
        assert resumed is not None and int(resumed.group(1)) >= 10, log[-2000:]
