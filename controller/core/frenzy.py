"""The Frenzy policy: MARP resource plans ranked per job, placed by HAS best-fit (Frenzy Sec. IV).

Frenzy: "Frenzy: A Memory-Aware Serverless LLM Training System for Heterogeneous GPU Clusters",
arXiv 2024 (arXiv:2412.14479; docs/reference/papers.md). MARP: Memory-Aware Resource Predictor;
HAS: Heterogeneity-Aware Scheduler.

MARP gives, for each (DP d, TP t), the bytes per GPU a job needs; the plans are ranked fewest GPUs
first, then smallest TP (less communication), so a job asks for the least it can run on. HAS walks
the ranked plans and takes the first one the free GPUs can hold, then places it:
1. a single node that holds the whole gang, smallest sufficient GPU memory first, and among those
   the node with the fewest free GPUs that still suffice (best fit);
2. else, inside one GPU model (least sufficient memory first), greedily the node with the most free
   GPUs, and repeat for what is left: a gang runs on one type (docs/scheduler.md, "Placement").
A gang is placed whole or not at all. Jobs are visited in submission order; one that does not fit
does not block smaller ones behind it (backfill).

MARP models data and tensor parallelism only (Frenzy Sec. IV-A: "we primarily consider data
parallelism and tensor parallelism"), with the data-parallel degree dividing the global batch and TP
dividing the heads. A job that runs only with a plan outside that space (pipeline stages, ZeRO,
offload, a TP that does not divide its heads: Morphling's LLaMA-30B on 24-48 GPUs, GPT-2's 25 heads
on 2-8 GPUs) has no MARP plan and would wait forever although the cluster runs it. For such a job
`plan_round` asks an optional `fallback` (the policy adapter's: the Cells of the estimates) in the
job's turn, so it is placed in submission order like the others. An optional `runs` check refuses a
HAS placement the estimates cannot run (MARP's memory fit is not the whole story: a type where the
job exceeds the time limit, a spread a measured table does not cover); HAS then tries without that
GPU model.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, replace
from difflib import get_close_matches
from functools import lru_cache

from tessera.controller.core.snapshot import (
    Action,
    Decision,
    GpuView,
    JobView,
    NodeView,
    PendingKind,
    PlanChoice,
    RoundPlan,
    Slice,
    Snapshot,
)
from tessera.estimator.cell_recipe import JobRecipe, recipe_on
from tessera.estimator.memory import estimate_memory, marp_memory
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError

GIB = 1024**3
TP_CHOICES = (1, 2, 4, 8)


@dataclass(frozen=True)
class FrenzyConfig:
    # Held back on every GPU for the CUDA context, allocator slack and NCCL buffers, which no
    # tensor formula counts (docs/reference/estimation.md 1.7: 300 MiB to 2 GiB).
    reserve_bytes: int = 1 * GIB
    max_dp: int = 1024


# The source of an opaque job's one plan (docs/opaque-jobs.md): no memory formula applies.
OPAQUE = "opaque"


@dataclass(frozen=True)
class ResourcePlan:
    dp: int
    tp: int
    micro_batch: int
    bytes_per_gpu: int
    # "formula:marp", or "formula" for a job with a recipe (estimate_memory of the recipe's plan)
    source: str = "formula:marp"

    @property
    def gpus(self) -> int:
        return self.dp * self.tp


# A job's recipe goes on top of MARP's bytes (Frenzy's 20 B/param is Megatron's fp16 recipe, no
# recomputation) and of what a worker runs for a field the recipe leaves unset (flash attention:
# ExecutionPlan's default, which the launched plan keeps).
MARP_PLAN = ExecutionPlan(precision="megatron-fp16", checkpointing="none")


def plan_bytes(job: JobView, dp: int, tp: int, micro_batch: int) -> tuple[int, str] | None:
    """Bytes per GPU of (dp, tp, micro_batch) and their source: MARP, or, for a job whose plan sets a
    recipe (LoRA, checkpointing, precision...), the memory formula of that recipe on MARP's plan
    (estimate_memory; the reserve is Frenzy's own). None when the recipe cannot run that plan."""
    if job.recipe is None or (not job.recipe.given and job.recipe.refused is None):
        return marp_memory(job.model, micro_batch, tp).total_bytes, "formula:marp"
    return _recipe_bytes(job.model, job.recipe, dp, tp, micro_batch)


@lru_cache(maxsize=65536)
def _recipe_bytes(model: ModelDims, recipe: JobRecipe, dp: int, tp: int, micro_batch: int) -> tuple[int, str] | None:
    """The fuller formula costs about 0.1 ms a plan and a waiting job's reason walks every (dp, tp) of
    the cluster each round: memoised (pure in its frozen arguments)."""
    try:
        plan = recipe_on(recipe, replace(MARP_PLAN, dp=dp, tp=tp, micro_batch=micro_batch))
        return estimate_memory(model, plan, other_bytes=0).total, "formula"
    except PlanInputError:
        return None


def resource_plans(job: JobView, max_gpus: int, cfg: FrenzyConfig) -> list[ResourcePlan]:
    """MARP's ranked plans for a job: every (d, t) with d dividing the global batch, d*t <= max_gpus.
    An opaque job (no model dims) has one plan: the GPUs it asked for, with no memory figure."""
    if job.opaque:
        n = job.gpus_hint or 1
        return [ResourcePlan(n, 1, 1, 0, OPAQUE)] if n <= max_gpus else []
    m = job.model
    plans: list[ResourcePlan] = []
    for tp in TP_CHOICES:
        if m.num_heads % tp or m.hidden_size % tp:
            continue
        for dp in range(1, min(job.global_batch_size, cfg.max_dp) + 1):
            n = dp * tp
            if n > max_gpus:
                break
            if job.global_batch_size % dp:
                continue
            if job.gpus_hint and n != job.gpus_hint:
                continue
            mb = job.global_batch_size // dp
            got = plan_bytes(job, dp, tp, mb)
            if got is not None:
                plans.append(ResourcePlan(dp, tp, mb, *got))
    plans.sort(key=lambda p: (p.gpus, p.tp))
    return plans


def _usable(g: GpuView, cfg: FrenzyConfig) -> int:
    return g.memory_bytes - g.foreign_used_bytes - cfg.reserve_bytes


@dataclass
class _Group:
    """Free GPUs of one model on one node that can hold the plan's bytes."""

    node_id: str
    model: str
    memory_bytes: int
    free: list[int]


def _groups(nodes: tuple[NodeView, ...], need: int, allowed: tuple[str, ...], cfg: FrenzyConfig) -> list[_Group]:
    out: dict[tuple[str, str], _Group] = {}
    for node in nodes:
        for g in node.idle():
            if allowed and g.model not in allowed:
                continue
            if _usable(g, cfg) < need:
                continue
            grp = out.setdefault((node.id, g.model), _Group(node.id, g.model, g.memory_bytes, []))
            grp.free.append(g.index)
    return sorted(out.values(), key=lambda x: (x.node_id, x.model))


def has_place(plan: ResourcePlan, nodes: tuple[NodeView, ...], allowed: tuple[str, ...],
              cfg: FrenzyConfig) -> tuple[Slice, ...] | None:
    """HAS placement of one plan on the free GPUs; None when the gang does not fit whole."""
    groups = _groups(nodes, plan.bytes_per_gpu, allowed, cfg)
    if sum(len(g.free) for g in groups) < plan.gpus:
        return None
    whole = [g for g in groups if len(g.free) >= plan.gpus]
    if whole:
        best = min(whole, key=lambda g: (g.memory_bytes, len(g.free), g.node_id))
        return (Slice(best.node_id, tuple(sorted(best.free)[: plan.gpus])),)
    # No single node: greedily the node with the most free GPUs, in whole TP groups so that no
    # tensor-parallel group straddles two nodes, and all of one GPU model (a gang runs on one type:
    # docs/scheduler.md, "Placement"), the model with the least sufficient memory first.
    for _, model in sorted({(g.memory_bytes, g.model) for g in groups}):
        got = _greedy([g for g in groups if g.model == model], plan)
        if got is not None:
            return got
    return None


def _greedy(groups: list[_Group], plan: ResourcePlan) -> tuple[Slice, ...] | None:
    left = plan.gpus
    slices: list[Slice] = []
    pool = list(groups)
    while left > 0:
        pool = [g for g in pool if len(g.free) >= plan.tp]
        if not pool:
            return None
        g = min(pool, key=lambda x: (-len(x.free), x.node_id))
        take = min(left, len(g.free) // plan.tp * plan.tp)
        slices.append(Slice(g.node_id, tuple(sorted(g.free)[:take])))
        left -= take
        pool.remove(g)
    return tuple(slices)


def _gib(b: float) -> str:
    """Bytes as a reason quotes them: GiB, or MiB under 1 GiB (a small job's plan read "8 x 0.0 GiB")."""
    return f"{b / GIB:.1f} GiB" if b >= GIB else f"{b / (1 << 20):.1f} MiB"


def cluster_text(snap: Snapshot) -> str:
    """The cluster's GPUs as a reason names them: "8 x A10-24GB (22.4 GiB), ..." (the memory each
    reports, before any reserve)."""
    if not snap.cluster_gpus:
        return "no GPUs registered"
    return ", ".join(f"{c} x {m} ({_gib(b)})" for m, b, c in snap.cluster_gpus)


def missing_types_reason(asked: tuple[str, ...], snap: Snapshot) -> str:
    """Why a job whose GPU types no node has waits: those types, what the cluster has, and the
    cluster's types closest to the names asked ("did you mean"), for a typo or a wrong family."""
    have = [m for m, _, _ in snap.cluster_gpus]
    close = [c for t in asked for c in get_close_matches(t, have, n=1, cutoff=0.6)]
    hint = f"; did you mean {' or '.join(dict.fromkeys(close))}?" if close else ""
    return (f"fits nowhere: no GPU of type {' or '.join(asked)} in the cluster "
            f"(it has {cluster_text(snap)}){hint}")


def _pending_reason(job: JobView, plans: list[ResourcePlan], snap: Snapshot,
                    cfg: FrenzyConfig) -> tuple[PendingKind, str]:
    total = sum(c for _, _, c in snap.cluster_gpus)
    if total == 0:
        return PendingKind.NO_ROOM_NOW, "waiting for nodes: no GPUs registered"
    # This and the next two never run on the GPUs the cluster has; only the third says "fits nowhere".
    if job.gpus_hint and job.gpus_hint > total:
        return (PendingKind.FITS_NOWHERE,
                f"asks for {job.gpus_hint} GPUs; the cluster has {total}: {cluster_text(snap)}")
    if not plans:
        return PendingKind.FITS_NOWHERE, (f"no plan: global batch {job.global_batch_size} cannot be split "
                                          f"over {job.gpus_hint or total} GPUs with TP in {TP_CHOICES}")
    allowed = [x for x in snap.cluster_gpus if job.may_use(x[0])]
    if not allowed:  # no memory figure explains this: the types it allows are not in the cluster
        return PendingKind.FITS_NOWHERE, missing_types_reason(job.gpu_types, snap)
    biggest = max(b for _, b, _ in allowed) - cfg.reserve_bytes
    smallest = min(plans, key=lambda p: p.bytes_per_gpu)
    if smallest.bytes_per_gpu > biggest:
        how = "MARP" if smallest.source == "formula:marp" else "the recipe's memory formula"
        why = (f"fits nowhere: needs at least {_gib(smallest.bytes_per_gpu)} per GPU "
               f"({how}, dp={smallest.dp} tp={smallest.tp}, +{_gib(cfg.reserve_bytes)} reserve); "
               f"the cluster has {cluster_text(snap)}")
        return PendingKind.FITS_NOWHERE, why
    # A gang runs on one GPU model (docs/scheduler.md, "Placement"): a plan runs where one model has
    # its GPUs, each with room for its bytes (a model's GPUs may report memories a little apart: one
    # row each in cluster_gpus). Before, a plan was quoted whatever GPUs could hold it, and a job
    # asking for more GPUs than any one type has waited on "N GPUs free now".
    def holds(p: ResourcePlan, usable: int) -> bool:
        return p.source == OPAQUE or usable >= p.bytes_per_gpu

    def most(p: ResourcePlan, rows: list[tuple[str, int, int]] = allowed) -> dict[str, int]:
        """The GPUs of each model (of `rows`, default the allowed ones) that hold the plan's bytes."""
        out: dict[str, int] = {}
        for m, b, c in rows:
            if holds(p, b - cfg.reserve_bytes):
                out[m] = out.get(m, 0) + c
        return out

    runnable = [p for p in plans if max(most(p).values(), default=0) >= p.gpus]
    if not runnable:
        fit = min((p for p in plans if most(p)), key=lambda p: (p.gpus, p.tp))
        top = max(most(fit).values())
        # A type it may not use would take it: its gpu_types are why, not the cluster (a live audit).
        barred = max(most(fit, list(snap.cluster_gpus)).values()) >= fit.gpus
        which = f"it may use (its gpu_types: {', '.join(job.gpu_types)})" if barred else "that holds it"
        what = (f"it runs on {fit.gpus} GPUs of one type, and no type it may use has more than {top}"
                if fit.source == OPAQUE else
                f"its smallest plan that fits in memory needs {fit.gpus} x {_gib(fit.bytes_per_gpu)} "
                f"(dp={fit.dp} tp={fit.tp}) of one GPU type, and no type {which} has more than {top}")
        return PendingKind.FITS_NOWHERE, f"fits nowhere: {what}: the cluster has {cluster_text(snap)}"
    best = runnable[0]
    models = {m for m, n in most(best).items() if n >= best.gpus}  # those that could take the gang
    free = sum(1 for n in snap.nodes for g in n.idle() if g.model in models and holds(best, _usable(g, cfg)))
    if best.source == OPAQUE:
        return PendingKind.NO_ROOM_NOW, (f"waiting for GPUs: needs {best.gpus} GPUs of "
                                         f"{'/'.join(job.gpu_types) or 'one type'}; {free} of them free now")
    need = f"its smallest plan that fits needs {best.gpus} x {_gib(best.bytes_per_gpu)} (dp={best.dp} tp={best.tp})"
    # The cluster's GPUs include nodes not READY (drained, unreachable, down): those that could take
    # the gang now are the READY nodes'. A drained node's job read "4 free GPUs could hold it now" of
    # a plan of 8, which it could not (a live audit).
    ready = {m: sum(1 for n in snap.nodes for g in n.gpus if g.model == m and holds(best, _usable(g, cfg)))
             for m in models}
    if max(ready.values(), default=0) < best.gpus:
        return PendingKind.NO_ROOM_NOW, (f"waiting for nodes: {need} of one GPU type; the READY nodes have "
                                         f"{max(ready.values(), default=0)} of a type that holds it, the others "
                                         "are on nodes drained, unreachable or down")
    return PendingKind.NO_ROOM_NOW, f"waiting for GPUs: {need} of one GPU type; {free} of them free now"


def memory_reason(job: JobView, snap: Snapshot, cfg: FrenzyConfig = FrenzyConfig()) -> str:
    """MARP's account of why a job waits (the memory it needs, what the cluster has), for any policy
    whose own reason for a job that fits nowhere does not say it."""
    max_gpus = sum(c for _, _, c in snap.cluster_gpus)
    return _pending_reason(job, resource_plans(job, max_gpus, cfg), snap, cfg)[1]


class _FreeIndex:
    """Sorted usable bytes of the free GPUs, per allowed-type filter: rejects a plan in O(log n)
    before HAS walks the nodes. Rebuilt lazily after each placement."""

    def __init__(self, cfg: FrenzyConfig) -> None:
        self.cfg = cfg
        self._cache: dict[tuple[str, ...], list[int]] = {}

    def invalidate(self) -> None:
        self._cache.clear()

    def count_at_least(self, nodes: dict[str, NodeView], allowed: tuple[str, ...], need: int) -> int:
        if allowed not in self._cache:
            self._cache[allowed] = sorted(_usable(g, self.cfg) for n in nodes.values() for g in n.idle()
                                          if not allowed or g.model in allowed)
        xs = self._cache[allowed]
        return len(xs) - bisect_left(xs, need)


# For a job MARP has no feasible plan for: given the job and the nodes as they are now (GPUs taken this
# round marked busy), a START (slices on those nodes), a PENDING with the reason, or None when the
# fallback has no way to run the job either (MARP's "fits nowhere" reason stands).
Fallback = Callable[[JobView, dict[str, NodeView], str], Decision | None]
# Whether the job can run on (GPU model, GPUs, nodes): MARP's memory fit is not enough where the
# estimates know better (a model that exceeds 300 s per iteration there, a spread the measured table
# does not cover). A HAS placement it refuses is tried again without that GPU model.
Runs = Callable[[JobView, str, int, int], bool]


def _model_at(nodes: dict[str, NodeView], sl: Slice) -> str:
    return next(g.model for g in nodes[sl.node_id].gpus if g.index == sl.gpu_indices[0])


def _runnable_place(job: JobView, plan: ResourcePlan, nodes: dict[str, NodeView], cfg: FrenzyConfig,
                    runs: Runs | None, models: tuple[str, ...]) -> tuple[tuple[Slice, ...] | None, bool]:
    """HAS placement of the plan that `runs` accepts, and whether `runs` refused one."""
    allowed = job.gpu_types
    refused = False
    while True:
        slices = has_place(plan, tuple(nodes.values()), allowed, cfg)
        if slices is None or runs is None:
            return slices, refused
        model = _model_at(nodes, slices[0])
        if runs(job, model, plan.gpus, len(slices)):
            return slices, refused
        refused = True
        allowed = tuple(m for m in (allowed or models) if m != model)
        if not allowed:
            return None, refused


def plan_round(snap: Snapshot, cfg: FrenzyConfig = FrenzyConfig(), fallback: Fallback | None = None,
               runs: Runs | None = None) -> RoundPlan:
    """Place pending jobs in submission order with MARP + HAS; running jobs keep their GPUs."""
    nodes = {n.id: n for n in snap.nodes}
    max_gpus = sum(c for _, _, c in snap.cluster_gpus) or sum(len(n.gpus) for n in snap.nodes)
    free = _FreeIndex(cfg)
    decisions: list[Decision] = []
    models = tuple(m for m, _, _ in snap.cluster_gpus) or tuple(sorted({g.model for n in snap.nodes for g in n.gpus}))
    for job in sorted(snap.pending, key=lambda j: (j.submit_time, j.id)):
        plans = resource_plans(job, max_gpus, cfg)
        placed = None
        refused = False
        for plan in plans:
            if free.count_at_least(nodes, job.gpu_types, plan.bytes_per_gpu) < plan.gpus:
                continue
            slices, no = _runnable_place(job, plan, nodes, cfg, runs, models)
            refused = refused or no
            if slices is not None:
                placed = (plan, slices)
                break
        if placed is None:
            kind, why = _pending_reason(job, plans, snap, cfg)
            if refused:
                why = f"MARP's plans fit only GPUs the estimates cannot run it on ({why})"
            ask = fallback is not None and (kind is PendingKind.FITS_NOWHERE or refused)
            other = fallback(job, nodes, why) if fallback is not None and ask else None
            if refused and ask and other is None:
                # The estimates know the job (they refused its placements) and have no Cell of its
                # count on any type: no GPU will ever run it (a `gpus: 3` job waited for ever on an
                # idle cluster, "waiting for GPUs"; a live audit).
                count = f"{job.gpus_hint} GPUs" if job.gpus_hint else "any count"
                kind, why = PendingKind.FITS_NOWHERE, (f"fits nowhere: the estimates run none of MARP's plans, "
                                                       f"and no GPU type it may use runs a Cell of {count} laid "
                                                       "out evenly over its nodes")
            if other is not None:
                if other.action is Action.START:
                    for s in other.slices:
                        n = nodes[s.node_id]
                        nodes[s.node_id] = NodeView(n.id, n.gpus, n.busy | frozenset(s.gpu_indices))
                    free.invalidate()
                decisions.append(other)
                continue
            decisions.append(Decision(job.id, Action.PENDING, why, pending=kind))
            continue
        plan, slices = placed
        model = _model_at(nodes, slices[0])
        for s in slices:
            n = nodes[s.node_id]
            nodes[s.node_id] = NodeView(n.id, n.gpus, n.busy | frozenset(s.gpu_indices))
        free.invalidate()
        where = " + ".join(f"{len(s.gpu_indices)} on {s.node_id}" for s in slices)
        how = "MARP" if plan.source == "formula:marp" else "recipe formula"
        reason = (f"HAS: opaque job: {plan.gpus} x {model}: {where}" if plan.source == OPAQUE else f"HAS: plan dp={plan.dp} tp={plan.tp} micro_batch={plan.micro_batch} needs "
                  f"{_gib(plan.bytes_per_gpu)}/GPU ({how}); {plan.gpus} x {model}: {where}"
                  f"{' (best fit)' if len(slices) == 1 else ' (no single node fits: greedy multi-node)'}")
        choice = PlanChoice(plan.dp, plan.tp, 1, plan.micro_batch, 1, model,
                            plan.bytes_per_gpu, plan.source)
        decisions.append(Decision(job.id, Action.START, reason, choice, slices))
    return RoundPlan(tuple(decisions))
