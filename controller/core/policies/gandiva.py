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

A job without a GPU count asks, on each type it may use, for the fewest GPUs it fits on there (the
artifact: on the type it names, else the first it fits on), and that count is its request when
grow-shrink shrinks it back. An opaque job (docs/opaque-jobs.md) never grows nor shrinks. A waiting
job's reason names the types and counts it waits for and what is free (paper); "fits nowhere as
requested" names the cause where one is known (why_not.py, as gavel names it).

Nodes down (registered, not READY): a request that no READY node runs, or that asks for more GPUs
than the READY nodes have, waits for nodes when the registered ones, READY or not, would run it
(why_not.if_back: a Cell of its count of a type it may use; the artifact: of the type it names); otherwise it
gets what it gets with every node READY ("fits nowhere as requested", or waiting for GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.controller.core.placement import BEST_FIT, SCATTER
from tessera.controller.core.policies import why_not
from tessera.controller.core.policies.common import Alloc, Board, free_text, place_as_requested
from tessera.controller.core.policy import Mode, RoundContext, queue_key
from tessera.controller.core.snapshot import CellEstimate, Decision, JobView, PendingKind, Slice

PAPER = Mode.PAPER
ARTIFACT = Mode.ARTIFACT
SHRUNK = "shrunk back toward its request to make room (grow-shrink)"
GROWN = "grown onto idle GPUs of its node (grow-shrink)"


@dataclass(frozen=True)
class _Before:
    """A job as it was before grow-shrink halved it, to undo that."""

    alloc: Alloc
    slices: tuple[Slice, ...]
    est: CellEstimate | None
    note: str


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
        self._runs: dict[str, dict[str, int]] = {}  # `runs` by job: asked at its start and for growth

    def allowed(self, job: JobView) -> list[str]:
        """The ready GPU types the job may use (its `gpu_types`, else every type)."""
        return [t for t in self.ctx.types() if job.may_use(t)]

    def request(self, job: JobView) -> tuple[str, int]:
        """The artifact's request: the type it names, else the first it fits on, at its count there."""
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

    def counts(self, job: JobView, types: list[str] | None = None) -> dict[str, int]:
        """The GPUs the job asks for on each of `types` (default: the READY ones) it may use: its
        hint, else the fewest it fits on there. The first type's count for all kept a 7B model that
        runs on 2 x A100 or 8 x A10 off idle A100 (8 > 4; a live audit)."""
        ts = [t for t in (self.ctx.types() if types is None else types) if job.may_use(t)]
        return dict.fromkeys(ts, job.gpus_hint) if job.gpus_hint else why_not.fewest(self.ctx, job, ts)

    def asks(self, job: JobView) -> dict[str, int]:
        """What the job asks for, by type: the artifact's one request, else (heterogeneity-blind: `find`
        places it on any type it may use) its count on each type."""
        if self.art:
            t, n = self.request(job)
            return {t: n} if t and n else {}
        return self.counts(job)

    def runs(self, job: JobView) -> dict[str, int]:
        """Of `asks`, the types whose count runs the job: the cluster registers that many GPUs of the
        type (the estimates time a Cell of any size, and a request larger than the type waited for
        ever) and the estimates have a Cell of them."""
        got = self._runs.get(job.id)
        if got is None:
            ctx = self.ctx
            have = why_not.by_type(ctx.snap)
            got = self._runs[job.id] = {t: n for t, n in self.asks(job).items()
                                        if n <= have.get(t, 0) and ctx.throughput(job, t, n, ctx.ideal_nodes(t, n)) > 0}
        return got

    def asked_of(self, a: Alloc) -> int:
        """A running job's request on its type (grow-shrink shrinks it back to that, never below): its
        hint, else the fewest it fits on there (taking its count for its request left a job without
        a hint grown for ever; a live audit); an opaque job's is what it runs on."""
        if a.job.opaque:
            return a.gpus
        return a.job.gpus_hint or self.counts(a.job, [a.gpu_type]).get(a.gpu_type, a.gpus)

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
            # Nobody grows onto a type a waiting job may run on (paper: any it may use); one that fits
            # nowhere waits for no type.
            self.grow(blocked | {t for j in b.waiting.values() if b.kinds.get(j.id) is not PendingKind.FITS_NOWHERE
                                 for t in (set(self.runs(j)) or {self.request(j)[0]})})

    def try_start(self, job: JobView, blocked: set[str]) -> None:
        b = self.b
        runs = self.runs(job)
        if not runs:
            if back := self.waits_for(job):  # registered nodes, READY or not, would run it
                b.pend(job, PendingKind.NO_ROOM_NOW, f"gandiva: waiting for nodes: no READY node runs it as "
                                                     f"requested; {back}")
            else:
                why = self.nowhere(job)
                b.pend(job, PendingKind.FITS_NOWHERE, "gandiva: fits nowhere as requested" + (f": {why}" if why else ""))
            return
        t, n = next(iter(runs.items()))  # the artifact's one request
        if self.art and t in blocked:
            b.pend(job, PendingKind.WAITING, f"gandiva: waiting behind an earlier job of {t}")
            return
        sl, where = self.find(job, runs)
        if sl is None:
            made, undo = self.shrink_grown(runs)
            sl, where = self.find(job, runs)
            if sl is None and made in runs:  # room on its type, yet no placement (the artifact's locality)
                self.unshrink(undo)
        if sl is None:
            blocked.update(runs)
            # The types it waits for, each at its count (it read "3 GPUs (any type)" for a job allowed A100 only).
            asked = f"{n} GPUs (of {t})" if self.art else " or ".join(f"{c} x {tt}" for tt, c in runs.items())
            more = all(c > self.ctx.total_gpus(tt) for tt, c in runs.items())
            if more and (back := self.waits_for(job)):  # more than the READY nodes have: they wait for nodes
                b.pend(job, PendingKind.NO_ROOM_NOW, f"gandiva: waiting for nodes: {asked} are more than the "
                                                     f"READY nodes have; {back}")
            elif self.art:
                b.pend(job, PendingKind.NO_ROOM_NOW, f"gandiva: waiting for {asked}")
            else:
                b.pend(job, PendingKind.NO_ROOM_NOW, f"gandiva: waiting for {asked}; {free_text(self.ctx)}")
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

    def nowhere(self, job: JobView) -> str:
        """Why no registered node, READY or not, runs its request (as gavel names it, why_not.py): an
        opaque job the cluster cannot hold or types it lacks, more GPUs than the cluster has of one
        type, no count that holds it in memory, else per type why its count there runs nowhere; the
        artifact judges the type it asks for only. "" when none is known."""
        ctx = self.ctx
        s = why_not.supply(job, ctx.snap, {t: ctx.total_gpus(t) for t in ctx.types()})
        if self.art and (t := self.request(job)[0]) in s.registered:  # (type_cause's "fits nowhere" is the same)
            s = s.only(t)
        of = f"of {next(iter(s.registered))}" if self.art and len(s.registered) == 1 else "of one type"
        return why_not.request_cause(ctx, job, s, self.counts(job, sorted(s.registered)), of)

    def find(self, job: JobView, runs: dict[str, int]) -> tuple[tuple[Slice, ...] | None, str]:
        ctx, b = self.ctx, self.b
        if self.art:
            t, n = next(iter(runs.items()))
            return place_as_requested(b, job, t, n, SCATTER, True,
                                      lambda k: ctx.throughput(job, t, n, k) > 0), t
        # Affinity: a node already running jobs of the same size, least loaded first; then an empty
        # node; then any node with room, over every GPU type the job may use (heterogeneity-blind),
        # each at the job's count there.
        best: tuple[tuple[int, int, int], tuple[Slice, ...], str] | None = None
        for tt, n in runs.items():
            sl = ctx.state.place(tt, n, 1, BEST_FIT)
            if sl is None:
                continue
            g = ctx.state.group(sl[0].node_id, tt)
            same = any(a.gpus == n and s.node_id == sl[0].node_id for a in b.allocs.values() for s in a.slices)
            rank = 0 if same else (1 if len(g.free) == g.capacity else 2)
            key = (rank, -len(g.free), ctx.types().index(tt))
            if best is None or key < best[0]:
                best = (key, sl, tt)
        return (best[1], best[2]) if best else (None, "")

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

    def shrink_grown(self, need: dict[str, int]) -> tuple[str, list[_Before]]:
        """Halve jobs grown past their request (`asked_of`), largest first, until a type holds the
        waiting job's count there. The artifact shrinks jobs of the type it asks for only; paper
        mode (heterogeneity-blind: grown jobs yield to demand) jobs of any type, a type the job does
        not run on counting its smallest count: the room goes to whoever runs there (restricting it
        to the job's types finished 712 jobs in place of 723 on arena-philly, fair rules, 2,000 rounds).
        Returns the type that holds it and the jobs as they were before; when no type does, the
        shrinks are undone: each restarts a job, for nothing (a live audit: a job grown to 2 x A40 was
        halved for a 2 x A40 job, which still waited on the one freed GPU)."""
        ctx, b = self.ctx, self.b
        least = min(need.values())
        undo: list[_Before] = []
        for a in sorted(b.allocs.values(), key=lambda a: (-a.gpus, queue_key(a.job))):
            if self.art and a.gpu_type not in need:
                continue
            n, asked = need.get(a.gpu_type, least), self.asked_of(a)
            before = _Before(a, a.slices, a.est, a.note)
            while a.gpus % 2 == 0 and a.gpus // 2 >= asked and ctx.state.fits(a.gpu_type, n) == 0:
                b.shrink(a, SHRUNK)  # (halved twice: said once, Board's with_note)
            if a.slices != before.slices:
                undo.append(before)
            if ctx.state.fits(a.gpu_type, n):
                return a.gpu_type, undo
        self.unshrink(undo)
        return "", []

    def unshrink(self, undo: list[_Before]) -> None:
        """Give shrunk jobs back the GPUs they held (`shrink_grown`'s record), as if never shrunk."""
        for x in reversed(undo):
            a = x.alloc
            self.b.release(a)
            self.ctx.state.take(x.slices, a.gpu_type)
            a.slices, a.est, a.note = x.slices, x.est, x.note
            a.gpus = sum(len(s.gpu_indices) for s in x.slices)

    def grow(self, wanted: set[str]) -> None:
        """Double single-node jobs onto idle GPUs of their node while their throughput rises; an opaque
        job runs on the GPUs it asked for, no more."""
        ctx, b = self.ctx, self.b
        for a in sorted(b.allocs.values(), key=lambda a: queue_key(a.job)):
            if a.gpu_type in wanted or a.nodes != 1 or a.job.opaque:
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
                b.reassign(a, a.gpu_type, sl, GROWN, already_released=True)  # (doubled twice: said once)
