"""An opaque job preempted for a guaranteed one is not said to go back "from its checkpoint": Tessera
takes none of it (docs/opaque-jobs.md); whether its program saves one on SIGTERM, the MIGRATING
event's stop says. A live audit read `...; back to the queue from its checkpoint: stopping attempt 1
(SIGTERM; its program may save to $TESSERA_CHECKPOINT_DIR)`."""

from __future__ import annotations

from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import plan_round
from tessera.controller.core.snapshot import Action, JobView, Snapshot, TenantQuota
from tests.unit.test_quotas_texts import EST, M, gjob, node, run


def victim(opaque: bool) -> JobView:
    return JobView("b", 0.0, M, 64, 1, (), "X", 1000, estimate_key="k", tenant="B", opaque=opaque)


def test_a_preempted_opaque_job_goes_back_to_the_queue_without_a_checkpoint() -> None:
    tenants = (TenantQuota("A", (("X", 2),)), TenantQuota("B"))
    for opaque, where in ((True, "back to the queue"), (False, "back to the queue from its checkpoint")):
        snap = Snapshot((node("n1", 2, (0,)),), (gjob("g", "A", 2, 5.0),), running=(run(victim(opaque), "n1", (0,)),),
                        now=10, tenants=tenants)
        d = {x.job_id: x for x in plan_round(snap, EST, make_policy("sia")).decisions}
        assert d["b"].action is Action.STOP
        assert d["b"].reason == ("preempted: guaranteed job g of tenant A reclaims 2 x X of its quota, 1 of them "
                                 f"from this job; {where}")
