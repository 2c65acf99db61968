"""Lower bounds for Espresso's cost tree (cost_tree.py): what any allocation below a node can cost
at best, how fast it can run at best, and how many layers it can hold at most.

Espresso (IEEE INFOCOM 2025, Sec. III-B, Eq. 4-7) bounds a partial plan by the iteration time of its
compute alone, W / (p x sum r_t) with p = m / (m + k - 1), and prunes on it. A pruning bound is only
safe when it never exceeds what the estimate that scores the leaves says, so the bounds here are
derived from that estimate itself (the Cell estimator's stage costs through StagePlacer, the same
numbers the leaves are scored with), term by term of its iteration time (cell_types.iteration_time):

    T_iter = sum_i T_i + (B - 1) max_i (T_i - Tcomm_i) + max_i sync_i     (Eq. 9 variant: + exposed sync >= 0)
    T_i    = compute_i + intra_i + inter_i,   T_i - Tcomm_i = compute_i + intra_i

with every term >= 0, and compute_i = sum over the stage's operators of a per-operator time (linear in
the operators: compute.stage_compute_time) + a fixed per-micro-batch overhead h. Let e_t be the least
per-layer compute on type t (at this dp and micro-batch size), n_i >= 1 the layers of stage i
(sum n_i = L), x the least inter-stage transfer between any two of the types. Then, for ANY order and
ANY split of ANY allocation with these stage types,

    sum_i compute_i >= k h + sum_i n_i e_i >= k h + sum_i e_i + (L - k) min_i e_i
    max_i compute_i >= h + max_i n_i e_i >= h + max(L / sum_i (1 / e_i), max_i e_i)
        (n_i e_i <= M for all i gives L = sum n_i <= M sum 1/e_i; n_i >= 1 gives M >= e_i)
    sum_i inter_i   >= (k - 1) x

so T_lb = k h + sum e_i + (L - k) min e + (k - 1) x + (B - 1) (h + max(L / sum 1/e_i, max e_i))
never exceeds the estimate. For a partial plan (some stages' types fixed, r stages left to choose
from types with caps) each sum takes its least possible value over the remaining choices and each
max its least, which keeps it a lower bound. The cost is z T P / 3600 with P = dp x sum of the
stages' prices per hour; the product of two lower bounds of non-negative factors is a lower bound,
and the (B - 1) L / R term is bounded jointly with the price: P / R >= the least price-to-rate ratio
any completion reaches (found exactly by Dinkelbach's iteration over the capped choices).

Capacity: a stage's memory only grows with its operators and with its in-flight micro-batches (>= 1),
so a stage of n layers of type t fits only if some n consecutive layers fit alone with one
micro-batch in flight: u_t = the largest such n bounds the layers a type can hold at any position,
and an allocation whose sum of u over its stages is below L cannot have a fitting plan.
tests/unit/test_cost_tree.py checks these bounds against the estimate, and the tree against the
exhaustive solver. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from tessera.estimator.cells import CellConfig, CellModel, GpuPool, StageCost
from tessera.estimator.stage_placer import StagePlacer

__all__ = ["Bound", "Shape", "build_shape", "microbatches"]


def microbatches(model: CellModel, k: int, config: CellConfig) -> int:
    """The placer's default micro-batch count for k stages (StagePlacer: microbatches_per_stage x k,
    or the largest count under it that divides the global batch)."""
    target = min(config.microbatches_per_stage * k, model.global_batch)
    return max(d for d in range(1, target + 1) if model.global_batch % d == 0)


@dataclass
class Shape:
    """One (dp, k) of the search: the pools, the shared stage-cost memo and the per-type bound terms."""

    dp: int
    k: int
    b: int
    pools: dict[str, GpuPool]
    cache: dict[tuple[GpuPool, int, int, int], StageCost]
    e: dict[str, float]  # least per-layer compute per micro-batch (seconds)
    u: dict[str, int]  # most layers one stage of the type can hold at any position
    x: dict[tuple[str, str], float]  # least inter-stage transfer between two types
    h: float  # per-micro-batch overhead of a stage
    caps: dict[str, int]  # most stages of each type (quota // dp)
    prices: dict[str, float]
    layers: int
    sigma: dict[str, float] = field(default_factory=dict)  # least per-layer gradient sync (seconds)
    overlap_sync: bool = False
    placers: dict[tuple[str, ...], StagePlacer] = field(default_factory=dict)
    work: int = 0  # the stage costs looked up to build it (StagePlacer.steps)

    def placer(self, model: CellModel, types: Sequence[str], config: CellConfig,
               overlap_sync: bool) -> StagePlacer:
        key = tuple(sorted(types))
        sp = self.placers.get(key)
        if sp is None:
            sp = StagePlacer(model, [self.pools[t] for t in key], self.dp, self.b, config=config,
                             overlap_sync=overlap_sync, cache=self.cache)
            self.placers[key] = sp
        return sp


def build_shape(model: CellModel, pools: Mapping[str, GpuPool], prices: Mapping[str, float],
                quotas: Mapping[str, int], dp: int, k: int, b: int, config: CellConfig,
                overlap_sync: bool, check: Callable[[int], None] | None = None) -> Shape:
    """The bound terms of one (dp, k), read off the estimate's own stage costs. `pools` must hold at
    least k x dp GPUs each (the placer's own check; quotas are the search's business). `check` is
    given the work done so far after each look-up of the costliest loop, and may raise to stop."""
    cache: dict[tuple[GpuPool, int, int, int], StageCost] = {}
    names = sorted(pools)
    L = model.num_layers
    probe = StagePlacer(model, [pools[names[0]]] * k, dp, b, config=config, overlap_sync=overlap_sync, cache=cache)
    h = config.prior.microbatch_overhead_s
    # distinct transformer layers (operators 1..L; 0 is the embedding, L + 1 the head)
    distinct: dict[object, int] = {}
    for i in range(1, L + 1):
        distinct.setdefault(replace(probe.ops[i], name=""), i)  # the names number the layers
    alike = len(distinct) == 1
    e: dict[str, float] = {}
    u: dict[str, int] = {}
    sigma: dict[str, float] = {}
    for t in names:
        p = pools[t]
        e[t] = max(0.0, min(probe.stage_cost(p, k - 1, i, i + 1).compute - h for i in distinct.values()))
        # position k - 1 has one micro-batch in flight, the fewest of any position; whether some
        # window of n layers fits only turns false as n grows (memory grows with operators), so
        # the largest n is found by bisection
        def fits(n: int, p: GpuPool = p) -> bool:
            for a in [1] if alike else range(1, L - n + 2):
                if probe.stage_cost(p, k - 1, a, a + n).fits:
                    return True
                if check is not None:
                    check(probe.steps)
            return False
        lo, hi = 0, L - (k - 1)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        u[t] = lo
        sigma[t] = _sync_per_layer(probe, p, k, L - (k - 1)) if alike else 0.0
    x: dict[tuple[str, str], float] = {}
    if k > 1:
        # a boundary after stage 0 sends the output of one of operators 1..L-1
        j = min(range(1, L), key=lambda i: probe.ops[i].out_bytes) if L > 1 else 1
        for a in names:
            for c in names:
                x[(a, c)] = probe.transfer_time(pools[a], pools[c], j + 1)
    caps = {t: quotas[t] // dp for t in names}
    return Shape(dp, k, b, dict(pools), cache, e, u, x, h, caps, {t: prices[t] for t in names}, L, sigma,
                 overlap_sync, work=probe.steps)


def _sync_per_layer(probe: StagePlacer, pool: GpuPool, k: int, most: int) -> float:
    """sigma with sync(n layers) >= n sigma for every n: the per-iteration gradient all-reduce and
    optimizer step of n alike layers is affine in n under the alpha-beta formula (latency + bytes /
    bandwidth; the step is linear), so sigma = min(sync(1), sync(2) - sync(1)). Checked on a third
    point; 0 (no bound) when it is not affine or when a profiled table prices the collective."""
    if most < 3:
        return 0.0
    c1, c2, cn = (probe.stage_cost(pool, k - 1, 1, 1 + n) for n in (1, 2, most))
    if any("profiled" in c.comm_source for c in (c1, c2, cn)):
        return 0.0
    step = c2.sync - c1.sync
    if abs(c1.sync + (most - 1) * step - cn.sync) > 1e-9 * max(cn.sync, 1e-12):
        return 0.0
    return max(0.0, min(c1.sync, step))


@dataclass(frozen=True)
class Bound:
    """Bounds over every allocation below a node: its least time, least cost, and whether its stages
    can hold the model at all (`holds`) and be completed within the caps (`completes`)."""

    time_s: float
    cost: float
    holds: bool
    completes: bool


def _pick(values: Mapping[str, float], caps: Mapping[str, int], types: Sequence[str], r: int,
          largest: bool) -> float | None:
    """The least (or largest) sum of r values drawn from `types` with at most caps[t] of each; None
    when the caps cannot supply r."""
    total, left = 0.0, r
    for t in sorted(types, key=lambda t: (-values[t] if largest else values[t], t)):
        n = min(left, caps[t])
        total += n * values[t]
        left -= n
        if not left:
            return total
    return total if left == 0 else None


def _least_ratio(p0: float, r0: float, prices: Mapping[str, float], rates: Mapping[str, float],
                 caps: Mapping[str, int], types: Sequence[str], r: int) -> float:
    """min over completions (r stages from `types`, caps) of (p0 + sum p) / (r0 + sum rate):
    Dinkelbach's iteration, exact in finitely many steps (each step strictly lowers the ratio)."""
    def best_for(lam: float) -> tuple[float, float]:
        left, ps, rs = r, 0.0, 0.0
        for t in sorted(types, key=lambda t: (prices[t] - lam * rates[t], t)):
            n = min(left, caps[t])
            ps += n * prices[t]
            rs += n * rates[t]
            left -= n
        return ps, rs
    ps, rs = best_for(0.0)
    lam = (p0 + ps) / (r0 + rs)
    for _ in range(64):
        ps, rs = best_for(lam)
        nxt = (p0 + ps) / (r0 + rs)
        if nxt >= lam * (1 - 1e-15):
            break
        lam = nxt
    return lam


def _sync_bound(shape: Shape, fixed: Mapping[str, int], rest: Sequence[str], r: int) -> float:
    """A lower bound of the iteration's once-per-iteration sync term over the completions: with
    sync_i >= n_i sigma_i, max_i sync_i >= max(L / sum 1/sigma_i, max sigma_i) as for compute; under
    Eq. 9 (overlap_sync) only stage 0's sync is surely exposed, >= the least sigma."""
    sig = shape.sigma
    used = [t for t, n in fixed.items() if n > 0]
    cand = used + (list(rest) if r else [])
    if not cand or any(sig.get(t, 0.0) <= 0 for t in cand):
        return 0.0
    if shape.overlap_sync:
        return min(sig[t] for t in cand)
    inv = {t: 1.0 / sig[t] for t in cand}
    inv_hi = sum(n * inv[t] for t, n in fixed.items() if n) + ((_pick(inv, shape.caps, rest, r, largest=True) or 0.0)
                                                              if r else 0.0)
    most = max([sig[t] for t in used] + ([min(sig[t] for t in rest)] if r else []))
    return max(shape.layers / inv_hi, most)


def bound(shape: Shape, fixed: Mapping[str, int], rest: Sequence[str], iterations: int) -> Bound:
    """Bounds for the allocations of `shape` whose stage counts agree with `fixed` and whose
    remaining k - sum(fixed) stages come from `rest` (within caps). See the module doc."""
    k, L, b, h = shape.k, shape.layers, shape.b, shape.h
    s = sum(fixed.values())
    r = k - s
    e, u = shape.e, shape.u
    rest = [t for t in rest if shape.caps[t] > 0]
    used = [t for t, n in fixed.items() if n > 0]
    sum_e_rest = _pick(e, shape.caps, rest, r, largest=False) if r else 0.0
    if sum_e_rest is None:
        return Bound(float("inf"), float("inf"), False, False)
    rates = {t: 1.0 / max(e[t], 1e-300) for t in set(used) | set(rest)}
    cand = used + (rest if r else [])
    min_e = min(e[t] for t in cand)
    max_e = max([e[t] for t in used] + ([min(e[t] for t in rest)] if r else []))
    sum_e = sum(n * e[t] for t, n in fixed.items()) + sum_e_rest
    rate_fixed = sum(n * rates[t] for t, n in fixed.items() if n)
    rate_hi = rate_fixed + ((_pick(rates, shape.caps, rest, r, largest=True) or 0.0) if r else 0.0)
    m_lb = max(L / rate_hi if rate_hi > 0 else 0.0, max_e)
    x = min((shape.x[(a, c)] for a in cand for c in cand), default=0.0) if k > 1 else 0.0
    head = k * h + sum_e + (L - k) * min_e + (k - 1) * x + (b - 1) * h + _sync_bound(shape, fixed, rest, r)
    t_lb = head + (b - 1) * m_lb
    price_fixed = sum(n * shape.prices[t] for t, n in fixed.items())
    price_lb = price_fixed + ((_pick(shape.prices, shape.caps, rest, r, largest=False) or 0.0) if r else 0.0)
    if r:
        ratio = _least_ratio(price_fixed, rate_fixed, shape.prices, rates, shape.caps, rest, r)
    else:
        ratio = price_fixed / rate_fixed if rate_fixed > 0 else 0.0
    per_hour_stage = head * price_lb + (b - 1) * max(m_lb * price_lb, L * ratio)
    cost = iterations * shape.dp * per_hour_stage / 3600.0
    u_hi = sum(n * u[t] for t, n in fixed.items()) + ((_pick({t: float(u[t]) for t in rest}, shape.caps, rest, r,
                                                             largest=True) or 0.0) if r else 0.0)
    return Bound(iterations * t_lb, cost, u_hi >= L, True)
