"""ClusterState.place: the gang placement rule, checked against its plain statement on random layouts.

Without NVLink islands, place() answers from the pool's free-count histogram and buckets; the rule
it must follow is the one written out in `by_rule`: fewest nodes first (the largest per-node share
that divides n), then, among groups with that many GPUs free, fewest free first (best fit) or most
free first (scatter), ties in snapshot order.
"""

from __future__ import annotations

import random

import pytest

from tessera.controller.core.placement import BEST_FIT, SCATTER, ClusterState, Group, quotas
from tessera.controller.core.snapshot import Slice


def layout(rng: random.Random, nodes: int, cap: int) -> ClusterState:
    groups = [Group(i, f"n{i:02d}", "A100", i, cap, sorted(rng.sample(range(cap), rng.randint(0, cap))))
              for i in range(nodes)]
    return ClusterState(groups)


def by_rule(state: ClusterState, n: int, prefer: str, nodes: int = 0) -> tuple[Slice, ...] | None:
    pool = state.pools["A100"]
    for q in quotas(n, pool.max_cap):
        k = n // q
        if nodes and k != nodes:
            continue
        elig = [g for g in pool.groups if len(g.free) >= q]
        if len(elig) < k:
            continue
        sign = -1 if prefer == SCATTER else 1
        elig.sort(key=lambda g: (sign * len(g.free), g.order))
        return tuple(Slice(g.node_id, tuple(g.free[:q])) for g in elig[:k])
    return None


@pytest.mark.parametrize("prefer", [BEST_FIT, SCATTER])
def test_place_follows_the_rule_on_random_layouts(prefer: str) -> None:
    rng = random.Random(7)
    for _ in range(300):
        state = layout(rng, rng.randint(1, 12), rng.choice([2, 4, 8]))
        for n in (1, 2, 3, 4, 6, 8, 12, 16, 24):
            nodes = rng.choice([0, 0, 1, 2, 4])
            assert state.place("A100", n, prefer=prefer, nodes=nodes) == by_rule(state, n, prefer, nodes)


def test_place_after_take_and_release_uses_the_current_free_counts() -> None:
    state = ClusterState([Group(0, "a", "A100", 0, 4, [0, 1, 2, 3]), Group(1, "b", "A100", 1, 4, [0, 1])])
    assert state.place("A100", 2) == (Slice("b", (0, 1)),)  # best fit: the node with 2 free
    state.take((Slice("b", (0, 1)),), "A100")
    assert state.place("A100", 2) == (Slice("a", (0, 1)),)
    assert state.place("A100", 8) is None
    state.release((Slice("b", (0, 1)),), "A100")
    assert state.place("A100", 6) is None  # 4 + 2 free, but no share of 6 splits evenly over them
    assert state.place("A100", 4, prefer=SCATTER) == (Slice("a", (0, 1, 2, 3)),)
