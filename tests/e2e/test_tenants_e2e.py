"""A guaranteed job preempts best-effort work on a live cluster (docs/tenants.md, "Live"; issue 15,
"Done when"): real controller and agent processes, the reference trainer on CPU (torch + gloo).

A declared agent of one A100-80GB (few ranks: the machine running the suite is small; a one-GPU job
cannot be halved, so it is preempted rather than shrunk); the tenants file gives team-a (alice) one
guaranteed A100 and team-b (bob) none. Bob's best-effort job fills the GPU and trains with checkpoints;
alice's guaranteed job within quota is submitted, the best-effort job is stopped with a checkpoint
and requeued, the guaranteed job starts and succeeds; then the best-effort job starts again from its
checkpoint with the same global batch and succeeds, under the default policy (crius). Every wait
is on job states and events.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tessera.v1 import common_pb2 as P
from tests.chaos.test_kill9 import long_job
from tests.e2e.cluster import Cluster
from tests.procs import tessctl, wait_for

pytestmark = pytest.mark.slow

NODE = "gpus:\n  - {model: A100-80GB, count: 1}\ncpus: 16\nhost_memory_gb: 128\n"
TENANTS = "tenants:\n  team-a:\n    quota: {A100-80GB: 1}\n  team-b: {}\n"


def test_guaranteed_job_preempts_best_effort_which_resumes_from_its_checkpoint(  # type: ignore[no-untyped-def]
        cluster_factory, tmp_path: Path) -> None:
    (tmp_path / "node.yaml").write_text(NODE)
    (tmp_path / "tenants.yaml").write_text(TENANTS)
    cl: Cluster = cluster_factory([("node-1", str(tmp_path / "node.yaml"))], policy="crius",
                                  controller_args=("--tenants", str(tmp_path / "tenants.yaml")))
    addr = cl.controller.address
    # Steps padded to 0.2 s: after its first checkpoint the filler still has 8 s of work, far more
    # than the guaranteed job's submission takes to preempt it (a round, debounced 0.2 s).
    filler = long_job("filler", iterations=50, TESSERA_TRAINER_MIN_STEP_SECONDS="0.2")
    filler.hint.gpus = 1
    urgent = long_job("urgent", iterations=20)
    urgent.hint.gpus, urgent.priority = 1, P.PRIORITY_GUARANTEED  # promised its hint: 1 GPU
    with cl.client_as("bob") as bob, cl.client_as("alice") as alice:
        be = bob.submit(filler)
        bob.wait(be.id, {"RUNNING"}, timeout=120)
        wait_for(lambda: bob.get(be.id).progress.checkpoint_iteration >= 10, 120, "the filler's first checkpoint")
        (row,) = bob.tenants().tenants  # team-b has no quota: every GPU it holds is borrowed
        assert (row.name, [(b.gpu_type, b.gpus) for b in row.borrowed]) == ("team-b", [("A100-80GB", 1)])

        g = alice.submit(urgent)
        assert (g.spec.guarantee.num_gpus, g.spec.tenant) == (1, "team-a")
        done = alice.wait(g.id, {"SUCCEEDED", "FAILED"}, timeout=240)
        assert done.state == P.JOB_STATE_SUCCEEDED, done.reason
        assert done.progress.iteration == 20
        placed = next(e.message for e in alice.get(g.id, with_events=True).events if e.kind == "PLACED")
        # Placed once the preempted job's GPU is free, before crius plans (controller/core/preplace.py).
        assert "guaranteed (tenant team-a)" in placed and "before crius plans the round" in placed

        finished = bob.wait(be.id, {"SUCCEEDED", "FAILED"}, timeout=300)
        assert finished.state == P.JOB_STATE_SUCCEEDED, finished.reason
        assert finished.progress.iteration == 50 and finished.attempt >= 2
        p = finished.plan  # the same global batch on the attempt that finished
        assert p.dp * p.micro_batch * p.grad_accum == finished.spec.global_batch_size == 16
        events = bob.get(be.id, with_events=True).events
        kinds = [e.kind for e in events]
        last_placed = max(i for i, k in enumerate(kinds) if k == "PLACED")
        assert kinds.index("MIGRATING") < kinds.index("STOPPED") < last_placed, kinds
        preempted = next(e.message for e in events if e.kind == "MIGRATING")
        # Neither tenant reads the other's job id (controller/redact.py): it would answer NOT_FOUND.
        assert "preempted: guaranteed job (another tenant's) of tenant team-a reclaims 1 x A100-80GB" in preempted
        assert g.id not in preempted
        log = bob.logs(be.id, tail_bytes=1_000_000).data.decode(errors="replace")
        resumed = re.search(r"resumed from step (\d+)", log)
        assert resumed is not None and int(resumed.group(1)) >= 10, log[-2000:]
        rows = {t.name: t for t in alice.tenants().tenants}
        assert list(rows) == ["team-a"] and rows["team-a"].jobs_running == rows["team-a"].jobs_pending == 0
    described = tessctl(addr, "describe", "job", be.id).stdout  # as the admin: every id
    assert f"preempted: guaranteed job {g.id}" in described and re.search(r"Priority:\s+best-effort", described)
