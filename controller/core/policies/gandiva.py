"""Gandiva (OSDI'18) as a baseline: introspective, heterogeneity-blind packing with migration and
grow-shrink (docs/reference/baselines.md Sec. 2).

- "artifact" (Crius `GandivaSched`, which "ignores the affinity restriction, not considering GPU
  co-location and over-subscription"): type and count as requested; best locality, then relaxed;
  otherwise a new job waits and blocks its type. In rounds with departures: (1) migration: jobs
  spread over more nodes than needed move to fewer nodes when they can; (2) waiting jobs are
  retried in FIFO order, shrinking jobs grown earlier back to their request when that makes room,
  and the first that still fails blocks its type; (3) grow: a job on one node doubles onto idle GPUs
  of its type while that raises its throughput and nobody waits for that type. Gandiva schedules
  with the optimal-plan throughputs and skips the data-parallel memory check, as the artifact does.
- "paper": the same mechanisms every round, but heterogeneity-blind: a job may land on any GPU
  type, chosen by Gandiva's affinity rule (a node already hosting jobs of the same GPU count, least
  loaded first; then an empty node; then any node); no time-slicing and no packing: both rest on
  suspending and co-locating jobs at mini-batch boundaries, which large-model jobs (that fill a
  GPU's memory and compute) do not allow; we state that instead of modelling it.

Nodes down (registered, not READY): a request that no READY node runs, or that asks for more GPUs
than the READY nodes have, waits for nodes when the registered ones, READY or not, would run it
(why_not.if_back: a Cell of its count of a type it may use; the artifact: of the type it names); otherwise it
gets what it gets with every node READY ("fits nowhere as requested", or waiting for GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.controller.core.placement import BEST_FIT, SCATTER
from tessera.controller.core.policies import why_not
from tessera.controller.core.policies.common import Board, place_as_requested
from tessera.controller.core.policy import Mode, RoundContext, queue_key
from tessera.controller.core.snapshot import Decision, JobView, PendingKind, Slice

PAPER = Mode.PAPER
ARTIFACT = Mode.ARTIFACT


@dataclass(frozen=True)
class GandivaOptions:
    """Gandiva has no options besides the mode."""


class GandivaPolicy:
    def __init__(self, mode: Mode = PAPER) -> None:
        self.mode = Mode(mode)

    @property
    def name(self) -> str:
        return "gandiva"

    def plan(self, ctx: RoundContext) -> list[Decision]:
        b = Board(ctx, self.name)
        _Gandiva(b, self.mode == ARTIFACT).round()
        return b.decisions(opportunistic=False)


class _Gandiva:
    def __init__(self, b: Board, art: bool) -> None:
        self.b = b
        self.ctx = b.ctx
        self.art = art

    def allowed(self, job: JobView) -> list[str]:
        """The ready GPU types the job may use (its `gpu_types`, else every type)."""
        return [t for t in self.ctx.types() if job.may_use(t)]

    def request(self, job: JobView) -> tuple[str, int]:
        ctx = self.ctx
        types = self.allowed(job)
        n = job.gpus_hint
        t = job.gpu_type_hint if job.gpu_type_hint in types else ""
        if not n:
            for tt in ([t] if t else types):
                cs = ctx.gpu_counts(job, tt)
                if cs:
                    n, t = cs[0], t or tt
                    break
        return t or (types[0] if types else ""), n

    def round(self) -> None:
        ctx, b = self.ctx, self.b
        departures = ctx.snap.departures > 0 or ctx.snap.arrivals is None
        blocked: set[str] = set()
        if departures or not self.art:
            self.migrate()
            for j in [j for j in ctx.pending if j.id not in ctx.arrivals]:
                self.try_start(j, blocked)
        else:
            for j in ctx.pending:
                if j.id not in ctx.arrivals:
                    blocked.add(self.request(j)[0])
        for j in ctx.pending:
            if j.id in ctx.arrivals:
                self.try_start(j, blocked)
        if departures or not self.art:
            self.grow(blocked | {self.request(j)[0] for j in b.waiting.values()})

    def _feasible(self, job: JobView, t: str, n: int) -> bool:
        """Whether n GPUs of t run the job; in paper mode (heterogeneity-blind: `find` may place it
        on any type), of any type it may use. The cluster must register n GPUs of the type: the
        estimates time a Cell of any size, and a request larger than the type waited for ever."""
        ctx = self.ctx
        have = why_not.by_type(ctx.snap)
        types = ([t] if t else []) if self.art else self.allowed(job)
        return any(n <= have.get(tt, 0) and ctx.throughput(job, tt, n, ctx.ideal_nodes(tt, n)) > 0 for tt in types)

    def try_start(self, job: JobView, blocked: set[str]) -> None:
        b = self.b
        t, n = self.request(job)
        if not n or not self._feasible(job, t, n):
            if back := self.waits_for(job):  # registered nodes, READY or not, would run it
                b.pend(job, PendingKind.NO_ROOM_NOW, f"gandiva: waiting for nodes: no READY node runs it as "
                                                     f"requested; {back}")
            else:
                b.pend(job, PendingKind.FITS_NOWHERE, "gandiva: fits nowhere as requested")
            return
        if self.art and t in blocked:
            b.pend(job, PendingKind.WAITING, f"gandiva: waiting behind an earlier job of {t}")
            return
        sl, where = self.find(job, t, n)
        if sl is None:
            self.shrink_grown(t if self.art else "", n)
            sl, where = self.find(job, t, n)
        if sl is None:
            blocked.add(t)
            asked = f"{n} GPUs ({'of ' + t if self.art else 'any type'})"
            more = n > max((self.ctx.total_gpus(tt) for tt in ([t] if self.art else self.allowed(job))), default=0)
            if more and (back := self.waits_for(job)):  # more than the READY nodes have: they wait for nodes
                b.pend(job, PendingKind.NO_ROOM_NOW, f"gandiva: waiting for nodes: {asked} are more than the "
                                                     f"READY nodes have; {back}")
            else:
                b.pend(job, PendingKind.NO_ROOM_NOW, f"gandiva: waiting for {asked}")
            return
        b.start(job, where, sl, "as requested" if self.art else f"affinity placement on {where}")

    def waits_for(self, job: JobView) -> str:
        """What the job waits for where the READY nodes do not run its request but registered ones,
        READY or not, would (why_not.if_back): what it would ask for with every registered node READY,
        its count (the fewest it fits on without one) of each type it may use (the artifact: of the
        type it names, when registered); "" when none would. Gandiva has no per-job cap."""
        ctx = self.ctx
        s = why_not.supply(job, ctx.snap, {t: ctx.total_gpus(t) for t in ctx.types()})
        # Paper mode is heterogeneity-blind (`find` places on any type it may use); the artifact keeps the named one.
        back = why_not.if_back(ctx, job, s, why_not.asks(ctx, job, s, named=self.art))
        return why_not.back_text(ctx, s, back) if back else ""

    def find(self, job: JobView, t: str, n: int) -> tuple[tuple[Slice, ...] | None, str]:
        ctx, b = self.ctx, self.b
        if self.art:
            return place_as_requested(b, job, t, n, SCATTER, True,
                                      lambda k: ctx.throughput(job, t, n, k) > 0), t
        # Affinity: a node already running jobs of the same size, least loaded first; then an empty
        # node; then any node with room, over every GPU type the job may use (heterogeneity-blind).
        same = {s.node_id for a in b.allocs.values() if a.gpus == n for s in a.slices}
        best: tuple[tuple[int, int, int], tuple[Slice, ...], str] | None = None
        for tt in self.allowed(job):
            if ctx.throughput(job, tt, n, ctx.ideal_nodes(tt, n)) <= 0:
                continue
            sl = ctx.state.place(tt, n, 1, BEST_FIT)
            if sl is None:
                continue
            g = ctx.state.group(sl[0].node_id, tt)
            rank = 0 if sl[0].node_id in same else (1 if len(g.free) == g.capacity else 2)
            key = (rank, -len(g.free), ctx.types().index(tt))
            if best is None or key < best[0]:
                best = (key, sl, tt)
        return (best[1], best[2]) if best else (None, t)

    def migrate(self) -> None:
        """Move jobs spread over more nodes than needed onto fewer nodes, when room allows."""
        ctx, b = self.ctx, self.b
        for a in sorted(b.allocs.values(), key=lambda a: queue_key(a.job)):
            if a.nodes <= ctx.ideal_nodes(a.gpu_type, a.gpus):
                continue
            tr = b.trial()
            tr.give(b.parts(a))
            k = tr.fits(a.gpu_type, a.gpus)
            if k and k < a.nodes:
                b.release(a)
                sl = b.place(a.gpu_type, a.gpus, SCATTER if self.art else BEST_FIT)
                if sl is None:
                    ctx.state.take(a.slices, a.gpu_type)
                    continue
                b.reassign(a, a.gpu_type, sl, "migrated to fewer nodes (locality)", already_released=True)

    def shrink_grown(self, t: str, need: int) -> None:
        ctx, b = self.ctx, self.b
        for a in sorted(b.allocs.values(), key=lambda a: (-a.gpus, queue_key(a.job))):
            if t and a.gpu_type != t:
                continue
            asked = a.job.gpus_hint or a.gpus
            while a.gpus > asked and ctx.state.fits(a.gpu_type, need) == 0:
                b.shrink(a, "shrunk back toward its request to make room (grow-shrink)")
            if ctx.state.fits(t or a.gpu_type, need):
                return

    def grow(self, wanted: set[str]) -> None:
        """Double single-node jobs onto idle GPUs of their node while their throughput rises."""
        ctx, b = self.ctx, self.b
        for a in sorted(b.allocs.values(), key=lambda a: queue_key(a.job)):
            if a.gpu_type in wanted or a.nodes != 1:
                continue
            while True:
                g = ctx.state.group(a.slices[0].node_id, a.gpu_type)
                if len(g.free) < a.gpus:
                    break
                gain = ctx.throughput(a.job, a.gpu_type, 2 * a.gpus, 1) - a.thr
                if gain <= 0:
                    break
                sl = (Slice(g.node_id, tuple(sorted(a.slices[0].gpu_indices + tuple(g.free[:a.gpus])))),)
                b.release(a)
                b.reassign(a, a.gpu_type, sl, "grown onto idle GPUs of its node (grow-shrink)", already_released=True)
