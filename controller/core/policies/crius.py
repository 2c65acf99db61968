"""The Crius Cell policy (Crius Sec. 6.1, Algorithm 1), the default policy of Tessera.

Crius: "A Codesign of Scheduling and Parallelization for Large Model Training in Heterogeneous
Clusters", arXiv 2024 (arXiv:2403.16125; docs/reference/papers.md).

Per round, with departures and arrivals as Algorithm 1 has them:
1. SchedDeparture: the waiting jobs, in queue order, each get CellBasedSched. A job that still does
   not fit may take the GPUs of opportunistic jobs queued after it, which are then suspended
   (opportunistic execution: large jobs do not starve).
2. SchedArrival: each new job gets CellBasedSched; a job that fits while an earlier job waits runs
   opportunistically.
3. Extra scheduling (CellBasedSched()): released resources go to running jobs, one step at a time,
   the step with the largest estimated gain of cluster throughput first (scale up, change type,
   move to fewer nodes).
4. FinalizeAlloc: the virtual allocation becomes decisions once, at the end (start, migrate, stop).

CellBasedSched(job) explores scheduling choices: the job takes one of its Cells (GPU type x count x
stages), after at most `search_depth` scaling steps of running jobs (halve a job's GPUs, move a job
to another GPU type, halve a job on another type to make room for such a move). Each choice is
scored by the estimated cluster throughput it leads to (sum of samples/s by the Cell estimates);
the best feasible one is applied virtually. The search is a depth-first walk with an upper bound
(a choice cannot gain more than the job's own throughput plus the best positive step per level),
on a virtual overlay of free-GPU counts (controller/core/placement.py `Trial`), so trying a choice
costs microseconds; it lives in crius_search.py (`Explorer`), whose docstring spells out the terms
(scaling step, shrink, type change, throughput) and, in paper mode with `upgrade_min_gain` (the
controller's --min-gain), the margin the restarts of a choice's scaling steps must pay.

Two modes:
- "paper": Cells from the hint (N/2, N, 2N) on every GPU type, or from the memory-feasible range
  when there is no hint; pick the best choice by cluster throughput; waiting jobs are retried every
  round; released resources go to running jobs only when no job is left waiting.
- "artifact": as the Crius artifact's `scheduler.py` runs it: a new job first tries its requested
  type and count as they are and takes them when they fit with the best locality; only otherwise
  the downgrade search (halve/move jobs including itself) runs, with depth 3, or 2 once more than
  150 jobs run; waiting jobs are retried only in rounds with departures; running jobs are upgraded
  (up to 10 steps, any gain > 0) after arrivals, and after departures when nothing arrived.

The deadline-aware variant (`crius-ddl`, Sec. 8.5) only counts Cells that finish the job before its
deadline (one round to start plus the restart cost) and drops waiting jobs that can no longer make
it. What this simplifies: TP groups are not kept inside NVLink islands during the search (only at
the final placement, which then may fail and fall back); the search does not move a job twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.controller.core import opaque
from tessera.controller.core.placement import BEST_FIT, Trial
from tessera.controller.core.policies import why_not
from tessera.controller.core.policies.common import Alloc, Board, free_text
from tessera.controller.core.policies.crius_search import SHRINK, Candidates, Choice, Explorer
from tessera.controller.core.policy import CellEstimate, Mode, RoundContext, queue_key
from tessera.controller.core.snapshot import Decision, JobView, PendingKind

PAPER = Mode.PAPER
ARTIFACT = Mode.ARTIFACT


@dataclass(frozen=True)
class CriusOptions:
    mode: Mode = PAPER
    # None: RoundConfig.search_depth ("artifact": 3, or 2 when more than 150 jobs run).
    search_depth: int | None = None
    deadline_aware: bool = False
    scale_count: bool = True  # adaptivity scaling (off: Crius-NA of the ablation)
    change_type: bool = True  # heterogeneity scaling (off: Crius-NH)
    opportunistic: bool = True
    upgrade_steps: int = 10
    # Relative throughput gain a running job's scale-up / type change / move needs; in paper mode, when
    # > 0, also the margin a choice's scaling steps (restarts) must pay (crius_search.py, "Restarts").
    upgrade_min_gain: float = 0.0
    # Restart cost assumed by the deadline check (s).
    restart_s: float = 40.0
    # Most choices one CellBasedSched explores (deterministic; bounds a round's cost together with
    # RoundConfig.max_evaluations); a job whose search runs out keeps the best choice found.
    search_budget: int = 200

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))  # a misspelt mode fails here


class CriusPolicy:
    def __init__(self, options: CriusOptions | None = None) -> None:
        self.options = options or CriusOptions()
        suffix = "-ddl" if self.options.deadline_aware else ""
        self._name = f"crius{suffix}"

    @property
    def name(self) -> str:
        return self._name

    # ------------------------------------------------------------------ the round

    def plan(self, ctx: RoundContext) -> list[Decision]:
        o = self.options
        b = Board(ctx, self.name)
        run = _Round(self, ctx, b)
        if o.deadline_aware:
            run.drop_late()
        arrivals = [j for j in ctx.pending if j.id in ctx.arrivals]
        older = [j for j in ctx.pending if j.id not in ctx.arrivals]
        departures = ctx.snap.departures > 0 or ctx.snap.arrivals is None
        if o.mode == ARTIFACT:
            if departures and older:
                run.restart_waiting(older)
            if departures and not arrivals:
                run.upgrade()
            for j in arrivals:
                run.arrive(j)
            if arrivals:
                run.upgrade()
        else:
            run.restart_waiting(older)
            for j in arrivals:
                run.arrive(j)
            if not any(j.id not in run.hopeless for j in b.waiting.values()):
                run.upgrade()
        return b.decisions(o.opportunistic)


class _Round:
    """One round of the Crius policy over a Board."""

    def __init__(self, pol: CriusPolicy, ctx: RoundContext, b: Board) -> None:
        self.opts = pol.options
        self.ctx = ctx
        self.board = b
        self.name = pol.name
        # estimate-key signature -> free GPUs per type when a search for it failed: a job like it is
        # searched again only once some type has more free GPUs (the artifact caches failures by
        # model too, `infeasible_job_infos`).
        self.failed: dict[str, dict[str, int]] = {}
        self.hopeless: set[str] = set()  # jobs with no feasible Cell even on an empty cluster
        self.failed_reason: dict[str, str] = {}
        self._lists: dict[tuple[str, str, str, int], Candidates] = {}
        if self.opts.search_depth is not None:
            self.depth = self.opts.search_depth
        elif self.opts.mode == ARTIFACT:
            self.depth = 3 if len(ctx.running) <= 150 else 2
        else:
            self.depth = ctx.config.search_depth

    # ------------------------------------------------------------------ estimates

    def types_for(self, job: JobView) -> list[str]:
        ts = self.ctx.types()
        return [t for t in ts if job.may_use(t)]

    def ddl_ok(self, job: JobView, est: CellEstimate | None, restart: bool) -> bool:
        if not self.opts.deadline_aware or job.deadline <= 0 or est is None:
            return True
        cfg = self.ctx.config
        end = (self.ctx.snap.now + cfg.interval_s + (self.opts.restart_s if restart else 0.0)
               + job.remaining_iterations * est.iteration_s)
        return end <= job.deadline

    def throughput(self, job: JobView, gpu_type: str, gpus: int, nodes: int, restart: bool = True) -> float:
        """Samples/s of the job's best Cell there (by the estimates); 0 when it cannot run there or
        would miss its deadline (`restart`: counting the restart cost)."""
        est = self.ctx.best(job, gpu_type, gpus, nodes)
        if est is None or not self.ddl_ok(job, est, restart):
            return 0.0
        return job.global_batch_size / est.iteration_s

    def ideal_throughput(self, job: JobView, gpu_type: str, gpus: int) -> float:
        """`throughput` on the fewest nodes that can hold the GPUs (the best locality)."""
        n = self.ctx.ideal_nodes(gpu_type, gpus)
        return self.throughput(job, gpu_type, gpus, n) if n else 0.0

    def alloc_throughput(self, a: Alloc) -> float:
        return self.throughput(a.job, a.gpu_type, a.gpus, a.nodes, restart=False) if a.est else 0.0

    # ------------------------------------------------------------------ Cells of a job

    def target_cells(self, job: JobView, pools: dict[str, int] | None = None) -> list[tuple[str, int, int]]:
        """(GPU type, GPUs, scaling steps it costs) of the job's Cells; `pools`: the most GPUs of each
        type a Cell may have (default: the READY nodes', within the per-job cap)."""
        o = self.opts
        scale = o.scale_count and not job.opaque  # an opaque job runs on exactly what it asked for
        cap = self.ctx.max_gpus()
        pools = {t: min(cap, self.ctx.total_gpus(t)) for t in self.types_for(job)} if pools is None else pools
        types = list(pools)
        req = job.gpu_type_hint if job.gpu_type_hint in types else ""
        out: list[tuple[str, int, int]] = []
        if o.mode == ARTIFACT:
            n0 = job.gpus_hint or self._smallest_count(job, req or (types[0] if types else ""))
            if n0 <= 0:
                return []
            for t in types:
                tc = 0 if (not req or t == req) else 1
                if tc and not o.change_type:
                    continue
                n, c = n0, 0
                while n >= 1:
                    if c and not scale:
                        break
                    out.append((t, n, tc + c))
                    n //= 2
                    c += 1
            return out
        for t in types:
            if req and t != req and not o.change_type:
                continue
            if job.gpus_hint:
                n = job.gpus_hint
                counts = sorted({max(1, n // 2), n, 2 * n}) if scale else [n]
            else:
                feas = [c for c in self.ctx.gpu_counts(job, t) if c & (c - 1) == 0]
                counts = feas[:3] if scale else feas[:1]
            for n in counts:
                if 0 < n <= pools[t]:
                    out.append((t, n, 0))
        return out

    def _smallest_count(self, job: JobView, gpu_type: str) -> int:
        if not gpu_type:
            return 0
        cs = self.ctx.gpu_counts(job, gpu_type)
        return cs[0] if cs else 0

    # ------------------------------------------------------------------ search

    def _shrink_list(self, gpu_type: str, exclude: set[str]) -> Candidates:
        allocs = [a for a in self.board.allocs.values() if a.gpu_type == gpu_type and a.gpus > 1
                  and a.job.id not in exclude]
        if self.opts.mode == ARTIFACT and allocs:
            # The artifact prefers the largest jobs: only those with at least half the largest count.
            top = max(a.gpus for a in allocs)
            allocs = [a for a in allocs if a.gpus >= top // 2]
        out = []
        for a in allocs:
            k = a.nodes // 2 if a.nodes > 1 else 1
            new = self.throughput(a.job, a.gpu_type, a.gpus // 2, k)
            if new <= 0:
                continue
            out.append((new - self.alloc_throughput(a), a))
        out.sort(key=lambda x: (-x[0], queue_key(x[1].job)))
        return out

    def shrink_list(self, t: str, exclude: set[str]) -> Candidates:
        """Halving candidates on a type, least loss first; cached while the board is unchanged."""
        if not self.opts.scale_count:
            return []
        if exclude:
            return self._shrink_list(t, exclude)
        k = ("s", t, "", self.board.version)
        got = self._lists.get(k)
        if got is None:
            got = self._lists[k] = self._shrink_list(t, exclude)
        return got

    def type_change_list(self, src: str, dst: str, exclude: set[str]) -> Candidates:
        """Moves from src to dst, largest gain first; cached while the board is unchanged."""
        if not self.opts.change_type:
            return []
        if exclude:
            return self._type_change_list(src, dst, exclude)
        k = ("h", src, dst, self.board.version)
        got = self._lists.get(k)
        if got is None:
            got = self._lists[k] = self._type_change_list(src, dst, exclude)
        return got

    def _type_change_list(self, src: str, dst: str, exclude: set[str]) -> Candidates:
        out = []
        for a in self.board.allocs.values():
            if a.gpu_type != src or a.job.id in exclude:
                continue
            if a.job.gpu_types and dst not in a.job.gpu_types:
                continue
            new = self.ideal_throughput(a.job, dst, a.gpus)
            if new <= 0:
                continue
            out.append((new - self.alloc_throughput(a), a))
        out.sort(key=lambda x: (-x[0], queue_key(x[1].job)))
        return out

    def search(self, job: JobView, base: Trial, exclude: set[str],
               direct_only: bool = False) -> Choice | None:
        """The best scheduling choice for a job over the board (see the module docstring)."""
        cells = []
        for t, n, cost in self.target_cells(job):
            if cost > self.depth and not direct_only:
                continue
            ideal = self.ideal_throughput(job, t, n)
            if ideal > 0:
                cells.append((ideal, t, n, cost))
        if not cells:
            return None
        cells.sort(key=lambda c: (-c[0], c[3], c[1], c[2]))
        ex = Explorer(self, job, exclude)
        ex.seed(cells, base)
        for ideal, t, n, cost in cells:
            if not self.ctx.spend():
                direct_only = True
            steps_left = 0 if direct_only else self.depth - cost
            if steps_left > 0 and base.free_gpus(t) + ex.freeable(t, steps_left) < n:
                continue  # even the largest steps cannot free n GPUs of this type
            ex.target(t, n, ideal, steps_left)
            if ex.cut(ideal + steps_left * ex.best_step_gain, 1):  # (its direct fit was tried above)
                continue
            ex.explore(base.copy(), [], 0.0, steps_left)
        return ex.best

    def apply(self, job: JobView, ch: Choice, extra_note: str = "") -> Alloc | None:
        """Apply a choice for real: the scaling steps, then the job's placement."""
        b = self.board
        notes = []
        for op in ch.steps:
            a = op.alloc
            if op.kind == SHRINK:
                b.shrink(a, f"scaled down to make room for {job.id}")
                notes.append(f"{a.job.id} halved to {a.gpus} x {a.gpu_type}")
            else:
                b.release(a)
                sl = b.place(op.to_type, a.gpus)
                if sl is None:  # the virtual view was optimistic; keep the job where it was
                    b.ctx.state.take(a.slices, a.gpu_type)
                    continue
                old = a.gpu_type
                b.reassign(a, op.to_type, sl, f"moved from {old} to make room for {job.id}", already_released=True)
                notes.append(f"{a.job.id} moved {old} -> {op.to_type}")
        sl = b.place(ch.gpu_type, ch.gpus, BEST_FIT)
        if sl is None:
            return None
        note = ("made room: " + ", ".join(notes)) if notes else ""
        if extra_note:
            note = f"{note}; {extra_note}" if note else extra_note
        return b.start(job, ch.gpu_type, sl, note)

    # ------------------------------------------------------------------ Algorithm 1 steps

    def _sig(self, job: JobView) -> str:
        return f"{job.key}|{job.gpus_hint}|{job.gpu_type_hint}|{','.join(job.gpu_types)}"

    def cell_based_sched(self, job: JobView, allow_reclaim: bool) -> bool:
        b = self.board
        sig = self._sig(job)
        seen = self.failed.get(sig)
        if not self.opts.deadline_aware and seen is not None and all(
                self.ctx.state.free_gpus(t) <= f for t, f in seen.items()):
            b.pend(job, PendingKind.NO_ROOM_NOW, self.failed_reason.get(sig, f"{self.name}: waiting"))
            return False
        if self._hopeless(job):
            return False
        direct_only = self.ctx.budget_exhausted
        base = b.trial()
        if self.opts.mode == ARTIFACT and not direct_only:
            req = job.gpu_type_hint if job.gpu_type_hint in self.types_for(job) else ""
            n0 = job.gpus_hint
            nodes = base.fits(req, n0) if req and n0 else 0
            if (nodes and nodes == self.ctx.ideal_nodes(req, n0) and self.throughput(job, req, n0, nodes) > 0
                    and self.apply(job, Choice(0.0, req, n0, nodes, [])) is not None):
                return True
        ch = self.search(job, base, set(), direct_only)
        if ch is not None and self.apply(job, ch) is not None:
            return True
        if allow_reclaim and self.opts.opportunistic and not direct_only and self._reclaim(job):
            return True
        reason = self._pending_reason(job)
        b.pend(job, PendingKind.NO_ROOM_NOW, reason)
        self.failed[sig] = {t: self.ctx.state.free_gpus(t) for t in self.ctx.types()}
        self.failed_reason[sig] = reason
        return False

    def _reclaim(self, job: JobView) -> bool:
        """Opportunistic execution: take back the GPUs of jobs queued after this one that run
        opportunistically; suspend those whose GPUs the job needs."""
        b = self.board
        mine = queue_key(job)
        opp = [a for a in b.allocs.values() if queue_key(a.job) > mine
               and (a.opportunistic or a.orig is None)]
        if not opp:
            return False
        tr = b.trial()
        for a in opp:
            tr.give(b.parts(a))
        ch = self.search(job, tr, {a.job.id for a in opp})
        if ch is None:
            return False
        saved = [(a, a.slices) for a in sorted(opp, key=lambda a: queue_key(a.job))]
        for a, _ in saved:
            b.release(a)
        got = self.apply(job, ch, "started by suspending opportunistic jobs queued after it")
        if got is None:
            for a, sl in saved:
                b.ctx.state.take(sl, a.gpu_type)
            return False
        for a, sl in saved:
            try:
                b.ctx.state.take(sl, a.gpu_type)
            except ValueError:
                del b.allocs[a.job.id]
                why = (f"{self.name}: suspended (opportunistic execution): its GPUs went to {job.id}, "
                       f"queued before it")
                if a.orig is not None:
                    b.suspended[a.job.id] = why
                else:
                    b.waiting[a.job.id] = a.job
                    b.pend(a.job, PendingKind.WAITING, why)
        return True

    def _hopeless(self, job: JobView) -> bool:
        """No Cell of the job is feasible anywhere, even on an empty cluster."""
        if job.id in self.hopeless:
            return True
        cells = self.target_cells(job)
        for t, n, _ in cells:
            if self.ideal_throughput(job, t, n) > 0:
                return False
        self.hopeless.add(job.id)
        nowhere, why = self._no_cell(job, cells)
        if not nowhere:
            # It waits for nodes to come back (drained, unhealthy): it may still make its deadline.
            self.board.pend(job, PendingKind.NO_ROOM_NOW, f"{self.name}: waiting for nodes: {why}")
        elif self.opts.deadline_aware and job.deadline > 0:
            ctx = self.ctx
            if any(ctx.ideal_nodes(t, n) and ctx.best(job, t, n, ctx.ideal_nodes(t, n)) for t, n, _ in cells):
                why = f"no Cell ({_cells_text(cells)}) finishes before the deadline"
            self.board.drop(job, f"{self.name}: dropped: {why}")
        else:
            self.board.pend(job, PendingKind.FITS_NOWHERE, f"{self.name}: fits nowhere: {why}")
        return True

    def _no_cell(self, job: JobView, cells: list[tuple[str, int, int]]) -> tuple[bool, str]:
        """Whether the job fits nowhere (else it waits for nodes), and why none of its Cells runs:
        the first cause that holds (why_not.py names those of the cluster). Only Cells the READY
        nodes can hold are asked of the estimates, so memory is named only where such Cells were
        refused (or no GPU count fits the job at all). A job the READY nodes cannot run waits for
        nodes only when one of its Cells on the registered GPUs, READY or not, is more than the READY
        nodes hold and covered by the estimates (`back`, why_not.if_back); else it fits nowhere, as
        it does with every node READY (`no_cell`)."""
        ctx = self.ctx
        s = why_not.round_supply(ctx, job)
        reg = self.target_cells(job, {m: s.limit(c) for m, c in s.registered.items()})  # with every node back
        back = why_not.if_back(ctx, job, s, ((t, n) for t, n, _ in reg))
        no_cell = (f"no node layout holds {_cells_text(reg or cells)} evenly" if job.opaque else  # (no memory figure)
                   f"no feasible Cell among {_cells_text(reg or cells)} (out of memory or not covered by the estimates)")
        nowhere, why = self._first_cause(job, s, cells, back, no_cell)
        return (nowhere, why) if nowhere or back or job.opaque else (True, no_cell)

    def _first_cause(self, job: JobView, s: why_not.Supply, cells: list[tuple[str, int, int]],
                     back: list[tuple[str, int]], no_cell: str) -> tuple[bool, str]:
        """`_no_cell`'s first cause, `back` and `no_cell` as it computes them."""
        ctx = self.ctx
        asked = opaque.gpus_of(job) if job.opaque else job.gpus_hint
        need = asked if job.opaque or not self.opts.scale_count else max(1, asked // 2)
        if job.opaque:
            what = why_not.opaque_what(asked)
        elif need != asked:
            what = f"its gpus hint is {asked}: its smallest Cell (half the hint) is {need} GPUs of one type"
        else:
            what = f"its gpus hint is {asked}: its Cell is {need} GPUs of one type"
        counted = bool(asked) and self.opts.mode != ARTIFACT
        most = (2 * asked if self.opts.scale_count else asked) if counted else asked  # its largest Cell
        asks = f"its gpus hint is {asked}: its largest Cell is {most} GPUs"

        def never() -> str:  # nodes coming back would not run it either
            if counted and (why := why_not.over_registered(s, need, what)):
                return why
            if job.opaque:
                return ""
            pow2 = not asked and self.opts.mode != ARTIFACT  # the artifact's Cells halve from the fewest, any count
            return why_not.memory_cause(s, why_not.fewest(ctx, job, sorted(s.registered), pow2), most, asks=asks)

        if cause := why_not.type_cause(job, ctx.snap, s, never):
            return cause
        req = job.gpu_type_hint if job.gpu_type_hint in s.ready else ""
        if req and not self.opts.change_type:  # its Cells are of that type only (target_cells)
            s = s.only(req, keep_listing=True)
        if counted:
            counts = {need, asked, 2 * asked} if self.opts.scale_count else {asked}  # its Cells' (target_cells)
            oom = "" if job.opaque else self._out_of_memory(job, s, why_not.fewest(ctx, job, sorted(s.registered)), counts)
            if cause := why_not.count_cause(s, need, what, oom):
                return cause
            # A hint too small for memory: say how many GPUs the job fits on, not only that it does not.
            if not job.opaque and (few := why_not.fewest(ctx, job, sorted(s.registered))) and (
                    small := why_not.memory_cause(s, few, most, asks=asks)):
                return True, small
        if cells:
            if back:  # a Cell the registered GPUs hold, the READY ones not, that the estimates cover
                return False, f"no Cell on the READY nodes ({_cells_text(cells)}); {why_not.back_text(ctx, s, back)}"
            return True, no_cell
        # No GPU count: its Cells come from the counts it fits on in memory (one type's in artifact mode).
        scope = [req or next(iter(s.ready))] if self.opts.mode == ARTIFACT else sorted(s.registered)
        fewest = why_not.fewest(ctx, job, scope, pow2=self.opts.mode != ARTIFACT)
        if oom := self._out_of_memory(job, s, fewest, scope=scope):
            return True, oom
        over = why_not.fewest_text(s, fewest)
        now = ", ".join(f"{ctx.total_gpus(m)} x {m}" for m in sorted(fewest))
        return False, f"{over}; READY: {now}"

    def _out_of_memory(self, job: JobView, s: why_not.Supply, fewest: dict[str, int],
                       counts: set[int] | None = None, scope: list[str] | None = None) -> str:
        """Why the job fits in memory on no count of its types (`scope`, else the supply's) that the
        registered GPUs could give it within the per-job cap, whatever nodes come back: `fewest`
        (why_not.fewest) over them all; "" when it may. `counts`: its Cells' GPU counts, any of which
        the estimates run on READY nodes says it may (a count between those `gpu_counts` tries)."""
        ctx = self.ctx
        scope = scope or sorted(s.registered)
        if not (oom := why_not.memory_cause(s, fewest, scope=scope)):
            return ""
        for m in scope:
            if any(0 < c <= s.limit(s.registered.get(m, 0)) and (nodes := ctx.ideal_nodes(m, c))
                   and ctx.throughput(job, m, c, nodes) > 0 for c in counts or ()):
                return ""
        return oom

    def _pending_reason(self, job: JobView) -> str:
        cells = sorted({(t, n) for t, n, c in self.target_cells(job)}, key=lambda x: (x[0], x[1]))
        txt = ", ".join(f"{n} x {t}" for t, n in cells[:6]) + (", ..." if len(cells) > 6 else "")
        budget = "; round budget spent, only direct fits tried" if self.ctx.budget_exhausted else ""
        return (f"{self.name}: waiting for GPUs: no Cell ({txt}) fits, even after up to {self.depth} "
                f"scaling steps of running jobs; {free_text(self.ctx)}{budget}")

    def restart_waiting(self, jobs: list[JobView]) -> None:
        for j in sorted(jobs, key=queue_key):
            if j.id in self.board.waiting and j.id not in self.board.dropped:
                self.cell_based_sched(j, allow_reclaim=True)

    def arrive(self, job: JobView) -> None:
        self.cell_based_sched(job, allow_reclaim=False)

    def drop_late(self) -> None:
        now = self.ctx.snap.now
        for j in list(self.board.waiting.values()):
            if j.deadline > 0 and j.deadline <= now:
                self.board.drop(j, f"{self.name}: dropped: its deadline passed while it waited")

    def upgrade(self) -> None:
        """Give free GPUs to running jobs, one step at a time, the largest gain first."""
        ctx, b, o = self.ctx, self.board, self.opts
        types = ctx.types()
        for _ in range(o.upgrade_steps):
            if ctx.budget_exhausted:
                return
            cands: list[tuple[float, int, Alloc, str, int]] = []
            for i, a in enumerate(b.allocs.values()):
                cur = self.alloc_throughput(a)
                opts: list[tuple[str, int]] = []
                if o.change_type:
                    opts += [(t, a.gpus) for t in types if t != a.gpu_type
                             and a.job.may_use(t)]
                if o.scale_count and 2 * a.gpus <= ctx.max_gpus():
                    opts.append((a.gpu_type, 2 * a.gpus))
                if a.nodes > ctx.ideal_nodes(a.gpu_type, a.gpus):
                    opts.append((a.gpu_type, a.gpus))
                for t, n in opts:
                    ub = self.ideal_throughput(a.job, t, n) - cur
                    if ub > o.upgrade_min_gain * cur and ub > 0:
                        cands.append((ub, i, a, t, n))
            cands.sort(key=lambda c: (-c[0], c[1]))
            best: tuple[float, Alloc, str, int, int] | None = None
            for ub, _, a, t, n in cands:
                if best is not None and ub <= best[0]:
                    break
                if not ctx.spend():
                    break
                tr = b.trial()
                tr.give(b.parts(a))
                nodes = tr.fits(t, n)
                if not nodes:
                    continue
                if t == a.gpu_type and n == a.gpus and nodes >= a.nodes:
                    continue
                gain = self.throughput(a.job, t, n, nodes) - self.alloc_throughput(a)
                if (gain > o.upgrade_min_gain * self.alloc_throughput(a) and gain > 0
                        and (best is None or gain > best[0])):
                    best = (gain, a, t, n, nodes)
            if best is None:
                return
            _, a, t, n, _nodes = best
            old = (a.gpu_type, a.gpus, a.nodes)
            b.release(a)
            sl = b.place(t, n)
            if sl is None:
                b.ctx.state.take(a.slices, a.gpu_type)
                return
            what = ("scaled up" if n > old[1] else "moved to fewer nodes") if t == old[0] else f"moved from {old[0]}"
            b.reassign(a, t, sl, f"{what}: released GPUs give +{best[0]:.1f} samples/s", already_released=True)


def _cells_text(cells: list[tuple[str, int, int]]) -> str:
    return ", ".join(sorted({f"{n} x {t}" for t, n, _ in cells}))

