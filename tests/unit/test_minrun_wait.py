"""A guaranteed job's wait under --min-run is bounded by it (controller/core/minrun.py): a review
of 2026-11-28 saw one wait 4,800 s (morphling), or for good (gavel, sia), behind best-effort jobs
started one after another on the GPUs freed meanwhile, each exempt in turn. A stream of best-effort
jobs (each on half of a 4-GPU node, submitted after the guaranteed one), rounds every 150 s; the
admission's record of `admitted_at` is kept as the live engine and the simulator keep it."""

from __future__ import annotations

import dataclasses

import pytest

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policy import RoundConfig, plan_round
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    GpuView,
    JobView,
    NodeView,
    Priority,
    Promise,
    RunningView,
    Slice,
    Snapshot,
    TenantQuota,
)
from tessera.estimator.models import ModelDims

GB = 1000**3
M = ModelDims(1024, 24, 16, 32000, 1024, "m")
EST = TableEstimates({("k", "X", n): 8.0 / n for n in (1, 2, 4)})
T0 = 1_800_000_000.0
TENANTS = (TenantQuota("A", (("X", 4),)), TenantQuota("B"))
G = JobView("g", T0 - 10, M, 64, 4, ("X",), "X", 1000, 0.0, estimate_key="k", tenant="A",
            priority=Priority.GUARANTEED, promise=Promise(4, 0, "", "X"))


def best_effort(k: int) -> JobView:
    return JobView(f"b{k:03d}", T0 + k, M, 64, 2, ("X",), "X", 10**6, 0.0, estimate_key="k", tenant="B")


def waited(policy: str, min_run: float, lifetime: float) -> float | None:
    """Seconds until g runs on its promise's 4 GPUs (None: not within 6,000 s)."""
    first = best_effort(-1)
    running = {first.id: (first, (Slice("x0", (0, 1)),), T0 - 100)}
    ends = {first.id: T0 + 300}
    pending = {"g": G, **{best_effort(k).id: best_effort(k) for k in range(40)}}
    for step in range(40):
        now = T0 + 150 * step
        for jid in [j for j, t in ends.items() if t <= now and j in running]:
            del running[jid]
        busy = frozenset(i for _, sl, _ in running.values() for s in sl for i in s.gpu_indices)
        nodes = (NodeView("x0", tuple(GpuView(i, "X", 40 * GB) for i in range(4)), busy),)
        views = tuple(RunningView(j, Cell("X", len(sl[0].gpu_indices)), sl, since=p, placed_at=p)
                      for j, sl, p in running.values())
        snap = Snapshot(nodes, tuple(pending.values()), (("X", 40 * GB, 4),), running=views, now=now,
                        tenants=TENANTS)
        plan = plan_round(snap, EST, make_policy(policy), RoundConfig(min_run_s=min_run))
        if "g" in plan.admitted and "g" in pending and pending["g"].admitted_at is None:
            pending["g"] = dataclasses.replace(pending["g"], admitted_at=now)
        for d in plan.decisions:
            if d.action is Action.STOP:
                pending[d.job_id] = running.pop(d.job_id)[0]
        for d in plan.decisions:
            if d.action in (Action.START, Action.MIGRATE):
                j = pending.pop(d.job_id) if d.action is Action.START else running[d.job_id][0]
                running[d.job_id] = (j, d.slices, now)
                if d.job_id != "g":
                    ends.setdefault(d.job_id, now + lifetime)
        if "g" in running and len(running["g"][1][0].gpu_indices) == 4:
            return now - T0
    return None


@pytest.mark.parametrize("policy", ["morphling", "crius", "gavel", "sia"])
@pytest.mark.parametrize("lifetime", [400.0, 1000.0])
def test_the_wait_is_at_most_the_minimum_run_and_a_round(policy: str, lifetime: float) -> None:
    assert waited(policy, 0.0, lifetime) == 0.0
    took = waited(policy, 600.0, lifetime)
    assert took is not None and took <= 600.0 + 150.0, took
