"""kill -9 of the controller at each named crash point of a round and of a migration
(common/crashpoints.py): the controller dies exactly there, restarts on the same state, and every job
runs to its end once, with the invariants of tests/chaos/invariants.py."""

from __future__ import annotations

import signal

import pytest

from tessera.common.crashpoints import POINTS
from tessera.v1 import common_pb2 as P
from tests.chaos.conftest import Factory
from tests.chaos.helpers import chaos_job, checker
from tests.chaos.invariants import step_log_dir
from tests.e2e.cluster import Cluster
from tests.procs import wait_for

pytestmark = pytest.mark.slow

ROUND_POINTS = ["round.planned", "round.placed", "round.between_launches", "launch.answered"]
MIGRATION_POINTS = ["migrate.checkpoint_requested", "migrate.old_stopped", "migrate.before_launch"]


def test_every_crash_point_has_a_test() -> None:
    assert sorted(ROUND_POINTS + MIGRATION_POINTS) == sorted(POINTS)


def died_at(cl: Cluster, point: str) -> None:
    """Wait for the armed controller to kill itself at `point` (and nowhere else)."""
    proc = cl.controller.proc
    wait_for(lambda: proc.poll() is not None, 90, f"the controller to die at {point}")
    assert proc.returncode == -signal.SIGKILL, proc.returncode
    hits = [e for e in cl.controller.events() if e.get("event") == "crash_point"]
    assert [h["point"] for h in hits] == [point], hits


def restart_and_finish(cl: Cluster, ids: list[str]) -> None:
    cl.restart_controller()
    for node in cl.agents:
        cl.controller.wait_event("node_registered", 30, node_id=node)
    with cl.client() as c:
        for i in ids:
            j = c.wait(i, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
            assert j.state == P.JOB_STATE_SUCCEEDED, (i, j.reason)
            assert j.progress.iteration == j.spec.iterations
    epochs = [e["epoch"] for e in cl.controller.events() if e.get("event") == "controller_started"]
    assert len(epochs) == 2 and epochs[1] > epochs[0]


@pytest.mark.parametrize("point", ROUND_POINTS)
def test_controller_killed_at_round_point(chaos_cluster: Factory, point: str) -> None:
    cl = chaos_cluster([("node-a10", "a10-node.yaml"), ("node-a40", "a40-node.yaml")], crash_at=point)
    steps = step_log_dir(cl.root)
    with cl.client() as c:
        ids = [c.submit(chaos_job(f"job{i}", steps, iterations=20)).id for i in range(3)]
    died_at(cl, point)
    restart_and_finish(cl, ids)
    checker(cl, ids).check(settle=10)


@pytest.mark.parametrize("point", MIGRATION_POINTS)
def test_controller_killed_at_migration_point(chaos_cluster: Factory, point: str) -> None:
    # Crius scales a running 4-GPU job down to 2 GPUs to make room for an arrival (as in
    # tests/e2e/test_crius_live.py): stop with a checkpoint, then relaunch on the smaller Cell. One
    # node: with idle A10s beside it, crius places the arrival there rather than halve the blocker.
    cl = chaos_cluster([("node-a100", "a100-node.yaml")], policy="crius", crash_at=point)
    steps = step_log_dir(cl.root)
    with cl.client() as c:
        blocker = c.submit(chaos_job("blocker", steps, iterations=60, gpus=8))
        c.wait(blocker.id, {"RUNNING"}, timeout=60)
        wait_for(lambda: c.get(blocker.id).progress.checkpoint_iteration >= 5, 60, "the blocker's first checkpoint")
        arrival = c.submit(chaos_job("arrival", steps, iterations=20, gpus=0))
    ids = [blocker.id, arrival.id]
    died_at(cl, point)
    restart_and_finish(cl, ids)
    with cl.client() as c:
        kinds = [e.kind for e in c.get(blocker.id, with_events=True).events]
    assert "MIGRATING" in kinds, kinds
    checker(cl, ids).check(settle=10)
