"""The cost objective (Espresso): jobs with `objective: cost` get the cheapest allocation of the free
GPUs, over mixed GPU types, whose predicted time meets their SLO (docs/cost-objective.md).

`plan_round` runs this pass before the policy, whatever the policy: the policy never sees a job with
the cost objective (pending or running), and the GPUs this pass gives are busy in the policy's
snapshot. The jobs are best-effort: with tenants, the guarantee layer may preempt them (a pipeline
whole) or keep one from starting, for a guaranteed job within its quota (`best_effort`). For each
such job, in queue order (submission time, id):

1. offers: the free GPUs of each type the job may use (its `gpu_types`, else every type), at the
   snapshot's price per GPU-hour (`Snapshot.prices`, the controller's --prices), with the memory the
   nodes report for them (declared or probed, less what other processes hold; the least of the
   type's GPUs); a type of the READY nodes without a price leaves the job pending with a reason
   naming it (one only on nodes not READY does not: they take no work);
2. `estimator.cost_tree.cheapest_plan` (Espresso Alg. 1 over Alg. 2's stage placer) gives the
   stages: GPU type, data-parallel GPUs (one dp for all stages, as in Espresso's cost trees) and
   layer range each, the iteration and total time, the cost; `NoFeasiblePlan` when no allocation
   of the free GPUs meets the SLO or no GPU it may use is free, in which case the same question
   over the whole cluster (every registered GPU, READY or not, at the memory its records declare)
   says whether the job waits for GPUs (NO_ROOM_NOW) or no plan can ever meet it (FITS_NOWHERE),
   with the best time a plan reaches in the reason, or that no plan holds the model in memory;
3. packing: each stage on GPUs of its type, on nodes of its own (different types are different
   nodes; the stage placer's estimate sends activations between stages over the network) except
   that a stage may continue on the node where the previous stage ended (its ranks follow on, so a
   node's ranks stay contiguous); a stage wider than any node's free GPUs spans several nodes. When
   the stages do not pack, that type's quota shrinks by one stage and the solver runs again.

The decision is a START whose plan carries the stages (`PlanChoice.stages`, pp = stages, the same
dp everywhere), the prediction (`PlanChoice.prediction`) and a Cell whose type is the stages' types
joined by "+". A running job with the cost objective is kept as it is: this pass does not move it.

Pure: no I/O, no clock (the SLO comes as seconds left, `JobView.slo_s`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from tessera.common.gpus import UnknownGpuError, lookup
from tessera.common.objective import cost_text
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    CostPrediction,
    Decision,
    JobView,
    NodeView,
    Objective,
    PendingKind,
    PlanChoice,
    Priority,
    RunningView,
    Slice,
    Snapshot,
    StageAssignment,
)
from tessera.estimator.cell_recipe import recipe_cell_model
from tessera.estimator.cells import CellInputError, CellModel
from tessera.estimator.cost_tree import (
    CostInputError,
    CostPlan,
    GpuOffer,
    NoFeasiblePlan,
    SearchTooLarge,
    cheapest_plan,
    seconds_text,
)
from tessera.estimator.plans import PlanInputError

# How many times a round re-solves a job whose stages did not pack onto the free nodes.
MAX_PACK_TRIES = 8
# Micro-batches per pipeline stage the trainer is asked for (the stage placer's default, 4 x stages).
MICROBATCHES_PER_STAGE = 4

Solver = Callable[[CellModel, Sequence[GpuOffer], int, float], CostPlan]


# Answers of the cost tree across rounds, by its input but the SLO, with the SLO they were found
# for: a job that waits asks again every round (same model, offers and iterations), and with a
# deadline its SLO shrinks each time. A cache only: every answer is the solver's, reused only where
# the solver would give it again (`_reuse`).
_MEMO: dict[tuple[CellModel, tuple[GpuOffer, ...], int], tuple[float, CostPlan | NoFeasiblePlan | SearchTooLarge]] = {}
_MEMO_SIZE = 512


def default_solver(model: CellModel, offers: Sequence[GpuOffer], iterations: int, slo_s: float) -> CostPlan:
    key = (model, tuple(offers), iterations)
    got = _reuse(_MEMO.get(key), slo_s)
    if got is None:
        try:
            got = cheapest_plan(model, offers, iterations, slo_s)
        except (NoFeasiblePlan, SearchTooLarge) as exc:  # remembered too: seconds of search each
            got = exc
        if len(_MEMO) >= _MEMO_SIZE:
            _MEMO.clear()
        _MEMO[key] = (slo_s, got)
    if isinstance(got, NoFeasiblePlan):
        raise NoFeasiblePlan(got.best_time_s, got.reason)
    if isinstance(got, SearchTooLarge):
        raise SearchTooLarge(got.field, got.reason)
    return got


def _reuse(entry: tuple[float, CostPlan | NoFeasiblePlan | SearchTooLarge] | None,
           slo_s: float) -> CostPlan | NoFeasiblePlan | SearchTooLarge | None:
    """The remembered answer where it is the solver's for `slo_s` too, else None. The cheapest plan
    within an SLO stays the cheapest within any tighter SLO it still meets (the plans that meet it
    are a subset); no plan meets any SLO under the fastest plan's time; the search's size does not
    depend on the SLO."""
    if entry is None:
        return None
    at, got = entry
    if slo_s == at or isinstance(got, SearchTooLarge):
        return got
    if isinstance(got, CostPlan):
        return got if got.total_time_s <= slo_s <= at else None
    if not math.isfinite(got.best_time_s):  # no plan holds the model in memory: no SLO changes that
        return got
    said = f"within {seconds_text(at)} s;"
    if slo_s < got.best_time_s and said in got.reason:
        return NoFeasiblePlan(got.best_time_s, got.reason.replace(said, f"within {seconds_text(slo_s)} s;", 1))
    return None


def is_cost_job(job: JobView) -> bool:
    return job.objective is Objective.COST


def split(snap: Snapshot) -> tuple[Snapshot, tuple[JobView, ...], tuple[RunningView, ...]]:
    """The policy's snapshot (without the cost objective's jobs), the cost jobs pending, running."""
    pending = tuple(j for j in snap.pending if is_cost_job(j))
    running = tuple(r for r in snap.running if is_cost_job(r.job))
    if not pending and not running:
        return snap, (), ()
    ids = {j.id for j in pending}
    arrivals = None if snap.arrivals is None else tuple(a for a in snap.arrivals if a not in ids)
    rest = replace(snap, pending=tuple(j for j in snap.pending if not is_cost_job(j)),
                   running=tuple(r for r in snap.running if not is_cost_job(r.job)), arrivals=arrivals)
    return rest, pending, running


def best_effort(snap: Snapshot) -> Snapshot:
    """The snapshot with every cost job best-effort (no promise), as the guarantee layer counts
    them: an SLO picks the cheapest plan, it reserves no quota (a guaranteed job with the cost
    objective is refused at submission; one stored before is treated so)."""
    def be(j: JobView) -> JobView:
        return replace(j, priority=Priority.BEST_EFFORT, promise=None) if is_cost_job(j) else j
    return replace(snap, pending=tuple(be(j) for j in snap.pending),
                   running=tuple(replace(r, job=be(r.job)) for r in snap.running))


@dataclass
class _Free:
    """Idle GPU indices per node and type, as this pass hands them out."""

    idle: dict[str, dict[str, list[int]]]

    @classmethod
    def of(cls, nodes: Sequence[NodeView]) -> _Free:
        return cls({n.id: {m: list(ix) for m, _, ix, _ in n.by_model if ix} for n in nodes})

    def count(self, gpu_type: str) -> int:
        return sum(len(t.get(gpu_type, ())) for t in self.idle.values())

    def types(self) -> list[str]:
        return sorted({m for t in self.idle.values() for m, ix in t.items() if ix})

    def take(self, slices: Sequence[Slice]) -> None:
        for s in slices:
            for ix in self.idle[s.node_id].values():
                for i in s.gpu_indices:
                    if i in ix:
                        ix.remove(i)

    def busy_nodes(self, nodes: Sequence[NodeView]) -> tuple[NodeView, ...]:
        """The nodes with what this pass gave marked busy (the policy's snapshot)."""
        out = []
        for n in nodes:
            left = {i for ix in self.idle.get(n.id, {}).values() for i in ix}
            taken = {g.index for g in n.idle()} - left
            out.append(replace(n, busy=n.busy | frozenset(taken)) if taken else n)
        return tuple(out)


def pack(stages: Sequence[StageAssignment], free: _Free) -> tuple[tuple[Slice, ...], str]:
    """The stages' GPUs in stage order (see the module docstring), or ((), type that did not fit)."""
    idle = {n: {t: list(ix) for t, ix in per.items()} for n, per in free.idle.items()}
    used: set[str] = set()
    out: list[tuple[str, list[int]]] = []
    for st in stages:
        need, t = st.gpus, st.gpu_type
        if out and len(idle[out[-1][0]].get(t, ())) >= need:
            node = out[-1][0]  # continue on the node where the previous stage ended
            out[-1][1].extend(idle[node][t][:need])
            del idle[node][t][:need]
            continue
        fresh = sorted((n for n in idle if n not in used and idle[n].get(t)), key=lambda n: (len(idle[n][t]), n))
        fit = [n for n in fresh if len(idle[n][t]) >= need]
        chosen = fit[:1] if fit else sorted(fresh, key=lambda n: (-len(idle[n][t]), n))
        for node in chosen:
            if need == 0:
                break
            got = idle[node][t][:need]
            del idle[node][t][:len(got)]
            need -= len(got)
            used.add(node)
            out.append((node, got))
        if need:
            return (), t
    return tuple(Slice(n, tuple(ix)) for n, ix in out), ""


def allocation_text(stages: Sequence[StageAssignment]) -> str:
    """e.g. "2 x A100-80GB (layers 0-8) | 2 x A10-24GB (layers 9-11)"."""
    return " | ".join(f"{s.gpus} x {s.gpu_type} (layers {s.layer_start}-{s.layer_end - 1})" for s in stages)


def mixed_type(stages: Sequence[StageAssignment]) -> str:
    """The Cell type of a pipeline over stages: their distinct types, in pipeline order, joined by "+"."""
    seen: list[str] = []
    for s in stages:
        if s.gpu_type not in seen:
            seen.append(s.gpu_type)
    return "+".join(seen)


def batch_split(global_batch: int, dp: int, pp: int) -> tuple[int, int] | None:
    """(micro_batch, micro-batches per step) with micro_batch x count x dp = the global batch, the
    count the largest divisor of the replica's batch up to 4 x stages; None when dp does not divide."""
    if dp < 1 or global_batch % dp:
        return None
    per = global_batch // dp
    target = max(1, min(per, MICROBATCHES_PER_STAGE * pp))
    count = max(d for d in range(1, target + 1) if per % d == 0)
    return per // count, count


def plan_stages(plan: CostPlan) -> tuple[StageAssignment, ...]:
    """The solver's stages in this vocabulary."""
    return tuple(StageAssignment(s.gpu_type, s.dp, s.first_layer, s.first_layer + s.layers) for s in plan.stages)


def plan_batch(plan: CostPlan, global_batch: int) -> tuple[int, int] | None:
    """(micro_batch, micro-batches per step) of the plan: the placer's micro-batch count when the
    replicas' batch splits into it, else `batch_split`'s."""
    b, dp = plan.num_microbatches, plan.dp
    if b >= 1 and dp >= 1 and global_batch % (b * dp) == 0:
        return global_batch // (b * dp), b
    return batch_split(global_batch, dp, len(plan.stages))


def _offer(t: str, price: float, quota: int, nodes: Sequence[NodeView], declared: int | None = None
           ) -> GpuOffer | None:
    """An offer of `quota` GPUs of type t, wired as the nodes are (the most of that type on one node)
    with the memory they report (the least of any GPU of the type, less what other processes hold;
    a stage may land on any of them). A GPU whose memory other processes hold entirely holds no
    stage: it is left out of the least and of the quota (which may have counted it free), and None
    when that leaves none (a full one's 0 was once read as "the catalog's"). `declared`: the least
    memory the registered records declare for the type, READY or not (the whole cluster's question:
    the catalog's 48 GB once stood for an A40 declared with 1.63 GB while its node was down). No
    GPU of the type in the nodes and none declared: the catalog's memory."""
    per_node, memory, full = 0, None, 0
    for n in nodes:
        mine = [g for g in n.gpus if g.model == t]
        per_node = max(per_node, len(mine))
        for g in mine:
            if (have := g.memory_bytes - g.foreign_used_bytes) > 0:
                memory = have if memory is None else min(memory, have)
            else:
                full += 1
    quota -= full
    if declared:
        memory = declared if memory is None else min(memory, declared)
    if quota <= 0 or (memory is None and full):
        return None
    if memory is None or memory == _catalog_bytes(t):
        memory = 0  # GpuOffer's "the catalog's"
    return GpuOffer(t, price, quota, max(1, per_node), memory_bytes=memory)


def _offers(counts: Mapping[str, int], prices: Mapping[str, float], nodes: Sequence[NodeView]) -> list[GpuOffer]:
    """The offers of the types with GPUs to offer, by type name."""
    out = [_offer(t, prices[t], n, nodes) for t, n in sorted(counts.items()) if n > 0]
    return [o for o in out if o is not None]


def _catalog_bytes(t: str) -> int:
    try:
        return lookup(t).memory_bytes
    except UnknownGpuError:
        return 0


def _priced(job: JobView, types: Sequence[str], prices: Mapping[str, float]) -> tuple[list[str], list[str]]:
    """(types the job may use that have a price, those that have none)."""
    allowed = [t for t in types if job.may_use(t)]
    return [t for t in allowed if t in prices], [t for t in allowed if t not in prices]


def unpriced_reason(unpriced: Sequence[str], priced: Sequence[str]) -> str:
    """Why a job waits while a GPU type of the cluster it may use has no price. The controller reads
    --prices at start only, so the remedy is a restart; and where types it may use are priced, the
    reason names them: the job could run on those alone, given gpu_types limited to them."""
    it = "it" if len(unpriced) == 1 else "them"
    why = (f"no price for GPU type {', '.join(unpriced)} in the controller's --prices, and the job may use {it}, "
           "so it waits (--prices is read at start only: add the price and restart the controller)")
    if priced:
        why += f"; priced: {', '.join(priced)} (a job with gpu_types limited to those can run on them)"
    return why


def _pending(job: JobView, why: str, kind: PendingKind) -> Decision:
    return Decision(job.id, Action.PENDING, why, pending=kind)


def _whole_cluster(job: JobView, snap: Snapshot, prices: Mapping[str, float]) -> tuple[list[GpuOffer], list[str]]:
    """The offers of every registered GPU the job may use, free or not, READY or not (`cluster_gpus`,
    with the memory the records declare), and the priced types it may use that have GPUs."""
    totals: dict[str, int] = {}
    declared: dict[str, int] = {}
    for m, b, n in snap.cluster_gpus:
        totals[m] = totals.get(m, 0) + n
        if b > 0:
            declared[m] = min(declared.get(m, b), b)
    usable = [t for t in _priced(job, sorted(totals), prices)[0] if totals[t] > 0]
    offers = [_offer(t, prices[t], totals[t], snap.nodes, declared.get(t)) for t in usable]
    return [o for o in offers if o is not None], usable


def _infeasible(job: JobView, model: CellModel, snap: Snapshot, prices: Mapping[str, float], iterations: int,
                solver: Solver, now: NoFeasiblePlan | None, none_free: bool = False) -> Decision:
    """No allocation of the free GPUs meets the SLO (`none_free`: no GPU it may use is free): whether
    one of the whole cluster would. Asked every round a job waits; the solver's memo answers it
    again without a search while the cluster's shape and the job's model stay the same."""
    offers, usable = _whole_cluster(job, snap, prices)
    slo = f"{job.slo_s:,.0f} s"
    if not offers and usable:
        return _pending(job, f"waiting for GPUs: other processes hold all the memory of a GPU of {', '.join(usable)}",
                        PendingKind.NO_ROOM_NOW)
    try:
        whole = solver(model, offers, iterations, job.slo_s) if offers else None
    except NoFeasiblePlan as exc:
        if not math.isfinite(exc.best_time_s):
            return _pending(job, f"no plan fits in memory, even on the whole cluster: {exc.reason}",
                            PendingKind.FITS_NOWHERE)
        return _pending(job, f"no plan meets the SLO ({slo} for {iterations:,} iterations) even on the whole "
                             f"cluster: the best any plan reaches is {exc.best_time_s:,.0f} s ({exc.reason})",
                        PendingKind.FITS_NOWHERE)
    if whole is None:
        return _pending(job, "no priced GPU type it may use exists in the cluster", PendingKind.FITS_NOWHERE)
    would = f"the whole cluster would ({whole.total_time_s:,.0f} s at {cost_text(whole.cost)})"
    if none_free:
        return _pending(job, f"waiting for GPUs: none of the types it may use is free; {would}",
                        PendingKind.NO_ROOM_NOW)
    free_best = ""
    if now is not None:
        free_best = (f"; the free GPUs reach {now.best_time_s:,.0f} s at best" if math.isfinite(now.best_time_s)
                     else "; no allocation of the free GPUs holds the model in memory")
    return _pending(job, f"waiting for GPUs: no allocation of the free GPUs meets the SLO ({slo} for "
                         f"{iterations:,} iterations){free_best}; {would}", PendingKind.NO_ROOM_NOW)


def place_one(job: JobView, snap: Snapshot, free: _Free, solver: Solver) -> Decision:
    """The decision for one pending job with the cost objective (the module docstring); input the
    cost tree refuses (a GPU type it does not know, a model it cannot split) leaves the job pending
    with the field it names, never fails the round."""
    try:
        return _place_one(job, snap, free, solver)
    except CostInputError as exc:
        return _pending(job, f"the cost tree cannot plan the job: {exc}", PendingKind.FITS_NOWHERE)


def _place_one(job: JobView, snap: Snapshot, free: _Free, solver: Solver) -> Decision:
    if job.slo_s == 0:
        return _pending(job, "the cost objective needs an SLO (slo: iterations_within or deadline)",
                        PendingKind.FITS_NOWHERE)
    if job.slo_s < 0:
        return _pending(job, "its SLO deadline has passed: no plan can meet it", PendingKind.FITS_NOWHERE)
    prices = dict(snap.prices)
    if not prices:
        return _pending(job, "no GPU prices configured (the controller's --prices)", PendingKind.FITS_NOWHERE)
    try:
        model = recipe_cell_model(job.model, job.global_batch_size, job.recipe).model
    except (CellInputError, PlanInputError) as exc:
        return _pending(job, f"the cost model cannot estimate the job: {exc}", PendingKind.FITS_NOWHERE)
    # The types of the nodes that take work (READY, not backing off): a type only on nodes down,
    # unreachable or draining does not hold the job (it blocked every unrestricted cost job until its
    # node was deleted); when such a node is back, the job still pending waits for its price then.
    ready_types = sorted({g.model for n in snap.nodes for g in n.gpus})
    priced, unpriced = _priced(job, ready_types, prices)
    if unpriced:
        return _pending(job, unpriced_reason(unpriced, priced), PendingKind.FITS_NOWHERE)
    iterations = max(1, math.ceil(job.remaining_iterations))
    quota = {t: free.count(t) for t in _priced(job, free.types(), prices)[0]}
    last: NoFeasiblePlan | None = None
    for _ in range(MAX_PACK_TRIES):
        offers = _offers(quota, prices, snap.nodes)
        if not offers:
            break
        try:
            plan = solver(model, offers, iterations, job.slo_s)
        except NoFeasiblePlan as exc:
            last = exc
            break
        stages = plan_stages(plan)
        dp = stages[0].gpus if stages else 0
        split_ = plan_batch(plan, job.global_batch_size)
        if not stages or any(s.gpus != dp for s in stages) or split_ is None:
            return _pending(job, f"the cost tree's plan cannot be launched (one dp that divides the global batch "
                                 f"{job.global_batch_size} in every stage): {allocation_text(stages)}",
                            PendingKind.NO_ROOM_NOW)
        slices, short = pack(stages, free)
        if not slices:
            quota[short] = max(0, quota[short] - dp)
            continue
        free.take(slices)
        return _start(job, plan, stages, slices, split_)
    return _infeasible(job, model, snap, prices, iterations, solver, last, none_free=last is None and not quota)


def _start(job: JobView, plan: CostPlan, stages: tuple[StageAssignment, ...], slices: tuple[Slice, ...],
           batch: tuple[int, int]) -> Decision:
    dp, pp = stages[0].gpus, len(stages)
    alloc = allocation_text(stages)
    pred = CostPrediction(plan.iter_time_s, plan.total_time_s, plan.cost, alloc)
    kind = mixed_type(stages)
    choice = PlanChoice(dp, 1, pp, batch[0], batch[1], kind, int(plan.estimate.memory_per_gpu), "cost-tree",
                        stages=stages, prediction=pred)
    why = (f"cost objective: {alloc}; predicted {plan.total_time_s:,.0f} s for {job.remaining_iterations:,.0f} "
           f"iterations (SLO {job.slo_s:,.0f} s), cost {cost_text(plan.cost)}")
    return Decision(job.id, Action.START, why, choice, slices, Cell(kind, dp * pp, pp), iteration_s=plan.iter_time_s)


def place(snap: Snapshot, pending: Sequence[JobView], solver: Solver | None = None
          ) -> tuple[list[Decision], tuple[NodeView, ...]]:
    """Decisions for the pending cost jobs, and the nodes with the GPUs they were given marked busy."""
    free = _Free.of(snap.nodes)
    solve = solver or default_solver
    out = [place_one(j, snap, free, solve) for j in sorted(pending, key=lambda j: (j.submit_time, j.id))]
    return out, free.busy_nodes(snap.nodes)


def keep(running: Sequence[RunningView]) -> list[Decision]:
    """Running cost jobs stay as they are (their placement, plan and stages)."""
    return [Decision(r.job.id, Action.KEEP, "running", r.plan, r.slices, r.cell) for r in running]
