"""Stage partition by FLOPs and inter-operator communication (Crius Sec. 4.2, Figure 7).

Crius: "A Codesign of Scheduling and Parallelization for Large Model Training in Heterogeneous
Clusters", arXiv 2024 (arXiv:2403.16125; docs/reference/papers.md).

A model is a chain of operators (embedding, transformer layers, head). For a Cell with `num_gpus` GPUs
and `num_stages` pipeline stages:

1. every operator is mapped to a fractional GPU share proportional to its FLOPs
   (`share_i = num_gpus * flops_i / total_flops`), so that, in theory, every operator takes the same
   time (`T = FLOPs / GPUs`);
2. the chain is cut into `num_stages` contiguous stages whose compute stays similar: first the
   smallest achievable bottleneck (the largest stage FLOPs) is found, then, among the cuts whose
   bottleneck is within `balance_tolerance` of it, the cut points whose inter-operator communication
   (bytes crossing the boundary) is smallest are chosen;
3. the shares of each stage's operators are accumulated into its GPU count, rounded to powers of two
   that add up to `num_gpus` (the paper: "the number of GPUs accumulated for each stage approximates a
   power of 2").

Pure: no I/O, deterministic.
"""

from __future__ import annotations

import math
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tessera.common.errors import InvalidArgument

# Operator kinds that are convolutions (estimator/convnets.py); the head's dense layer is not one.
CONV_KINDS = frozenset({"stem", "bottleneck"})


@dataclass(frozen=True)
class LayerShape:
    """What a profiler needs to rebuild an operator on one device (tessera.estimator.compute)."""

    kind: str  # "embedding" | "transformer" | "moe" | "head" | "stem" | "bottleneck" | "pool_head"
    hidden: int  # transformers: hidden size; convnets: input channels (stem: its output channels)
    heads: int = 1
    ffn: int = 0
    seq: int = 1
    vocab: int = 0
    experts: int = 0
    top_k: int = 0
    recompute: bool = False
    stride: int = 1  # convnets: the block's stride (heads = width factor, ffn = filters, seq = input side)


@dataclass(frozen=True)
class Operator:
    """One operator of the model chain, with per-sample (one sequence) costs.

    - `flops`: training FLOPs per sample that run as matrix multiplies (forward + backward, plus the
      recomputed forward when activation recomputation is on);
    - `traffic_bytes`: memory-bound bytes per sample on one GPU (elementwise ops, softmax, norms),
      split into `traffic_bytes` (replicated under TP) and `traffic_sharded_bytes` (divided by TP);
    - `params` / `expert_params`: parameter counts; expert parameters are sharded across DP ranks
      (GShard expert parallelism) when the operator's stage is data parallel;
    - `out_bytes`: bytes per sample of the activation handed to the next operator (the inter-operator
      communication of Sec. 4.2; a pipeline boundary sends this forward and its gradient backward);
    - `tp_comm_bytes`: bytes per sample all-reduced over the TP group per training step (Megatron: 2
      forward + 2 backward all-reduces per layer, 2 more under recomputation);
    - `a2a_bytes`: bytes per sample exchanged by all-to-all per training step when experts are
      sharded across DP ranks (dispatch + combine, forward, backward and recomputation);
    - `stored_bytes`: activation bytes per sample kept for the backward pass (the operator's input
      only under recomputation, else its full activations); not divided by TP;
    - `comm_calls`: collective calls per training step behind `tp_comm_bytes` / `a2a_bytes` (for the
      per-message latency terms);
    - `shape`: what a profiler needs to rebuild the operator (tessera.estimator.compute);
    - `linear_flops`: the part of `flops` in weight GEMMs (linear layers, the logits): what Float8
      linears speed up and what LoRA's frozen base skips the weight gradient of (0 = not split);
    - `frozen_params`: the part of `params` that trains no gradient and keeps no optimizer state
      (LoRA's frozen base: estimator/cell_recipe.py), held at the model's `frozen_bytes` per parameter.

    `traffic_bytes + traffic_sharded_bytes` is also the operator's transient activation footprint per
    sample (Korthikanti et al.'s count), which the memory check uses.
    """

    name: str
    flops: float
    params: float = 0.0
    expert_params: float = 0.0
    out_bytes: float = 0.0
    traffic_bytes: float = 0.0
    traffic_sharded_bytes: float = 0.0
    tp_comm_bytes: float = 0.0
    a2a_bytes: float = 0.0
    stored_bytes: float = 0.0
    comm_calls: int = 0
    shape: LayerShape | None = None
    linear_flops: float = 0.0
    frozen_params: float = 0.0


@dataclass(frozen=True)
class StagePartition:
    """The result: operator index ranges [start, end) per stage and GPUs per stage."""

    bounds: tuple[tuple[int, int], ...]
    gpus: tuple[int, ...]
    stage_flops: tuple[float, ...]
    gpu_shares: tuple[float, ...]  # fractional GPUs per operator (Fig. 7 step 1)
    cut_bytes: tuple[float, ...]  # bytes crossing each of the num_stages-1 boundaries (per sample)

    @property
    def num_stages(self) -> int:
        return len(self.bounds)


class PartitionError(InvalidArgument, ValueError):
    """Raised for inputs that admit no partition; `field` names the offending field."""


def gpu_shares(ops: Sequence[Operator], num_gpus: int) -> tuple[float, ...]:
    """Fig. 7 step 1: fractional GPUs per operator, proportional to its FLOPs."""
    total = sum(o.flops for o in ops)
    if total <= 0:
        raise PartitionError("ops", "total flops must be > 0")
    return tuple(num_gpus * o.flops / total for o in ops)


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def power_of_two_split(shares: Sequence[float], total: int) -> tuple[int, ...] | None:
    """Round fractional shares to powers of two that sum to `total`, or None when impossible.

    Starts from the largest power of two not above each share (at least 1) and, while the sum is short,
    doubles the stage whose share is furthest above its count; while the sum is over, halves the stage
    furthest below its share. Equal shares of a power-of-two total give equal counts.
    """
    n = len(shares)
    if n == 0 or n > total:
        return None
    counts = []
    for s in shares:
        c = 1
        while c * 2 <= s + 1e-9:
            c *= 2
        counts.append(c)
    for _ in range(4 * total):
        cur = sum(counts)
        if cur == total:
            return tuple(counts)
        if cur < total:
            room = [i for i in range(n) if cur + counts[i] <= total]
            if not room:
                return None
            i = max(room, key=lambda k: (shares[k] / counts[k], -k))
            counts[i] *= 2
        else:
            big = [i for i in range(n) if counts[i] > 1]
            if not big:
                return None
            i = min(big, key=lambda k: (shares[k] / counts[k], k))
            counts[i] //= 2
    return tuple(counts) if sum(counts) == total else None


def _prefix(flops: Sequence[float]) -> list[float]:
    pre = [0.0]
    for f in flops:
        pre.append(pre[-1] + f)
    return pre


def _fits(pre: Sequence[float], k: int, b: float) -> bool:
    """Whether the chain cuts into at most k contiguous parts of at most `b` FLOPs each (greedy: a
    part grows while it fits, exact because a part's FLOPs only grow with its end)."""
    parts, start = 1, 0
    for j in range(1, len(pre)):
        if pre[j] - pre[start] > b:
            start = j - 1
            parts += 1
            if parts > k or pre[j] - pre[start] > b:
                return False
    return True


def _min_bottleneck(flops: Sequence[float], k: int) -> float:
    """Smallest achievable max-stage FLOPs when cutting the chain into k contiguous non-empty parts
    (k <= len(flops)). The answer is one stage's `pre[j] - pre[i]`, and `_fits` is monotone in the
    bound, so a bisection over the ordered bit patterns of the non-negative floats finds exactly the
    value the O(k n^2) dynamic programme would, in O(64 n)."""
    pre = _prefix(flops)
    if _fits(pre, k, 0.0):
        return 0.0
    lo, hi = 0, _bits(pre[-1])  # _fits(pre, k, total) holds: one part
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fits(pre, k, _float(mid)):
            hi = mid
        else:
            lo = mid
    return _float(hi)


def _bits(x: float) -> int:
    return int.from_bytes(struct.pack(">d", x), "big")


def _float(bits: int) -> float:
    return float(struct.unpack(">d", bits.to_bytes(8, "big"))[0])


def clear_cache() -> None:
    """Drop the memoised stage bounds (`_cuts`): a cold measurement starts from nothing."""
    _cuts.cache_clear()


# States of one DP row computed at once: bounds the band's memory (rows x the widest window).
_ROWS = 256


@lru_cache(maxsize=512)
def _cuts(flops: tuple[float, ...], out_bytes: tuple[float, ...], k: int,
          tolerance: float) -> tuple[tuple[int, int], ...]:
    """The stage bounds of `partition_stages` (its step 2), memoised: they do not depend on the GPUs,
    and a Cell search asks for every stage count at several GPU counts."""
    n = len(flops)
    limit = _min_bottleneck(flops, k) * (1 + tolerance) * (1 + 1e-12)
    pre = _prefix(flops)
    # lo[j]: the first i whose stage ops[i:j] is within the limit (a stage's FLOPs fall as i grows)
    lo = [0] * (n + 1)
    i = 0
    for j in range(1, n + 1):
        while pre[j] - pre[i] > limit:
            i += 1
        lo[j] = i
    # DP: cost[s][j] = (boundary bytes, max stage flops) of the best way to cut ops[:j] into s
    # stages, the earliest i of the last cut on ties. Row s needs only the j that s stages within
    # the limit can reach and k - s more can finish (with a margin far above the rounding of the
    # prefix sums): a state outside is never on the chosen path, so leaving it out changes nothing
    # but the time. Each row is computed over its band at once (numpy: the same IEEE sums and
    # maxima as scalar code, so the same choices).
    pre_a = np.array(pre)
    lo_a = np.array(lo)
    cut = np.array((0.0,) + tuple(out_bytes[:-1]))  # cut[i]: the bytes of a boundary before ops[i]
    cost_b = np.full(n + 1, np.inf)
    cost_m = np.full(n + 1, np.inf)
    cost_b[0] = cost_m[0] = 0.0
    back = np.full((k + 1, n + 1), -1, dtype=np.int64)
    reach = limit * (1 + 1e-9)
    for s in range(1, k + 1):
        row_b = np.full(n + 1, np.inf)
        row_m = np.full(n + 1, np.inf)
        first = max(s, bisect_left(pre, pre[n] - (k - s) * reach))
        last = min(n - (k - s), bisect_right(pre, s * reach) - 1)
        for j0 in range(first, last + 1, _ROWS):
            js = np.arange(j0, min(last, j0 + _ROWS - 1) + 1)
            a = np.maximum(s - 1, lo_a[js])
            width = int((js - a).max(initial=0))
            if width <= 0:
                continue
            ii = a[:, None] + np.arange(width)[None, :]
            valid = ii < js[:, None]
            ii = np.where(valid, ii, 0)
            b_ = np.where(valid, cost_b[ii] + cut[ii], np.inf)
            b_min = b_.min(axis=1)
            m_ = np.where(valid & (b_ == b_min[:, None]), np.maximum(cost_m[ii], pre_a[js][:, None] - pre_a[ii]),
                          np.inf)
            m_min = m_.min(axis=1)
            col = np.argmax(m_ == m_min[:, None], axis=1)
            ok = np.isfinite(b_min)
            row_b[js[ok]] = b_min[ok]
            row_m[js[ok]] = m_min[ok]
            back[s, js[ok]] = ii[ok, col[ok]]
        cost_b, cost_m = row_b, row_m
    if not math.isfinite(cost_b[n]):  # cannot happen with a consistent limit; kept as a guard
        raise PartitionError("ops", "no balanced partition found")
    bounds: list[tuple[int, int]] = []
    j = n
    for s in range(k, 0, -1):
        i = int(back[s, j])
        bounds.append((i, j))
        j = i
    bounds.reverse()
    return tuple(bounds)


def partition_stages(
    ops: Sequence[Operator],
    num_gpus: int,
    num_stages: int,
    balance_tolerance: float = 0.1,
) -> StagePartition:
    """Cut `ops` into `num_stages` contiguous stages and give each a power-of-two GPU count.

    Among all cuts whose largest stage has at most (1 + balance_tolerance) times the smallest possible
    largest-stage FLOPs, the one whose boundaries carry the fewest bytes (`out_bytes` of the operator
    before each cut) wins; ties go to the most balanced, then the earliest cuts. Raises PartitionError
    naming the field when `num_stages` exceeds the operators or the GPUs, or when no power-of-two GPU
    split exists.
    """
    if num_gpus < 1:
        raise PartitionError("num_gpus", f"must be >= 1, got {num_gpus}")
    if num_stages < 1:
        raise PartitionError("num_stages", f"must be >= 1, got {num_stages}")
    if num_stages > len(ops):
        raise PartitionError("num_stages", f"{num_stages} stages but only {len(ops)} operators")
    if num_stages > num_gpus:
        raise PartitionError("num_stages", f"{num_stages} stages but only {num_gpus} GPUs")
    if balance_tolerance < 0:
        raise PartitionError("balance_tolerance", "must be >= 0")
    for o in ops:
        if o.flops < 0:
            raise PartitionError(f"ops[{o.name}].flops", "must be >= 0")
    shares = gpu_shares(ops, num_gpus)
    bounds = _cuts(tuple(o.flops for o in ops), tuple(o.out_bytes for o in ops), num_stages, balance_tolerance)
    pre = _prefix([o.flops for o in ops])
    stage_flops = tuple(pre[b] - pre[a] for a, b in bounds)
    stage_shares = [sum(shares[a:b]) for a, b in bounds]
    if num_gpus % num_stages == 0 and _is_pow2(num_gpus // num_stages):
        # the common case (power-of-two Cells): equal GPUs per stage, as Alpa's submeshes
        gpus: tuple[int, ...] | None = tuple([num_gpus // num_stages] * num_stages)
    else:
        gpus = power_of_two_split(stage_shares, num_gpus)
    if gpus is None:
        raise PartitionError(
            "num_gpus", f"{num_gpus} GPUs cannot be split into {num_stages} power-of-two stage groups"
        )
    cut_bytes = tuple(ops[a - 1].out_bytes for a, _ in bounds[1:])
    return StagePartition(tuple(bounds), gpus, stage_flops, shares, cut_bytes)
