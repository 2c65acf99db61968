"""The stage partition's fast search (estimator/partition.py: a bisection for the least bottleneck,
a band of reachable states and a window of cuts in the dynamic programme) against the plain
O(k n^2) programme it replaced, written out here as the specification: the same bounds on every
chain, ties included (equal FLOPs, equal boundary bytes, zero-FLOP operators)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.estimator.partition import _cuts, _min_bottleneck


def plain_min_bottleneck(flops: list[float], k: int) -> float:
    n = len(flops)
    pre = [0.0]
    for f in flops:
        pre.append(pre[-1] + f)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for s in range(1, k + 1):
        for j in range(s, n + 1):
            best[s][j] = min(max(best[s - 1][i], pre[j] - pre[i]) for i in range(s - 1, j))
    return best[k][n]


def plain_bounds(flops: list[float], out: list[float], k: int, tol: float) -> tuple[tuple[int, int], ...]:
    """Fewest boundary bytes among the cuts within (1 + tol) of the least bottleneck; ties to the
    smaller largest stage, then the earliest cut (the first i of an ascending scan)."""
    n = len(flops)
    limit = plain_min_bottleneck(flops, k) * (1 + tol) * (1 + 1e-12)
    pre = [0.0]
    for f in flops:
        pre.append(pre[-1] + f)
    inf = (float("inf"), float("inf"))
    cost = [[inf] * (n + 1) for _ in range(k + 1)]
    back = [[-1] * (n + 1) for _ in range(k + 1)]
    cost[0][0] = (0.0, 0.0)
    for s in range(1, k + 1):
        for j in range(s, n + 1):
            for i in range(s - 1, j):
                seg = pre[j] - pre[i]
                if cost[s - 1][i] == inf or seg > limit:
                    continue
                cand = (cost[s - 1][i][0] + (out[i - 1] if i > 0 else 0.0), max(cost[s - 1][i][1], seg))
                if cand < cost[s][j]:
                    cost[s][j], back[s][j] = cand, i
    bounds = []
    j = n
    for s in range(k, 0, -1):
        bounds.append((back[s][j], j))
        j = back[s][j]
    return tuple(reversed(bounds))


flop = st.one_of(st.integers(0, 4).map(float), st.sampled_from([0.1, 1.0, 5.0, 1e6]),
                 st.floats(0, 1e9, allow_nan=False, allow_infinity=False))
chains = st.lists(st.tuples(flop, st.sampled_from([1.0, 2.0, 2.0, 0.5])), min_size=1, max_size=40)


@settings(max_examples=400, deadline=None)
@given(chains, st.integers(1, 40), st.sampled_from([0.0, 0.1, 0.34, 1.0]))
def test_fast_partition_equals_the_plain_programme(chain: list[tuple[float, float]], k: int, tol: float) -> None:
    flops = [f for f, _ in chain]
    if sum(flops) <= 0:
        flops[0] = 1.0
    out = [b for _, b in chain]
    k = min(k, len(flops))
    assert _min_bottleneck(flops, k) == plain_min_bottleneck(flops, k)
    assert _cuts(tuple(flops), tuple(out), k, tol) == plain_bounds(flops, out, k, tol)
