"""The baselines of Espresso's evaluation (Sec. V-A), on the cost tree's search space and estimate.

Espresso ("Cost-Efficient Large Model Training by Exploiting GPU Heterogeneity in the Cloud", IEEE
INFOCOM 2025) compares its allocator with:

- Sia+: "selects 2^n (n in N) GPUs of the same type in heterogeneous environments" (Sia, SOSP 2023):
  the cheapest allocation of one type whose GPU count is a power of two, placed by Alg. 2 (one type:
  the order is moot, Alg. 2 only splits the layers);
- Whale+: "places stages on GPUs in decreasing order of GPU memory capacity and combines the model
  partitioning strategy based on load balancing" (Whale, ATC 2022): layers in proportion to each
  stage's FP16 rate;
- HPH+: "places stages on GPUs in ascending order of GPU computing capability and combines the model
  partitioning strategy based on integer programming" (HPH, CLUSTER 2022): the split that minimises
  the slowest stage (its compute and the transfer from the stage before), found exactly by dynamic
  programming over the stages and layer counts (what the integer program optimises), then scored.

"We integrate our GPU provisioning strategy with Whale+ and HPH+": both run the cost tree
(cost_tree.py) with their placement at the leaves instead of Alg. 2. Every answer is scored by the
same estimate (StagePlacer.evaluate), so the comparison measures allocation and placement, not the
estimate. The tree's bounds hold for any order and split, so each search is exact for its placement.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tessera.estimator.cells import CellConfig, CellModel, GpuPool
from tessera.estimator.cost_bounds import Shape
from tessera.estimator.cost_tree import CostPlan, GpuOffer, _prepare, _solve
from tessera.estimator.stage_placer import HeteroPlan, HeteroStage, StagePlacer

__all__ = ["hph_placement", "hph_plus", "sia_plus", "whale_placement", "whale_plus"]


def whale_placement(sp: StagePlacer) -> HeteroPlan:
    """Whale+: decreasing memory (ties: the faster first), layers in proportion to the FP16 rate."""
    order = sorted(sp.pools, key=lambda p: (-p.gpu_type.memory_gb, -p.gpu_type.tflops_fp16, p.gpu))
    layers = _proportional(order, sp.model.num_layers)
    return sp.evaluate([HeteroStage(p, n) for p, n in zip(order, layers, strict=True)])


def hph_placement(sp: StagePlacer) -> HeteroPlan:
    """HPH+: increasing FP16 rate; the split minimising (slowest stage, then the sum of the stages),
    each stage's time its busy time plus the transfer from the stage before, stages that do not fit
    excluded. Exact over the splits by dynamic programming; the layers are alike, as Alg. 2 takes them
    (StagePlacer._range), and the chosen split is scored exactly by `evaluate`."""
    order = sorted(sp.pools, key=lambda p: (p.gpu_type.tflops_fp16, p.gpu))
    k, total = len(order), sp.model.num_layers
    inf = (float("inf"), float("inf"))

    def stage(i: int, n: int) -> tuple[float, bool]:
        start, end = sp._range(i, n)  # the placer's own reading of alike layers
        c = sp.stage_cost(order[i], i, start, end)
        return c.busy + hop[i], c.fits

    hop = [0.0] + [sp.transfer_time(order[i - 1], order[i], 1) for i in range(1, k)]
    table = {(i, n): stage(i, n) for i in range(k) for n in range(1, total - (k - 1) + 1)}

    # best[i][a]: (max, sum) over stages 0..i holding the first a layers; choice[i][a]: stage i's layers
    best = [[inf] * (total + 1) for _ in range(k)]
    choice = [[0] * (total + 1) for _ in range(k)]
    for a in range(1, total - (k - 1) + 1):
        t, ok = table[(0, a)]
        if ok:
            best[0][a], choice[0][a] = (t, t), a
    for i in range(1, k):
        for a in range(i + 1, total - (k - 1 - i) + 1):
            for n in range(1, a - i + 1):
                prev = best[i - 1][a - n]
                if prev == inf:
                    continue
                t, ok = table[(i, n)]
                if ok:
                    cand = (max(prev[0], t), prev[1] + t)
                    if cand < best[i][a]:
                        best[i][a], choice[i][a] = cand, n
    if best[k - 1][total] == inf:  # no split fits: Whale's proportions, scored (and marked) as they are
        layers = _proportional(order, total)
    else:
        layers, a = [], total
        for i in range(k - 1, -1, -1):
            layers.append(choice[i][a])
            a -= choice[i][a]
        layers.reverse()
    return sp.evaluate([HeteroStage(p, n) for p, n in zip(order, layers, strict=True)])


def _proportional(order: Sequence[GpuPool], total: int) -> list[int]:
    """Whale's load balance: layers in proportion to the FP16 rate, at least 1 each."""
    rate = sum(p.gpu_type.tflops_fp16 for p in order)
    layers = [max(1, round(total * p.gpu_type.tflops_fp16 / rate)) for p in order]
    while sum(layers) > total:
        layers[max(range(len(layers)), key=lambda i: layers[i])] -= 1
    while sum(layers) < total:
        layers[min(range(len(layers)), key=lambda i: layers[i])] += 1
    return layers


def _pow2_one_type(shape: Shape, alloc: Mapping[str, int]) -> bool:
    gpus = shape.dp * shape.k
    return len(alloc) == 1 and gpus & (gpus - 1) == 0


def sia_plus(model: CellModel, offers: Sequence[GpuOffer], iterations: int, slo_s: float, *,
             config: CellConfig | None = None, max_stages: int = 8, cluster: Mapping[str, int] | None = None,
             overlap_sync: bool = False) -> CostPlan:
    """Sia+: the cheapest single-type allocation of 2^n GPUs meeting the SLO (NoFeasiblePlan: none)."""
    p = _prepare(model, offers, iterations, slo_s, config, max_stages, cluster, overlap_sync)
    return _solve(p, None, _pow2_one_type)


def whale_plus(model: CellModel, offers: Sequence[GpuOffer], iterations: int, slo_s: float, *,
               config: CellConfig | None = None, max_stages: int = 8, cluster: Mapping[str, int] | None = None,
               overlap_sync: bool = False) -> CostPlan:
    """Whale+: the cost tree with Whale's placement at the leaves."""
    p = _prepare(model, offers, iterations, slo_s, config, max_stages, cluster, overlap_sync)
    return _solve(p, whale_placement)


def hph_plus(model: CellModel, offers: Sequence[GpuOffer], iterations: int, slo_s: float, *,
             config: CellConfig | None = None, max_stages: int = 8, cluster: Mapping[str, int] | None = None,
             overlap_sync: bool = False) -> CostPlan:
    """HPH+: the cost tree with HPH's placement at the leaves."""
    p = _prepare(model, offers, iterations, slo_s, config, max_stages, cluster, overlap_sync)
    return _solve(p, hph_placement)
