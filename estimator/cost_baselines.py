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

from tessera.estimator.cells import CellConfig, CellModel
from tessera.estimator.cost_bounds import Shape
from tessera.estimator.cost_placements import hph_placement, whale_placement
from tessera.estimator.cost_tree import CostPlan, GpuOffer, _prepare, _solve

__all__ = ["hph_plus", "sia_plus", "whale_plus"]


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
