"""Morphling (MLSys'25, ../shared/seeds/morphling.txt Sec. 3-5, Algorithm 1): the execution plan is
a scheduling dimension next to GPU count and placement, CPUs are a resource next to GPUs, and
allocation follows the slopes of the jobs' resource-sensitivity curves, with the least sensitive
job shrunk first. docs/scheduler-morphling.md says how it decides and what is approximated.

One round (`MorphlingPolicy.plan`):
1. Privileged jobs (Algorithm 1 lines 2-3): pending guaranteed jobs whose minRes fits in what is
   left of their tenant's quota (quota usage = minRes, Sec. 5), in queue order, each placed at its
   minRes; to make room any job over its minimum may be shrunk or preempted (line 14, case 2).
2. SortBySlope (line 4): every other job, pending or running, proposes its best step up its curve
   (the highest slope: value gained per GPU); the highest slope is served first. A step that does
   not fit the free GPUs shrinks the lowest-slope jobs over their minimum on a node (line 14, case
   1: only while the step gains more than the shrunk jobs lose). Shrinking to 0 is a preemption.
3. Values count a reconfiguration's cost (Snapshot.restart_cost_s): a running job moves, grows or
   changes plan only when its remaining time at the new point plus the cost is shorter.

Guaranteed jobs are never preempted, never shrunk below minRes, and never paused for a
reconfiguration unless they are ahead of their promise by more than its cost.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from tessera.controller.core.policies import why_not
from tessera.controller.core.policies.common import Alloc, Board, free_text
from tessera.controller.core.policies.morphling_curves import (
    CpuNeed,
    Curves,
    MorphlingInputError,
    Point,
    remaining_time,
)
from tessera.controller.core.policies.morphling_texts import gpus, held_at_minimum, victim
from tessera.controller.core.policy import Mode, RoundContext
from tessera.controller.core.snapshot import Decision, JobView, PendingKind, Slice


@dataclass(frozen=True)
class MorphlingOptions:
    # Seconds one reconfiguration costs when the snapshot does not say (Snapshot.restart_cost_s 0):
    # the Morphling artifact's measured 260 s per placement change (data/README.md).
    restart_cost_s: float = 260.0
    # CPU threads a plan needs per GPU, and what ZeRO-Offload needs on top (0 = CPUs not scheduled;
    # a node that reports no CPUs is never limited by them).
    cpus_per_gpu: int = 0
    offload_cpus_per_gpu: int = 0
    # A shrink or preemption of running work happens only when the job served gains this many
    # times what the shrunk jobs lose (1 = Algorithm 1's plain slope comparison).
    preempt_factor: float = 2.0
    # Iterations assumed for a job that does not say how many it has (live jobs without a count).
    unknown_iterations: float = 1e6
    # Extra seconds of lead a guaranteed job must keep over its promise after a reconfiguration.
    guarantee_margin_s: float = 60.0
    # Hysteresis against thrashing: a running job grows or moves only when its value (completion
    # rate, the reconfiguration's cost included) gains this factor (1 = any gain).
    grow_factor: float = 1.5
    # Makespan guard (docs/scheduler-morphling.md, "Critical jobs"): a best-effort job whose
    # remaining time at its most efficient point is at least `critical_factor` x the drain time of
    # all known work is placed before the slope order (0 = off); one that holds its point keeps it
    # while its whole length there is at least `critical_keep` x this bound. Tuned on morphling-base.
    critical_factor: float = 0.85
    critical_keep: float = 0.1

    def __post_init__(self) -> None:
        for name in ("restart_cost_s", "cpus_per_gpu", "offload_cpus_per_gpu", "guarantee_margin_s",
                     "critical_factor", "critical_keep"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise MorphlingInputError(f"option {name} must be a finite number >= 0, got {v!r}")
        for name in ("preempt_factor", "grow_factor"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 1:
                raise MorphlingInputError(f"option {name} must be a finite number >= 1, got {v!r}")
        if not self.unknown_iterations > 0:
            raise MorphlingInputError(f"option unknown_iterations must be > 0, got {self.unknown_iterations!r}")


class MorphlingPolicy:
    # Algorithm 1 places the admitted guaranteed jobs first itself (lines 2-3, at minRes), so the
    # guarantee layer does not place them before it (controller/core/preplace.py).
    places_admitted = True

    def __init__(self, options: MorphlingOptions | None = None, mode: Mode = Mode.PAPER) -> None:
        self.options = options or MorphlingOptions()
        # Recorded like every policy's; the paper and the artifact describe the same algorithm.
        self.mode = Mode(mode)

    @property
    def name(self) -> str:
        return "morphling"

    def plan(self, ctx: RoundContext) -> list[Decision]:
        return _Round(ctx, self.options).run()


@dataclass
class _Step:
    """One victim's part of making room: shrink to `to` (kept slices `keep`) or preempt (to None)."""

    jid: str
    to: Point | None
    keep: tuple[Slice, ...]
    freed: int
    loss: float


def _secs(x: float) -> str:
    """Seconds as the reasons write them: 13,968; under 10, to the tenth (a live demo read "the 0 s")."""
    return f"{x:,.0f}" if x >= 10 else f"{x:.1f}"


def cheapest(points: list[Point]) -> Point | None:
    """The point with the fewest GPU-seconds per iteration (the fastest among equals); None if none."""
    return min(points, key=lambda p: (p.it * p.gpus, p.it)) if points else None


class _Round:
    def __init__(self, ctx: RoundContext, o: MorphlingOptions) -> None:
        self.ctx = ctx
        self.o = o
        self.C = ctx.snap.restart_cost_s if ctx.snap.restart_cost_s > 0 else o.restart_cost_s
        self.b = Board(ctx, "morphling")
        self.cv = Curves(ctx, CpuNeed(o.cpus_per_gpu, o.offload_cpus_per_gpu))
        self.now = ctx.snap.now
        self.jobs: dict[str, JobView] = {j.id: j for j in ctx.pending}
        self.jobs.update((r.job.id, r.job) for r in ctx.running.values())
        # The point each placed job holds this round, and whether that differs from how it runs now.
        self.point: dict[str, Point] = {}
        self.changed: dict[str, bool] = {}
        self.touched: set[str] = set()  # the jobs the last `schedule` shrank or preempted
        self.floor: dict[str, int] = {}  # critical jobs: the GPUs they keep this round
        self.placing_critical = False  # a critical job's placement shrinks others, never preempts
        self.critical_note = ""
        self._held: dict[str, list[str]] = {}  # pend_reason: per GPU type, the jobs none of which gives a GPU
        self.cpu_free: dict[str, float] = {
            n.id: float(max(0, n.cpus - n.busy_cpus)) if n.cpus > 0 else math.inf for n in ctx.snap.nodes}
        for jid, a in self.b.allocs.items():
            if a.est is not None:
                self.point[jid] = Point(a.gpu_type, a.gpus, a.nodes, a.est)
            self.changed[jid] = False

    # ------------------------------------------------------------------ values

    def value(self, job: JobView, p: Point, changed: bool) -> float:
        """Completion rate 1 / T at point p (T: the remaining iterations there, plus the cost of a
        reconfiguration when p is not how the job runs now)."""
        t = remaining_time(job, p.it, self.o.unknown_iterations) + (self.C if changed else 0.0)
        return 1.0 / t if t > 0 else math.inf

    def cur_value(self, jid: str) -> float:
        p = self.point.get(jid)
        if p is None or jid not in self.b.allocs:
            return 0.0
        return self.value(self.jobs[jid], p, self.changed[jid])

    def running(self, jid: str) -> bool:
        return jid in self.ctx.running

    def may_pause(self, job: JobView) -> bool:
        """A guaranteed running job may be reconfigured only with lead enough to pay the pause."""
        if not self.cv.guaranteed(job) or not self.running(job.id) or self.changed.get(job.id):
            return True
        return self.cv.slack_s(job, self.now, self.C) >= self.C + self.o.guarantee_margin_s

    def min_gpus(self, job: JobView) -> int:
        m = self.cv.min_res(job)
        return m.gpus if m is not None else 0

    # ------------------------------------------------------------------ the round

    def run(self) -> list[Decision]:
        self.privileged()
        self.critical()
        self.by_slope()
        for jid, j in list(self.b.waiting.items()):
            if jid not in self.b.reasons:
                self.pend_reason(j)
        return self.b.decisions(opportunistic=False)

    def privileged(self) -> None:
        """Algorithm 1 lines 2-3: the guaranteed jobs admitted within quota this round (the
        guarantee layer admits them and hides those over quota), in queue order, at minRes."""
        # Largest minRes first (first-fit decreasing): small guaranteed jobs placed first would
        # split the nodes a large one needs whole.
        admitted = [j for j in self.ctx.pending if self.cv.guaranteed(j)]
        admitted.sort(key=lambda j: (-(self.min_gpus(j)), j.submit_time, j.id))
        for j in admitted:
            m = self.cv.min_res(j)
            if m is None:
                self.b.pend(j, PendingKind.NO_ROOM_NOW,
                            "morphling: guaranteed, but no estimate of its promise on this cluster")
                continue
            if not self.schedule(j, m, privileged=True, gain=math.inf):
                self.b.pend(j, PendingKind.NO_ROOM_NOW,
                            f"morphling: guaranteed, minRes {m.gpus} x {m.gpu_type} (plan {m.plan or 'best'}), "
                            f"but no node can free that many GPUs from jobs over their minimum; "
                            f"{free_text(self.ctx)}")

    def efficient(self, job: JobView) -> Point | None:
        """The job's cheapest point in GPU-seconds per iteration (the fastest among equals)."""
        return cheapest(self.cv.hull(job))

    def critical(self) -> None:
        """Makespan guard, not in Algorithm 1: its slopes serve short jobs first, and a long job
        waits as long as anything shorter can use a GPU (LLaMA-30B jobs of morphling-base waited
        30,000 s). drain = every known job's remaining GPU-seconds at its most efficient point over
        the cluster's GPUs, a bound no schedule of the known work beats. A best-effort job whose own
        remaining time there is at least `critical_factor` x drain would end last if it waited, so
        it gets, before the slope order, its cheapest point that ends within drain (the fastest if
        none does), shrinking best-effort jobs over their minimum but preempting none, longest
        first. A best-effort job that holds that point (placed by the guard or not: no state is
        kept between rounds) keeps it (never shrunk below, never preempted) as long as its whole
        length there is at least `critical_keep` x the bound: drain grows with every arrival and
        the job's remaining time shrinks as it runs, and a job preempted near its end waited behind
        every shorter one again."""
        cf = self.o.critical_factor
        cap = sum(self.ctx.total_gpus(t) for t in self.ctx.types())
        if not cf or cap <= 0:
            return
        work = 0.0
        cands: list[tuple[float, str, float]] = []  # remaining and whole time at the cheapest point
        for jid in sorted(self.jobs):
            job = self.jobs[jid]
            e = self.efficient(job)
            if e is None:
                continue
            t = remaining_time(job, e.it, self.o.unknown_iterations)
            work += t * e.gpus
            if not self.cv.guaranteed(job) and job.iterations > 0 and jid not in self.b.suspended:
                cands.append((t, jid, job.iterations * e.it))
        drain = work / cap
        crit: list[tuple[float, str, Point]] = []
        for t, jid, whole in cands:
            job = self.jobs[jid]
            hull = self.cv.hull(job)
            ends = [p for p in hull if remaining_time(job, p.it, self.o.unknown_iterations) <= drain]
            want = cheapest(ends) or hull[-1]
            cur = self.point.get(jid) if jid in self.b.allocs else None
            held = cur is not None and cur.gpus >= want.gpus
            if (whole >= cf * self.o.critical_keep * drain) if held else (t >= cf * drain):
                crit.append((t, jid, want))
                if held:
                    self.floor[jid] = want.gpus
        crit.sort(key=lambda c: (-c[0], c[1]))
        for t, jid, want in crit:
            if jid in self.floor or jid in self.b.suspended:
                continue  # holds its point already, or preempted this round
            job = self.jobs[jid]
            if jid in self.b.allocs and not self.value(job, want, True) > self.cur_value(jid):
                continue
            self.floor[jid] = want.gpus
            # A job alone is trivially its own critical path: say nothing rather than "1 s ... 1 s".
            self.critical_note = (f"on the makespan's critical path: {_secs(t)} s at its most efficient point, "
                                  f"at least {cf:g} x the {_secs(drain)} s the cluster needs for all known work"
                                  if len(self.jobs) > 1 else "")
            self.placing_critical = True
            placed = self.schedule(job, want, privileged=True, gain=math.inf)
            self.placing_critical = False
            if not placed:
                del self.floor[jid]

    def moves(self, jid: str) -> list[tuple[float, Point, float]]:
        """The job's steps up its curve with a positive gain, highest slope first."""
        job = self.jobs[jid]
        if jid in self.b.suspended:
            return []  # preempted this round: it waits for the next one
        if self.cv.guaranteed(job) and jid not in self.b.allocs:
            return []  # not admitted: only the privileged phase places guaranteed jobs
        cur = self.point.get(jid) if jid in self.b.allocs else None
        g0 = cur.gpus if cur is not None else 0
        v0 = self.cur_value(jid)
        if cur is not None and not self.may_pause(job):
            return []
        out = []
        # Hysteresis: a running job reconfigures only for `grow_factor` times its value now.
        hold = self.o.grow_factor if self.running(jid) and not self.changed.get(jid) else 1.0
        for p in self.cv.steps(job):
            if p.gpus <= g0:
                continue
            gain = self.value(job, p, True) - v0 * hold
            if gain > 0:
                out.append((gain / (p.gpus - g0), p, gain))
        out.sort(key=lambda sp: (-sp[0], sp[1].gpus))
        return out

    def by_slope(self) -> None:
        heap: list[tuple[float, float, str, int]] = []
        version: dict[str, int] = {}

        def push(jid: str) -> None:
            version[jid] = version.get(jid, 0) + 1
            mv = self.moves(jid)
            if mv:
                job = self.jobs[jid]
                heapq.heappush(heap, (-mv[0][0], job.submit_time, jid, version[jid]))

        for jid in sorted(self.jobs):
            if jid in self.b.waiting and jid in self.b.reasons:
                continue  # decided by the privileged phase (over quota, no room)
            push(jid)
        frozen: set[str] = set()
        while heap:
            _, _, jid, ver = heapq.heappop(heap)
            if ver != version.get(jid) or jid in frozen:
                continue
            if not self.ctx.spend():
                break
            job = self.jobs[jid]
            done = False
            for _slope, p, gain in self.moves(jid):
                if self.schedule(job, p, privileged=False, gain=gain):
                    done = True
                    for v in sorted(self.touched | {jid}):
                        if v not in frozen:
                            push(v)
                    break
            if not done:
                frozen.add(jid)

    # ------------------------------------------------------------------ ScheduleJob

    def schedule(self, job: JobView, p: Point, privileged: bool, gain: float) -> bool:
        """Give `job` point p (GPUs on p.nodes nodes, compact), shrinking or preempting jobs over
        their minimum where needed and allowed; False (nothing changed) when it cannot."""
        self.touched = set()
        st = self.ctx.state
        a = self.b.allocs.get(job.id)
        if a is not None:
            self.b.release(a)
            self._cpus(a, +1)
        q = p.gpus // p.nodes
        slices = st.place(p.gpu_type, p.gpus, nodes=p.nodes)
        pt: Point | None = None
        steps: list[_Step] = []
        if slices is not None:
            pt = self.cv.with_cpus(job, p, min(self.cpu_free[s.node_id] for s in slices))
        if pt is None:
            slices, steps, pt = self.make_room(job, p, q, privileged, gain)
        if slices is None or pt is None:
            if a is not None:
                self.ctx.state.take(a.slices, a.gpu_type)
                self._cpus(a, -1)
            return False
        for s in steps:
            self.apply_step(s, job, p if privileged and not self.placing_critical else None)
        self._commit(job, a, pt, slices)
        return True

    def _commit(self, job: JobView, a: Alloc | None, pt: Point, slices: tuple[Slice, ...]) -> None:
        st = self.ctx.state
        why = f"plan {pt.plan or 'best'}"
        if self.placing_critical and self.critical_note:
            why += f"; {self.critical_note}"
        if a is None:
            a = self.b.start(job, pt.gpu_type, slices, why, pt.est)
            self.changed[job.id] = True
        else:
            st.take(slices, pt.gpu_type)
            a.gpu_type, a.slices, a.gpus, a.est = pt.gpu_type, slices, pt.gpus, pt.est
            a.note = why
            self.changed[job.id] = True
            self.b.version += 1
        self.point[job.id] = pt
        self._cpus(a, -1)

    def _cpus(self, a: Alloc, sign: int) -> None:
        if a.est is None:
            return
        for s in a.slices:
            self.cpu_free[s.node_id] += sign * self.cv.cpu.of(a.est, len(s.gpu_indices))

    # ------------------------------------------------------------------ GetLowestSlopeOverMinJob

    def make_room(self, job: JobView, p: Point, q: int, privileged: bool,
                  gain: float) -> tuple[tuple[Slice, ...] | None, list[_Step], Point | None]:
        """The cheapest nodes on which shrinking the lowest-slope jobs over their minimum frees q
        GPUs each, and the steps; (None, [], None) when no such nodes or the loss exceeds the gain."""
        pool = self.ctx.state.pools.get(p.gpu_type)
        if pool is None:
            return None, [], None
        on_node: dict[str, list[str]] = {}
        for jid, a in self.b.allocs.items():
            if a.gpu_type == p.gpu_type and jid != job.id:
                for sl in a.slices:
                    on_node.setdefault(sl.node_id, []).append(jid)
        options: list[tuple[float, str, list[_Step]]] = []
        for g in pool.groups:
            if g.capacity < q:
                continue
            need = q - len(g.free)
            if need <= 0:
                options.append((0.0, g.node_id, []))
                continue
            got = self.victims(g.node_id, on_node.get(g.node_id, []), need)
            if got is not None:
                options.append((sum(stp.loss for stp in got), g.node_id, got))
        if len(options) < p.nodes:
            return None, [], None
        if privileged:
            # Pack guaranteed work: the node with the least room outside guaranteed minimums
            # first, so that whole nodes stay for large guaranteed jobs; then the least loss.
            def room(node: str) -> int:
                grp = self.ctx.state.group(node, p.gpu_type)
                held = sum(self.min_share(jid, node) for jid in on_node.get(node, []))
                return grp.capacity - held
            options.sort(key=lambda o: (room(o[1]), o[0], self.ctx.state.group(o[1], p.gpu_type).order))
        else:
            options.sort(key=lambda o: (o[0], self.ctx.state.group(o[1], p.gpu_type).order))
        chosen = options[:p.nodes]
        # A job asked to give GPUs on two nodes takes its deepest step (counted once).
        merged: dict[str, _Step] = {}
        for _, _, ss in chosen:
            for stp in ss:
                had = merged.get(stp.jid)
                if had is None or (stp.to.gpus if stp.to else 0) < (had.to.gpus if had.to else 0):
                    merged[stp.jid] = stp
        steps = [merged[j] for j in sorted(merged)]
        chosen_nodes = {node for _, node, _ in chosen}
        dest: set[tuple[str, int]] = set()
        for stp in steps:
            held = {sl.node_id for sl in self.b.allocs[stp.jid].slices}
            for k in stp.keep:
                if k.node_id in held:
                    continue
                ids = {(k.node_id, i) for i in k.gpu_indices}
                if k.node_id in chosen_nodes or ids & dest:
                    return None, [], None  # a move onto GPUs this placement or another move needs
                dest |= ids
        loss = sum(stp.loss for stp in steps)
        if not privileged and not gain > self.o.preempt_factor * loss:
            return None, [], None
        # The node's free GPUs after the steps: its own free ones, then what the steps release.
        slices: list[Slice] = []
        free_cpu = math.inf
        for _, node, ss in chosen:
            grp = self.ctx.state.group(node, p.gpu_type)
            avail = list(grp.free)
            for stp in steps:
                a = self.b.allocs[stp.jid]
                kept = {i for k in stp.keep if k.node_id == node for i in k.gpu_indices}
                avail += [i for sl in a.slices if sl.node_id == node for i in sl.gpu_indices if i not in kept]
            if len(avail) < q:
                return None, [], None  # merged steps left this node short
            slices.append(Slice(node, tuple(sorted(avail)[:q])))
            cpus = self.cpu_free[node] + sum(self._step_cpus(stp, node) for stp in steps)
            free_cpu = min(free_cpu, cpus)
        pt = self.cv.with_cpus(job, p, free_cpu)
        if pt is None:
            return None, [], None
        return tuple(slices), steps, pt

    def min_share(self, jid: str, node: str) -> int:
        """GPUs a job must keep on `node`: its minimum'stp share there (0 for best-effort work)."""
        m = self.min_gpus(self.jobs[jid])
        a = self.b.allocs[jid]
        if not m or not a.slices:
            return 0
        on = sum(len(sl.gpu_indices) for sl in a.slices if sl.node_id == node)
        return min(on, -(-m // len(a.slices)))

    def _step_cpus(self, s: _Step, node: str) -> float:
        a = self.b.allocs[s.jid]
        if a.est is None:
            return 0.0
        before = sum(len(sl.gpu_indices) for sl in a.slices if sl.node_id == node)
        after = sum(len(sl.gpu_indices) for sl in s.keep if sl.node_id == node)
        cpu = self.cv.cpu
        new = cpu.of(s.to.est, after) if s.to is not None else 0
        return cpu.of(a.est, before) - new

    def victims(self, node: str, jids: list[str], need: int) -> list[_Step] | None:
        """Greedy: the cheapest loss per freed GPU first, until `need` GPUs are free on the node; a
        job already asked to shrink may be asked to shrink further (its step replaced)."""
        cands: list[_Step] = []
        for jid in jids:
            cands.extend(self.shrink_options(jid, node))
        chosen: dict[str, _Step] = {}
        freed = 0
        while freed < need:
            best: _Step | None = None
            best_key = math.inf
            for s in cands:
                cur = chosen.get(s.jid)
                more = s.freed - (cur.freed if cur else 0)
                if more <= 0:
                    continue
                key = (s.loss - (cur.loss if cur else 0.0)) / min(more, need - freed)
                if key < best_key:
                    best, best_key = s, key
            if best is None:
                return None
            had = chosen.get(best.jid)
            freed += best.freed - (had.freed if had else 0)
            chosen[best.jid] = best
        return [chosen[j] for j in sorted(chosen)]

    def shrink_options(self, jid: str, node: str) -> list[_Step]:
        """How a job on `node` can give GPUs there: a smaller point on a subset of its nodes (the
        others kept first), or preemption (best-effort only). A guaranteed job keeps its minRes, its promise's
        speed, and its lead over the promise."""
        a = self.b.allocs[jid]
        job = self.jobs[jid]
        cur = self.point.get(jid)
        v0 = self.cur_value(jid)
        on = sum(len(s.gpu_indices) for s in a.slices if s.node_id == node)
        out: list[_Step] = []
        guaranteed = self.cv.guaranteed(job)
        if not self.may_pause(job):
            return out
        if cur is not None:
            floor = max(self.min_gpus(job), self.floor.get(jid, 0))
            tp = self.cv.promised_time(job) if guaranteed else math.inf
            # Nodes to keep: the others first, so that the shrink frees this one where it can.
            order = [sl for sl in a.slices if sl.node_id != node] + [sl for sl in a.slices if sl.node_id == node]
            for p in self.cv.hull(job):
                if p.gpus >= a.gpus or p.gpus < floor or p.it > tp or p.gpu_type != a.gpu_type:
                    continue
                q = p.gpus // p.nodes
                if p.nodes > len(a.slices) or any(len(sl.gpu_indices) < q for sl in order[:p.nodes]):
                    continue
                keep = tuple(Slice(sl.node_id, sl.gpu_indices[:q]) for sl in order[:p.nodes])
                freed = on - sum(len(sl.gpu_indices) for sl in keep if sl.node_id == node)
                if freed <= 0:
                    continue
                loss = v0 - self.value(job, p, True)
                out.append(_Step(jid, p, keep, freed, max(0.0, loss)))
        if not guaranteed and jid not in self.floor and not self.placing_critical:
            out.append(_Step(jid, None, (), on, v0))
        elif cur is not None and len(a.slices) == 1 and self.running(jid) and not self.changed.get(jid):
            # A guaranteed job with lead enough for a restart may move to free GPUs elsewhere
            # (defragmentation: guaranteed jobs at their minimum are otherwise never moved).
            pool = self.ctx.state.pools[a.gpu_type]
            room = sorted((len(g.free), g.order, g) for g in pool.groups if g.node_id != node and len(g.free) >= a.gpus)
            if room:
                g = room[0][2]
                dest = (Slice(g.node_id, tuple(g.free[:a.gpus])),)
                out.append(_Step(jid, cur, dest, on, max(0.0, v0 - self.value(job, cur, True))))
        return out

    def apply_step(self, s: _Step, for_job: JobView, reclaimed: Point | None) -> None:
        """`reclaimed`: the point of a guaranteed job within quota the step makes room for."""
        a = self.b.allocs[s.jid]
        gives = a.gpus - (s.to.gpus if s.to is not None else 0)
        self.touched.add(s.jid)
        self._cpus(a, +1)
        if s.to is None:
            why = victim("preempted", for_job, reclaimed, self.placing_critical, gives, a.job)
            self.b.suspend(a, f"morphling: {why}", PendingKind.NO_ROOM_NOW)
            self.point.pop(s.jid, None)
            self.changed[s.jid] = True
            return
        kept = {(k.node_id, i) for k in s.keep for i in k.gpu_indices}
        had = {(sl.node_id, i) for sl in a.slices for i in sl.gpu_indices}
        rel = tuple(Slice(sl.node_id, tuple(i for i in sl.gpu_indices if (sl.node_id, i) not in kept))
                    for sl in a.slices)
        add = tuple(Slice(k.node_id, tuple(i for i in k.gpu_indices if (k.node_id, i) not in had)) for k in s.keep)
        self.ctx.state.release(tuple(r for r in rel if r.gpu_indices), a.gpu_type)
        self.ctx.state.take(tuple(x for x in add if x.gpu_indices), a.gpu_type)
        moved = any(x.gpu_indices for x in add)
        a.slices, a.gpus, a.est = s.keep, s.to.gpus, s.to.est
        what = "moved" if moved else f"shrunk to {gpus(s.to.gpus)} (plan {s.to.plan or 'best'})"
        a.note = victim(what, for_job, reclaimed, self.placing_critical, gives)
        self.point[s.jid] = s.to
        self.changed[s.jid] = True
        self.b.version += 1
        self._cpus(a, -1)

    # ------------------------------------------------------------------ reasons

    def pend_reason(self, j: JobView) -> None:
        hull, ctx = self.cv.hull(j), self.ctx
        if not hull:  # nodes coming back (a count of a registered type) may run it: it waits for them
            s = why_not.round_supply(ctx, j)
            if back := why_not.if_back(ctx, j, s, ((t, g) for t in s.registered for g in ctx.gpu_counts(j, t))):
                self.b.pend(j, PendingKind.NO_ROOM_NOW, "morphling: waiting for nodes: no plan of this job runs on "
                            f"the READY nodes; {why_not.back_text(ctx, s, back)}")
            else:
                self.b.pend(j, PendingKind.FITS_NOWHERE,
                            "morphling: fits nowhere: no plan of this job runs on any GPU count of this cluster")
            return
        p = hull[0]
        held = self.held(p.gpu_type)
        why = (held_at_minimum(p, all(self.cv.guaranteed(self.jobs[h]) for h in held)) if held else
               f"morphling: waiting; its best step ({p.gpus} x {p.gpu_type}, plan {p.plan or 'best'}) "
               "gains less than shrinking running jobs would lose")
        self.b.pend(j, PendingKind.NO_ROOM_NOW, f"{why}; {free_text(self.ctx)}")

    def held(self, gpu_type: str) -> list[str]:
        """The jobs on `gpu_type` when none of them may give up a GPU (shrink, preemption or move:
        `shrink_options`), else []; once per type, after the round's steps."""
        if gpu_type not in self._held:
            on = [(jid, sl.node_id) for jid, a in sorted(self.b.allocs.items()) if a.gpu_type == gpu_type
                  for sl in a.slices]
            self._held[gpu_type] = [] if any(self.shrink_options(j, n) for j, n in on) else sorted({j for j, _ in on})
        return self._held[gpu_type]
