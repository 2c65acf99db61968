"""Tenants in replay: the MT trace's tenants, CPUs on the nodes, the SLA metric (controller/sim/tenants.py)."""

from __future__ import annotations

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import RoundConfig
from tessera.controller.core.snapshot import JobView, Priority, Promise, TenantQuota
from tessera.controller.sim.clusters import Cluster, NodeGroup, load_cluster
from tessera.controller.sim.engine import MORPHLING, Simulator, Truth
from tessera.controller.sim.metrics import summarize
from tessera.controller.sim.tenants import behind, cpus_on, morphling_mt, promise_time, tenancy
from tessera.controller.sim.traces import TraceJob
from tessera.estimator.models import ModelDims

M = ModelDims(64, 2, 4, 256, 64, "m")
CLUSTER = Cluster("tiny", (NodeGroup("x-", 1, 4, "X", 40.0, 1, 32, 256.0),))
EST = TableEstimates({("k", "X", n): 4.0 / n for n in (1, 2, 4)})


def tj(jid: str, t: float, gpus: int, iters: int, tenant: str = "", sla: bool = False) -> TraceJob:
    return TraceJob(jid, t, iters, "k", M, 1, gpus, "X", sla=sla, exec_plan="zero-dp" if sla else "", cpus=8 * gpus,
                    tenant=tenant)


def run(trace: list[TraceJob], tenants: tuple[TenantQuota, ...], policy: str = "fcfs") -> dict[str, object]:
    sim = Simulator(CLUSTER, trace, EST, Truth(EST), MORPHLING, "t", RoundConfig(interval_s=60.0), tenants=tenants)
    return summarize(sim.run(make_policy(policy)))


def test_the_sla_on_a_literal_timeline() -> None:
    # Admitted at 0, t_P = 2 s/iter, one 260 s restart allowed: at 300 s, 20 iterations are due.
    assert not behind(20.0, 1000.0, 300.0, 0.0, 260.0, 2.0)
    assert behind(19.9, 1000.0, 300.0, 0.0, 260.0, 2.0)
    assert not behind(0.0, 1000.0, 260.0, 0.0, 260.0, 2.0)  # nothing is due before the restart is paid
    assert not behind(10.0, 10.0, 1e6, 0.0, 260.0, 2.0)  # capped at the job's total
    assert not behind(0.0, 10.0, 1e6, 0.0, 260.0, 0.0)  # no estimate of the promise: nothing to hold


def test_a_guaranteed_job_preempts_in_replay_and_keeps_its_promise() -> None:
    tenants = (TenantQuota("A", (("X", 4),)), TenantQuota("B"))
    trace = [tj("be", 0.0, 4, 10_000, "B"), tj("g", 600.0, 4, 300, "A", sla=True)]
    s = run(trace, tenants)
    assert s["guaranteed_jobs"] == 1 and s["sla_violations"] == 0 and s["suspensions"] == 1
    assert s["jobs_finished"] == 2
    # Without tenants the same trace is best-effort only: FCFS leaves g waiting behind be.
    plain = run([tj("be", 0.0, 4, 10_000), tj("g", 600.0, 4, 300, sla=True)], ())
    assert plain["suspensions"] == 0 and plain["guaranteed_jobs"] == 0 and plain["sla_violations"] == 0


def test_a_promise_the_cluster_cannot_keep_is_a_violation() -> None:
    # A quota larger than the cluster: both admitted, one waits while its clock runs.
    tenants = (TenantQuota("A", (("X", 8),)),)
    s = run([tj("g1", 0.0, 4, 1000, "A", sla=True), tj("g2", 0.0, 4, 1000, "A", sla=True)], tenants)
    assert s["guaranteed_jobs"] == 2 and s["sla_violations"] == 1 and s["jobs_finished"] == 2


def test_the_mt_tenants_cpus_and_the_promise_time() -> None:
    jobs, tenants = morphling_mt([tj("g", 0.0, 2, 10, sla=True), tj("b", 0.0, 1, 10)], "X")
    assert tenants == (TenantQuota("A", (("X", 64),)), TenantQuota("B"))
    assert [j.tenant for j in jobs] == ["A", "B"]
    assert tenancy(jobs[0]) == ("A", Priority.GUARANTEED, Promise(2, 16, "zero-dp", ""))
    assert tenancy(jobs[1]) == ("B", Priority.BEST_EFFORT, None)
    assert cpus_on(jobs[0], 1) == 8
    node = load_cluster("morphling-64").nodes()[0]
    assert node.cpus == 96 and node.host_memory_bytes == 1600 * 1000**3
    view = JobView("g", 0.0, M, 1, 2, estimate_key="k", promise=Promise(2, 16, "zero-dp"))
    assert promise_time(view, "X", 4, Truth(EST)) == 2.0


class _PlanOracle(TableEstimates):
    """An oracle that times plans: iteration_time(model, placement, plan), as the Morphling oracle
    does once it reads plans (the promised plan is slower than the best one here)."""

    def iteration_time(self, model: str, placement: str, plan: str = "") -> float:
        return 3.0 if (placement, plan) == ("2", "zero-dp") else 0.0


def test_the_promise_time_uses_the_promised_plan_when_the_oracle_times_plans() -> None:
    view = JobView("g", 0.0, M, 1, 2, estimate_key="k", promise=Promise(2, 16, "zero-dp"))
    assert promise_time(view, "X", 4, Truth(_PlanOracle(EST.table))) == 3.0
    # A plan the oracle has not measured there: the best plan on those GPUs.
    other = JobView("g", 0.0, M, 1, 2, estimate_key="k", promise=Promise(2, 16, "ga"))
    assert promise_time(other, "X", 4, Truth(_PlanOracle(EST.table))) == 2.0
