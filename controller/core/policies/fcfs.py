"""First come, first served (docs/reference/baselines.md Sec. 1): strict FIFO per GPU type, whole
gangs, the GPU type and count the user asked for, no backfill, no scaling, no preemption.

- "artifact" (Crius `FCFSSched`): a new job whose request is infeasible even with the best locality
  is dropped (unless registered nodes, once back, would run it: it waits for them); a new job
  starts only if no job of its GPU type waits and a gang with the best locality (per node
  min(n, node size)) fits, on the nodes with the most idle GPUs first; waiting jobs are retried
  only in rounds with departures, in FIFO order, and the first that does not fit blocks its type
  for the round.
- "paper" (FCFS as Kubernetes / YARN queues run it): every round, waiting jobs in FIFO order, the
  first that does not fit blocks its type; placement is Tessera's (fewest nodes, best fit), with
  relaxed locality when the best one does not fit.

Simplifies: a job without a GPU count asks for the smallest count that fits in memory; a job
without a GPU type asks for the type where that count is fastest among those whose READY nodes can
run it as asked (the fastest of all when none can: its reason names that type's cause).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera.controller.core.placement import BEST_FIT, SCATTER
from tessera.controller.core.policies import why_not
from tessera.controller.core.policies.common import Board, free_text
from tessera.controller.core.policy import Mode, RoundContext
from tessera.controller.core.snapshot import Decision, JobView, PendingKind

PAPER = Mode.PAPER
ARTIFACT = Mode.ARTIFACT


def requested(ctx: RoundContext, job: JobView) -> tuple[str, int]:
    """The (GPU type, GPUs) a job asks for; ("", 0) when nothing in the cluster matches. Of the
    allowed types, the fastest whose READY nodes can run the job as asked (`runs_as_asked`): a
    type with too few READY GPUs for the count loses to a slower one that has them; the fastest of
    all when none can, and of equally fast ones the closest to running it."""
    types = [t for t in ctx.types() if job.may_use(t)]
    if job.gpu_type_hint in types:
        types = [job.gpu_type_hint]
    best: tuple[tuple[bool, float, float, int], str, int] | None = None
    for t in types:
        cs = ctx.gpu_counts(job, t) if not job.gpus_hint else ()
        n = job.gpus_hint or (cs[0] if cs else 0)
        if not n:
            continue
        runs = runs_as_asked(ctx, job, t, n)
        key = (runs, ctx.throughput(job, t, n, ctx.ideal_nodes(t, n)), 0.0, 0)
        if not runs:
            # Among types that cannot run it, equally fast (often: not at all), the one closest to
            # running it, whose reason then helps: the fewest GPUs it fits on, then the most GPUs (a
            # live audit: `gpus: 1` for a 7B model was told it fits on no fewer than 8 x A10-24GB,
            # the first type by name, where 2 x A100-80GB hold it).
            fits = cs or ctx.gpu_counts(job, t)
            key = (*key[:2], -(fits[0] if fits else math.inf), ctx.total_gpus(t))
        if best is None or key > best[0]:
            best = (key, t, n)
    if best is None:
        return ("", 0)
    return (best[1], best[2])


def runs_as_asked(ctx: RoundContext, job: JobView, t: str, n: int) -> bool:
    """Whether n x t runs the job on idle READY nodes with the best locality (`why_not_as_asked`
    is None): no more GPUs than the READY nodes have of t or than a job may have, and a Cell."""
    cap = ctx.config.max_gpus_per_job
    return (0 < n <= ctx.total_gpus(t) and not (cap and n > cap)
            and ctx.throughput(job, t, n, ctx.ideal_nodes(t, n)) > 0)


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
                if t and runs_as_asked(ctx, j, t, n):
                    blocked.add(t)
        for j in new:
            if art:
                t, n = requested(ctx, j)
                if (not t or ctx.throughput(j, t, n, ctx.ideal_nodes(t, n)) <= 0) and not waits_for(ctx, j):
                    b.drop(j, f"fcfs: dropped: {n} x {t or 'any GPU'} is infeasible even with the best locality")
                    continue
            self._try(b, j, blocked)
        return b.decisions(opportunistic=False)

    def _try(self, b: Board, job: JobView, blocked: set[str]) -> None:
        ctx = b.ctx
        t, n = requested(ctx, job)
        if not t:
            nowhere, why = why_no_type(ctx, job)
            self._never(b, job, nowhere, why)
            return
        if t in blocked:
            b.pend(job, PendingKind.WAITING,
                   f"fcfs: waiting behind an earlier job for {t} (FIFO, no backfill)")
            return
        cause = why_not_as_asked(ctx, job, t, n)
        if cause is not None:
            # Never runnable as asked on the READY nodes: it waits with a reason but blocks nobody.
            self._never(b, job, *cause)
            return
        if self.mode == ARTIFACT:
            sl = b.place(t, n, SCATTER) if ctx.state.fits(t, n) == ctx.ideal_nodes(t, n) else None
        else:
            sl = b.place(t, n, BEST_FIT)
            if sl is not None and ctx.throughput(job, t, n, len(sl)) <= 0:
                sl = None
        if sl is None:
            blocked.add(t)
            b.pend(job, PendingKind.NO_ROOM_NOW, f"fcfs: waiting for {n} x {t}: {free_text(ctx)}")
            return
        b.start(job, t, sl, "as requested (FIFO)")

    @staticmethod
    def _never(b: Board, job: JobView, nowhere: bool, why: str) -> None:
        back = "" if job.opaque else waits_for(b.ctx, job)
        if nowhere and back:  # nodes coming back would run it
            nowhere, why = False, f"{why}; {back}"
        elif not nowhere and not job.opaque and not back:  # nor would they: no Cell covers its count
            asks = why_not.asks(b.ctx, job, why_not.round_supply(b.ctx, job))
            asked = " or ".join(f"{n} x {t}" for t, n in asks if n)
            nowhere, why = True, f"{why}; the estimates have no Cell of {asked or 'it'} on the registered nodes"
        if nowhere:
            b.pend(job, PendingKind.FITS_NOWHERE, f"fcfs: fits nowhere: {why}")
        else:
            b.pend(job, PendingKind.NO_ROOM_NOW, f"fcfs: waiting for nodes: {why}")


def why_no_type(ctx: RoundContext, job: JobView) -> why_not.Cause:
    """Why `requested` found no (type, count) for the job: GPU types the cluster lacks, none READY,
    or (a job without a GPU count) no count of a READY type that fits it in memory."""
    s = why_not.round_supply(ctx, job)
    if cause := why_not.type_cause(job, ctx.snap, s, None if job.opaque else lambda: _never_fits(ctx, job, s)):
        return cause
    types = [t for t in ctx.types() if job.may_use(t)]
    if job.gpu_type_hint in types:  # as `requested` asks
        types = [job.gpu_type_hint]
    return True, f"no count of {' or '.join(types)} GPUs fits it (out of memory or not covered by the estimates)"


def why_not_as_asked(ctx: RoundContext, job: JobView, t: str, n: int) -> why_not.Cause | None:
    """Why the job cannot run on n x t even on idle READY nodes, None when it can (with the best
    locality): more GPUs than the cluster (or its READY nodes) has of t, more than a job may have,
    or out of memory on n x t, naming the fewest GPUs of t it fits on."""
    if runs_as_asked(ctx, job, t, n):
        return None  # the common case, without building the supply
    nodes = ctx.ideal_nodes(t, n)
    s = why_not.round_supply(ctx, job).only(t)
    if cause := why_not.type_cause(job, ctx.snap, s):  # an opaque job the cluster cannot hold
        return cause
    if job.opaque:
        what = why_not.opaque_what(n)
    elif job.gpus_hint:
        what = f"it asks for {n} x {t}"
    else:  # no GPU count: `requested` took the fewest GPUs of t it fits on in memory
        what = f"it fits in memory on no fewer than {n} x {t}"
    oom = _out_of_memory(ctx, job, t, n)
    if cause := why_not.count_cause(s, n, what, oom):
        return cause
    # Within the READY GPUs and the cap (count_cause): what refuses it is its Cell of n x t.
    if job.opaque:  # no memory: an opaque job's only Cell is refused when its nodes cannot share it evenly
        return True, f"{why_not.opaque_what(n)}, which {nodes} nodes of {t} cannot split evenly"
    if oom:
        return True, oom
    fits = list(ctx.gpu_counts(job, t))  # the counts of t it fits on in memory, by the estimates
    where = f"{n} x {t} on {nodes} node{'s' if nodes > 1 else ''}"
    if n in fits:
        return True, f"the estimates have no Cell of {where} (it fits in memory on {n} x {t})"
    counts = ", ".join(str(c) for c in fits[:-1]) + (" or " if len(fits) > 1 else "") + str(fits[-1])
    return True, (f"the estimates have no Cell of {where} (out of memory or not covered; it fits in memory "
                  f"on {counts} x {t})")


def waits_for(ctx: RoundContext, job: JobView) -> str:
    """What the job waits for where no READY node runs it as asked but registered ones, READY or
    not, would (why_not.if_back): its count (the fewest it fits on without one) of an allowed type,
    the one it asks for when registered (as `requested` would ask, nodes back); "" when none would."""
    if job.opaque:
        return ""
    s = why_not.round_supply(ctx, job)
    back = why_not.if_back(ctx, job, s, why_not.asks(ctx, job, s))
    return why_not.back_text(ctx, s, back) if back else ""


def _never_fits(ctx: RoundContext, job: JobView, s: why_not.Supply) -> str:
    """Why nothing the registered GPUs could give the job runs it ("" when something may): a job
    with a GPU count runs on that many of one type, which must hold it in memory."""
    n = job.gpus_hint
    if n and (why := why_not.over_registered(s, n, f"it asks for {n} GPUs of one type")):
        return why
    return why_not.memory_cause(s, why_not.fewest(ctx, job, sorted(s.registered)), n)


def _out_of_memory(ctx: RoundContext, job: JobView, t: str, n: int) -> str:
    """Why n x t never holds the job in memory, whatever nodes come back ("" when it may, or for an
    opaque job): the estimates have no Cell of n x t and no count of t it fits on is n or fewer."""
    if job.opaque or ctx.throughput(job, t, n, ctx.ideal_nodes(t, n)) > 0:
        return ""
    fits = ctx.gpu_counts(job, t)  # the counts of t it fits on in memory (on the registered GPUs)
    if not fits:
        return f"it does not fit in memory on {n} x {t}, nor on any other count of {t}"
    if fits[0] > n:
        return f"it does not fit in memory on {n} x {t}; it fits in memory on no fewer than {fits[0]} x {t}"
    return ""
