"""The round's `Sizer` for the tenants' admission (controller/core/quotas.py): minRes, the length of
a promise, and whether a promise can be laid out on the nodes beside the admitted guaranteed jobs.

Morphling Sec. 5 (../shared/seeds/morphling.txt): "We consider the quota usage of each job as its
minimum demand" (minRes: "the fewest resources (possibly with a better execution plan) needed to
achieve the performance of the original resource and plan"). docs/tenants.md, "Admission with a
sizer", says why each rule and names the knobs.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math

from tessera.controller.core.guarantees import EPS, RoundView, promise_time
from tessera.controller.core.placement import ClusterState, quotas
from tessera.controller.core.quotas import Charge
from tessera.controller.core.snapshot import JobView, Promise, RunningView


class RoundSizer:
    """`quotas.Sizer` on a round's estimates and nodes. `handles`: the policy keeps guarantees
    itself and may shrink a guaranteed job it grew back to its minimum (Morphling's Algorithm 1),
    so such a job holds only its minRes's share of each node for the layout; under any other policy
    it holds what it runs on."""

    def __init__(self, ctx: RoundView, handles: bool = False) -> None:
        self.ctx = ctx
        self.handles = handles
        self._tp: dict[tuple[str, str], float] = {}
        self._layouts: dict[tuple[str, str], list[tuple[int, int]]] = {}
        st = ClusterState.from_nodes(ctx.snap.nodes)
        # (node, type) -> GPUs there; -> GPUs held or reserved by admitted guaranteed jobs.
        self.cap = {(g.node_id, g.gpu_type): g.capacity for g in st.groups}
        self.taken: dict[tuple[str, str], int] = {}

    def t_p(self, job: JobView, promise: Promise) -> float:
        k = (job.id, promise.gpu_type)
        got = self._tp.get(k)
        if got is None:
            got = promise_time(self.ctx, job, promise) if promise.gpu_type else 0.0
            self._tp[k] = got
        return got

    def layouts(self, job: JobView, promise: Promise) -> list[tuple[int, int]]:
        """(GPUs, nodes) as fast as the promise, fewest GPUs first, fewest nodes first: the layouts
        the guarantee layer's search tries (guarantees.Guard._search); [] = no estimate."""
        k = (job.id, promise.gpu_type)
        got = self._layouts.get(k)
        if got is None:
            t, tp = promise.gpu_type, self.t_p(job, promise)
            cap = self.ctx.max_per_node(t)
            got = []
            if tp > 0 and cap > 0:
                counts = sorted({c for c in self.ctx.gpu_counts(job, t) if 0 < c < promise.gpus} | {promise.gpus})
                for n in counts:
                    for q in quotas(n, cap):
                        b = self.ctx.best(job, t, n, n // q)
                        if b is not None and b.iteration_s <= tp * (1 + EPS):
                            got.append((n, n // q))
            self._layouts[k] = got
        return got

    # ------------------------------------------------------------------ quotas.Sizer

    def min_gpus(self, job: JobView, promise: Promise) -> int:
        lay = self.layouts(job, promise)
        return lay[0][0] if lay else promise.gpus

    def length_s(self, job: JobView, promise: Promise) -> float:
        if job.iterations <= 0:
            return math.inf
        # A promise without a type: on its type hint, else the fastest type the cluster has.
        types = ([promise.gpu_type] if promise.gpu_type else [job.gpu_type_hint] if job.gpu_type_hint
                 else sorted({t for _, t in self.cap}))
        tps = [tp for t in types if (tp := self.t_p(job, Promise(promise.gpus, promise.cpus, promise.plan, t))) > 0]
        return job.remaining_iterations * min(tps) if tps else math.inf

    def hold(self, running: RunningView, charge: Charge) -> None:
        t = running.cell.gpu_type
        share = -(-charge.gpus // max(1, len(running.slices)))
        for s in running.slices:
            n = len(s.gpu_indices)
            k = (s.node_id, t)
            self.taken[k] = self.taken.get(k, 0) + (min(n, share) if self.handles else n)

    def reserve(self, job: JobView, charge: Charge) -> bool:
        t = charge.gpu_type
        lay = self.layouts(job, charge.promise)
        if not lay:
            return True  # no estimate of the promise: nothing to lay out (admitted as before)
        room = sorted(((c - self.taken.get(k, 0), k[0]) for k, c in self.cap.items() if k[1] == t))
        for n, nodes in lay:
            q = n // nodes
            # Best fit: the nodes with the least room that still hold q, so that whole nodes stay
            # for large promises.
            fit = [node for r, node in room if r >= q][:nodes]
            if len(fit) == nodes:
                for node in fit:
                    self.taken[(node, t)] = self.taken.get((node, t), 0) + q
                return True
        return False
