"""The cheapest mixed-GPU allocation under a time SLO: Espresso's GPU allocator (Sec. III-B, Alg. 1),
with its stage placer (Alg. 2, stage_placer.py) at the leaves.

Espresso: "Cost-Efficient Large Model Training by Exploiting GPU Heterogeneity in the Cloud", IEEE
INFOCOM 2025 (docs/reference/papers.md). Its problem (Eq. 1-3): given GPU types t with prices c_t per
hour and quotas Lim_t, a job of z iterations and an SLO, choose the allocation N (types and counts)
and the stage placement G minimising C = z T_iter (sum_t c_t n_t) subject to z T_iter <= T_SLO and
n_t <= Lim_t. An allocation here is a pipeline of k stages, each of dp GPUs of one type (Espresso's
uniform DP size d per stage), so n_t = dp x (stages of type t); T_iter is the stage placer's estimate
of the placement Alg. 2 builds for it (docs/estimator-stage-placer.md).

The cost tree (Alg. 1): one tree per (dp, k) in the boundaries (BP: k from 1 to max_stages and the
model's layers; dp over the divisors of the micro-batch size the placer uses for k stages, within
the largest quota), a node fixing how many stages take each type in turn (Alg. 1 line 20), so a
root-to-leaf path is one multiset of k stage types. All trees share one priority queue ordered by a
lower bound on the cost of any allocation below a node, expanded best first; a node is dropped when
its lower-bound time exceeds the SLO or its stages cannot hold the model (TCP), or when its lower-bound
cost exceeds the cheapest feasible allocation found so far (CP). The search stops when the queue's
least bound exceeds that allocation's cost: every allocation not scored then costs more. The bounds
(cost_bounds.py) are derived from the same estimate that scores the leaves, so, unlike the paper's
(whose Eq. 5 cost model is not a bound of its estimator's time, and whose published allocator misses
cheaper plans its estimator scores), they never exceed it: the tree returns the exhaustive optimum.

Limits, so that no input runs away (the controller asks this per job per round): k at most
MAX_STAGES; each search at most `max_work` units of work (MAX_SEARCH_WORK by default: BOUND_WORK per
node bounded, and per allocation placed the stage placer's steps, StagePlacer.steps), and no leaf
whose Alg. 2 exceeds the placer's MAX_PLACE_WORK; past either, the search stops with SearchTooLarge
(a CostInputError, field max_stages).

`exhaustive_cheapest` scores every allocation of the same space with the same placement (Espresso's
"Optimal", Sec. V). Baselines (Sia+, Whale+, HPH+): cost_baselines.py. Pure: no I/O, no clock.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from tessera.common.errors import InvalidArgument, InvalidInput
from tessera.common.gpus import UnknownGpuError, lookup
from tessera.estimator.cells import CellConfig, CellInputError, CellModel, GpuPool
from tessera.estimator.clusterfile import link_gbps_refusal
from tessera.estimator.cost_bounds import Shape, bound, build_shape, microbatches
from tessera.estimator.cost_placements import best_placement
from tessera.estimator.stage_placer import MAX_PLACE_WORK, HeteroPlan, StagePlacer

__all__ = ["MAX_SEARCH_WORK", "MAX_STAGES", "CostInputError", "CostPlan", "CostStage", "GpuOffer", "NoFeasiblePlan",
           "SearchTooLarge", "cheapest_plan", "count_allocations", "exhaustive_cheapest", "exhaustive_sweep",
           "fastest_plan"]

Leaf = Callable[[StagePlacer], HeteroPlan]
# Slack on the pruning comparisons: a bound equal to a cost in exact arithmetic may round above it.
_SLACK = 1e-9
# The longest pipeline the tree considers (`max_stages` above it is refused): the trees grow with the
# number of multisets of k stage types, C(types + k - 1, k), and each leaf's placement with k.
MAX_STAGES = 16
# The work one search may take by default (`max_work`). The unit, a stage cost looked up (plus its
# operators when computed: StagePlacer.steps), takes 0.3-3 us on one core of the project's 2-CPU
# machine: 96 layers over 24 GPU types up to 16 stages reaches 3M in 3.3 s (171 s, 2.8 GB for the
# first 20,000 nodes unbudgeted), 1,024 layers over 4 types up to 4 stages in 3.2 s. The largest
# search of bench/espresso_cost.py (measured 2026-11-27) takes 362,316 units (0.8 s) with the
# registered models, 658,541 (2.1 s) with --shapes table2; the unit tests under 3,000. Nodes alone
# would not do: that bench's largest search by nodes expands and places 1,802 in 0.5 s.
MAX_SEARCH_WORK = 3_000_000
# The work laying out the trees may take (the per-(dp, k) bound terms, before the search; same unit).
# Unbudgeted, a MoE model of 96 layers over the 24 catalog types up to 16 stages took 54 s here, inside
# a controller round on its event loop; a dense one 1.1M units (1.5 s).
MAX_PREPARE_WORK = 3_000_000
# The work charged per node bounded (pushed on the queue or pruned): a bound costs about as much as
# 50 stage costs looked up (0.2 ms over 24 GPU types).
BOUND_WORK = 50


class CostInputError(InvalidArgument, ValueError):
    """Bad input to the cost tree; `field` names it (``offers[1].price_per_hour``, ``slo_s``...)."""


class SearchTooLarge(CostInputError):
    """The search would exceed its budget (`max_work`, or the placer's MAX_PLACE_WORK at a leaf);
    field ``max_stages``. A CostInputError, so whoever catches those catches it."""


class NoFeasiblePlan(InvalidInput, ValueError):
    """No allocation within the quotas meets the SLO. `best_time_s` is the least time (all the
    iterations) any allocation reaches, inf when none holds the model in memory; `reason` says why."""

    def __init__(self, best_time_s: float, reason: str) -> None:
        super().__init__(reason)
        self.best_time_s = best_time_s
        self.reason = reason

    def __reduce__(self) -> tuple[type[NoFeasiblePlan], tuple[float, str]]:
        return type(self), (self.best_time_s, self.reason)


@dataclass(frozen=True)
class GpuOffer:
    """GPUs one can rent: `quota` of `gpu_type` (a catalog name or alias) at `price_per_hour` each.
    `gpus_per_node` and `nic_gbps` (GB/s per direction, GpuPool's unit) say how they are wired."""

    gpu_type: str
    price_per_hour: float
    quota: int
    gpus_per_node: int = 8
    nic_gbps: float = 12.5
    # Memory of each offered GPU when not the catalog's (what the nodes report); 0 = the catalog's.
    memory_bytes: int = 0

    def __post_init__(self) -> None:
        try:
            entry = lookup(str(self.gpu_type))
        except UnknownGpuError as exc:
            raise CostInputError("gpu_type", str(exc)) from exc
        object.__setattr__(self, "gpu_type", entry.name)
        p = self.price_per_hour
        if p is None or isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < math.inf:
            raise CostInputError("price_per_hour", f"must be a number >= 0, got {p!r}")
        for f in ("quota", "gpus_per_node"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CostInputError(f, f"must be an integer >= 1, got {v!r}")
        if why := link_gbps_refusal(self.nic_gbps):  # the pools' bounds: refused here, not in a leaf
            raise CostInputError("nic_gbps", why)


@dataclass(frozen=True)
class CostStage:
    """Stage i: `dp` GPUs of `gpu_type` holding transformer layers [first_layer, first_layer + layers)."""

    gpu_type: str
    dp: int
    first_layer: int
    layers: int


@dataclass(frozen=True)
class CostPlan:
    """An allocation, its placement and what it costs. `cost` = price x GPUs x time (Espresso Eq. 1),
    in the offers' currency; `total_time_s` = iterations x `iter_time_s`. `explored`: nodes expanded
    and allocations placed; `placed`: allocations scored by the stage placer; `pruned`: nodes
    discarded by the bounds (or never expanded once the search stopped)."""

    stages: tuple[CostStage, ...]
    gpus: tuple[tuple[str, int], ...]
    dp: int
    num_microbatches: int
    iter_time_s: float
    total_time_s: float
    cost: float
    price_per_hour: float
    estimate: HeteroPlan
    explored: int = 0
    placed: int = 0
    pruned: int = 0

    @property
    def num_gpus(self) -> int:
        return sum(n for _, n in self.gpus)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def allocation(self) -> str:
        """e.g. "2 x RTX-A6000-48GB + 1 x RTX-3090-24GB"."""
        return " + ".join(f"{n} x {t}" for t, n in self.gpus)

    def describe(self) -> str:
        """e.g. "[RTX-3090-24GB:9, RTX-A6000-48GB:18] dp2 mb8" (the placer's form)."""
        return self.estimate.describe()


@dataclass(frozen=True)
class _Problem:
    model: CellModel
    offers: tuple[GpuOffer, ...]
    iterations: int
    slo_s: float
    config: CellConfig
    max_stages: int
    overlap_sync: bool
    shapes: tuple[Shape, ...]
    max_work: int = MAX_SEARCH_WORK
    # The most GPUs (dp x k) of any tree, and of any had the global batch not bounded dp (BP's
    # divisors): when the first is less, the batch, not the quotas, bounds the allocations searched.
    batch_gpus: int = 0
    quota_gpus: int = 0


@dataclass
class _Stats:
    expanded: int = 0
    placed: int = 0
    pruned: int = 0
    work: int = 0


def _check(model: object, offers: object, iterations: object, slo_s: object, max_stages: object,
           cluster: Mapping[str, int] | None) -> tuple[GpuOffer, ...]:
    if not isinstance(model, CellModel):
        raise CostInputError("model", f"must be a CellModel, got {type(model).__name__}")
    if model.family == "wresnet":
        raise CostInputError("model", "the stage placer splits transformer layers, not a Wide-ResNet")
    if isinstance(offers, (str, bytes)) or not isinstance(offers, Sequence) or not offers:
        raise CostInputError("offers", "need at least one GPU offer")
    seen: dict[str, int] = {}
    for i, o in enumerate(offers):
        if not isinstance(o, GpuOffer):
            raise CostInputError(f"offers[{i}]", f"must be a GpuOffer, got {type(o).__name__}")
        if o.gpu_type in seen:
            raise CostInputError(f"offers[{i}].gpu_type", f"{o.gpu_type} is offered twice (offers[{seen[o.gpu_type]}])")
        seen[o.gpu_type] = i
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise CostInputError("iterations", f"must be an integer >= 1, got {iterations!r}")
    if isinstance(slo_s, bool) or not isinstance(slo_s, (int, float)) or not slo_s > 0 or math.isnan(slo_s):
        raise CostInputError("slo_s", f"must be a number of seconds > 0, got {slo_s!r}")
    if isinstance(max_stages, bool) or not isinstance(max_stages, int) or not 1 <= max_stages <= MAX_STAGES:
        raise CostInputError("max_stages", f"must be an integer from 1 to {MAX_STAGES}, got {max_stages!r}")
    if cluster is not None:
        have: dict[str, int] = {}
        for name, n in cluster.items():
            try:
                have[lookup(name).name] = have.get(lookup(name).name, 0) + int(n)
            except UnknownGpuError as exc:
                raise CostInputError("cluster", str(exc)) from exc
        for i, o in enumerate(offers):
            if o.quota > have.get(o.gpu_type, 0):
                raise CostInputError(f"offers[{i}].quota", f"{o.quota} x {o.gpu_type} exceeds the cluster's "
                                                           f"{have.get(o.gpu_type, 0)}")
    return tuple(offers)


def _prepare(model: CellModel, offers: Sequence[GpuOffer], iterations: int, slo_s: float,
             config: CellConfig | None, max_stages: int, cluster: Mapping[str, int] | None,
             overlap_sync: bool, max_work: int = MAX_SEARCH_WORK) -> _Problem:
    offs = _check(model, offers, iterations, slo_s, max_stages, cluster)
    if isinstance(max_work, bool) or not isinstance(max_work, int) or max_work < 1:
        raise CostInputError("max_work", f"must be an integer >= 1, got {max_work!r}")
    cfg = config or CellConfig()
    most = max(o.quota for o in offs)
    shapes: list[Shape] = []
    done = 0  # laying out the trees has a budget of its own

    def check(steps: int) -> None:
        if done + steps > MAX_PREPARE_WORK:
            raise SearchTooLarge("max_stages", f"search too large: laying out the trees took over {MAX_PREPARE_WORK} units "
                                               f"of work ({len(shapes)} of them built; up to {max_stages} stages, "
                                               f"{len(offs)} GPU types); lower --max-stages or offer fewer types")
    for k in range(1, min(max_stages, model.num_layers) + 1):
        b = microbatches(model, k, cfg)
        per_micro = model.global_batch // b
        # BP: dp divides the micro-batch (whole samples per rank) and fits in some quota
        for dp in (d for d in range(1, min(per_micro, most) + 1) if per_micro % d == 0):
            usable = [o for o in offs if o.quota >= dp]
            if sum(o.quota // dp for o in usable) < k:
                continue
            # pools sized to the shape (k x dp of each type), so one placer check passes for every
            # allocation; the quotas are enforced by the search (caps), not by the pools
            pools = {o.gpu_type: GpuPool(o.gpu_type, k * dp, o.gpus_per_node, nic_gbps=o.nic_gbps,
                                         memory_bytes=o.memory_bytes) for o in usable}
            try:
                shapes.append(build_shape(model, pools, {o.gpu_type: o.price_per_hour for o in usable},
                                          {o.gpu_type: o.quota for o in usable}, dp, k, b, cfg, overlap_sync, check))
            except CellInputError as exc:
                raise CostInputError("model", str(exc)) from exc
            done += shapes[-1].work
            check(0)
    return _Problem(model, offs, iterations, float(slo_s), cfg, max_stages, overlap_sync, tuple(shapes), max_work,
                    max((s.dp * s.k for s in shapes), default=0), _quota_gpus(offs, min(max_stages, model.num_layers)))


def _quota_gpus(offs: Sequence[GpuOffer], most_k: int) -> int:
    """The most GPUs dp x k of k stages of dp GPUs each (one type per stage) the quotas hold, any dp."""
    best = 0
    for k in range(1, most_k + 1):
        lo, hi = 0, max(o.quota for o in offs)  # the largest dp with k stages: stages(dp) falls as dp grows
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if sum(o.quota // mid for o in offs) >= k else (lo, mid - 1)
        best = max(best, lo * k)
    return best


def _memory_reason(p: _Problem) -> str:
    """Why no allocation searched holds the model: memory, or, when the global batch kept the search
    below the GPUs the quotas hold, that bound first (more GPUs shard the model further)."""
    where = f"{len(p.offers)} GPU type(s) within their quotas, at most {p.max_stages} stages"
    name = p.model.name or "the model"
    if p.batch_gpus >= p.quota_gpus:
        return f"no allocation of {where} holds {name} in GPU memory"
    return (f"the global batch of {p.model.global_batch:,} bounds data parallelism: each stage's dp must divide "
            f"the samples of one micro-batch (global batch / micro-batches, {p.config.microbatches_per_stage} "
            f"per stage), so at most {p.batch_gpus:,} of the {p.quota_gpus:,} GPUs the quotas hold were searched "
            f"(dp x stages), and no allocation of {where} on them holds {name} in GPU memory; a larger global "
            f"batch would admit more GPUs")


def _alloc_cost(p: _Problem, shape: Shape, counts: Mapping[str, int], iter_time: float) -> float:
    per_hour = shape.dp * sum(n * shape.prices[t] for t, n in counts.items())
    return p.iterations * iter_time * per_hour / 3600.0


def _key(objective: str, cost: float, time: float, gpus: int, desc: str) -> tuple[float, float, int, str]:
    return (cost, time, gpus, desc) if objective == "cost" else (time, cost, gpus, desc)


def _place(p: _Problem, shape: Shape, counts: Mapping[str, int], leaf: Leaf | None,
           st: _Stats | None = None) -> HeteroPlan:
    """The leaf's placement; its placer's steps are charged to `st.work`."""
    types = [t for t, n in sorted(counts.items()) for _ in range(n)]
    sp = shape.placer(p.model, types, p.config, p.overlap_sync)
    work = sp.place_work()
    if work > MAX_PLACE_WORK:  # the placer's own limit, checked here for every leaf (before any cost)
        raise SearchTooLarge("max_stages", f"search too large: placing {shape.k} stages of {len(counts)} GPU type(s) "
                                           f"over {p.model.num_layers} layers exceeds the stage placer's limit "
                                           f"({work} > {MAX_PLACE_WORK}); lower --max-stages or offer fewer types")
    before = sp.steps
    hp = sp.place() if leaf is None else leaf(sp)
    if st is not None:
        st.work += sp.steps - before
    return hp


def _order(shape: Shape) -> list[str]:
    """The tree's branching order: types by price x per-layer time (the cheapest work first), which
    only changes how soon good leaves are found, never which allocation wins."""
    return sorted(shape.pools, key=lambda t: (shape.prices[t] * shape.e[t], t))


def _search(p: _Problem, objective: str, slo_s: float, leaf: Leaf | None,
            only: Callable[[Shape, Mapping[str, int]], bool] | None = None
            ) -> tuple[tuple[Shape, dict[str, int], HeteroPlan] | None, _Stats]:
    """Best-first branch and bound over every (dp, k) tree at once. `objective` "cost" or "time"."""
    st = _Stats()
    orders = [_order(s) for s in p.shapes]
    heap: list[tuple[float, int, int, int, tuple[int, ...]]] = []
    tie = itertools.count()
    best: tuple[Shape, dict[str, int], HeteroPlan] | None = None
    best_key: tuple[float, float, int, str] | None = None

    def push(si: int, j: int, counts: tuple[int, ...]) -> None:
        shape, order = p.shapes[si], orders[si]
        fixed = dict(zip(order, counts, strict=False))
        s = sum(counts)
        rest = order[j:] if s < shape.k else []
        bd = bound(shape, fixed, rest, p.iterations)
        st.work += BOUND_WORK
        lb = bd.cost if objective == "cost" else bd.time_s
        if (not bd.completes or not bd.holds or bd.time_s * (1 - _SLACK) > slo_s
                or (best_key is not None and lb * (1 - _SLACK) > best_key[0])):
            st.pruned += 1
            return
        heapq.heappush(heap, (lb, next(tie), si, j, counts))

    for si in range(len(p.shapes)):
        push(si, 0, ())
    while heap:
        lb, _, si, j, counts = heapq.heappop(heap)
        if best_key is not None and lb * (1 - _SLACK) > best_key[0]:
            st.pruned += 1 + len(heap)
            break
        if st.work > p.max_work:
            raise SearchTooLarge("max_stages", f"search too large: {st.expanded} nodes expanded and {st.placed} "
                                               f"allocations placed took {st.work} units of work, over the budget of "
                                               f"{p.max_work} ({len(p.shapes)} trees of up to {p.max_stages} stages, "
                                               f"{len(p.offers)} GPU types); lower --max-stages or offer fewer types")
        shape, order = p.shapes[si], orders[si]
        s = sum(counts)
        if s == shape.k:  # a complete allocation: place it
            alloc = {t: n for t, n in zip(order, counts, strict=False) if n}
            if only is not None and not only(shape, alloc):
                continue
            hp = _place(p, shape, alloc, leaf, st)
            st.placed += 1
            total = p.iterations * hp.iter_time
            if not hp.fits or total > slo_s:
                continue
            key = _key(objective, _alloc_cost(p, shape, alloc, hp.iter_time), total,
                       shape.dp * shape.k, hp.describe())
            if best_key is None or key < best_key:
                best, best_key = (shape, alloc, hp), key
            continue
        st.expanded += 1
        t = order[j]
        for y in range(min(shape.caps[t], shape.k - s) + 1):
            if j + 1 == len(order) and s + y < shape.k:
                continue
            push(si, j + 1, (*counts, y))
    return best, st


def _plan(p: _Problem, found: tuple[Shape, dict[str, int], HeteroPlan], st: _Stats) -> CostPlan:
    shape, alloc, hp = found
    stages, first = [], 0
    for s in hp.stages:
        stages.append(CostStage(s.pool.gpu, shape.dp, first, s.layers))
        first += s.layers
    gpus = tuple(sorted((t, n * shape.dp) for t, n in alloc.items()))
    per_hour = sum(n * shape.prices[t] for t, n in gpus)
    return CostPlan(tuple(stages), gpus, shape.dp, shape.b, hp.iter_time, p.iterations * hp.iter_time,
                    _alloc_cost(p, shape, alloc, hp.iter_time), per_hour, hp,
                    st.expanded + st.placed, st.placed, st.pruned)


def _infeasible(p: _Problem, leaf: Leaf | None,
                only: Callable[[Shape, Mapping[str, int]], bool] | None = None) -> NoFeasiblePlan:
    fastest, _ = _search(p, "time", math.inf, leaf, only)
    where = f"{len(p.offers)} GPU type(s) within their quotas, at most {p.max_stages} stages"
    if fastest is None:
        # No field: no SLO would help (a memory failure read "slo_s: ...", which plan-cost and the
        # controller each stripped).
        return NoFeasiblePlan(math.inf, _memory_reason(p))
    hp = fastest[2]
    best = p.iterations * hp.iter_time
    return NoFeasiblePlan(best, f"slo_s: no allocation of {where} runs {p.iterations} iterations within "
                                f"{seconds_text(p.slo_s)} s; the fastest takes {best:,.1f} s ({hp.describe()})")


def seconds_text(x: float) -> str:
    """An SLO as its reasons write it: whole seconds as such (1,209,600), else to the tenth, as the
    fastest time beside it (an SLO of 2.7 s rounded to 3 read as met by 2.8 s), and under 0.1 s to
    three figures."""
    if math.isfinite(x) and x == int(x):
        return f"{x:,.0f}"
    return f"{x:,.1f}" if x >= 0.1 else f"{x:.3g}"  # (a test's SLO of 1 ms read "0.0 s")


def cheapest_plan(model: CellModel, offers: Sequence[GpuOffer], iterations: int, slo_s: float, *,
                  config: CellConfig | None = None, max_stages: int = 8, cluster: Mapping[str, int] | None = None,
                  overlap_sync: bool = False, placement: str = "espresso",
                  max_work: int = MAX_SEARCH_WORK) -> CostPlan:
    """The cheapest allocation (Alg. 1's cost tree, Alg. 2 at its leaves) whose `iterations` run within
    `slo_s` seconds; NoFeasiblePlan when none does. `cluster` ({type: GPUs}): the quotas may not exceed
    it. `placement`: "espresso" (Alg. 2, the paper's) or "best" (of Alg. 2's, Whale's and HPH's).
    SearchTooLarge when the search (or, with no plan, the search for the fastest) exceeds `max_work`."""
    leaf = _leaf(placement)
    p = _prepare(model, offers, iterations, slo_s, config, max_stages, cluster, overlap_sync, max_work)
    return _solve(p, leaf)


def _leaf(placement: str) -> Leaf | None:
    if placement == "espresso":
        return None
    if placement == "best":
        return best_placement
    raise CostInputError("placement", f"must be 'espresso' or 'best', got {placement!r}")


def _solve(p: _Problem, leaf: Leaf | None,
           only: Callable[[Shape, Mapping[str, int]], bool] | None = None) -> CostPlan:
    found, st = _search(p, "cost", p.slo_s, leaf, only)
    if found is None:
        raise _infeasible(p, leaf, only)
    return _plan(p, found, st)


def fastest_plan(model: CellModel, offers: Sequence[GpuOffer], iterations: int, *,
                 config: CellConfig | None = None, max_stages: int = 8,
                 cluster: Mapping[str, int] | None = None, overlap_sync: bool = False,
                 placement: str = "espresso", max_work: int = MAX_SEARCH_WORK) -> CostPlan:
    """The fastest allocation within the quotas (the same tree, ordered by time); NoFeasiblePlan
    (best time inf) when none holds the model; SearchTooLarge over `max_work`."""
    leaf = _leaf(placement)
    p = _prepare(model, offers, iterations, math.inf, config, max_stages, cluster, overlap_sync, max_work)
    found, st = _search(p, "time", math.inf, leaf)
    if found is None:
        raise _infeasible(p, leaf)
    return _plan(p, found, st)


def _allocations(p: _Problem) -> Iterator[tuple[Shape, dict[str, int]]]:
    for shape in p.shapes:
        types = sorted(shape.pools)
        for combo in itertools.combinations_with_replacement(types, shape.k):
            alloc = {t: combo.count(t) for t in types if t in combo}
            if all(n <= shape.caps[t] for t, n in alloc.items()):
                yield shape, alloc


def count_allocations(model: CellModel, offers: Sequence[GpuOffer], *, config: CellConfig | None = None,
                      max_stages: int = 8) -> int:
    """How many allocations `exhaustive_cheapest` would place (to decide whether it is affordable)."""
    p = _prepare(model, offers, 1, math.inf, config, max_stages, None, False)
    return sum(1 for _ in _allocations(p))


def exhaustive_cheapest(model: CellModel, offers: Sequence[GpuOffer], iterations: int, slo_s: float, *,
                        config: CellConfig | None = None, max_stages: int = 8,
                        cluster: Mapping[str, int] | None = None, overlap_sync: bool = False,
                        placement: str = "espresso") -> CostPlan:
    """Every allocation of the tree's space placed (by Alg. 2, or `placement`) and costed, no pruning:
    the optimum the tree must return. For small instances (count_allocations says how many)."""
    got = exhaustive_sweep(model, offers, iterations, [slo_s], config=config, max_stages=max_stages,
                           cluster=cluster, overlap_sync=overlap_sync, placement=placement)[0]
    if isinstance(got, NoFeasiblePlan):
        raise got
    return got


def exhaustive_sweep(model: CellModel, offers: Sequence[GpuOffer], iterations: int, slos: Sequence[float], *,
                     config: CellConfig | None = None, max_stages: int = 8, cluster: Mapping[str, int] | None = None,
                     overlap_sync: bool = False, placement: str = "espresso") -> list[CostPlan | NoFeasiblePlan]:
    """`exhaustive_cheapest` for several SLOs at once: every allocation is placed once, then each SLO
    takes the cheapest that meets it (or its NoFeasiblePlan, with the best time of all)."""
    if isinstance(slos, (str, bytes)) or not isinstance(slos, Sequence) or not slos:
        raise CostInputError("slos", "need at least one SLO")
    for slo in slos:
        _check(model, offers, iterations, slo, max_stages, cluster)
    leaf = _leaf(placement)
    p = _prepare(model, offers, iterations, math.inf, config, max_stages, cluster, overlap_sync)
    scored: list[tuple[Shape, dict[str, int], HeteroPlan]] = []
    for shape, alloc in _allocations(p):
        scored.append((shape, alloc, _place(p, shape, alloc, leaf)))
    fitting = [s for s in scored if s[2].fits]
    fastest = min(fitting, key=lambda s: (s[2].iter_time, s[2].describe()), default=None)
    where = f"{len(p.offers)} GPU type(s) within their quotas, at most {p.max_stages} stages"
    out: list[CostPlan | NoFeasiblePlan] = []
    for slo in slos:
        best, best_key = None, None
        for shape, alloc, hp in fitting:
            total = p.iterations * hp.iter_time
            if total > slo:
                continue
            key = _key("cost", _alloc_cost(p, shape, alloc, hp.iter_time), total, shape.dp * shape.k,
                       hp.describe())
            if best_key is None or key < best_key:
                best, best_key = (shape, alloc, hp), key
        if best is not None:
            out.append(_plan(p, best, _Stats(placed=len(scored))))
        elif fastest is None:
            out.append(NoFeasiblePlan(math.inf, f"slo_s: {_memory_reason(p)}"))
        else:
            t = p.iterations * fastest[2].iter_time
            out.append(NoFeasiblePlan(t, f"slo_s: no allocation of {where} runs {p.iterations} iterations within "
                                         f"{seconds_text(slo)} s; the fastest takes {t:,.1f} s ({fastest[2].describe()})"))
    return out
