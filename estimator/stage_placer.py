"""Stage placement over mixed GPU types: Espresso's resource-aware stage placer (Sec. III-C, Alg. 2).

A pipeline of k stages, stage s on `dp` GPUs of one type (data parallel inside the stage, as
Espresso's DeepSpeed runs), the types given by an allocation (the multiset N of Alg. 1). The placer
decides which type takes which position and how many transformer layers each stage holds. Stage
costs are the Cell estimator's (`cells._stage_cost`: compute from the catalog and the efficiency
prior, memory with the 1F1B in-flight micro-batches of the stage's position), each stage on nodes of
its own, so activations between stages cross the network; the iteration time is the Cell
estimator's (Crius Sec. 5.1 plus the slowest stage's gradient sync and optimizer step), or with
`overlap_sync` Espresso's Eq. 9 (each stage's sync overlapped with the earlier stages' backward).

Alg. 2 as written: for each layer count l0 of stage 0, take at each position the remaining type of
least compute-memory ratio CMR(t, s) = F(t) / M(t) x alpha(t, s) (Eq. 10: F the FP16 rate, M the
memory, alpha = max(l_m, l_c) / l_c with l_m the most layers that fit there and l_c the most whose
gradient sync fits in the window the earlier stages' backward passes leave), give it min(l_m, l_f)
layers (l_f: its share of the layers by compute rate, Whale's balance), add any layers left to
stages 1..k-1 one by one while they fit, and keep the plan of least estimated iteration time.
`exhaustive` scores every order and every split with the same estimate, the paper's "Optimal".
Both refuse work too large before starting it (a CellInputError naming the sizes): `place` over
MAX_PLACE_WORK, `exhaustive` over `max_plans` plans, counted without enumerating them.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from tessera.estimator.cells import (
    CellConfig,
    CellInputError,
    CellModel,
    GpuPool,
    StageCost,
    StagePlan,
    _Placement,
    _stage_cost,
    iteration_time,
    model_operators,
    pipeline_latency,
    pool_links,
)
from tessera.estimator.comm import CommModel, Link
from tessera.estimator.partition import Operator

__all__ = ["MAX_PLACE_WORK", "HeteroPlan", "HeteroStage", "StagePlacer", "distinct_orders", "order_count"]

# The most work `place` takes on, in the units of `StagePlacer.place_work` (distinct types x stages x
# layers^2: Alg. 2 costs every layer count at every position for every type, each cost over the
# stage's layers). On one core of the project's 2-CPU machine a unit takes 130-210 ns, so 2^24 is
# about 3 s (256 layers x 16 stages x 16 types: 3.0 s; 512 layers, 64 stages, 8 types, 2^27: 27 s).
# The largest in the tests and benches is under 1% of it: 156,800 (70 layers, 8 stages, 4 types,
# bench/espresso_cost.py --shapes table2).
MAX_PLACE_WORK = 1 << 24


@dataclass(frozen=True)
class HeteroStage:
    """One pipeline stage: `dp` GPUs of `pool`'s type holding `layers` transformer layers (stage 0
    also holds the embedding, the last stage the head)."""

    pool: GpuPool
    layers: int


@dataclass(frozen=True)
class HeteroPlan:
    stages: tuple[HeteroStage, ...]
    dp: int
    num_microbatches: int
    stage_costs: tuple[StageCost, ...]
    iter_time: float

    @property
    def fits(self) -> bool:
        return all(c.fits for c in self.stage_costs)

    @property
    def memory_per_gpu(self) -> float:
        return max(c.memory_bytes for c in self.stage_costs)

    def describe(self) -> str:
        """e.g. "[2 x A30-24GB: layers 0-9, 2 x RTX-A6000-48GB: layers 10-23] dp2 mb8": each stage's
        GPUs, type and inclusive layer range, as `describe job` and plan-cost write stages (it read
        "[A30-24GB:10, ...]", Espresso's "[GPU type : #num]" notation, whose number counts GPUs)."""
        parts, first = [], 0
        for s in self.stages:
            parts.append(f"{self.dp} x {s.pool.gpu}: layers {first}-{first + s.layers - 1}")
            first += s.layers
        return f"[{', '.join(parts)}] dp{self.dp} mb{self.num_microbatches}"


class StagePlacer:
    """Places one model on one allocation; stage costs are memoised per (pool, position, operator range)."""

    def __init__(self, model: CellModel, pools: Sequence[GpuPool], dp: int, num_microbatches: int | None = None,
                 config: CellConfig | None = None, comm: CommModel | None = None, overlap_sync: bool = False,
                 cache: dict[tuple[GpuPool, int, int, int], StageCost] | None = None) -> None:
        """`cache`: a stage-cost memo to share between placers of one model, stage count, dp,
        micro-batch count, config and comm model (the key holds only the pool, position and range):
        the cost tree (cost_tree.py) places many allocations of one shape and reuses the costs."""
        if model.family == "wresnet":
            raise CellInputError("family", "stage placement covers transformer layers, not a Wide-ResNet")
        if not pools:
            raise CellInputError("pools", "the allocation needs at least one stage")
        if len(pools) > model.num_layers:
            raise CellInputError("pools", f"{len(pools)} stages for {model.num_layers} layers")
        if dp < 1:
            raise CellInputError("dp", f"must be >= 1, got {dp}")
        self.config = config or CellConfig()
        # Default: the paper's 4 x stages micro-batches, or the largest count under it that divides the batch.
        target = min(self.config.microbatches_per_stage * len(pools), model.global_batch)
        b = num_microbatches or max(d for d in range(1, target + 1) if model.global_batch % d == 0)
        if not 1 <= b <= model.global_batch or model.global_batch % b:
            raise CellInputError("num_microbatches", f"must divide the global batch {model.global_batch}, got {b}")
        if dp > model.global_batch // b:
            raise CellInputError("dp", f"{dp} ranks for micro-batches of {model.global_batch // b} samples")
        for i, p in enumerate(pools):
            if dp > p.num_gpus:
                raise CellInputError(f"pools[{i}]", f"{p.gpu} has {p.num_gpus} GPUs, a stage needs dp = {dp}")
            need = sum(q == p for q in pools) * dp
            if need > p.num_gpus:
                raise CellInputError(f"pools[{i}]", f"{sum(q == p for q in pools)} stages x dp {dp} of {p.gpu} need "
                                     f"{need} GPUs, the pool has {p.num_gpus}")
        self.model = model
        self.overlap_sync = overlap_sync
        self.pools = tuple(pools)
        self.dp = dp
        self.num_microbatches = b
        self.comm = comm or CommModel()
        self.ops: tuple[Operator, ...] = model_operators(model)
        self._cache: dict[tuple[GpuPool, int, int, int], StageCost] = {} if cache is None else cache
        self._scans: dict[tuple[GpuPool, int], tuple[list[int], int, list[float]]] = {}
        # The work done so far: 1 per stage cost looked up, plus its operators when computed (the
        # cost tree charges its search budget with it).
        self.steps = 0

    # -- the estimate of one plan --------------------------------------------------------------------

    def _bounds(self, layers: Sequence[int]) -> list[tuple[int, int]]:
        """Operator ranges: the embedding joins stage 0, the head the last stage."""
        out, start = [], 0
        for i, n in enumerate(layers):
            end = start + n + (1 if i == 0 else 0) + (1 if i == len(layers) - 1 else 0)
            out.append((start, end))
            start = end
        return out

    def stage_cost(self, pool: GpuPool, position: int, start: int, end: int) -> StageCost:
        """The stage's costs without the inter-stage transfer (added by `evaluate`)."""
        key = (pool, position, start, end)
        hit = self._cache.get(key)
        self.steps += 1
        if hit is None:
            self.steps += end - start
            per_node = min(self.dp, pool.gpus_per_node)
            place = _Placement(self._nodes(pool), per_node)
            intra, inter = pool_links(pool, self.config.links)
            hit = _stage_cost(self.ops, StagePlan(start, end, self.dp, 1), 0, None, place, pool.gpu_type, intra,
                              inter, self.model.global_batch / self.num_microbatches, position, len(self.pools),
                              self.num_microbatches, self.config, self.comm, None, self.model)
            self._cache[key] = hit
        return hit

    def _nodes(self, pool: GpuPool) -> int:
        """Nodes a stage of dp GPUs of this pool spans."""
        return math.ceil(self.dp / min(self.dp, pool.gpus_per_node))

    def transfer_time(self, prev: GpuPool, cur: GpuPool, start: int) -> float:
        """The inter-stage time a stage starting at operator `start` on `cur` pays after `prev`."""
        return self._p2p(prev, cur, start)

    def _p2p(self, prev: GpuPool, cur: GpuPool, start: int) -> float:
        """Activation forward and gradient backward between two stages on different nodes: over the
        slower of the two networks, split over the fewer nodes' NICs."""
        nbytes = 2 * self.ops[start - 1].out_bytes * self.model.global_batch / self.num_microbatches
        links = [pool_links(p, self.config.links)[1] for p in (prev, cur)]
        link: Link = min(links, key=lambda x: x.bandwidth_gbps * x.efficiency)
        return self.comm.time("p2p", nbytes / min(self._nodes(prev), self._nodes(cur)), 2, link).seconds

    def evaluate(self, stages: Sequence[HeteroStage]) -> HeteroPlan:
        if len(stages) != len(self.pools):
            raise CellInputError("stages", f"{len(stages)} given for an allocation of {len(self.pools)}")
        if sorted(s.pool.gpu for s in stages) != sorted(p.gpu for p in self.pools):
            raise CellInputError("stages", "the GPU types must be the allocation's")
        if any(s.layers < 1 for s in stages) or sum(s.layers for s in stages) != self.model.num_layers:
            raise CellInputError("stages", f"layers must be >= 1 each and add up to {self.model.num_layers}")
        costs = []
        for i, ((start, end), st) in enumerate(zip(self._bounds([s.layers for s in stages]), stages, strict=True)):
            c = self.stage_cost(st.pool, i, start, end)
            if i > 0:
                c = replace(c, inter_comm=self._p2p(stages[i - 1].pool, st.pool, start))
            costs.append(c)
        return HeteroPlan(tuple(stages), self.dp, self.num_microbatches, tuple(costs), self._iter_time(costs))

    def _iter_time(self, costs: Sequence[StageCost]) -> float:
        """The Cell estimator's iteration time; with `overlap_sync`, Espresso's Eq. 9 instead: each
        stage's gradient sync (and optimizer step) overlaps the backward passes of the stages before
        it, so only max_i (sync_i - sum_{j<i} backward_j) is added to the pipeline."""
        if not self.overlap_sync:
            return iteration_time(costs, self.num_microbatches)
        pipe = pipeline_latency([c.latency for c in costs], [c.inter_comm for c in costs], self.num_microbatches)
        exposed, behind = 0.0, 0.0
        for c in costs:
            exposed = max(exposed, c.sync - behind)
            behind += self._backward(c)
        return pipe + exposed

    # -- Alg. 2 ----------------------------------------------------------------------------------------

    def _range(self, position: int, n: int) -> tuple[int, int]:
        """Operators of a stage of n layers at this position, wherever the stages before end (the
        layers are alike: only the embedding of stage 0 and the head of the last change the cost)."""
        k, last = len(self.pools), len(self.ops)
        if k == 1:
            return 0, last
        if position == 0:
            return 0, n + 1
        if position == k - 1:
            return last - 1 - n, last
        return 1, 1 + n

    def _max_layers(self, pool: GpuPool, position: int, limit: float | None = None) -> int:
        """l_m (most layers that fit at this position), or with `limit` l_c (most whose gradient sync
        takes at most `limit` seconds); 0 when not even one does."""
        k, total = len(self.pools), self.model.num_layers
        scan = self._scans.get((pool, position))
        if scan is None:
            sizes = [total] if k == 1 else list(range(1, total - (k - 1) + 1))
            costs = [self.stage_cost(pool, position, *self._range(position, n)) for n in sizes]
            fit = next((i for i, c in enumerate(costs) if not c.fits), len(costs))
            # the scan stops at the first size over the limit: the first whose running maximum is
            prefix = list(itertools.accumulate((c.sync for c in costs), max))
            scan = (sizes, fit, prefix)
            self._scans[(pool, position)] = scan
        sizes, fit, prefix = scan
        count = fit if limit is None else bisect.bisect_right(prefix, limit)
        return sizes[count - 1] if count else 0

    def _backward(self, c: StageCost) -> float:
        """The last micro-batch's backward pass: 2 of the 3 forward-equivalents (3 of 4 with recomputation)."""
        share = 3 / 4 if self.model.recompute else 2 / 3
        return c.compute * share

    def _balanced(self) -> dict[str, float]:
        """l_f per type: the layers in proportion to the FP16 rate over the allocation (Whale)."""
        rate = sum(p.gpu_type.tflops_fp16 for p in self.pools)
        return {p.gpu: self.model.num_layers * p.gpu_type.tflops_fp16 / rate for p in self.pools}

    def place_work(self) -> int:
        """The work `place` takes on: distinct types x stages x layers^2 (MAX_PLACE_WORK)."""
        return len({p.gpu for p in self.pools}) * len(self.pools) * self.model.num_layers ** 2

    def place(self, max_work: int = MAX_PLACE_WORK) -> HeteroPlan:
        """Alg. 2: the plan of least estimated iteration time among those it builds; when none fits
        in memory, the best of them anyway (its stage costs say which stage does not fit). Refused
        (CellInputError, field "stages") when `place_work` exceeds `max_work`, before any cost."""
        k = len(self.pools)
        work = self.place_work()
        if work > max_work:
            nt, n = len({p.gpu for p in self.pools}), self.model.num_layers
            raise CellInputError("stages", f"placing {k} stages of {nt} GPU type(s) over {n} layers is too large: "
                                 f"{nt} x {k} x {n}^2 = {work} exceeds the limit {max_work}; use fewer stages, "
                                 "GPU types or layers")
        types = {p.gpu: p for p in self.pools}
        l_m = {(t, s): self._max_layers(p, s) for t, p in types.items() for s in range(k)}
        l_f = self._balanced()
        cands: list[HeteroPlan] = []
        l_max = max(1, max(l_m[(t, 0)] for t in types))
        for l0 in range(1, min(l_max, self.model.num_layers - (k - 1)) + 1):
            left = [p.gpu for p in self.pools]
            fit0 = [t for t in set(left) if l_m[(t, 0)] >= l0] or list(set(left))
            first = self._least_cmr(fit0, 0, l0, l_m, window=None)
            left.remove(first)
            plan = [HeteroStage(types[first], l0)]
            window = self.stage_cost(types[first], 0, *self._range(0, l0)).sync
            for s in range(1, k):
                prev = plan[-1]
                window += self._backward(self.stage_cost(prev.pool, s - 1, *self._range(s - 1, prev.layers)))
                t = self._least_cmr(sorted(set(left)), s, None, l_m, window)
                left.remove(t)
                plan.append(HeteroStage(types[t], max(1, min(l_m[(t, s)], round(l_f[t])))))
            cands.append(self.evaluate(self._cover(plan, l_m)))
        return _best(cands)

    def _least_cmr(self, candidates: Sequence[str], position: int, layers: int | None,
                   l_m: dict[tuple[str, int], int], window: float | None) -> str:
        """The candidate type of least CMR(t, s) = F/M x max(l_m, l_c)/l_c (Eq. 10); ties by name."""
        def cmr(t: str) -> tuple[float, str]:
            pool = next(p for p in self.pools if p.gpu == t)
            g = pool.gpu_type
            lm = l_m[(t, position)] if layers is None else layers
            lc = max(1, self._max_layers(pool, position, limit=window)) if window is not None else max(1, lm)
            return g.tflops_fp16 / g.memory_gb * max(lm, lc) / lc, t
        return min(candidates, key=cmr)

    def _cover(self, plan: list[HeteroStage], l_m: dict[tuple[str, int], int]) -> list[HeteroStage]:
        """AdjustToCoverAllLayers: layers short of the model go to stages 1..k-1 one by one, to the
        one with the most room left under l_m (any of them once none has room); layers over it come
        off the last stages first, none below 1 (stage 0 last)."""
        total, k = self.model.num_layers, len(plan)
        layers = [s.layers for s in plan]
        later = list(range(1, k)) or [0]
        while sum(layers) < total:
            room = {i: l_m[(plan[i].pool.gpu, i)] - layers[i] for i in later}
            layers[max(later, key=lambda i: (room[i], -i))] += 1
        while sum(layers) > total:
            i = next((j for j in reversed(later) if layers[j] > 1), 0)
            layers[i] -= 1
        return [HeteroStage(s.pool, n) for s, n in zip(plan, layers, strict=True)]

    # -- the exhaustive optimum ----------------------------------------------------------------------

    def exhaustive(self, max_plans: int = 2_000_000) -> HeteroPlan:
        """Every distinct order of the allocation's types x every split of the layers (compositions
        into k parts >= 1), scored by `evaluate`; the fastest that fits (else the fastest). The plans
        are counted first (the multinomial of the type counts x C(layers - 1, k - 1)), refused over
        `max_plans` before any is built, and the orders enumerated lazily, in sorted order."""
        k, total = len(self.pools), self.model.num_layers
        names = [p.gpu for p in self.pools]
        orders, splits = order_count(names), math.comb(total - 1, k - 1)
        if orders * splits > max_plans:
            raise CellInputError("exhaustive", f"{orders * splits} plans exceed max_plans {max_plans} ({orders} "
                                 f"distinct order(s) of the {k} stages' types x {splits} splits of {total} layers)")
        types = {p.gpu: p for p in self.pools}
        return _best(self.best_split([types[t] for t in order], max_plans) for order in distinct_orders(names))

    def best_split(self, order: Sequence[GpuPool], max_plans: int = 2_000_000) -> HeteroPlan:
        """For one order of the stages' types, the best split of the layers (every composition)."""
        k, total = len(order), self.model.num_layers
        if math.comb(total - 1, k - 1) > max_plans:
            raise CellInputError("best_split", f"{math.comb(total - 1, k - 1)} splits exceed max_plans {max_plans}")
        return _best(self.evaluate([HeteroStage(p, b - a) for p, a, b in zip(order, (0, *cuts), (*cuts, total),
                                                                              strict=True)])
                     for cuts in itertools.combinations(range(1, total), k - 1))


def order_count(names: Sequence[str]) -> int:
    """How many distinct orders the names have: k! / prod(count_t!) over each name's count."""
    out = math.factorial(len(names))
    for c in Counter(names).values():
        out //= math.factorial(c)
    return out


def distinct_orders(names: Sequence[str]) -> Iterator[tuple[str, ...]]:
    """The distinct orders of `names` (a multiset), in sorted order, one at a time: the same sequence
    as sorted(set(itertools.permutations(names))) without building it (the next lexicographic
    permutation, which skips repeats)."""
    a = sorted(names)
    while True:
        yield tuple(a)
        i = len(a) - 2
        while i >= 0 and a[i] >= a[i + 1]:
            i -= 1
        if i < 0:
            return
        j = len(a) - 1
        while a[j] <= a[i]:
            j -= 1
        a[i], a[j] = a[j], a[i]
        a[i + 1:] = reversed(a[i + 1:])


def _best(plans: Iterable[HeteroPlan]) -> HeteroPlan:
    """The fastest plan that fits, else the fastest."""
    return min(plans, key=lambda p: (not p.fits, p.iter_time))
