"""Stage placements other than Espresso's Alg. 2, for the baselines (cost_baselines.py) and for the
cost tree's `placement="best"` (cost_tree.py): Whale's and HPH's, as Espresso's Sec. V describes them.

- Whale (ATC 2022), "places stages on GPUs in decreasing order of GPU memory capacity and combines
  the model partitioning strategy based on load balancing": layers in proportion to the FP16 rate;
- HPH (CLUSTER 2022), "places stages on GPUs in ascending order of GPU computing capability and
  combines the model partitioning strategy based on integer programming": the split minimising the
  slowest stage, found exactly by dynamic programming.

Each returns the placer's own estimate of its plan (StagePlacer.evaluate). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera.estimator.cells import GpuPool
from tessera.estimator.stage_placer import HeteroPlan, HeteroStage, StagePlacer

__all__ = ["best_placement", "hph_placement", "whale_placement"]


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


def best_placement(sp: StagePlacer) -> HeteroPlan:
    """The best of Alg. 2's, Whale's and HPH's placements of one allocation (fitting first, then the
    shortest iteration): the cost tree's `placement="best"`."""
    return min((sp.place(), whale_placement(sp), hph_placement(sp)), key=lambda h: (not h.fits, h.iter_time))
