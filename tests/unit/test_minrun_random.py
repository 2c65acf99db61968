"""--min-run on random snapshots (controller/core/minrun.py): with and without it, every policy,
with and without tenants, the cost objective, GPUs busy outside the round, placements of unknown,
boundary and future time, guaranteed jobs admitted a while ago. The merged plan decides every job
once and passes the round's placement check against the whole snapshot; the jobs it keeps as exempt
are kept exactly where they ran and are exempt by the rules; quota admission is unchanged; wakes
are the exemptions' ends. (Drafted by the review of 2026-11-28, which found the unbounded wait.)"""

from __future__ import annotations

import dataclasses
import random
import zlib

import pytest

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.forecast import ForecastConfig, forecast
from tessera.controller.core.minrun import MAX_SKEW_S
from tessera.controller.core.policies import FACTORIES, make_policy
from tessera.controller.core.policy import RoundConfig, RoundContext, _check, plan_round
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    GpuView,
    JobView,
    NodeView,
    Objective,
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
TABLE = {("k", t, n): (8.0 if t == "X" else 5.0) / n for t in ("X", "Y") for n in (1, 2, 4, 8)}
EST = TableEstimates(TABLE, node_slowdown=0.1)
NOW = 1_800_000_000.0
TENANTS = (TenantQuota("A", (("X", 4), ("Y", 2))), TenantQuota("B", (("X", 2),)), TenantQuota("C"))


def jv(rng: random.Random, jid: str, n: int, t: str, tenant: str, guaranteed: bool) -> JobView:
    prio = Priority.GUARANTEED if guaranteed else Priority.BEST_EFFORT
    promise = Promise(n, 0, "", t if rng.random() < 0.5 else "") if guaranteed else None
    admitted = rng.choice((None, NOW - 50, NOW - 700)) if guaranteed else None
    return JobView(jid, NOW - rng.uniform(0, 5000), M, 64, n, (), t, 1000, rng.choice((0.0, 300.0)),
                   estimate_key="k", tenant=tenant, priority=prio, promise=promise,
                   deadline=NOW + rng.choice((0.0, 0.0, 50.0, 1e5)), admitted_at=admitted)


def random_snapshot(rng: random.Random, tenants: bool) -> Snapshot:
    nodes = {f"x{i}": "X" for i in range(3)} | {f"y{i}": "Y" for i in range(2)}
    free = {n: list(range(4)) for n in nodes}
    foreign: dict[str, set[int]] = {n: set() for n in nodes}
    running: list[RunningView] = []
    for k in range(rng.randint(0, 8)):
        n = rng.choice((1, 2, 4, 8))
        t = rng.choice(("X", "Y"))
        cand = [nid for nid in nodes if nodes[nid] == t]
        if n <= 4:
            nid = rng.choice(cand)
            if len(free[nid]) < n:
                continue
            idx, free[nid] = free[nid][:n], free[nid][n:]
            slices = (Slice(nid, tuple(idx)),)
        else:
            two = [c for c in cand if len(free[c]) == 4][:2]
            if len(two) < 2:
                continue
            slices = tuple(Slice(c, (0, 1, 2, 3)) for c in two)
            for c in two:
                free[c] = []
        guar = tenants and rng.random() < 0.35
        tenant = rng.choice(("A", "B")) if guar else rng.choice(("A", "B", "C"))
        j = jv(rng, f"r{k}", n, t, tenant, guar)
        placed = rng.choice((None, NOW - 10, NOW - 100, NOW - 599, NOW - 600, NOW - 5000, NOW + 30))
        running.append(RunningView(j, Cell(t, n), slices, since=NOW - rng.uniform(0, 9000), placed_at=placed,
                                   opportunistic=rng.random() < 0.2))
    # a few GPUs busy with nothing the round knows (ending workers)
    for nid in nodes:
        if free[nid] and rng.random() < 0.2:
            foreign[nid].add(free[nid].pop())
    pending = [jv(rng, f"p{k}", rng.choice((1, 2, 4, 8)), rng.choice(("X", "Y")),
                  rng.choice(("A", "B", "C")), tenants and rng.random() < 0.5) for k in range(rng.randint(0, 6))]
    if rng.random() < 0.3 and pending:  # cost objective job
        pending[0] = dataclasses.replace(pending[0], objective=Objective.COST, slo_s=1e5, priority=Priority.BEST_EFFORT,
                                         promise=None)
    views = tuple(NodeView(nid, tuple(GpuView(i, t, 40 * GB) for i in range(4)),
                           frozenset(i for i in range(4) if i not in free[nid]))
                  for nid, t in nodes.items())
    return Snapshot(views, tuple(pending), (("X", 40 * GB, 12), ("Y", 40 * GB, 8)), running=tuple(running),
                    now=NOW, tenants=TENANTS if tenants else (), prices=(("X", 2.0), ("Y", 3.0)))


KEPT = "running; not restarted by a round before"


def may_be_exempt(r: RunningView, s: Snapshot, m: float) -> bool:
    return (r.job.priority is Priority.BEST_EFFORT and r.placed_at is not None and r.placed_at <= s.now + MAX_SKEW_S
            and s.now < r.placed_at + m)


@pytest.mark.parametrize("policy", sorted(FACTORIES))
@pytest.mark.parametrize("tenants", [True, False])
def test_random_rounds_keep_the_rounds_invariants(policy: str, tenants: bool) -> None:
    rng = random.Random(zlib.crc32(f"{policy}{tenants}".encode()))
    for trial in range(30):
        s = random_snapshot(rng, tenants)
        running = {r.job.id: r for r in s.running}
        plan = plan_round(s, EST, make_policy(policy), RoundConfig(min_run_s=600.0))
        assert sorted(d.job_id for d in plan.decisions) == sorted([*running, *(j.id for j in s.pending)]), trial
        _check(RoundContext(s, EST, RoundConfig()), plan.decisions, policy)
        kept = [d for d in plan.decisions if d.reason.startswith(KEPT)]
        for d in kept:
            r = running[d.job_id]
            assert may_be_exempt(r, s, 600.0) and d.action is Action.KEEP, (trial, d)
            assert (d.slices, d.cell) == (r.slices, r.cell), (trial, d)
        if kept:
            ends = sorted(running[d.job_id].placed_at + 600.0 for d in kept)  # type: ignore[operator]
            assert plan.wakes[-1] == ends[0] > s.now, (trial, plan.wakes)
        else:
            assert plan == plan_round(s, EST, make_policy(policy), RoundConfig()), trial
        assert plan.admitted == plan_round(s, EST, make_policy(policy), RoundConfig()).admitted or not tenants


@pytest.mark.parametrize("policy", ["crius", "morphling", "fcfs", "elasticflow-l"])
def test_random_forecasts_run(policy: str) -> None:
    rng = random.Random(5)
    for _ in range(10):
        s = random_snapshot(rng, True)
        out = forecast(s, EST, make_policy(policy), RoundConfig(min_run_s=600.0),
                       ForecastConfig(rounds_at_departures=True, start_cost_s=0.0))
        assert set(out) == {j.id for j in s.pending} | {r.job.id for r in s.running}
