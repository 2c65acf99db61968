"""One scheduling round: `plan_round(snapshot, estimates, policy, config) -> RoundPlan`.

The live controller and the simulator call this same function. It is pure and deterministic: the
only inputs are its arguments; the optional wall-clock budget reads a clock the caller passes in
(`RoundConfig.clock`), and with no clock the round is bounded by a count of evaluated choices.

A policy is a small object behind the `Policy` protocol: it reads a `RoundContext` (the snapshot,
a mutable copy of the free GPUs, memoised estimates, the budget) and returns decisions for the jobs
it acts on. `plan_round` fills in the rest (running jobs kept, pending jobs with a reason), checks
that the plan is physically possible (no GPU given twice, whole gangs, one GPU type per gang, or
per pipeline stage for the cost objective's mixed-type pipelines) and counts what the round cost.
Jobs with the cost objective are placed by controller/core/cost_objective.py before the policy runs.

The `Estimates` protocol is what a round needs from the estimator: the Cells of a job on a given
GPU type, count and node spread, with an estimated iteration time each. The simulator passes a
table of measured iteration times (the Crius artifact's) or the estimator itself; the live
controller passes the Cell estimator (estimator/cells.py) behind `CachedEstimates`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from tessera.common.errors import TesseraError
from tessera.controller.core import cost_objective, guarantees, minrun
from tessera.controller.core.admission import RoundSizer
from tessera.controller.core.placement import ClusterState, quotas
from tessera.controller.core.preplace import preplace
from tessera.controller.core.quotas import admit
from tessera.controller.core.snapshot import (
    PLACED,
    Action,
    Decision,
    JobView,
    PendingKind,
    Promise,
    RoundPlan,
    RoundStats,
    RunningView,
    Slice,
    Snapshot,
)

# CellEstimate lives in snapshot.py (the guarantee layer needs it without this module); its old
# home keeps exporting it.
from tessera.controller.core.snapshot import CellEstimate as CellEstimate  # noqa: PLC0414
from tessera.controller.core.untimed import cap_untimed


@runtime_checkable
class Estimates(Protocol):
    """What a round asks the estimator. Implementations must be deterministic."""

    def cells(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> Sequence[CellEstimate]:
        """The job's Cells on `gpus` GPUs of `gpu_type` spread evenly over `nodes` nodes: one per
        feasible pipeline-stage count (Crius: 1 .. gpus, powers of two), each with the iteration
        time of the best plan inside it. Empty when the job cannot run there (out of memory, a
        plan the estimator does not cover)."""
        ...

    def gpu_counts(self, job: JobView, gpu_type: str) -> Sequence[int]:
        """GPU counts (ascending) at which the job fits in memory on this type: the Cells of a job
        submitted without a GPU count come from this range."""
        ...


@runtime_checkable
class DataParallelMemory(Protocol):
    """Optional: whether plain data parallelism fits in memory. Baselines in the Crius artifact's
    mode schedule with data-parallel profiles ("schedule with DP data, run with Alpa")."""

    def dp_fits(self, job: JobView, gpu_type: str, gpus: int) -> bool: ...


class CachedEstimates:
    """Memoises `cells` and `gpu_counts` by (job estimate key, type, GPUs, nodes) across rounds.

    The event loop forgets keys (a measured step time) while the warm-up or forecast thread fills
    the caches: writes and `forget` hold `_lock`. A comprehension over a dict the other thread grew
    raised "dictionary changed size during iteration" (288 of 300 calls in the test), and so did a
    copy by list() once, under load (a collection ran Python finalizers mid-copy)."""

    def __init__(self, inner: Estimates) -> None:
        self.inner = inner
        self._cells: dict[tuple[str, str, int, int], tuple[CellEstimate, ...]] = {}
        self._counts: dict[tuple[str, str], tuple[int, ...]] = {}
        self._dp: dict[tuple[str, str, int], bool] = {}
        # Checked once: isinstance against a runtime-checkable Protocol reads its attributes every
        # time (gavel asked two million times a round).
        self._inner_dp: DataParallelMemory | None = inner if isinstance(inner, DataParallelMemory) else None
        self._lock = threading.Lock()
        self.misses = 0

    def cells(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> Sequence[CellEstimate]:
        k = (job.key, gpu_type, gpus, nodes)
        got = self._cells.get(k)
        if got is None:
            self.misses += 1
            got = tuple(self.inner.cells(job, gpu_type, gpus, nodes))
            with self._lock:
                self._cells[k] = got
        return got

    def gpu_counts(self, job: JobView, gpu_type: str) -> Sequence[int]:
        k = (job.key, gpu_type)
        got = self._counts.get(k)
        if got is None:
            got = tuple(self.inner.gpu_counts(job, gpu_type))
            with self._lock:
                self._counts[k] = got
        return got

    def known(self, job: JobView, gpu_type: str) -> bool:
        """Whether the job's GPU counts on the type are memoised (its Cells there computed)."""
        return (job.key, gpu_type) in self._counts

    def forget(self, key: str) -> None:
        """Drop what is memoised for one estimate key (its inner answers changed, e.g. measured)."""
        with self._lock:
            self._cells = {k: v for k, v in self._cells.items() if k[0] != key}
            self._counts = {k: v for k, v in self._counts.items() if k[0] != key}
            self._dp = {k: v for k, v in self._dp.items() if k[0] != key}

    def dp_fits(self, job: JobView, gpu_type: str, gpus: int) -> bool:
        inner = self._inner_dp
        if inner is None:
            return True
        k = (job.key, gpu_type, gpus)
        got = self._dp.get(k)
        if got is None:
            got = inner.dp_fits(job, gpu_type, gpus)
            with self._lock:
                self._dp[k] = got
        return got


@dataclass(frozen=True)
class RoundConfig:
    """Knobs of one round, with the defaults the live controller uses."""

    # Crius search depth: the most scaling steps (GPU count halved/doubled, GPU type changed) one
    # scheduling choice may make (Crius Sec. 6.1 and 8.7).
    search_depth: int = 3
    # Deterministic budget: the most scheduling choices a round evaluates. Past it, jobs still to
    # be decided get only a direct fit (no scaling of others) and the stats say so.
    max_evaluations: int = 500_000
    # Wall-clock budget per round in seconds (0 = none). Needs `clock`; a budget by time makes the
    # round depend on the machine, so the simulator leaves it off by default.
    time_budget_s: float = 0.0
    clock: Callable[[], float] | None = None
    # Length of a round; the deadline-aware policy counts one round before a job can start.
    interval_s: float = 300.0
    # Upper bound of the GPUs of one job (0 = the largest node group count times the nodes).
    max_gpus_per_job: int = 0
    # Tenants' admission (controller/core/quotas.py, docs/tenants.md): a guaranteed job waiting
    # longer than this (seconds since submission) is admitted before shorter promises, and blocks
    # its tenant's later ones while it does not fit (the bound against starvation of the
    # shortest-promise-first order). A knob tuned on the Morphling MT replay (docs/tenants.md).
    admit_starve_s: float = 8 * 3600.0
    # Guaranteed jobs not admitted may run as best-effort (preemptible) on idle GPUs until admitted
    # (docs/tenants.md, "Borrowing while not admitted"). Off by default: on the Morphling MT replay
    # it made morphling's average JCT worse and left guaranteed jobs never admitted (the figures
    # are in docs/tenants.md).
    admit_borrow: bool = False
    # A best-effort job placed less than this long ago (seconds) is not restarted by the round:
    # not preempted, shrunk, moved or suspended (controller/core/minrun.py, --min-run). 0 = off.
    min_run_s: float = 0.0


class Mode(StrEnum):
    """Which description of a policy to follow: "paper", as its own paper describes it, or
    "artifact", as the Crius artifact ran it (docs/scheduler.md; a policy may treat both alike)."""

    PAPER = "paper"
    ARTIFACT = "artifact"


class Policy(Protocol):
    """A scheduling policy: decisions for the jobs it acts on, from a round's context.

    The contract, which `finalize` enforces (a breach raises `RoundPlanError`, a bug in the policy):
    - At most one decision per job, and only for jobs of the snapshot (`ctx.running`, `ctx.pending`).
    - A pending job may get `Action.START`, `PENDING` or `DROP`; a running job `KEEP`, `MIGRATE`,
      `STOP` or `DROP`. A job the policy leaves out stays as it is: a running job is kept, a
      pending job waits (`PendingKind.WAITING`, "waiting: <policy> did not place it this round").
    - Every `PENDING` decision carries its `pending` kind (waiting, no room now, fits nowhere) and
      no other decision carries one: the engine acts on the kind (a job that fits nowhere gets the
      memory it needs added to its reason), people read the reason.
    - `START`, `MIGRATE` and `KEEP` name their whole placement: with a `cell`, exactly `cell.gpus`
      GPUs, all of `cell.gpu_type` (or, for a plan with `stages`, each stage's GPUs of its own type,
      in slice order: the cost objective's pipelines); every GPU idle in the snapshot or held by a
      running job of this round, and given to one job only.
    A policy may read everything in the context, use `ctx.state` (its copy of the free GPUs) and the
    memoised estimates, and keep state of its own between rounds only as a cache that does not
    change its decisions (rounds must replay bit for bit). It may not change the snapshot, call
    out (clock, network, randomness) other than through the context, or decide a job it was not
    given; a round over its budget (`ctx.spend()` false) still returns decisions, with direct fits
    only.

    With tenants configured, the guarantee layer (controller/core/guarantees.py) runs around every
    policy: guaranteed jobs over quota are not in the context, the admitted ones are in
    `ctx.guaranteed`, and after the policy each admitted job is held to its promise. A policy that
    handles guarantees itself may say so with a true `handles_guarantees` attribute: the layer then
    lets it give guaranteed jobs more GPUs than their promise (docs/tenants.md).
    """

    @property
    def name(self) -> str: ...

    def plan(self, ctx: RoundContext) -> list[Decision]: ...


class BudgetExhausted(Exception):
    pass


@dataclass
class RoundContext:
    """What a policy reads and uses during one round. `state` starts with the GPUs of running jobs
    held; a policy that moves a running job releases them first."""

    snap: Snapshot
    estimates: Estimates
    config: RoundConfig
    state: ClusterState = field(init=False)
    running: dict[str, RunningView] = field(init=False)
    pending: list[JobView] = field(init=False)
    arrivals: frozenset[str] = field(init=False)
    estimate_calls: int = 0
    evaluations: int = 0
    budget_exhausted: bool = False
    _memo: dict[tuple[str, str, int, int], CellEstimate | None] = field(default_factory=dict)
    # ideal_nodes by (type, GPUs): it reads every node of the type, and sia asks millions of times.
    _ideal: dict[tuple[str, int], int] = field(default_factory=dict)
    # The estimates when they answer dp_fits, checked once (see CachedEstimates._inner_dp).
    _dp_est: DataParallelMemory | None = None
    _t0: float = 0.0
    # Tenants configured (Snapshot.tenants): the guaranteed jobs admitted within their tenant's
    # quota this round, each with its promise (its GPU type filled in). After the policy, the
    # guarantee layer (controller/core/guarantees.py) holds each of them to its promise: a policy
    # that wants no override places them at least as fast as the promise (docs/tenants.md).
    # Guaranteed jobs over quota are not in `pending` at all. Empty without tenants.
    guaranteed: dict[str, Promise] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.state = ClusterState.from_nodes(self.snap.nodes)
        self.running = {r.job.id: r for r in sorted(self.snap.running, key=lambda r: r.job.id)}
        self.pending = sorted(self.snap.pending, key=queue_key)
        ids = [j.id for j in self.pending]
        self.arrivals = frozenset(ids if self.snap.arrivals is None else self.snap.arrivals)
        self._dp_est = self.estimates if isinstance(self.estimates, DataParallelMemory) else None
        if self.config.clock is not None:
            self._t0 = self.config.clock()

    # ------------------------------------------------------------------ estimates

    def best(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> CellEstimate | None:
        """The job's best Cell (fastest stage count) on this resource, memoised for the round."""
        k = (job.key, gpu_type, gpus, nodes)
        if k in self._memo:
            return self._memo[k]
        self.estimate_calls += 1
        cells = self.estimates.cells(job, gpu_type, gpus, nodes)
        best = min(cells, key=lambda c: (c.iteration_s, c.cell.stages), default=None)
        if best is not None and best.iteration_s <= 0:
            best = None
        self._memo[k] = best
        return best

    def throughput(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> float:
        """Samples per second of the job's best Cell there; 0 when it cannot run."""
        b = self.best(job, gpu_type, gpus, nodes)
        return job.global_batch_size / b.iteration_s if b else 0.0

    def dp_fits(self, job: JobView, gpu_type: str, gpus: int) -> bool:
        return self._dp_est.dp_fits(job, gpu_type, gpus) if self._dp_est is not None else True

    def gpu_counts(self, job: JobView, gpu_type: str) -> Sequence[int]:
        return self.estimates.gpu_counts(job, gpu_type)

    # ------------------------------------------------------------------ cluster

    def types(self) -> list[str]:
        return self.state.types()

    def max_per_node(self, gpu_type: str) -> int:
        pool = self.state.pools.get(gpu_type)
        return pool.max_cap if pool else 0

    def ideal_nodes(self, gpu_type: str, gpus: int) -> int:
        """Nodes of the fewest-node even layout of the gang that the type's nodes hold when idle (the
        largest per-node share of placement.quotas, as ClusterState.place lays a gang out): 3 GPUs on
        three 2-GPU nodes are 3 x 1, not an uneven 2 + 1. When the nodes hold no even layout (5 GPUs on
        two 4-GPU nodes) the fewest nodes by count, an uneven split no Cell covers. 0: no such type."""
        got = self._ideal.get((gpu_type, gpus))
        if got is None:
            got = self._ideal[gpu_type, gpus] = self._layout_nodes(gpu_type, gpus)
        return got

    def _layout_nodes(self, gpu_type: str, gpus: int) -> int:
        pool = self.state.pools.get(gpu_type)
        cap = pool.max_cap if pool else 0
        if pool is None or cap <= 0:
            return 0
        if gpus <= cap:
            return 1
        for q in quotas(gpus, cap):
            if sum(1 for g in pool.groups if g.capacity >= q) >= gpus // q:
                return gpus // q
        return -(-gpus // cap)

    def total_gpus(self, gpu_type: str) -> int:
        pool = self.state.pools.get(gpu_type)
        return pool.total if pool else 0

    def max_gpus(self) -> int:
        if self.config.max_gpus_per_job:
            return self.config.max_gpus_per_job
        return max((p.total for p in self.state.pools.values()), default=0)

    # ------------------------------------------------------------------ budget

    def spend(self, n: int = 1) -> bool:
        """Count n evaluated choices; False once the round's budget is spent."""
        if self.budget_exhausted:
            return False
        self.evaluations += n
        over = self.evaluations > self.config.max_evaluations
        clock = self.config.clock
        if not over and clock is not None and self.config.time_budget_s > 0 and self.evaluations % 64 == 0:
            over = clock() - self._t0 > self.config.time_budget_s
        self.budget_exhausted = over
        return not self.budget_exhausted


def queue_key(job: JobView) -> tuple[float, str]:
    """The order of the queue: submission time, then id."""
    return (job.submit_time, job.id)


class RoundPlanError(TesseraError, ValueError):
    """A policy returned a round plan that cannot be carried out (a bug in the policy: INTERNAL)."""


def plan_round(snapshot: Snapshot, estimates: Estimates, policy: Policy,
               config: RoundConfig | None = None) -> RoundPlan:
    """Decide one round: each job's Cell, plan and placement, and a reason for each job pending,
    scaled, moved, suspended or dropped. Pure and deterministic (see the module docstring)."""
    cfg = config or RoundConfig()
    if cfg.min_run_s > 0:  # some running best-effort jobs are out of the round (controller/core/minrun.py)
        once = dataclasses.replace(cfg, min_run_s=0.0)
        return minrun.plan(snapshot, cfg.min_run_s, lambda s: plan_round(s, estimates, policy, once))
    rest, cost_jobs, cost_running = cost_objective.split(snapshot)
    if rest is snapshot:
        return _policy_round(snapshot, estimates, policy, cfg)
    # Jobs with the cost objective are placed first, whatever the policy; the policy sees neither
    # them nor the GPUs they hold (controller/core/cost_objective.py). They are best-effort work:
    # with tenants, the guarantee layer may preempt them like any other.
    placed, nodes = cost_objective.place(snapshot, cost_jobs)
    if snapshot.tenants:
        cost = [*placed, *cost_objective.keep(cost_running)]
        return _guarded_round(cost_objective.best_effort(snapshot), estimates, policy, cfg,
                              dataclasses.replace(rest, nodes=nodes), cost)
    inner = _policy_round(dataclasses.replace(rest, nodes=nodes), estimates, policy, cfg)
    ctx = RoundContext(snapshot, estimates, cfg)
    st = inner.stats
    ctx.estimate_calls, ctx.evaluations, ctx.budget_exhausted = st.estimate_calls, st.choices_evaluated, st.budget_exhausted
    return finalize(ctx, [*inner.decisions, *placed], policy.name)


def _policy_round(snapshot: Snapshot, estimates: Estimates, policy: Policy, cfg: RoundConfig) -> RoundPlan:
    if snapshot.tenants:
        return _guarded_round(snapshot, estimates, policy, cfg)
    ctx = RoundContext(releasing_free(snapshot), estimates, cfg)
    return finalize(ctx, policy.plan(ctx), policy.name)


def releasing_free(snap: Snapshot) -> Snapshot:
    """The snapshot as a policy plans on it: the GPUs being freed (`NodeView.releasing`) free. A start
    the policy places on them waits for their holder's checkpoint (`Engine._place`). Seen busy, they
    made a job already given them look short: crius halved a second running job for a job waiting
    on the first one's checkpoint, and the first one's GPUs then sat idle (a live audit)."""
    if not any(n.releasing for n in snap.nodes):
        return snap
    return dataclasses.replace(snap, nodes=tuple(
        dataclasses.replace(n, busy=n.busy - n.releasing, releasing=frozenset()) if n.releasing else n
        for n in snap.nodes))


def _guarded_round(snapshot: Snapshot, estimates: Estimates, policy: Policy, cfg: RoundConfig,
                   seen: Snapshot | None = None, placed: Sequence[Decision] = ()) -> RoundPlan:
    """A round with tenants (controller/core/guarantees.py, docs/tenants.md): admission within the
    quotas before the policy (guaranteed jobs over quota hidden from it), the policy's own round,
    then every admitted guaranteed job held to its promise. `seen`: the part of the snapshot the
    policy sees, when `placed` (the cost objective's decisions) holds the rest; the repair may
    preempt those like the policy's best-effort work."""
    handles = bool(getattr(policy, "handles_guarantees", False))
    full = RoundContext(snapshot, estimates, cfg)
    adm = admit(snapshot, RoundSizer(full, handles), cfg.admit_starve_s, cfg.admit_borrow)
    view: Snapshot = seen or snapshot
    before: list[Decision] = []
    # controller/core/preplace.py: a policy that places admitted jobs itself only on GPUs being freed
    own = handles or bool(getattr(policy, "places_admitted", False))
    view, before = preplace(full, adm, view, placed, policy.name, releasing_only=own)
    ctx = RoundContext(guarantees.policy_view(releasing_free(view), adm, borrow=cfg.admit_borrow), estimates, cfg)
    decided = {d.job_id for d in before}
    ctx.guaranteed = {k: p for k, p in guarantees.promises(adm).items() if k not in decided}
    first = finalize(ctx, policy.plan(ctx), policy.name)
    rest = [d for d in placed if d.job_id not in decided]
    decisions = [*first.decisions, *before, *rest]
    if not handles:
        decisions = cap_untimed(full, adm, decisions, policy.name)  # controller/core/untimed.py
    decisions = guarantees.repair(full, adm, decisions, policy.name, handles)
    full.estimate_calls += ctx.estimate_calls
    full.evaluations += ctx.evaluations
    full.budget_exhausted = full.budget_exhausted or ctx.budget_exhausted
    return dataclasses.replace(finalize(full, decisions, policy.name), admitted=tuple(sorted(adm.charges)))




def finalize(ctx: RoundContext, decided: Sequence[Decision], policy_name: str) -> RoundPlan:
    """The round's plan from a policy's decisions: jobs it left out filled in, the `Policy` contract
    checked (see its docstring), the cost and estimated throughput counted."""
    by_id: dict[str, Decision] = {}
    for d in decided:
        if d.job_id in by_id:
            raise RoundPlanError(f"policy {policy_name} decided job {d.job_id} twice")
        by_id[d.job_id] = d
    out: list[Decision] = []
    for r in ctx.running.values():
        got = by_id.pop(r.job.id, None)
        if got is None:
            d = Decision(r.job.id, Action.KEEP, "running", r.plan, r.slices, r.cell,
                         opportunistic=r.opportunistic)
        elif got.action is Action.START:
            raise RoundPlanError(f"policy {policy_name} started job {r.job.id}, which is running")
        elif got.action is Action.PENDING:
            raise RoundPlanError(f"policy {policy_name} left running job {r.job.id} pending; use stop")
        else:
            d = got
        out.append(d)
    for j in ctx.pending:
        got = by_id.pop(j.id, None)
        if got is None:
            d = Decision(j.id, Action.PENDING, f"waiting: {policy_name} did not place it this round",
                         pending=PendingKind.WAITING)
        elif got.action in (Action.KEEP, Action.MIGRATE, Action.STOP):
            raise RoundPlanError(f"policy {policy_name} gave action {got.action} to pending job {j.id}")
        else:
            d = got
        out.append(d)
    if by_id:
        raise RoundPlanError(f"policy {policy_name} decided unknown jobs {sorted(by_id)}")
    for d in out:
        if (d.action is Action.PENDING) != (d.pending is not None):
            what = "without a pending kind" if d.pending is None else f"with pending kind {d.pending}"
            raise RoundPlanError(f"policy {policy_name}: {d.action} of {d.job_id} {what}")
    _check(ctx, out, policy_name)
    jobs = {j.id: j for j in ctx.pending}
    jobs.update((r.job.id, r.job) for r in ctx.running.values())
    thr = 0.0
    for d in out:
        if d.action in PLACED and d.iteration_s > 0:
            thr += jobs[d.job_id].global_batch_size / d.iteration_s
    stats = RoundStats(ctx.estimate_calls, ctx.evaluations, ctx.budget_exhausted, thr)
    return RoundPlan(tuple(out), stats, policy_name)


def _check(ctx: RoundContext, decisions: Sequence[Decision], policy_name: str) -> None:
    """Every GPU given once, to a gang placed whole on GPUs of its Cell's type that are idle or
    held by running jobs of this round's plan."""
    nodes = {n.id: n for n in ctx.snap.nodes}
    held = {(s.node_id, i) for r in ctx.running.values() for s in r.slices for i in s.gpu_indices}
    named = {j.id: j.gpu_types for j in ctx.snap.pending} | {k: r.job.gpu_types for k, r in ctx.running.items()}
    used: dict[tuple[str, int], str] = {}
    for d in decisions:
        if d.action not in PLACED:
            continue
        if not d.slices:
            raise RoundPlanError(f"policy {policy_name}: {d.action} of {d.job_id} without a placement")
        gpu_ids = [(s.node_id, i) for s in d.slices for i in s.gpu_indices]
        if d.cell is not None:
            if len(gpu_ids) != d.cell.gpus:
                raise RoundPlanError(f"policy {policy_name}: {d.job_id} has {len(gpu_ids)} GPUs for {d.cell}")
            # A pipeline over mixed GPU types (the cost objective): each stage's GPUs of its type.
            stages = d.plan.stages if d.plan is not None else ()
            want = [st.gpu_type for st in stages for _ in range(st.gpus)] or [d.cell.gpu_type] * len(gpu_ids)
            if (types := named.get(d.job_id)) and not set(want) <= set(types):
                raise RoundPlanError(f"policy {policy_name}: {d.job_id} placed on {', '.join(sorted(set(want)))}; "
                                     f"it names {', '.join(types)}")
            if len(want) != len(gpu_ids):
                raise RoundPlanError(f"policy {policy_name}: {d.job_id} has {len(gpu_ids)} GPUs for stages of "
                                     f"{len(want)}")
            bad = [g for g, t in zip(gpu_ids, want, strict=True)
                   if g[0] not in nodes or nodes[g[0]].models.get(g[1]) != t]
            if bad:
                raise RoundPlanError(f"policy {policy_name}: {d.job_id} placed on GPUs not of type "
                                     f"{d.cell.gpu_type}: {bad[:4]}")
        for gid in gpu_ids:
            node = nodes.get(gid[0])
            idle = node is not None and gid[1] in node.models and (gid[1] not in node.busy or gid[1] in node.releasing)
            if not idle and gid not in held:
                raise RoundPlanError(f"policy {policy_name}: {d.job_id} placed on GPU {gid}, which is not free")
            if gid in used:
                raise RoundPlanError(f"policy {policy_name}: GPU {gid} given to {used[gid]} and {d.job_id}")
            used[gid] = d.job_id


def slices_gpus(slices: Sequence[Slice]) -> int:
    return sum(len(s.gpu_indices) for s in slices)
