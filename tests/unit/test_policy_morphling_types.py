"""morphling on a cluster of two GPU types: a job whose fastest type is busy takes the other when it
is idle. Before, its curve kept only the fastest type's point at each count, so it waited on busy
H100s while every A100 was idle (a live audit of the demo cluster: tiny, medium and wide ran one at a
time on 4 A100 while 10 A10 and A40 GPUs sat idle). Literal snapshots and a literal table."""

from __future__ import annotations

from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import plan_round
from tessera.controller.core.snapshot import Action, Cell, JobView, RunningView, Slice, Snapshot
from tests.unit.test_policy_gpu_types import A100, CLUSTER, EST, H100, H_BUSY, A, M


def test_a_job_whose_fastest_type_is_busy_starts_on_the_idle_one() -> None:
    # H100 runs "k" twice as fast as A100; the holder has 40 of 50 iterations left on all 4 H100.
    held = JobView("holder", 0.0, M, 64, 0, (), estimate_key="k", iterations=50, done_iterations=10)
    holder = RunningView(held, Cell(H100, 4, 1), (Slice("h", (0, 1, 2, 3)),))
    job = JobView("j", 1.0, M, 64, 0, (), estimate_key="k", iterations=100)
    got = {d.job_id: d for d in plan_round(Snapshot((A, H_BUSY), (job,), CLUSTER, (holder,)), EST,
                                           make_policy("morphling")).decisions}
    assert got["holder"].action is Action.KEEP
    d = got["j"]
    assert d.action is Action.START and d.cell == Cell(A100, 4, 0) and d.slices == (Slice("a", (0, 1, 2, 3)),)
    # Where the fastest type is free, it is still the one taken.
    free = Snapshot((A, H_BUSY.__class__("h", H_BUSY.gpus)), (job,), CLUSTER)
    (d,) = plan_round(free, EST, make_policy("morphling")).decisions
    assert d.cell is not None and d.cell.gpu_type == H100


def test_the_critical_path_note_keeps_small_times() -> None:
    # (A live demo read "1 s at its most efficient point, at least 0.85 x the 0 s the cluster needs".)
    from tessera.controller.core.policies.morphling import _secs
    assert (_secs(13_968.4), _secs(10.0), _secs(0.44)) == ("13,968", "10", "0.4")
