"""A job a policy declines (drops) for want of memory gets the memory figures in its stored reason,
as one that fits nowhere does (controller/rounds.py `pending_reason`; docs/scheduler.md); one
declined for a deadline it cannot meet gets none. Before (a live audit): elasticflow's
"declined: no count of ... GPUs fits it (out of memory or not covered by the estimates)" for the
demo's huge job had no figures, where crius, gandiva, sia and fcfs said "its plans need at least
1,894.7 GiB per GPU on 8 x A10-24GB ...": a drop has no pending kind, and only FITS_NOWHERE got them."""

from __future__ import annotations

from tessera.controller.core.frenzy import FrenzyConfig
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import plan_round
from tessera.controller.core.snapshot import Action, Decision, JobView, Snapshot
from tessera.controller.rounds import pending_reason
from tests.unit.test_memory_need import HUGE, SMALL, huge_on_pools

NEED = "its plans need at least 1,894.7 GiB per GPU on 8 x A10-24GB (2 stages; 21.2 GiB usable)"
CLUSTER = "the cluster has 8 x A10-24GB (22.4 GiB), 4 x A100-80GB (74.5 GiB)"


def test_a_decline_for_memory_names_the_memory_it_needs() -> None:
    job, snap, est = huge_on_pools()
    plan = plan_round(snap, est, make_policy("elasticflow"))
    (d,) = plan.decisions
    assert d.action is Action.DROP and d.pending is None
    why = pending_reason(d, {"j": job}, snap, plan.policy, FrenzyConfig(), est.least_need)
    assert why.startswith(f"{d.reason}; fits nowhere: {NEED}") and why.endswith(CLUSTER), why
    # Without the Cells' figure, MARP's stands (as for a job that fits nowhere).
    marp = pending_reason(d, {"j": job}, snap, plan.policy, FrenzyConfig())
    assert "(MARP, dp=" in marp and marp.startswith(f"{d.reason}; fits nowhere: needs at least "), marp


def test_a_decline_for_a_deadline_names_no_memory() -> None:
    _, snap, est = huge_on_pools()
    small = JobView("j", 0.0, SMALL, 8, iterations=10**7, deadline=100.0)  # fits; cannot finish in time
    snap2 = Snapshot(snap.nodes, (small,), snap.cluster_gpus)
    for policy in ("elasticflow", "crius-ddl"):
        plan = plan_round(snap2, est, make_policy(policy))
        (d,) = plan.decisions
        assert d.action is Action.DROP and "deadline" in d.reason, d.reason
        for needs in (est.least_need, None):
            assert pending_reason(d, {"j": small}, snap2, plan.policy, FrenzyConfig(), needs) == d.reason
    # Where the Cells give no figure, MARP's is not read as the cause of a decline of a job with a
    # deadline (MARP overstates a large model's need): the huge model, as if declined for its deadline.
    late = JobView("j", 0.0, HUGE, 1536, iterations=10, deadline=100.0)
    d = Decision("j", Action.DROP, "elasticflow: declined: no data-parallel share of 1-8 GPUs of any type meets "
                                   "its deadline")
    assert pending_reason(d, {"j": late}, Snapshot(snap.nodes, (late,), snap.cluster_gpus), "elasticflow",
                          FrenzyConfig(), lambda j: None) == d.reason
