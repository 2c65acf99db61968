"""The simulation loop: a simulated clock, simulated nodes and GPUs, the same `plan_round` as the
live controller, and a throughput oracle that says how fast each placed job really trains.

Each round: (1) running jobs progress over the last interval and the finished ones leave; (2) the
jobs submitted since arrive; (3) `plan_round` decides; (4) the decisions are applied: starts and
migrations pay the restart cost of the rules, suspended jobs go back to the queue with their
progress, dropped jobs leave; (5) the round's metrics are recorded.

Three sets of rules (`Rules`), see docs/simulator.md:
- "arena": the Crius artifact's simulator (scheduler.py, simulator.py, trace_manager.py): 300 s
  rounds; jobs arrive in 300 s chunks and their submission time becomes the round's time; a job's
  progress is the floor of its cumulative execution time over its *current* iteration time (the
  artifact's `update_remained_iter_num`); a job that gains GPUs pays min(10 s x GPUs, 40 s) under
  Crius and min(150 s x GPUs, 600 s) under the baselines, and a cost over 300 s loses whole rounds
  (`resched_time_debt_table`); cluster throughput per round is scaled by the cost;
- "fair": the same clock, but arrivals at their real time, progress counted interval by interval,
  and every policy pays the same restart cost (default 260 s, Morphling's measured cost per
  placement change) for every start and every change of its GPUs;
- "morphling": the Morphling artifact's rules: 60 s rounds, 260 s per placement change, a job ends
  after its `steps` iterations.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from tessera.controller.core.policy import CachedEstimates, Estimates, Policy, RoundConfig, plan_round
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    JobView,
    NodeView,
    Objective,
    PlanChoice,
    RunningView,
    Slice,
    Snapshot,
    TenantQuota,
)
from tessera.controller.sim import tenants as tn
from tessera.controller.sim.clusters import Cluster
from tessera.controller.sim.oracles import ArenaOracle
from tessera.controller.sim.traces import TraceJob
from tessera.controller.sim.unstarted import classify


@dataclass(frozen=True)
class Rules:
    name: str
    interval_s: float = 300.0
    default_rounds: int = 0  # 0 = until every job is done
    progress: str = "exact"  # "artifact" | "exact"
    arrivals: str = "exact"  # "artifact" | "exact"
    # Restart cost: (seconds per GPU, cap) for Crius and for the others; or one fixed cost for all.
    crius_cost: tuple[float, float] = (10.0, 40.0)
    other_cost: tuple[float, float] = (150.0, 600.0)
    fixed_cost: float | None = None
    # Which jobs pay: "gain" = jobs that got a GPU they did not hold (the artifact), "change" = any
    # change of the GPU set, first start included.
    pays: str = "change"
    # Arena traces scale iterations by 5 at generation; the artifact's simulator divides them back.
    iteration_divisor: int = 1
    deadline_factor: float = 1.0

    def cost(self, policy: str, gpus: int) -> float:
        if self.fixed_cost is not None:
            return self.fixed_cost
        per, cap = self.crius_cost if policy.startswith("crius") else self.other_cost
        return min(per * gpus, cap)


ARENA = Rules("arena", 300.0, 2000, "artifact", "artifact", pays="gain", iteration_divisor=5, deadline_factor=5.0)
FAIR = Rules("fair", 300.0, 2000, "exact", "exact", fixed_cost=260.0, iteration_divisor=5, deadline_factor=5.0)
MORPHLING = Rules("morphling", 60.0, 0, "exact", "exact", fixed_cost=260.0)
RULES = {"arena": ARENA, "fair": FAIR, "morphling": MORPHLING}


class Truth:
    """How fast a job really trains on a resource (seconds per iteration; 0 = cannot run) and its
    throughput for the metrics. Defaults to the estimates' best Cell."""

    def __init__(self, est: Estimates) -> None:
        self.est = est
        self._memo: dict[tuple[str, str, int, int], float] = {}

    def iteration_s(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> float:
        k = (job.key, gpu_type, gpus, nodes)
        v = self._memo.get(k)
        if v is None:
            cells = self.est.cells(job, gpu_type, gpus, nodes)
            v = min((c.iteration_s for c in cells), default=0.0)
            self._memo[k] = v
        return v

    def throughput(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> float:
        it = self.iteration_s(job, gpu_type, gpus, nodes)
        return job.global_batch_size / it if it > 0 else 0.0


class ArenaTruth(Truth):
    """The artifact's own numbers: throughput of the optimal plan, iteration time rounded as its
    `_get_iter_time(force_opt=True)` does."""

    def __init__(self, oracle: ArenaOracle) -> None:
        super().__init__(oracle)
        self.oracle = oracle

    def iteration_s(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> float:
        return self.oracle.iteration_time(job.key, gpu_type, gpus, nodes)

    def throughput(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> float:
        return self.oracle.throughput(job.key, gpu_type, gpus, nodes)


@dataclass
class SimJob:
    t: TraceJob
    view: JobView
    arrive_round: int
    arrive_time: float  # when it entered the queue (arena: the round's time)
    iters_total: float
    state: str = "future"  # future | pending | running | done | dropped
    cell: Cell | None = None
    slices: tuple[Slice, ...] = ()
    plan_opp: bool = False
    done: float = 0.0
    exec_time: float = 0.0
    it_s: float = 0.0
    debt: float = 0.0  # arena: seconds left in the artifact's debt table (0 = not in it)
    in_debt: bool = False
    blocked: float = 0.0  # exact: restart seconds still to pay
    pay_now: float = 0.0  # arena: restart seconds paid inside this round
    queue_s: float = 0.0
    pending_since: float = 0.0
    first_start: float | None = None
    placed_at: float | None = None  # its present placement's start or move (controller/core/minrun.py)
    end: float | None = None
    launches: int = 0  # GPU-set changes that paid a cost (first start included)
    changes: int = 0  # GPU-set changes after the first start (restarts)
    restart_gpu_s: float = 0.0  # GPU-seconds charged for the paid ones (bench/morphling_waste.py)
    suspensions: int = 0
    unrunnable: int = 0  # starts/migrations onto GPUs the truth says it cannot run on (0 s/iteration)
    reason: str = ""
    # Guaranteed jobs (docs/tenants.md): the round that first admitted it within quota (its SLA
    # clock), its promise's iteration time, and whether it was ever behind its promise.
    sla_since: float | None = None
    sla_tp: float = 0.0
    sla_behind: bool = False
    # At the end of the run, for a job that arrived and was never started nor dropped: "runnable"
    # (the cluster has a Cell for it) or "infeasible" (none); see controller/sim/unstarted.py.
    unstarted: str = ""
    # A pipeline over mixed GPU types (the cost objective): its plan with the stages; it runs at the
    # cost tree's predicted iteration time (the truth has no mixed-type Cells).
    plan: PlanChoice | None = None


@dataclass
class RoundRecord:
    index: int
    time: float
    throughput: float
    running: int
    pending: int
    gpus_used: int
    started: int
    migrated: int
    suspended: int
    finished: int
    evaluations: int


@dataclass
class SimResult:
    policy: str
    mode: str
    rules: str
    trace: str
    cluster: str
    jobs: list[SimJob]
    rounds: list[RoundRecord]
    round_seconds: list[float] = field(default_factory=list)
    # Why the run ended: "done" (no job left), "stuck" (nothing could change any more) or "rounds"
    # (the round limit).
    end: str = ""


class Simulator:
    def __init__(self, cluster: Cluster, trace: Sequence[TraceJob], estimates: Estimates, truth: Truth,
                 rules: Rules, trace_name: str = "", round_config: RoundConfig | None = None,
                 type_of: Callable[[str], str] | None = None, tenants: tuple[TenantQuota, ...] = (),
                 prices: Mapping[str, float] | None = None) -> None:
        self.cluster = cluster
        self.trace = list(trace)
        self.estimates = estimates
        self.truth = truth
        self.rules = rules
        self.trace_name = trace_name
        self.cfg = round_config or RoundConfig(interval_s=rules.interval_s)
        # Trace GPU type spelling -> cluster type name ("a40" -> "A40-48GB").
        self.type_of = type_of or (lambda s: s)
        # Tenants with quotas (docs/tenants.md); empty: every job best-effort, as before tenants.
        self.tenants = tenants
        # Price per GPU-hour of each type, for jobs with the cost objective (Snapshot.prices).
        self.prices = tuple(sorted((prices or {}).items()))

    def run(self, policy: Policy, mode: str = "", rounds: int = 0, max_rounds: int = 100_000,
            clock: Callable[[], float] = time.perf_counter, until_done: bool = False,
            observe: Callable[[Snapshot], None] | None = None) -> SimResult:
        """Simulate `rounds` rounds (0: the rules' default, else until every job is done). With
        `until_done`, `rounds` is only a cap: the run ends once every job is done or none can.
        `observe` sees each round's snapshot before the policy (bench/forecast_accuracy.py)."""
        r_ = self.rules
        interval = r_.interval_s
        est = self.estimates if isinstance(self.estimates, CachedEstimates) else CachedEstimates(self.estimates)
        nodes0 = self.cluster.nodes()
        node_index = {n.id: i for i, n in enumerate(nodes0)}
        busy: list[set[int]] = [set() for _ in nodes0]
        busy_cpus = [0] * len(nodes0)
        node_views: list[NodeView] = list(nodes0)
        dirty: set[int] = set()
        cluster_gpus = self.cluster.cluster_gpus()
        if not self.trace:
            return SimResult(policy.name, mode, r_.name, self.trace_name, self.cluster.name, [], [], end="done")
        t0 = self.trace[0].submit_time
        # Arrival round of each job.
        jobs: list[SimJob] = []
        for tj in self.trace:
            if r_.arrivals == "artifact":
                # trace_manager.py: the first 300 s chunk whose end reaches the submission.
                k = max(0, math.ceil((tj.submit_time - t0) / interval) - 1)
                arrive_t = t0 + k * interval
            else:
                k = max(0, math.ceil((tj.submit_time - t0) / interval))
                arrive_t = tj.submit_time
            deadline = 0.0
            if tj.deadline > 0:
                base = t0 + k * interval if r_.arrivals == "artifact" else tj.submit_time
                deadline = base + (tj.deadline - tj.submit_time) * r_.deadline_factor
            iters = max(1, tj.iterations // r_.iteration_divisor)
            hint = self.type_of(tj.gpu_type) if tj.gpu_type else ""
            tenant, prio, promise = tn.tenancy(tj, hint)
            view = JobView(tj.id, tj.submit_time, tj.model, tj.global_batch_size, tj.gpus, (), hint, iters, 0.0,
                           deadline, 0, tj.model_key, tenant=tenant, priority=prio, promise=promise,
                           objective=Objective(tj.objective), slo_s=tj.slo_s)
            jobs.append(SimJob(tj, view, k, arrive_t, float(iters)))
        by_round: dict[int, list[SimJob]] = {}
        for j in jobs:
            by_round.setdefault(j.arrive_round, []).append(j)
        last_arrival = max(by_round)
        limit = (rounds or max_rounds) if until_done else (rounds or r_.default_rounds or max_rounds)
        running: dict[str, SimJob] = {}
        pending: dict[str, SimJob] = {}
        records: list[RoundRecord] = []
        secs: list[float] = []
        departures = 0
        end = "rounds"

        def hold(j: SimJob, on: bool) -> None:
            for s in j.slices:
                i = node_index[s.node_id]
                if on:
                    busy[i].update(s.gpu_indices)
                else:
                    busy[i].difference_update(s.gpu_indices)
                busy_cpus[i] += (1 if on else -1) * tn.cpus_on(j.t, len(s.gpu_indices))
                dirty.add(i)

        for r in range(limit):
            now = t0 + r * interval
            finished_now = 0
            # (1) progress over the last interval
            if r > 0:
                for j in list(running.values()):
                    if self._progress(j, now, interval):
                        finished_now += 1
                        hold(j, False)
                        del running[j.t.id]
            departures = finished_now
            if self.tenants:
                self._check_sla(jobs, now)
            # (2) arrivals
            new_ids = []
            for j in by_round.get(r, ()):
                j.state = "pending"
                j.pending_since = j.arrive_time
                pending[j.t.id] = j
                new_ids.append(j.t.id)
            if not running and not pending and r > last_arrival:
                end = "done"
                break
            # (3) decide
            for i in dirty:
                n0 = nodes0[i]
                node_views[i] = NodeView(n0.id, n0.gpus, frozenset(busy[i]), n0.cpus, n0.host_memory_bytes,
                                         min(n0.cpus, busy_cpus[i]) if n0.cpus else 0)
            dirty.clear()
            run_views = tuple(
                RunningView(self._view(j), j.cell, j.slices, j.plan, opportunistic=j.plan_opp,  # type: ignore[arg-type]
                            since=j.first_start or 0.0, placed_at=j.placed_at)
                for j in running.values())
            snap = Snapshot(tuple(node_views), tuple(self._view(j) for j in pending.values()), cluster_gpus,
                            run_views, now, tuple(new_ids), departures, self.tenants, r_.fixed_cost or 0.0,
                            prices=self.prices)
            if observe is not None:
                observe(snap)
            c0 = clock()
            plan = plan_round(snap, est, policy, self.cfg)
            secs.append(clock() - c0)
            for jid in plan.admitted:
                adm = running.get(jid) or pending.get(jid)
                if adm is not None and adm.sla_since is None:
                    adm.sla_since = now
            # (4) apply
            started = migrated = suspended = 0
            paying: list[SimJob] = []
            # GPUs given up this round are released before any are taken (a job may start on GPUs
            # another job leaves in the same round).
            for d in plan.decisions:
                if d.action in (Action.MIGRATE, Action.STOP, Action.DROP) and d.job_id in running:
                    hold(running[d.job_id], False)
            for d in plan.decisions:
                found = running.get(d.job_id) or pending.get(d.job_id)
                if found is None:
                    continue
                j = found
                if d.action is Action.START or d.action is Action.MIGRATE:
                    old = {(s.node_id, i) for s in j.slices for i in s.gpu_indices}
                    new = {(s.node_id, i) for s in d.slices for i in s.gpu_indices}
                    j.cell = d.cell or Cell(self._type_at(d.slices), len(new))
                    j.slices = d.slices
                    j.plan_opp = d.opportunistic
                    j.plan = d.plan if d.plan is not None and d.plan.stages else None
                    hold(j, True)
                    job_view = self._view(j)
                    j.it_s = d.iteration_s if j.plan is not None else self._iter_s(job_view, j)
                    if j.it_s <= 0:
                        # The policy believed it could run there; the truth says it cannot. The job
                        # holds the GPUs without progress until a policy moves it (as a real job
                        # that keeps failing would); counted so that a run's summary shows it.
                        j.unrunnable += 1
                    pays = bool(new - old) if r_.pays == "gain" else (new != old)
                    if d.action is Action.START:
                        started += 1
                        del pending[j.t.id]
                        running[j.t.id] = j
                        j.state = "running"
                        j.queue_s += now - j.pending_since
                        if j.first_start is None:
                            j.first_start = now
                        else:
                            j.changes += 1
                    else:
                        migrated += 1
                        j.changes += 1
                    j.placed_at = now
                    if pays:
                        paying.append(j)
                    j.reason = d.reason
                elif d.action is Action.KEEP:
                    j.plan_opp = d.opportunistic
                elif d.action is Action.STOP:
                    suspended += 1
                    del running[j.t.id]
                    j.state = "pending"
                    j.suspensions += 1
                    j.pending_since = now
                    pending[j.t.id] = j
                    j.slices, j.cell, j.plan = (), None, None
                    if r_.progress == "artifact":
                        # The artifact restarts the count from what was left (exec time kept).
                        j.iters_total = max(0.0, j.iters_total - math.floor(j.exec_time / j.it_s) if j.it_s else j.iters_total)
                    j.in_debt, j.debt, j.blocked = False, 0.0, 0.0
                    j.reason = d.reason
                elif d.action is Action.DROP:
                    running.pop(j.t.id, None)
                    pending.pop(j.t.id, None)
                    j.state = "dropped"
                    j.queue_s += now - j.pending_since if j.first_start is None else 0.0
                    j.reason = d.reason
                elif d.action is Action.PENDING:
                    j.reason = d.reason
            for j in paying:
                j.launches += 1
                gpus = len([i for s in j.slices for i in s.gpu_indices])
                cost = r_.cost(policy.name, gpus)
                if j.launches > 1:
                    j.restart_gpu_s += cost * gpus
                if r_.progress == "artifact":
                    self._artifact_cost(j, cost, interval)
                else:
                    j.blocked = cost
            # (5) metrics
            thr = self._metric(running.values(), paying, interval)
            # Nothing can change any more: no arrivals left, no job making progress, no start.
            stuck = (r > last_arrival and started == 0 and migrated == 0
                     and not any(j.it_s > 0 for j in running.values()))
            records.append(RoundRecord(r, now, thr, len(running), len(pending),
                                       sum(len(b) for b in busy), started, migrated, suspended, finished_now,
                                       plan.stats.choices_evaluated))
            if stuck and (until_done or not rounds):
                end = "stuck"
                break  # an idle cluster and no more arrivals: the waiting jobs can never start
        end_t = t0 + len(records) * interval
        for j in pending.values():
            j.queue_s += end_t - j.pending_since
        horizon = len(records)
        marks = classify(((j.view, j.arrive_round < horizon and j.first_start is None and j.state != "dropped")
                          for j in jobs), est, nodes0)
        for j, m in zip(jobs, marks, strict=True):
            j.unstarted = m
            if m == "infeasible":
                j.reason = "infeasible: no Cell for it on any GPU type of the cluster" + (f"; last: {j.reason}" if j.reason else "")
        return SimResult(policy.name, mode, r_.name, self.trace_name, self.cluster.name, jobs, records, secs,
                         end if records else "done")

    # ------------------------------------------------------------------ helpers

    def _view(self, j: SimJob) -> JobView:
        v = j.view
        if v.done_iterations != j.done or v.restarts != j.changes or v.admitted_at != j.sla_since:
            its = int(j.iters_total) if self.rules.progress == "artifact" else v.iterations
            # An SLO of `iterations within` is the iterations left's share of it (common/objective.py).
            slo = j.t.slo_s * max(0.0, its - j.done) / its if j.t.slo_s and its else v.slo_s
            v = replace(v, iterations=its, done_iterations=j.done, restarts=j.changes, slo_s=slo,
                        admitted_at=j.sla_since)
            j.view = v
        return v

    def _check_sla(self, jobs: Iterable[SimJob], now: float) -> None:
        """Round end `now`: every admitted guaranteed job behind its promise is marked (once)."""
        r_ = self.rules
        for j in jobs:
            if j.sla_since is None or j.sla_behind or j.state in ("dropped", "future"):
                continue
            if not j.sla_tp:
                p = j.view.promise
                t = (p.gpu_type if p and p.gpu_type else "") or (j.cell.gpu_type if j.cell else "") \
                    or j.view.gpu_type_hint or self.cluster.gpu_types()[0]
                j.sla_tp = tn.promise_time(j.view, t, self.cluster.per_node(t), self.truth) or -1.0
            done = j.iters_total if j.state == "done" else j.done
            if tn.behind(done, j.iters_total, now, j.sla_since, r_.fixed_cost or 0.0, j.sla_tp):
                j.sla_behind = True

    def _type_at(self, slices: Sequence[Slice]) -> str:
        if not hasattr(self, "_node_type"):
            self._node_type = {n.id: n.gpus[0].model for n in self.cluster.nodes()}
        return self._node_type.get(slices[0].node_id, "")

    def _iter_s(self, view: JobView, j: SimJob) -> float:
        assert j.cell is not None
        return self.truth.iteration_s(view, j.cell.gpu_type, j.cell.gpus, len(j.slices))

    def _progress(self, j: SimJob, now: float, interval: float) -> bool:
        """Advance a running job over [now - interval, now]; True when it finished."""
        if self.rules.progress == "artifact":
            if j.in_debt:
                return False
            j.exec_time += interval
            if j.it_s <= 0:
                return False
            left = j.iters_total - math.floor(j.exec_time / j.it_s)
            j.done = j.iters_total - max(0.0, left)
            if left <= 0:
                j.state, j.end = "done", now
                return True
            return False
        avail = interval
        use = min(j.blocked, avail)
        j.blocked -= use
        avail -= use
        if j.it_s <= 0 or avail <= 0:
            return False
        need = (j.iters_total - j.done) * j.it_s
        if need <= avail:
            j.done = j.iters_total
            j.state, j.end = "done", now - interval + use + need
            return True
        j.done += avail / j.it_s
        return False

    @staticmethod
    def _artifact_cost(j: SimJob, cost: float, interval: float) -> None:
        # scheduler.py `_get_cluster_perf`: a cost within the round only scales this round's
        # throughput; a larger one becomes a debt that stops progress round by round.
        j.pay_now = cost if cost <= interval else 0.0
        if cost <= interval:
            j.in_debt, j.debt = False, 0.0
        else:
            j.in_debt, j.debt = True, cost

    def _metric(self, running: Iterable[SimJob], paying: list[SimJob], interval: float) -> float:
        total = 0.0
        paid = {id(j) for j in paying}
        for j in running:
            assert j.cell is not None
            if j.plan is not None:
                thr = j.view.global_batch_size / j.it_s if j.it_s > 0 else 0.0
            else:
                thr = self.truth.throughput(j.view, j.cell.gpu_type, j.cell.gpus, len(j.slices))
            if self.rules.progress == "artifact":
                if id(j) in paid and j.pay_now:
                    thr *= (interval - j.pay_now) / interval
                    j.pay_now = 0.0
                if j.in_debt:
                    if j.debt <= interval:
                        thr *= (interval - j.debt) / interval
                        j.in_debt, j.debt = False, 0.0
                    else:
                        thr = 0.0
                        j.debt -= interval
            else:
                thr *= max(0.0, interval - j.blocked) / interval
            total += thr
        return total
