"""What a scheduling round sees, built from the store's records and the live node table.

Pure: records and live nodes in, a policy `Snapshot` (controller/core/snapshot.py) out; the engine
reads the store and passes what it read. The live controller's GPU occupancy (`busy_gpus`) is here
too, because the snapshot, placement checks and `tessctl get nodes` must agree on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping

from tessera.common.gpus import lookup
from tessera.common.objective import slo_seconds
from tessera.controller.core import opaque
from tessera.controller.core.backoff import healthy
from tessera.controller.core.quotas import is_borrower, is_guaranteed
from tessera.controller.core.snapshot import (
    Cell,
    CostPrediction,
    GpuView,
    JobView,
    NodeView,
    Objective,
    PlanChoice,
    Priority,
    Promise,
    RunningView,
    Slice,
    Snapshot,
    StageAssignment,
    TenantQuota,
)
from tessera.controller.core.validate import canonical_gpu_types, resolve_model
from tessera.controller.registry import LiveNode, running_gpus
from tessera.controller.store import TERMINAL, JobRecord, NodeRecord
from tessera.estimator.cell_recipe import JobRecipe
from tessera.estimator.convert import execution_plan
from tessera.estimator.plans import ExecutionPlan, PlanInputError
from tessera.v1 import common_pb2

P = common_pb2


def job_recipe(spec: common_pb2.JobSpec) -> JobRecipe | None:
    """The job's recipe (JobSpec.plan) with the fields it sets; None when it sets none. The spec was
    validated at submission (controller/core/validate.py reads the same plan)."""
    if not spec.HasField("plan") or not spec.plan.ListFields():
        return None
    given = frozenset(d.name for d, _ in spec.plan.ListFields())
    try:
        return JobRecipe(execution_plan(spec.plan), given)
    except PlanInputError as exc:  # a record from an older vocabulary: its estimates refuse it by name
        return JobRecipe(ExecutionPlan(), given, refused=(exc.field, exc.reason))


def job_promise(spec: common_pb2.JobSpec) -> tuple[Priority, Promise | None]:
    """The job's class and, for a guaranteed one, its promise (JobSpec.priority/guarantee, validated
    at submission: a guaranteed job always holds a guarantee of at least one GPU)."""
    if spec.priority != P.PRIORITY_GUARANTEED:
        return Priority.BEST_EFFORT, None
    g = spec.guarantee
    return Priority.GUARANTEED, Promise(g.num_gpus, g.num_cpus, g.plan, lookup(g.gpu_type).name if g.gpu_type else "")


def job_view(job: JobRecord, progress: common_pb2.Progress | None, now: float = 0.0) -> JobView:
    """The policy's view of a job; `progress` is the latest report (the record's when None); `now`
    (wall time) turns an SLO deadline into seconds left."""
    prog = progress if progress is not None else job.progress
    if not job.spec.HasField("model"):
        return opaque_view(job, prog)
    # A waiting job's next attempt resumes from its last checkpoint, not from its last report: its
    # SLO's share and the iterations left count from there.
    done = 0.0 if prog is None else float(max(0, prog.checkpoint_iteration) if job.state == P.JOB_STATE_PENDING
                                          else prog.iteration)
    cost = job.spec.objective == P.OBJECTIVE_COST
    priority, promise = job_promise(job.spec)
    return JobView(job.id, job.submit_time, resolve_model(job.spec.model), job.spec.global_batch_size,
                   job.spec.hint.gpus, canonical_gpu_types(job.spec), iterations=job.spec.iterations,
                   done_iterations=done, restarts=job.restarts, recipe=job_recipe(job.spec),
                   objective=Objective.COST if cost else Objective.DEFAULT,
                   slo_s=slo_seconds(job.spec, done, now) if cost else 0.0,
                   tenant=job.spec.tenant or "default", priority=priority, promise=promise)


def opaque_view(job: JobRecord, prog: common_pb2.Progress | None) -> JobView:
    """An opaque job (docs/opaque-jobs.md): its GPUs and types only; one nominal iteration to go
    unless it reports iterations of its own (the policies' remaining-time sums stay positive)."""
    types = canonical_gpu_types(job.spec)
    done = float(prog.iteration) if prog else 0.0
    total = job.spec.iterations or 1
    priority, promise = job_promise(job.spec)
    # The first allowed type as the preference: a policy that starts from a type hint (Gandiva)
    # then asks for one the job allows.
    return JobView(job.id, job.submit_time, opaque.PLACEHOLDER_MODEL, 1, job.spec.hint.gpus or 1, types,
                   types[0] if types else "", iterations=total, done_iterations=min(done, total - 1) if not job.spec.iterations else done,
                   restarts=job.restarts, estimate_key=opaque.opaque_key(job.spec.hint.gpus or 1, types),
                   opaque=True, tenant=job.spec.tenant or "default", priority=priority, promise=promise)


def busy_cpus(placed: Iterable[JobRecord]) -> dict[str, int]:
    """CPUs held per node: a placed guaranteed job holds its promised CPUs, spread over its nodes in
    proportion to its GPUs there (the first slices take the remainder). Jobs without a promise of
    CPUs hold none that the controller counts (the agents do not meter CPUs)."""
    out: dict[str, int] = {}
    for j in placed:
        cpus = j.spec.guarantee.num_cpus if j.spec.priority == P.PRIORITY_GUARANTEED else 0
        slices = [s for s in j.placement.slices if s.gpu_indices] if j.placement else []
        gpus = sum(len(s.gpu_indices) for s in slices)
        if cpus <= 0 or not gpus:
            continue
        left = cpus
        for i, s in enumerate(slices):
            share = left if i == len(slices) - 1 else -(-cpus * len(s.gpu_indices) // gpus)
            share = min(share, left)
            out[s.node_id] = out.get(s.node_id, 0) + share
            left -= share
    return out


def jobs_on(active: Iterable[JobRecord], node_id: str) -> list[JobRecord]:
    """The jobs among `active` placed (at least partly) on `node_id`."""
    return [j for j in active if j.placement and any(s.node_id == node_id for s in j.placement.slices)]


def unseen_gpus(active: Iterable[JobRecord], sees: Callable[[str], bool]) -> dict[str, set[int]]:
    """GPUs per node held by the placements of active jobs whose tenant `sees` says no to."""
    out: dict[str, set[int]] = {}
    for job in active:
        if not sees(job.spec.tenant):
            for s in job.placement.slices if job.placement else ():
                out.setdefault(s.node_id, set()).update(s.gpu_indices)
    return out


def releasing_gpus(active: Iterable[JobRecord], move_targets: Mapping[str, tuple[Slice, ...]]) -> dict[str, set[int]]:
    """GPUs per node of MIGRATING jobs (checkpointing to stop: requeued, or relaunched on a move's
    target) that no move's target takes again: free once their workers exit."""
    out: dict[str, set[int]] = {}
    for job in active:
        if job.state == common_pb2.JOB_STATE_MIGRATING and job.placement is not None:
            for s in job.placement.slices:
                out.setdefault(s.node_id, set()).update(s.gpu_indices)
    for slices in move_targets.values():
        for sl in slices:
            out.get(sl.node_id, set()).difference_update(sl.gpu_indices)
    return out


def busy_gpus(nodes: Mapping[str, LiveNode], active: Iterable[JobRecord],
              move_targets: Mapping[str, tuple[Slice, ...]], exclude: str = "") -> dict[str, set[int]]:
    """GPUs held per node: by active attempts' placements, by the targets of migrations under way,
    and by any worker an agent reports running (all but job `exclude`'s own)."""
    busy: dict[str, set[int]] = {n: running_gpus(live, exclude) for n, live in nodes.items()}
    for job in active:
        if job.id == exclude:
            continue
        for s in job.placement.slices if job.placement else ():
            busy.setdefault(s.node_id, set()).update(s.gpu_indices)
    for job_id, slices in move_targets.items():
        if job_id != exclude:
            for sl in slices:
                busy.setdefault(sl.node_id, set()).update(sl.gpu_indices)
    return busy


def build_snapshot(records: Mapping[str, NodeRecord], nodes: Mapping[str, LiveNode], states: Mapping[str, int],
                   busy: Mapping[str, set[int]], pending: Iterable[JobRecord], placed: Iterable[JobRecord],
                   progress: Mapping[str, common_pb2.Progress], now: float,
                   prices: Mapping[str, float] | None = None, tenants: tuple[TenantQuota, ...] = (),
                   holding: Iterable[JobRecord] | None = None,
                   releasing: Mapping[str, set[int]] | None = None) -> Snapshot:
    """The round's input. `states`: each node's state (only READY nodes that are not unhealthy take
    work; controller/core/backoff.py); `pending`: the
    PENDING jobs; `placed`: the STARTING and RUNNING ones; `now`: wall time (deadlines' clock);
    `tenants`: the tenants file's quotas (controller/tenants.py), empty without one; `holding`: the
    jobs whose promised CPUs are held (MIGRATING ones too), `placed` when None."""
    placed = list(placed)
    cpus = busy_cpus(placed if holding is None else holding)
    views: list[NodeView] = []
    totals: dict[tuple[str, int], int] = {}
    gpu_type: dict[tuple[str, int], str] = {}
    for rec in sorted(records.values(), key=lambda r: r.id):
        for g in rec.inventory.gpus:
            totals[(g.model, g.memory_bytes)] = totals.get((g.model, g.memory_bytes), 0) + 1
        if states.get(rec.id) != P.NODE_STATE_READY or not healthy(rec.unhealthy_until, now):
            continue  # a node whose launches keep failing is as unavailable as a drained one
        live = nodes[rec.id]
        gpus = tuple(GpuView(g.index, g.model, g.memory_bytes, g.foreign_used_bytes,
                             island=0 if g.nvlink_peers else -1) for g in live.inventory.gpus)
        gpu_type.update(((rec.id, g.index), g.model) for g in live.inventory.gpus)
        # CPUs and host memory as the agent reports them (nodeagent/inventory.py: the OS's, or the
        # declared inventory file's cpus/host_memory_gb).
        held = frozenset(busy.get(rec.id, ()))
        views.append(NodeView(rec.id, gpus, held, cpus=live.inventory.cpu_count,
                              host_memory_bytes=live.inventory.host_memory_bytes, busy_cpus=cpus.get(rec.id, 0),
                              releasing=held & frozenset((releasing or {}).get(rec.id, ()))))
    waiting = tuple(job_view(j, progress.get(j.id), now) for j in pending)
    running: list[RunningView] = []
    for j in placed:
        if j.plan is None or j.placement is None:
            continue
        if j.plan.stages:  # a pipeline over mixed GPU types: kept as placed (controller/core/cost_objective.py)
            mixed = staged_running(j, job_view(j, progress.get(j.id), now), gpu_type)
            if mixed is not None:
                running.append(mixed)
            continue
        types = {gpu_type.get((s.node_id, i)) for s in j.placement.slices for i in s.gpu_indices}
        if len(types) != 1 or None in types:
            continue  # on a node not READY, or a mixed-type gang: its GPUs stay busy, untouched
        (t,) = types
        slices = tuple(Slice(s.node_id, tuple(s.gpu_indices)) for s in j.placement.slices)
        p = j.plan
        choice = PlanChoice(p.dp, p.tp, p.pp, p.micro_batch, p.grad_accum, p.gpu_model,
                            p.memory_per_gpu_bytes, p.memory_source)
        running.append(RunningView(job_view(j, progress.get(j.id), now), Cell(str(t), p.dp * p.tp * p.pp, p.pp), slices,
                                   choice, j.placement.opportunistic, since=j.start_time,
                                   placed_at=j.placement.placed_at or None))
    cluster = tuple(sorted((m, b, c) for (m, b), c in totals.items()))
    return Snapshot(tuple(views), waiting, cluster, running=tuple(running), now=now,
                    prices=tuple(sorted((prices or {}).items())), tenants=tenants)


def staged_running(j: JobRecord, view: JobView, gpu_type: Mapping[tuple[str, int], str]) -> RunningView | None:
    """A running pipeline over mixed GPU types as the round sees it: its stages in its plan; None
    when one of its GPUs is not on a READY node (its GPUs stay busy, untouched)."""
    assert j.plan is not None and j.placement is not None
    if any((s.node_id, i) not in gpu_type for s in j.placement.slices for i in s.gpu_indices):
        return None
    p = j.plan
    stages = tuple(StageAssignment(s.gpu_model, s.gpus, s.layer_start, s.layer_end) for s in p.stages)
    pred = p.prediction
    choice = PlanChoice(p.dp, p.tp, p.pp, p.micro_batch, p.grad_accum, p.gpu_model, p.memory_per_gpu_bytes,
                        p.memory_source, stages=stages,
                        prediction=CostPrediction(pred.iteration_seconds, pred.total_seconds, pred.cost,
                                                  pred.allocation) if p.HasField("prediction") else None)
    slices = tuple(Slice(s.node_id, tuple(s.gpu_indices)) for s in j.placement.slices)
    return RunningView(view, Cell(p.gpu_model, p.dp * p.tp * p.pp, p.pp), slices, choice, j.placement.opportunistic,
                       since=j.start_time, placed_at=j.placement.placed_at or None)


def gpu_pools(records: Iterable[NodeRecord]) -> dict[str, tuple[int, int, bool]]:
    """The registered GPU pools: {type: (total GPUs, most GPUs on one node, any NVLink)}."""
    pools: dict[str, tuple[int, int, bool]] = {}
    for rec in records:
        per: dict[str, int] = {}
        nvl: dict[str, bool] = {}
        for g in rec.inventory.gpus:
            per[g.model] = per.get(g.model, 0) + 1
            nvl[g.model] = nvl.get(g.model, False) or bool(g.nvlink_peers)
        for m, n in per.items():
            tot, most, nv = pools.get(m, (0, 0, False))
            pools[m] = (tot + n, max(most, n), nv or nvl[m])
    return pools


class Admissions:
    """When the tenants' admission first admitted each guaranteed job (RoundPlan.admitted): its SLA
    clock, `JobView.admitted_at` (docs/tenants.md). Kept in memory: after a controller restart a job
    counts from its submission again, which is stricter (it may be moved less), never looser. A job
    first seen admitted while it runs (placed by an earlier leader, or admitted after it started
    on borrowed quota) counts from its submission too: the round's time would give it less
    progress to keep than its promise owes it since it was really admitted."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        # The running guaranteed jobs the last round did not admit (their tenant's quota no longer
        # covers them: they run as best-effort), for `get tenants`'s warnings.
        self.unguarded: frozenset[str] = frozenset()

    def record(self, admitted: Iterable[str], snap: Snapshot) -> None:
        admitted = set(admitted)
        live = {j.id for j in snap.pending} | {r.job.id for r in snap.running}
        self.at = {k: v for k, v in self.at.items() if k in live}
        running = {r.job.id: r.job.submit_time for r in snap.running}
        for job_id in admitted:
            self.at.setdefault(job_id, running.get(job_id, snap.now))
        tenants = {t.name: t for t in snap.tenants}
        self.unguarded = frozenset(r.job.id for r in snap.running if r.job.id not in admitted
                                   and is_guaranteed(r.job, tenants) and not is_borrower(r))

    def apply(self, snap: Snapshot) -> Snapshot:
        if not self.at:
            return snap

        def view(j: JobView) -> JobView:
            t = self.at.get(j.id)
            return j if t is None else dataclasses.replace(j, admitted_at=t)

        return dataclasses.replace(snap, pending=tuple(view(j) for j in snap.pending),
                                   running=tuple(dataclasses.replace(r, job=view(r.job)) for r in snap.running))


class RoundCursor:
    """What changed since the last round's snapshot: the arrivals (pending jobs no earlier round
    saw) and departures that Algorithm 1 and the baselines read (Snapshot.arrivals, .departures),
    as the simulator gives them. Before, the live controller gave neither, so every pending job was
    new at every round: crius never tried its waiting jobs with reclaim, and never suspended a job
    it had started ahead of one of them (a live audit: a 4-GPU job waited until the 2-GPU job that
    had jumped it ended). A departure is a job that ended; so is, for the policies that retry
    their older jobs only after departures (artifact mode), GPUs freed another way (a node back,
    a job stopped): one counts when the free GPUs grew and no job ended. The first round after a
    start sees every pending job as new, as before. Only `run_round` marks: a look at the snapshot
    changes nothing."""

    def __init__(self) -> None:
        self.seen: frozenset[str] | None = None
        self.free = 0

    def mark(self, snap: Snapshot, get: Callable[[str], JobRecord | None]) -> Snapshot:
        ids = {j.id for j in snap.pending} | {r.job.id for r in snap.running}
        free = sum(len(n.gpus) - len(n.busy) for n in snap.nodes)
        seen, freed = self.seen, free > self.free
        self.free = free
        if seen is None:
            self.seen = frozenset(ids)
            return snap
        gone = [(i, get(i)) for i in seen - ids]
        # Out of this snapshot but not ended (checkpointing to stop, backing off): still seen.
        kept = {i for i, j in gone if j is not None and j.state not in TERMINAL}
        self.seen = frozenset(ids | kept)
        ended = len(gone) - len(kept)
        arrivals = tuple(j.id for j in snap.pending if j.id not in seen)
        return dataclasses.replace(snap, arrivals=arrivals, departures=ended or int(freed))
