"""Placement of whole gangs on the free GPUs of a round, and a cheap virtual view for policy search.

Rules (docs/scheduler.md, "Placement"):
- a gang is placed whole or not at all, on GPUs of one type (a node holding two GPU models counts as
  two groups, one per model);
- fewest nodes first: the gang is split evenly, q GPUs on each of n/q nodes, trying the largest
  per-node share q first (q divides n, q <= the largest group, q a multiple of the TP degree);
- best fit: among the groups with at least q free GPUs, those with the fewest free GPUs first, then
  the group order of the snapshot (node order, then model); the "scatter" preference (the Crius
  artifact's baselines) takes the groups with the most free GPUs first instead;
- a TP group (tp consecutive ranks) never leaves one NVLink island of a node when islands are known.

`ClusterState` is the mutable working copy of one round (GPU indices). `Trial` is a virtual overlay
that tracks free *counts* only, so a policy can try thousands of what-ifs without copying the
cluster; applying a chosen what-if to the `ClusterState` uses the same choice rules and lands on the
same groups.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tessera.controller.core.snapshot import NodeView, Slice, Snapshot

BEST_FIT = "best-fit"
SCATTER = "scatter"


_QUOTAS: dict[tuple[int, int, int], list[int]] = {}


def quotas(n: int, max_per_node: int, tp: int = 1) -> list[int]:
    """Per-node shares to try for a gang of n GPUs, fewest nodes first."""
    k = (n, max_per_node, tp)
    got = _QUOTAS.get(k)
    if got is None:
        got = [q for q in range(min(n, max_per_node), 0, -1) if n % q == 0 and q % tp == 0]
        if len(_QUOTAS) < 100_000:
            _QUOTAS[k] = got
    return got


@dataclass
class Group:
    """The GPUs of one model on one node."""

    gid: int
    node_id: str
    gpu_type: str
    order: int
    capacity: int
    free: list[int]
    islands: dict[int, int] = field(default_factory=dict)

    def tp_room(self, tp: int) -> int:
        """GPUs usable by whole TP groups of size tp, each inside one NVLink island."""
        if tp <= 1 or not self.islands:
            return len(self.free)
        per: dict[int, int] = {}
        for g in self.free:
            isl = self.islands.get(g, -1)
            per[isl] = per.get(isl, 0) + 1
        if -1 in per:  # unknown island for some GPU: treat the node as one island
            return len(self.free) // tp * tp
        return sum(c // tp * tp for c in per.values())

    def pick(self, q: int, tp: int) -> list[int]:
        """q free GPU indices: the lowest indices, or whole TP groups per island when tp > 1."""
        if tp <= 1 or not self.islands:
            return self.free[:q]
        per: dict[int, list[int]] = {}
        for g in self.free:
            per.setdefault(self.islands.get(g, -1), []).append(g)
        out: list[int] = []
        # Best fit inside the node too: islands with the fewest free GPUs that hold a TP group first.
        for isl in sorted(per, key=lambda i: (len(per[i]), i)):
            gs = per[isl]
            take = min(len(gs) // tp * tp, q - len(out))
            out.extend(gs[:take])
            if len(out) == q:
                break
        return sorted(out)


class Pool:
    """Free GPUs of one type, with a histogram of free counts per group."""

    def __init__(self, gpu_type: str, groups: list[Group]) -> None:
        self.gpu_type = gpu_type
        self.groups = groups
        self.max_cap = max((g.capacity for g in groups), default=0)
        self.total = sum(g.capacity for g in groups)
        self.hist = [0] * (self.max_cap + 1)
        for g in groups:
            self.hist[len(g.free)] += 1
        self._buckets: list[list[Group]] | None = None
        # Without NVLink islands a group's room for any TP size is its free count, so the
        # histogram and buckets answer placement without looking at every group.
        self.has_islands = any(g.islands for g in groups)

    @property
    def free_gpus(self) -> int:
        return sum(f * c for f, c in enumerate(self.hist))

    def buckets(self) -> list[list[Group]]:
        """Groups by free count (index), each in snapshot order; rebuilt after a change."""
        if self._buckets is None:
            b: list[list[Group]] = [[] for _ in range(self.max_cap + 1)]
            for g in self.groups:
                b[len(g.free)].append(g)
            self._buckets = b
        return self._buckets

    def _moved(self, g: Group, before: int) -> None:
        self.hist[before] -= 1
        self.hist[len(g.free)] += 1
        self._buckets = None


def fits_hist(hist: Sequence[int], n: int, max_cap: int, tp: int = 1) -> int:
    """Fewest nodes a gang of n GPUs needs given a histogram of free counts; 0 if it does not fit."""
    if n <= 0 or max_cap <= 0:
        return 0
    for q in quotas(n, max_cap, tp):
        if sum(hist[q:]) >= n // q:
            return n // q
    return 0


def _first(buckets: list[list[Group]], q: int, k: int, prefer: str) -> list[Group]:
    """The k groups with at least q free GPUs that the sort in ClusterState.place would put
    first: fewest free (best fit) or most free (scatter), then snapshot order."""
    counts = range(len(buckets) - 1, q - 1, -1) if prefer == SCATTER else range(q, len(buckets))
    out: list[Group] = []
    for f in counts:
        out.extend(buckets[f][: k - len(out)])
        if len(out) == k:
            break
    return out


class ClusterState:
    """The GPUs of a round: which are free, grouped by type, node and model."""

    def __init__(self, groups: list[Group]) -> None:
        self.groups = groups
        by_type: dict[str, list[Group]] = {}
        for g in groups:
            by_type.setdefault(g.gpu_type, []).append(g)
        self.pools = {t: Pool(t, gs) for t, gs in sorted(by_type.items())}
        self._by_node_type = {(g.node_id, g.gpu_type): g for g in groups}

    @staticmethod
    def from_nodes(nodes: Iterable[NodeView], release: Iterable[Slice] = ()) -> ClusterState:
        """Free GPUs are the idle ones plus `release` (the GPUs of running jobs a policy may move)."""
        extra: dict[str, set[int]] = {}
        for s in release:
            extra.setdefault(s.node_id, set()).update(s.gpu_indices)
        groups: list[Group] = []
        for node in nodes:
            mine = extra.get(node.id)
            for model, cap, idle, isl in node.by_model:
                free = list(idle)
                if mine:
                    free = sorted(set(free) | {i for i in mine if node.models.get(i) == model})
                groups.append(Group(len(groups), node.id, model, len(groups), cap, free, isl))
        return ClusterState(groups)

    @staticmethod
    def from_snapshot(snap: Snapshot) -> ClusterState:
        return ClusterState.from_nodes(snap.nodes, (s for r in snap.running for s in r.slices))

    def types(self) -> list[str]:
        return list(self.pools)

    def group(self, node_id: str, gpu_type: str) -> Group:
        return self._by_node_type[(node_id, gpu_type)]

    def fits(self, gpu_type: str, n: int, tp: int = 1) -> int:
        """Fewest nodes a gang of n GPUs of this type needs on the free GPUs now; 0 if none."""
        pool = self.pools.get(gpu_type)
        if pool is None:
            return 0
        if tp <= 1 or not pool.has_islands:
            return fits_hist(pool.hist, n, pool.max_cap)
        return len(self.place(gpu_type, n, tp) or ())

    def place(self, gpu_type: str, n: int, tp: int = 1, prefer: str = BEST_FIT,
              nodes: int = 0) -> tuple[Slice, ...] | None:
        """Slices for a gang of n GPUs of one type (not taken yet); None if it does not fit whole.
        `nodes` > 0 asks for exactly that many nodes."""
        pool = self.pools.get(gpu_type)
        if pool is None or n <= 0:
            return None
        by_count = tp <= 1 or not pool.has_islands
        for q in quotas(n, pool.max_cap, tp):
            k = n // q
            if nodes and k != nodes:
                continue
            if by_count:
                if sum(pool.hist[q:]) < k:
                    continue
                return tuple(Slice(g.node_id, tuple(g.pick(q, tp))) for g in _first(pool.buckets(), q, k, prefer))
            elig = [g for g in pool.groups if g.tp_room(tp) >= q]
            if len(elig) < k:
                continue
            if prefer == SCATTER:
                elig.sort(key=lambda g: (-len(g.free), g.order))
            else:
                elig.sort(key=lambda g: (len(g.free), g.order))
            return tuple(Slice(g.node_id, tuple(g.pick(q, tp))) for g in elig[:k])
        return None

    def take(self, slices: Sequence[Slice], gpu_type: str) -> None:
        """Mark the slices' GPUs used; ValueError (and nothing changed) if any is not free."""
        pool = self.pools[gpu_type]
        for s in slices:
            g = self._by_node_type.get((s.node_id, gpu_type))
            if g is None or not set(s.gpu_indices) <= set(g.free):
                raise ValueError(f"GPUs {list(s.gpu_indices)} of {s.node_id} ({gpu_type}) are not free")
        for s in slices:
            g = self._by_node_type[(s.node_id, gpu_type)]
            before = len(g.free)
            want = set(s.gpu_indices)
            g.free = [i for i in g.free if i not in want]
            pool._moved(g, before)

    def release(self, slices: Sequence[Slice], gpu_type: str) -> None:
        pool = self.pools[gpu_type]
        for s in slices:
            g = self._by_node_type[(s.node_id, gpu_type)]
            before = len(g.free)
            if set(s.gpu_indices) & set(g.free):
                raise ValueError(f"GPUs of {s.node_id} released twice")
            g.free = sorted(g.free + list(s.gpu_indices))
            pool._moved(g, before)

    def free_gpus(self, gpu_type: str) -> int:
        pool = self.pools.get(gpu_type)
        return pool.free_gpus if pool else 0


class Trial:
    """A virtual change set over a ClusterState that tracks free counts only (tp = 1 semantics).

    `take` chooses groups exactly as `ClusterState.place` would with the same free counts, so a
    what-if found here can be applied for real afterwards."""

    __slots__ = ("base", "hists", "over")

    def __init__(self, base: ClusterState) -> None:
        self.base = base
        self.over: dict[int, int] = {}
        self.hists: dict[str, list[int]] = {}

    def copy(self) -> Trial:
        t = Trial(self.base)
        t.over = dict(self.over)
        t.hists = {k: list(v) for k, v in self.hists.items()}
        return t

    def free_of(self, g: Group) -> int:
        return self.over.get(g.gid, len(g.free))

    def _hist(self, gpu_type: str) -> list[int]:
        h = self.hists.get(gpu_type)
        if h is None:
            h = list(self.base.pools[gpu_type].hist)
            self.hists[gpu_type] = h
        return h

    def _set(self, g: Group, new: int) -> None:
        h = self._hist(g.gpu_type)
        h[self.free_of(g)] -= 1
        h[new] += 1
        self.over[g.gid] = new

    def fits(self, gpu_type: str, n: int) -> int:
        pool = self.base.pools.get(gpu_type)
        if pool is None:
            return 0
        h = self.hists.get(gpu_type, pool.hist)
        return fits_hist(h, n, pool.max_cap)

    def free_gpus(self, gpu_type: str) -> int:
        pool = self.base.pools.get(gpu_type)
        if pool is None:
            return 0
        h = self.hists.get(gpu_type, pool.hist)
        return sum(f * c for f, c in enumerate(h))

    def take(self, gpu_type: str, n: int, prefer: str = BEST_FIT) -> list[tuple[Group, int]] | None:
        pool = self.base.pools.get(gpu_type)
        if pool is None or n <= 0:
            return None
        k_nodes = self.fits(gpu_type, n)
        if not k_nodes:
            return None
        q = n // k_nodes
        buckets = pool.buckets()
        moved: dict[int, list[Group]] = {}
        for gid, f in self.over.items():
            g = self.base.groups[gid]
            if g.gpu_type == gpu_type:
                moved.setdefault(f, []).append(g)
        levels = range(q, pool.max_cap + 1)
        if prefer == SCATTER:
            levels = range(pool.max_cap, q - 1, -1)
        picked: list[Group] = []
        for f in levels:
            at = [g for g in buckets[f] if g.gid not in self.over] + moved.get(f, [])
            if moved.get(f):
                at.sort(key=lambda g: g.order)
            picked.extend(at[: k_nodes - len(picked)])
            if len(picked) >= k_nodes:
                break
        chosen = [(g, q) for g in picked]
        for g, c in chosen:
            self._set(g, self.free_of(g) - c)
        return chosen

    def give(self, parts: Iterable[tuple[Group, int]]) -> None:
        for g, c in parts:
            self._set(g, self.free_of(g) + c)
