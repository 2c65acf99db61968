"""Gavel (OSDI'20) as a baseline: heterogeneity-aware allocation over GPU types at the GPU count the
user asked for (docs/reference/baselines.md Sec. 3). A job without one gets, on each type it may use,
the fewest GPUs it fits on there (its scale factor s_mj per type, where Gavel's s_m is one per job):
a single count, such as the first type's, would rule out every type with fewer GPUs than that. A
running job keeps its count on any type it moves to.

- "artifact" (Crius `GavelSched`): no time fractions. A new job is dropped when no GPU type can run
  its request; otherwise it is admitted by a binary program over all running jobs plus itself:
  each job on exactly one type, the GPUs of each type within its total, at most 3 running jobs
  changing type, maximise the sum of (data-parallel-profiled) throughputs. Jobs whose type changed
  are re-placed (best locality, then relaxed, nodes with most idle GPUs first); if any does not fit,
  the admission fails and the job waits. Waiting jobs are retried in rounds with departures, and
  the first that fails blocks its requested type. A job whose request only registered nodes that
  are not READY run waits for them (in both modes), neither dropped nor "fits nowhere".
- "paper" (max-sum-throughput policy, `max_sum_throughput.py`): each round the LP
  max sum T_mj X_mj, sum_j X_mj <= 1, sum_m s_mj X_mj <= n_j over all active jobs is solved through its
  dual (one price per GPU type, exact coordinate descent over the breakpoints); each job goes to the
  type of its largest reduced profit T_mj - price_j s_mj. Running jobs move when their type changes
  and there is room; waiting jobs start in order of reduced profit, and a large job never blocks a
  smaller one. A running opaque job (docs/opaque-jobs.md) stays where it runs, its GPUs off the LP:
  its throughput is nominal, below any real job's, so the LP counted its GPUs as free to others.
  A job that fits nowhere names why, as fcfs does (why_not.py): GPU types the cluster lacks, more
  GPUs than it has of one type, no count that holds it in memory, else no Cell of its count on
  each type (the artifact drops it: "N GPUs of no type can run it", the cause for one without a count).

Simplifies: the binary program is solved by a bounded branch and bound over at most 3 moves (the
12 best moves per level), not CPLEX; the paper mode has no time-slicing between rounds (Gavel's
6-minute time shares would restart long LLM jobs every round), so an allocation is sticky and the
priorities X_mj / f_mj reduce to the reduced profits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tessera.controller.core.placement import BEST_FIT, SCATTER
from tessera.controller.core.policies import why_not
from tessera.controller.core.policies.common import Alloc, Board, free_text, place_as_requested
from tessera.controller.core.policy import Mode, RoundContext, queue_key
from tessera.controller.core.snapshot import Decision, JobView, PendingKind

PAPER = Mode.PAPER
ARTIFACT = Mode.ARTIFACT
INFEASIBLE = -1e9
MAX_MOVES = 3
BRANCH = 12


@dataclass(frozen=True)
class GavelOptions:
    """`move_min_gain` m (paper mode): a running job moves to another type only when its throughput
    there beats its current one by 1 + m. 0 (the replays, and the paper, whose rounds move jobs
    for any gain in price-adjusted profit) moves it whenever the allocation says so; the live
    controller passes --min-gain (0.2): a live audit saw jobs restarted A40 -> A100 for 0.4% more
    samples/s, one of them four times in six minutes, each restart a checkpoint and a relaunch."""

    move_min_gain: float = 0.0


class GavelPolicy:
    def __init__(self, mode: Mode = PAPER, options: GavelOptions | None = None) -> None:
        self.mode = Mode(mode)
        self.options = options or GavelOptions()

    @property
    def name(self) -> str:
        return "gavel"

    def plan(self, ctx: RoundContext) -> list[Decision]:
        b = Board(ctx, self.name)
        if self.mode == ARTIFACT:
            _Artifact(b).round()
        else:
            _Paper(b, self.options.move_min_gain).round()
        return b.decisions(opportunistic=False)


def _counts(ctx: RoundContext, job: JobView, types: list[str] | None = None) -> dict[str, int]:
    """The GPUs Gavel gives the job on each of `types` (default: the READY ones) it may use, its
    scale factor there: its hint on every type, else the fewest it fits on in memory there (none
    where it fits on no count). The first type's count for all kept a 7B model that runs on 2 x
    A100 or 8 x A10 off 4 idle A100 (8 > 4)."""
    ts = [t for t in (ctx.types() if types is None else types) if job.may_use(t)]
    if job.gpus_hint:
        return dict.fromkeys(ts, job.gpus_hint)
    return why_not.fewest(ctx, job, ts)


WAITS = "gavel: waiting for nodes: no READY GPU type runs its request; "


def _nowhere(ctx: RoundContext, job: JobView) -> str:
    """Why no READY type runs the job and no registered node coming back would (why_not.request_cause,
    over its count on each registered type)."""
    s = why_not.round_supply(ctx, job)
    return why_not.request_cause(ctx, job, s, _counts(ctx, job, sorted(s.registered))) or \
        "no GPU type runs its request"


def _waits_for(ctx: RoundContext, job: JobView) -> str:
    """What the job waits for where its request runs on no READY type but registered nodes, once
    back, would run it (why_not.if_back): its count on each registered type (`_counts`); "" when
    none would."""
    s = why_not.round_supply(ctx, job)
    counts = _counts(ctx, job, sorted(s.registered))
    back = why_not.if_back(ctx, job, s, counts.items()) if counts else []
    return why_not.back_text(ctx, s, back) if back else ""


class _Artifact:
    def __init__(self, b: Board) -> None:
        self.b = b
        self.ctx = b.ctx
        self.types = self.ctx.types()

    def thr_dp(self, job: JobView, t: str, n: int) -> float:
        ctx = self.ctx
        if not ctx.dp_fits(job, t, n):
            return INFEASIBLE
        v = ctx.throughput(job, t, n, ctx.ideal_nodes(t, n))
        return v if v > 0 else INFEASIBLE

    def round(self) -> None:
        ctx, b = self.ctx, self.b
        departures = ctx.snap.departures > 0 or ctx.snap.arrivals is None
        older = [j for j in ctx.pending if j.id not in ctx.arrivals]
        if departures:
            blocked: set[str] = set()
            for j in older:
                req = j.gpu_type_hint
                if req in blocked:
                    b.pend(j, PendingKind.WAITING, f"gavel: waiting behind an earlier job asking for {req}")
                    continue
                if self.fit(j) is False:  # one waiting for nodes of its type to come back blocks nobody
                    blocked.add(req)
        for j in ctx.pending:
            if j.id not in ctx.arrivals:
                continue
            back = self.back(j, _counts(ctx, j))
            if back == "":
                b.drop(j, f"gavel: dropped: {j.gpus_hint} GPUs of no type can run it" if j.gpus_hint else
                       f"gavel: dropped: {_nowhere(ctx, j)}")
            elif back:
                b.pend(j, PendingKind.NO_ROOM_NOW, WAITS + back)
            else:
                self.fit(j)

    def runs_nowhere(self, job: JobView, counts: dict[str, int]) -> bool:
        ctx = self.ctx
        return not any(n <= ctx.total_gpus(t) and ctx.throughput(job, t, n, ctx.ideal_nodes(t, n)) > 0
                       for t, n in counts.items())

    def back(self, job: JobView, counts: dict[str, int]) -> str | None:
        """None when a READY type runs its count there (`_counts`); else what it waits for
        (`_waits_for`), "" when registered nodes coming back would not run it either."""
        return _waits_for(self.ctx, job) if self.runs_nowhere(job, counts) else None

    def fit(self, job: JobView) -> bool | None:
        """Whether the job started; None when it waits for registered nodes to come back."""
        ctx, b = self.ctx, self.b
        counts = _counts(ctx, job)
        if back := self.back(job, counts):
            b.pend(job, PendingKind.NO_ROOM_NOW, WAITS + back)
            return None
        running = sorted(b.allocs.values(), key=lambda a: (a.orig.since if a.orig else 1e18, queue_key(a.job)))
        sol = self.solve(running, job, counts)
        if sol is None:
            b.pend(job, PendingKind.NO_ROOM_NOW,
                   "gavel: not admitted: the GPUs of each type are all allocated (binary program infeasible)")
            return False
        new_t, moves = sol
        n = counts[new_t]
        saved = [(a, a.gpu_type, a.slices) for a, _ in moves]
        for a, _ in moves:
            b.release(a)
        placed: list[tuple[Alloc, str]] = []
        ok = True
        for a, t in moves:
            sl = place_as_requested(b, a.job, t, a.gpus, SCATTER, True, self._checker(a.job, t, a.gpus))
            if sl is None:
                ok = False
                break
            b.ctx.state.take(sl, t)
            placed.append((a, t))
            a.gpu_type, a.slices = t, sl
        target = None
        if ok:
            target = place_as_requested(b, job, new_t, n, SCATTER, True, lambda k: self._ok(job, new_t, n, k))
        if not ok or target is None:
            for a, t in placed:
                b.ctx.state.release(a.slices, t)
            for a, t0, sl0 in saved:
                a.gpu_type, a.slices = t0, sl0
                b.ctx.state.take(sl0, t0)
            b.pend(job, PendingKind.NO_ROOM_NOW,
                   f"gavel: admitted to {n} x {new_t} but the placement failed (fragmentation or "
                   f"relaxed locality out of memory); waiting")
            return False
        for a, t in placed:
            a.est = ctx.best(a.job, t, a.gpus, len(a.slices))
            a.note = f"type changed by Gavel's admission of {job.id}"
        b.start(job, new_t, target, f"admitted by Gavel's binary program ({len(moves)} jobs change type)")
        return True

    def _checker(self, job: JobView, t: str, n: int) -> Callable[[int], bool]:
        return lambda nodes: self._ok(job, t, n, nodes)

    def _ok(self, job: JobView, t: str, n: int, nodes: int) -> bool:
        return job.may_use(t) and self.ctx.dp_fits(job, t, n) and self.ctx.throughput(job, t, n, nodes) > 0

    def solve(self, running: list[Alloc], job: JobView,
              counts: dict[str, int]) -> tuple[str, list[tuple[Alloc, str]]] | None:
        """max sum T over (running jobs + job) x type, totals per type, <= 3 running jobs moved; the
        job on type t takes counts[t] GPUs."""
        ctx = self.ctx
        cap = {t: ctx.total_gpus(t) for t in self.types}
        use = dict.fromkeys(self.types, 0)
        rows = []
        for a in running:
            use[a.gpu_type] += a.gpus
            tv = {t: self.thr_dp(a.job, t, a.gpus) for t in self.types}
            rows.append((a, tv))
        moves_from: dict[str, list[tuple[float, int, str]]] = {t: [] for t in self.types}
        positive: list[tuple[float, int, str]] = []
        for i, (a, tv) in enumerate(rows):
            for t in self.types:
                if t == a.gpu_type or not a.job.may_use(t):
                    continue
                g = tv[t] - tv[a.gpu_type]
                moves_from[a.gpu_type].append((g, i, t))
                if g > 0:
                    positive.append((g, i, t))
        for lst in moves_from.values():
            lst.sort(key=lambda x: (-x[0], x[1], x[2]))
        positive.sort(key=lambda x: (-x[0], x[1], x[2]))
        max_pos = positive[0][0] if positive else 0.0
        tnew = {t: self.thr_dp(job, t, counts[t]) if t in counts else INFEASIBLE for t in self.types}
        best: list[tuple[float, str, list[tuple[int, str]]]] = []

        def dfs(use: dict[str, int], value: float, moves: list[tuple[int, str]], t_new: str) -> None:
            over = [t for t in self.types if use[t] > cap[t]]
            if not over and (not best or value > best[0][0]):
                best[:] = [(value, t_new, list(moves))]
            if len(moves) >= MAX_MOVES:
                return
            if not over and best and value + (MAX_MOVES - len(moves)) * max_pos <= best[0][0]:
                return
            moved = {i for i, _ in moves}
            pool = moves_from[over[0]] if over else positive
            k = 0
            for g, i, t in pool:
                if i in moved:
                    continue
                a = rows[i][0]
                if use[t] + a.gpus > cap[t]:
                    continue
                k += 1
                if k > BRANCH:
                    break
                use2 = dict(use)
                use2[a.gpu_type] -= a.gpus
                use2[t] += a.gpus
                dfs(use2, value + g, [*moves, (i, t)], t_new)

        base = sum(tv[a.gpu_type] for a, tv in rows)
        for t in sorted(self.types, key=lambda t: -tnew[t]):
            if t not in counts or counts[t] > cap[t]:
                continue
            use2 = dict(use)
            use2[t] += counts[t]
            dfs(use2, base + tnew[t], [], t)
        if not best:
            return None
        _, t_new, mv = best[0]
        return t_new, [(rows[i][0], t) for i, t in mv]


class _Paper:
    def __init__(self, b: Board, move_min_gain: float = 0.0) -> None:
        self.b = b
        self.ctx = b.ctx
        self.types = self.ctx.types()
        self.move_min_gain = move_min_gain

    def _pays(self, j: JobView, a: Alloc, t: str, n: int, thr: dict[str, float]) -> bool:
        """Whether moving running job j from its type to t is worth a restart: throughput on t at
        least 1 + move_min_gain times what it has now (always, at 0)."""
        if self.move_min_gain <= 0:
            return True
        now = self.ctx.throughput(j, a.gpu_type, a.gpus, len(a.slices))
        return thr.get(t, 0.0) >= (1 + self.move_min_gain) * now

    def round(self) -> None:
        ctx, b = self.ctx, self.b
        # (job, its GPUs on each type, its allocation): a running job keeps its count on any type.
        jobs: list[tuple[JobView, dict[str, int], Alloc | None]] = []
        # A running opaque job stays put, its GPUs off the LP: its throughput is nominal (1 iteration/s),
        # so every real job outbid it and the price of its type counted its GPUs as free for them.
        pinned: dict[str, int] = {}
        for a in b.allocs.values():
            if a.job.opaque:
                pinned[a.gpu_type] = pinned.get(a.gpu_type, 0) + a.gpus
            else:
                jobs.append((a.job, dict.fromkeys(self.types, a.gpus), a))
        for j in ctx.pending:
            if counts := _counts(ctx, j):
                jobs.append((j, counts, None))
            elif back := _waits_for(ctx, j):  # no count on a READY type
                b.pend(j, PendingKind.NO_ROOM_NOW, WAITS + back)
            else:  # (it read "gavel: waiting", which said neither why nor for what)
                b.pend(j, PendingKind.FITS_NOWHERE, f"gavel: fits nowhere: {_nowhere(ctx, j)}")
        thr = [{t: ctx.throughput(j, t, ns[t], ctx.ideal_nodes(t, ns[t]))
                if t in ns and ns[t] <= ctx.total_gpus(t) and j.may_use(t) else 0.0 for t in self.types}
               for j, ns, _ in jobs]
        price = self.prices(jobs, thr, pinned)
        want: list[tuple[float, int, list[str]]] = []
        for i, (j, ns, cur) in enumerate(jobs):
            red = {t: thr[i][t] - price[t] * ns[t] for t in self.types if thr[i][t] > 0}
            if not red:
                if cur is None and (back := _waits_for(ctx, j)):
                    b.pend(j, PendingKind.NO_ROOM_NOW, WAITS + back)
                elif cur is None:
                    b.pend(j, PendingKind.FITS_NOWHERE, f"gavel: fits nowhere: {_nowhere(ctx, j)}")
                continue
            # The LP leaves a job's reduced profit equal on the types it would split its time over:
            # a job whose first such type is full starts on the next (five identical jobs all went
            # to the 4 A100, the fifth waiting while 2 A40 sat idle: a live audit).
            order = sorted(red, key=lambda x: (-red[x], self.types.index(x)))
            top = red[order[0]]
            want.append((top, i, [x for x in order if red[x] >= top - 1e-6 * max(1.0, abs(top))]))
        # Running jobs move first (they free GPUs), then waiting jobs start; each by reduced profit.
        want.sort(key=lambda w: (jobs[w[1]][2] is None, -w[0], queue_key(jobs[w[1]][0])))
        for profit, i, ties in want:
            j, counts, held = jobs[i]
            t = ties[0]
            n = counts[t]
            if held is not None:
                a = held
                if a.gpu_type == t or not self._pays(j, a, t, n, thr[i]):
                    continue
                b.release(a)
                sl = b.place(t, n, BEST_FIT)
                if sl is None:
                    b.ctx.state.take(a.slices, a.gpu_type)
                    continue
                old = a.gpu_type
                b.reassign(a, t, sl, f"Gavel's allocation moves it from {old} (price-adjusted gain)",
                           already_released=True)
            else:
                for t in ties:
                    n = counts[t]
                    sl = b.place(t, n, BEST_FIT)
                    if sl is not None and ctx.throughput(j, t, n, len(sl)) > 0:
                        break
                else:
                    t, n = ties[0], counts[ties[0]]
                    sl = None
                if sl is None:
                    b.pend(j, PendingKind.NO_ROOM_NOW,
                           f"gavel: its share is {n} x {t} (the allocation's price per {t} GPU: "
                           f"{price[t]:.2f}) and that does not fit now; smaller jobs may pass it; {free_text(ctx)}")
                    continue
                b.start(j, t, sl, f"Gavel's max-sum-throughput share (reduced profit {profit:.1f})")

    def prices(self, jobs: list[tuple[JobView, dict[str, int], Alloc | None]],
               thr: list[dict[str, float]], pinned: dict[str, int]) -> dict[str, float]:
        ctx = self.ctx
        lam = dict.fromkeys(self.types, 0.0)
        for _ in range(30):
            changed = False
            for t in self.types:
                cap = ctx.total_gpus(t) - pinned.get(t, 0)
                bps = []
                for i, (_, ns, _) in enumerate(jobs):
                    if thr[i][t] <= 0:
                        continue
                    alt = max([0.0] + [thr[i][u] - lam[u] * ns[u] for u in self.types if u != t and thr[i][u] > 0])
                    bp = (thr[i][t] - alt) / ns[t]
                    if bp > 0:
                        bps.append((bp, ns[t]))
                bps.sort(key=lambda x: -x[0])
                new, used = 0.0, 0
                for bp, n in bps:
                    if used + n > cap:
                        new = bp * (1 + 1e-9) + 1e-12  # just past the job that does not fit
                        break
                    used += n
                if abs(new - lam[t]) > 1e-9:
                    changed = True
                lam[t] = new
            if not changed:
                break
        return lam
