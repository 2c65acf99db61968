"""Tenants in replay: the Morphling MT trace's two tenants, the jobs' views of their class and promise,
the CPUs a job holds, and the SLA metric (`sla_violations`, docs/tenants.md).

- `morphling_mt(jobs, gpu_type)`: Morphling Sec. 7, "Multi-tenant trace (MT) ... sets up two
  tenants, Tenant-A with a quota of 64 GPUs, and Tenant-B with no quota ... Jobs from Tenant-A/B
  are all guaranteed/best-effort": the rows with `is_sla=1` go to tenant A, guaranteed, with the
  row's GPUs, CPUs and plan as their promise; the others to tenant B, best-effort.
- The SLA (the preamble's definition, docs/tenants.md): a guaranteed job admitted at s_j with
  promise P must, at every round end t, have done at least min(total, (t - s_j - R) / t_P)
  iterations, R the restart cost of the rules, t_P its iteration time with exactly P (its GPUs on
  the fewest nodes, its plan when the oracle can time a plan, else the best plan there). A job
  behind at any round end counts once.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from tessera.controller.core.placement import quotas
from tessera.controller.core.snapshot import JobView, Priority, Promise, TenantQuota
from tessera.controller.sim.traces import TraceJob

# Relative slack on "behind": progress is a float sum of interval / iteration time.
EPS = 1e-9

MT_GUARANTEED = "A"
MT_BEST_EFFORT = "B"
MT_QUOTA = 64  # Morphling Sec. 7: Tenant-A's quota of 64 GPUs (the whole 8 x 8 A800 cluster)


def morphling_mt(jobs: Sequence[TraceJob], gpu_type: str) -> tuple[list[TraceJob], tuple[TenantQuota, ...]]:
    """The MT trace's tenants (module docstring), the quota on the cluster's `gpu_type`."""
    out = [replace(j, tenant=MT_GUARANTEED if j.sla else MT_BEST_EFFORT) for j in jobs]
    return out, (TenantQuota(MT_GUARANTEED, ((gpu_type, MT_QUOTA),)), TenantQuota(MT_BEST_EFFORT))


def tenancy(tj: TraceJob, gpu_type: str = "") -> tuple[str, Priority, Promise | None]:
    """A trace job's tenant, class and promise: guaranteed with its row's GPUs, CPUs and plan when
    it has a tenant and `sla`, else best-effort (no tenant: best-effort, as before tenants)."""
    if not tj.tenant or not tj.sla:
        return tj.tenant, Priority.BEST_EFFORT, None
    return tj.tenant, Priority.GUARANTEED, Promise(tj.gpus, tj.cpus, tj.exec_plan, gpu_type)


def cpus_on(tj: TraceJob, gpus: int) -> int:
    """CPUs a job holds with `gpus` GPUs on one node: its row's CPUs per GPU (8 in the Morphling
    workloads: num_cpus / num_gpus) times those GPUs; 0 for a job that asked for none."""
    if tj.cpus <= 0 or tj.gpus <= 0:
        return 0
    return tj.cpus * gpus // tj.gpus


class TruthLike(Protocol):
    """controller/sim/engine.py's Truth (not imported: the engine imports this module)."""

    def iteration_s(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> float: ...


def promise_time(view: JobView, gpu_type: str, per_node: int, truth: TruthLike) -> float:
    """t_P in replay: the promise's GPUs on the fewest nodes (even split, as the core places it) of
    `gpu_type`; the oracle's time of the promised plan when it can time plans (an
    `iteration_time(model, placement, plan)` such as the Morphling oracle's), else the truth's best
    plan there; 0 = no measurement."""
    p = view.promise
    if p is None or p.gpus <= 0 or per_node <= 0:
        return 0.0
    oracle = getattr(truth, "est", None)
    timed = getattr(oracle, "iteration_time", None)
    plan_aware = False
    if p.plan and callable(timed):
        try:
            plan_aware = len(inspect.signature(timed).parameters) >= 3
        except (TypeError, ValueError):
            plan_aware = False
    for q in quotas(p.gpus, per_node):
        k = p.gpus // q
        if plan_aware and callable(timed):
            t = float(timed(view.key, str(q) * k, p.plan))
            if t > 0:
                return t
        t = truth.iteration_s(view, gpu_type, p.gpus, k)
        if t > 0:
            return t
    return 0.0


def behind(done: float, total: float, t: float, since: float, restart_s: float, t_p: float) -> bool:
    """Whether a guaranteed job is behind its promise at round end t (module docstring)."""
    if t_p <= 0:
        return False
    need = min(total, max(0.0, (t - since - restart_s) / t_p))
    return done < need * (1 - EPS) - EPS
