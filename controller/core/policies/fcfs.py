"""First come, first served (docs/reference/baselines.md Sec. 1): strict FIFO per GPU type, whole
gangs, the GPU type and count the user asked for, no backfill, no scaling, no preemption.

- "artifact" (Crius `FCFSSched`): a new job whose request is infeasible even with the best locality
  is dropped; a new job starts only if no job of its GPU type waits and a gang with the best
  locality (per node min(n, node size)) fits, on the nodes with the most idle GPUs first; waiting
  jobs are retried only in rounds with departures, in FIFO order, and the first that does not fit
  blocks its type for the round.
- "paper" (FCFS as Kubernetes / YARN queues run it): every round, waiting jobs in FIFO order, the
  first that does not fit blocks its type; placement is Tessera's (fewest nodes, best fit), with
  relaxed locality when the best one does not fit.

Simplifies: a job without a GPU count asks for the smallest count that fits in memory; a job
without a GPU type asks for the type where that count is fastest.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.controller.core.placement import BEST_FIT, SCATTER
from tessera.controller.core.policies.common import Board, free_text
from tessera.controller.core.policy import Mode, RoundContext
from tessera.controller.core.snapshot import Decision, JobView, PendingKind

PAPER = Mode.PAPER
ARTIFACT = Mode.ARTIFACT


def requested(ctx: RoundContext, job: JobView) -> tuple[str, int]:
    """The (GPU type, GPUs) a job asks for; ("", 0) when nothing in the cluster matches."""
    types = [t for t in ctx.types() if not job.gpu_types or t in job.gpu_types]
    if job.gpu_type_hint in types:
        types = [job.gpu_type_hint]
    best: tuple[float, str, int] | None = None
    for t in types:
        n = job.gpus_hint
        if not n:
            cs = ctx.gpu_counts(job, t)
            if not cs:
                continue
            n = cs[0]
        thr = ctx.throughput(job, t, n, ctx.ideal_nodes(t, n))
        if best is None or thr > best[0]:
            best = (thr, t, n)
    if best is None:
        return ("", 0)
    return (best[1], best[2])


@dataclass(frozen=True)
class FcfsOptions:
    """FCFS has no options besides the mode."""


class FcfsPolicy:
    def __init__(self, mode: Mode = PAPER) -> None:
        self.mode = Mode(mode)

    @property
    def name(self) -> str:
        return "fcfs"

    def plan(self, ctx: RoundContext) -> list[Decision]:
        b = Board(ctx, self.name)
        art = self.mode == ARTIFACT
        blocked: set[str] = set()
        departures = ctx.snap.departures > 0 or ctx.snap.arrivals is None
        older = [j for j in ctx.pending if j.id not in ctx.arrivals]
        new = [j for j in ctx.pending if j.id in ctx.arrivals]
        if not art or departures:
            for j in older:
                self._try(b, j, blocked)
        for j in older:
            if j.id in b.waiting:
                t, n = requested(ctx, j)
                if t and ctx.throughput(j, t, n, ctx.ideal_nodes(t, n)) > 0:
                    blocked.add(t)
        for j in new:
            if art:
                t, n = requested(ctx, j)
                if not t or ctx.throughput(j, t, n, ctx.ideal_nodes(t, n)) <= 0:
                    b.drop(j, f"fcfs: dropped: {n} x {t or 'any GPU'} is infeasible even with the best locality")
                    continue
            self._try(b, j, blocked)
        return b.decisions(opportunistic=False)

    def _try(self, b: Board, job: JobView, blocked: set[str]) -> None:
        ctx = b.ctx
        t, n = requested(ctx, job)
        if not t:
            b.pend(job, PendingKind.FITS_NOWHERE,
                   "fcfs: fits nowhere: no GPU type in the cluster holds the job")
            return
        if t in blocked:
            b.pend(job, PendingKind.WAITING,
                   f"fcfs: waiting behind an earlier job for {t} (FIFO, no backfill)")
            return
        ok = ctx.throughput(job, t, n, ctx.ideal_nodes(t, n)) > 0
        sl = None
        if ok:
            if self.mode == ARTIFACT:
                sl = b.place(t, n, SCATTER) if ctx.state.fits(t, n) == ctx.ideal_nodes(t, n) else None
            else:
                sl = b.place(t, n, BEST_FIT)
                if sl is not None and ctx.throughput(job, t, n, len(sl)) <= 0:
                    sl = None
        if not ok:
            # Never runnable as asked: it waits with a reason but blocks nobody.
            b.pend(job, PendingKind.FITS_NOWHERE,
                   f"fcfs: fits nowhere: {n} x {t} is infeasible (out of memory or not covered)")
            return
        if sl is None:
            blocked.add(t)
            b.pend(job, PendingKind.NO_ROOM_NOW, f"fcfs: waiting for {n} x {t}: {free_text(ctx)}")
            return
        b.start(job, t, sl, "as requested (FIFO)")
