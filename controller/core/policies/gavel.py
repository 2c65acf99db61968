"""Gavel (OSDI'20) as a baseline: heterogeneity-aware allocation over GPU types at the GPU count the
user asked for (docs/reference/baselines.md Sec. 3).

- "artifact" (Crius `GavelSched`): no time fractions. A new job is dropped when no GPU type can run
  its request; otherwise it is admitted by a binary program over all running jobs plus itself:
  each job on exactly one type, the GPUs of each type within its total, at most 3 running jobs
  changing type, maximise the sum of (data-parallel-profiled) throughputs. Jobs whose type changed
  are re-placed (best locality, then relaxed, nodes with most idle GPUs first); if any does not fit,
  the admission fails and the job waits. Waiting jobs are retried in rounds with departures, and
  the first that fails blocks its requested type. A job whose request only registered nodes that
  are not READY run waits for them (in both modes), neither dropped nor "fits nowhere".
- "paper" (max-sum-throughput policy, `max_sum_throughput.py`): each round the LP
  max sum T_mj X_mj, sum_j X_mj <= 1, sum_m s_m X_mj <= n_j over all active jobs is solved through its
  dual (one price per GPU type, exact coordinate descent over the breakpoints); each job goes to the
  type of its largest reduced profit T_mj - price_j s_m. Running jobs move when their type changes
  and there is room; waiting jobs start in order of reduced profit, and a large job never blocks a
  smaller one.

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
from tessera.controller.core.policies.common import Alloc, Board, place_as_requested
from tessera.controller.core.policy import Mode, RoundContext, queue_key
from tessera.controller.core.snapshot import Decision, JobView, PendingKind

PAPER = Mode.PAPER
ARTIFACT = Mode.ARTIFACT
INFEASIBLE = -1e9
MAX_MOVES = 3
BRANCH = 12


@dataclass(frozen=True)
class GavelOptions:
    """Gavel has no options besides the mode."""


class GavelPolicy:
    def __init__(self, mode: Mode = PAPER) -> None:
        self.mode = Mode(mode)

    @property
    def name(self) -> str:
        return "gavel"

    def plan(self, ctx: RoundContext) -> list[Decision]:
        b = Board(ctx, self.name)
        if self.mode == ARTIFACT:
            _Artifact(b).round()
        else:
            _Paper(b).round()
        return b.decisions(opportunistic=False)


def _count(ctx: RoundContext, job: JobView, types: list[str] | None = None) -> int:
    """The GPUs Gavel asks for: the job's hint, else the fewest it fits on of the first of `types`
    (default: the READY ones) it may use and fits on."""
    if job.gpus_hint:
        return job.gpus_hint
    for t in ctx.types() if types is None else types:
        if not job.may_use(t):
            continue
        cs = ctx.gpu_counts(job, t)
        if cs:
            return cs[0]
    return 0


WAITS = "gavel: waiting for nodes: no READY GPU type runs its request; "


def _nowhere(ctx: RoundContext, job: JobView) -> str:
    """Why no count of any type runs the job: the types it asks for are not in the cluster, or none
    of its types holds it in memory."""
    s = why_not.round_supply(ctx, job)
    cause = why_not.type_cause(job, ctx.snap, s)
    return cause[1] if cause is not None and cause[0] else why_not.memory_cause(s, {})


def _waits_for(ctx: RoundContext, job: JobView) -> str:
    """What the job waits for where its request runs on no READY type but registered nodes, once
    back, would run it (why_not.if_back): the count `_count` asks for over the registered types, on
    each of them; "" when none would."""
    s = why_not.round_supply(ctx, job)
    n = _count(ctx, job, sorted(s.registered))
    back = why_not.if_back(ctx, job, s, ((t, n) for t in s.registered)) if n else []
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
            n = _count(ctx, j)
            back = self.back(j, n)
            if back == "":
                b.drop(j, f"gavel: dropped: {n} GPUs of no type can run it" if n else
                       f"gavel: dropped: {_nowhere(ctx, j)}")
            elif back:
                b.pend(j, PendingKind.NO_ROOM_NOW, WAITS + back)
            else:
                self.fit(j)

    def runs_nowhere(self, job: JobView, n: int) -> bool:
        return not any(n and job.may_use(t) and self.ctx.throughput(job, t, n, self.ctx.ideal_nodes(t, n)) > 0
                       for t in self.types)

    def back(self, job: JobView, n: int) -> str | None:
        """None when a READY type runs its n GPUs; else what it waits for (`_waits_for`), "" when
        registered nodes coming back would not run it either."""
        return _waits_for(self.ctx, job) if self.runs_nowhere(job, n) else None

    def fit(self, job: JobView) -> bool | None:
        """Whether the job started; None when it waits for registered nodes to come back."""
        ctx, b = self.ctx, self.b
        n = _count(ctx, job)
        if back := self.back(job, n):
            b.pend(job, PendingKind.NO_ROOM_NOW, WAITS + back)
            return None
        running = sorted(b.allocs.values(), key=lambda a: (a.orig.since if a.orig else 1e18, queue_key(a.job)))
        sol = self.solve(running, job, n)
        if sol is None:
            b.pend(job, PendingKind.NO_ROOM_NOW,
                   "gavel: not admitted: the GPUs of each type are all allocated (binary program infeasible)")
            return False
        new_t, moves = sol
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

    def solve(self, running: list[Alloc], job: JobView, n: int) -> tuple[str, list[tuple[Alloc, str]]] | None:
        """max sum T over (running jobs + job) x type, totals per type, <= 3 running jobs moved."""
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
        tnew = {t: self.thr_dp(job, t, n) for t in self.types}
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
            if n > cap[t] or not job.may_use(t):
                continue
            use2 = dict(use)
            use2[t] += n
            dfs(use2, base + tnew[t], [], t)
        if not best:
            return None
        _, t_new, mv = best[0]
        return t_new, [(rows[i][0], t) for i, t in mv]


class _Paper:
    def __init__(self, b: Board) -> None:
        self.b = b
        self.ctx = b.ctx
        self.types = self.ctx.types()

    def round(self) -> None:
        ctx, b = self.ctx, self.b
        jobs: list[tuple[JobView, int, Alloc | None]] = []
        for a in b.allocs.values():
            jobs.append((a.job, a.gpus, a))
        for j in ctx.pending:
            n = _count(ctx, j)
            if n:
                jobs.append((j, n, None))
            elif back := _waits_for(ctx, j):  # no count on a READY type
                b.pend(j, PendingKind.NO_ROOM_NOW, WAITS + back)
            else:  # (it read "gavel: waiting", which said neither why nor for what)
                b.pend(j, PendingKind.FITS_NOWHERE, f"gavel: fits nowhere: {_nowhere(ctx, j)}")
        thr = [{t: ctx.throughput(j, t, n, ctx.ideal_nodes(t, n)) if n <= ctx.total_gpus(t) and j.may_use(t) else 0.0
                for t in self.types} for j, n, _ in jobs]
        price = self.prices(jobs, thr)
        want: list[tuple[float, int, str]] = []
        for i, (j, n, cur) in enumerate(jobs):
            red = {t: thr[i][t] - price[t] * n for t in self.types if thr[i][t] > 0}
            if not red:
                if cur is None and (back := _waits_for(ctx, j)):
                    b.pend(j, PendingKind.NO_ROOM_NOW, WAITS + back)
                elif cur is None:
                    b.pend(j, PendingKind.FITS_NOWHERE, "gavel: fits nowhere: no GPU type runs its request")
                continue
            t = max(self.types, key=lambda x: (red.get(x, -1e18), -self.types.index(x)))
            want.append((red[t], i, t))
        # Running jobs move first (they free GPUs), then waiting jobs start; each by reduced profit.
        want.sort(key=lambda w: (jobs[w[1]][2] is None, -w[0], queue_key(jobs[w[1]][0])))
        for profit, i, t in want:
            j, n, held = jobs[i]
            if held is not None:
                a = held
                if a.gpu_type == t:
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
                sl = b.place(t, n, BEST_FIT)
                if sl is None or ctx.throughput(j, t, n, len(sl)) <= 0:
                    b.pend(j, PendingKind.NO_ROOM_NOW,
                           f"gavel: its share is {n} x {t} (price {price[t]:.2f}/GPU) and that does not "
                           f"fit now; smaller jobs may pass it")
                    continue
                b.start(j, t, sl, f"Gavel's max-sum-throughput share (reduced profit {profit:.1f})")

    def prices(self, jobs: list[tuple[JobView, int, Alloc | None]], thr: list[dict[str, float]]) -> dict[str, float]:
        ctx = self.ctx
        lam = dict.fromkeys(self.types, 0.0)
        for _ in range(30):
            changed = False
            for t in self.types:
                cap = ctx.total_gpus(t)
                bps = []
                for i, (_, n, _) in enumerate(jobs):
                    if thr[i][t] <= 0:
                        continue
                    alt = max([0.0] + [thr[i][u] - lam[u] * n for u in self.types if u != t and thr[i][u] > 0])
                    bp = (thr[i][t] - alt) / n
                    if bp > 0:
                        bps.append((bp, n))
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
