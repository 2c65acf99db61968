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

from tessera.controller.core.policies.common import Alloc, Board, free_text
from tessera.controller.core.policies.morphling_curves import (
    CpuNeed,
    Curves,
    MorphlingInputError,
    Point,
    remaining_time,
)
from tessera.controller.core.policy import RoundContext
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
    preempt_factor: float = 1.0
    # Iterations assumed for a job that does not say how many it has (live jobs without a count).
    unknown_iterations: float = 1e6
    # Extra seconds of lead a guaranteed job must keep over its promise after a reconfiguration.
    guarantee_margin_s: float = 60.0
    # Aging against starvation: a job's value is multiplied by 1 + (now - submit) / aging_s, so a
    # long job that has waited gains on the short ones (0 = none: pure shortest-remaining-first).
    aging_s: float = 0.0
    # Grow a job past its most efficient point (fewest GPU-seconds to finish) only in rounds where
    # no job is left waiting: GPUs spent on poor scaling are taken from the queue.
    efficient_first: bool = False
    # Starvation limit: a best-effort job in the system this long is placed at its most efficient
    # point before the slope phase and is not preempted after (0 = none).
    starve_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("restart_cost_s", "cpus_per_gpu", "offload_cpus_per_gpu", "guarantee_margin_s", "aging_s",
                     "starve_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise MorphlingInputError(f"option {name} must be a finite number >= 0, got {v!r}")
        if not self.preempt_factor > 0 or not math.isfinite(self.preempt_factor):
            raise MorphlingInputError(f"option preempt_factor must be > 0, got {self.preempt_factor!r}")
        if not self.unknown_iterations > 0:
            raise MorphlingInputError(f"option unknown_iterations must be > 0, got {self.unknown_iterations!r}")


class MorphlingPolicy:
    def __init__(self, options: MorphlingOptions | None = None) -> None:
        self.options = options or MorphlingOptions()

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
        self._eff: dict[str, int] = {}
        self.limit_growth = False
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
        w = 1.0 + max(0.0, self.now - job.submit_time) / self.o.aging_s if self.o.aging_s > 0 else 1.0
        return w / t if t > 0 else math.inf

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

    def starving(self, job: JobView) -> bool:
        """A best-effort job in the system for `starve_s` or more: it gets a minimum, its most
        efficient point, like a guaranteed job's minRes (0 = never)."""
        return (self.o.starve_s > 0 and not self.cv.guaranteed(job)
                and self.now - job.submit_time >= self.o.starve_s)

    def min_gpus(self, job: JobView) -> int:
        if self.starving(job):
            return self.efficient_gpus(job)
        m = self.cv.min_res(job)
        return m.gpus if m is not None else 0

    # ------------------------------------------------------------------ the round

    def run(self) -> list[Decision]:
        self.privileged()
        self.starved()
        self.by_slope()
        for jid, j in list(self.b.waiting.items()):
            if jid not in self.b.reasons:
                self.pend_reason(j)
        return self.b.decisions(opportunistic=False)

    def privileged(self) -> None:
        if not self.ctx.snap.tenants:
            return
        used: dict[tuple[str, str], int] = {}
        for jid in self.b.allocs:
            j = self.jobs[jid]
            m = self.cv.min_res(j)
            if m is not None:
                used[(j.tenant, m.gpu_type)] = used.get((j.tenant, m.gpu_type), 0) + m.gpus
        quotas = {t.name: t for t in self.ctx.snap.tenants}
        for j in self.ctx.pending:
            if not self.cv.guaranteed(j):
                continue
            m = self.cv.min_res(j)
            if m is None:
                self.b.pend(j, PendingKind.FITS_NOWHERE,
                            f"morphling: guaranteed, but its promise cannot run on this cluster "
                            f"(no estimate for {j.promise.gpus if j.promise else 0} GPUs)")
                continue
            tq = quotas.get(j.tenant)
            left = (tq.quota(m.gpu_type) if tq else 0) - used.get((j.tenant, m.gpu_type), 0)
            if m.gpus > left:
                self.b.pend(j, PendingKind.WAITING,
                            f"morphling: guaranteed job over its tenant's quota: minRes {m.gpus} x {m.gpu_type} "
                            f"(plan {m.plan or 'best'}), {max(0, left)} left of tenant {j.tenant!r}'s quota")
                continue
            if self.schedule(j, m, privileged=True, gain=math.inf):
                used[(j.tenant, m.gpu_type)] = used.get((j.tenant, m.gpu_type), 0) + m.gpus
            else:
                self.b.pend(j, PendingKind.NO_ROOM_NOW,
                            f"morphling: guaranteed, minRes {m.gpus} x {m.gpu_type} within quota, but no node "
                            f"can free that many GPUs from jobs over their minimum; {free_text(self.ctx)}")

    def starved(self) -> None:
        """Jobs waiting past `starve_s`, oldest first, at their most efficient point, shrinking
        jobs over their minimum as a guaranteed job would (Tiresias-style starvation limit)."""
        for j in self.ctx.pending:
            if j.id not in self.b.waiting or j.id in self.b.reasons or not self.starving(j):
                continue
            g = self.efficient_gpus(j)
            pts = [p for p in self.cv.hull(j) if p.gpus == g]
            if pts and self.schedule(j, pts[0], privileged=True, gain=math.inf):
                self.b.allocs[j.id].note += f"; waited {self.now - j.submit_time:.0f} s (starvation limit)"

    def moves(self, jid: str) -> list[tuple[float, Point]]:
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
        cap = self.efficient_gpus(job) if self.limit_growth else 0
        for p in self.cv.hull(job):
            if p.gpus <= g0 or (cap and p.gpus > max(cap, g0)):
                continue
            gain = self.value(job, p, True) - v0
            if gain > 0:
                out.append((gain / (p.gpus - g0), p))
        out.sort(key=lambda sp: (-sp[0], sp[1].gpus))
        return out

    def efficient_gpus(self, job: JobView) -> int:
        """GPUs of the job's most efficient point: the fewest GPU-seconds to finish, one start
        included."""
        got = self._eff.get(job.id)
        if got is None:
            hull = self.cv.hull(job)
            costs = [(p.gpus * (remaining_time(job, p.it, self.o.unknown_iterations) + self.C), p.gpus) for p in hull]
            got = min(costs)[1] if costs else 0
            self._eff[job.id] = got
        return got

    def by_slope(self) -> None:
        """SortBySlope. With `efficient_first`, a first pass stops every job at its most efficient
        point, and growth past it happens only when no job is left waiting."""
        self.limit_growth = self.o.efficient_first
        self._by_slope()
        if self.limit_growth and not any(j not in self.b.reasons or self.b.kinds.get(j) is not PendingKind.WAITING
                                         for j in self.b.waiting):
            self.limit_growth = False
            self._by_slope()

    def _by_slope(self) -> None:
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
            v0 = self.cur_value(jid)
            done = False
            for _slope, p in self.moves(jid):
                if self.schedule(job, p, privileged=False, gain=self.value(job, p, True) - v0):
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
            self.apply_step(s, job)
        self._commit(job, a, pt, slices)
        return True

    def _commit(self, job: JobView, a: Alloc | None, pt: Point, slices: tuple[Slice, ...]) -> None:
        st = self.ctx.state
        why = f"plan {pt.plan or 'best'}"
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
                for s in a.slices:
                    on_node.setdefault(s.node_id, []).append(jid)
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
                options.append((sum(s.loss for s in got), g.node_id, got))
        if len(options) < p.nodes:
            return None, [], None
        options.sort(key=lambda o: (o[0], self.ctx.state.group(o[1], p.gpu_type).order))
        chosen = options[:p.nodes]
        steps: list[_Step] = []
        seen: set[str] = set()
        for _, _, ss in chosen:
            for s in ss:
                if s.jid not in seen:  # a job preempted for two nodes is counted once
                    seen.add(s.jid)
                    steps.append(s)
        loss = sum(s.loss for s in steps)
        if not privileged and not gain > self.o.preempt_factor * loss:
            return None, [], None
        # The node's free GPUs after the steps: its own free ones, then what the steps release.
        slices = []
        free_cpu = math.inf
        for _, node, ss in chosen:
            grp = self.ctx.state.group(node, p.gpu_type)
            avail = list(grp.free)
            for s in steps:
                a = self.b.allocs[s.jid]
                kept = {i for k in s.keep if k.node_id == node for i in k.gpu_indices}
                avail += [i for sl in a.slices if sl.node_id == node for i in sl.gpu_indices if i not in kept]
            slices.append(Slice(node, tuple(sorted(avail)[:q])))
            cpus = self.cpu_free[node] + sum(self._step_cpus(s, node) for s in steps)
            free_cpu = min(free_cpu, cpus)
        pt = self.cv.with_cpus(job, p, free_cpu)
        if pt is None:
            return None, [], None
        return tuple(slices), steps, pt

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
        """Greedy: the cheapest loss per freed GPU first, until `need` GPUs are free on the node."""
        cands: list[_Step] = []
        for jid in jids:
            cands.extend(self.shrink_options(jid, node))
        chosen: list[_Step] = []
        used: set[str] = set()
        freed = 0
        while freed < need:
            best: _Step | None = None
            best_key = math.inf
            for s in cands:
                if s.jid in used:
                    continue
                key = s.loss / min(s.freed, need - freed)
                if key < best_key:
                    best, best_key = s, key
            if best is None:
                return None
            chosen.append(best)
            used.add(best.jid)
            freed += best.freed
        return chosen

    def shrink_options(self, jid: str, node: str) -> list[_Step]:
        """How a job on `node` can give GPUs there: a smaller point on the same node (single-node
        jobs), or preemption (best-effort only). A guaranteed job keeps its minRes, its promise's
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
        if cur is not None and len(a.slices) == 1:
            floor = self.min_gpus(job)
            tp = self.cv.promised_time(job) if guaranteed else math.inf
            idx = a.slices[0].gpu_indices
            for p in self.cv.hull(job):
                if p.gpus >= a.gpus or p.nodes != 1 or p.gpus < floor or p.it > tp:
                    continue
                if p.gpu_type != a.gpu_type:
                    continue
                keep = (Slice(node, idx[:p.gpus]),)
                loss = v0 - self.value(job, p, True)
                out.append(_Step(jid, p, keep, a.gpus - p.gpus, max(0.0, loss)))
        if not guaranteed and not self.starving(job):
            out.append(_Step(jid, None, (), on, v0))
        return out

    def apply_step(self, s: _Step, for_job: JobView) -> None:
        a = self.b.allocs[s.jid]
        self.touched.add(s.jid)
        self._cpus(a, +1)
        if s.to is None:
            self.b.suspend(a, f"morphling: preempted for {for_job.id}, whose slope is higher",
                           PendingKind.NO_ROOM_NOW)
            self.point.pop(s.jid, None)
            self.changed[s.jid] = True
            return
        kept = {(k.node_id, i) for k in s.keep for i in k.gpu_indices}
        rel = tuple(Slice(sl.node_id, tuple(i for i in sl.gpu_indices if (sl.node_id, i) not in kept))
                    for sl in a.slices)
        self.ctx.state.release(tuple(r for r in rel if r.gpu_indices), a.gpu_type)
        a.slices, a.gpus, a.est = s.keep, s.to.gpus, s.to.est
        note = f"shrunk to {s.to.gpus} GPUs (plan {s.to.plan or 'best'}) for {for_job.id}, whose slope is higher"
        a.note = note
        self.point[s.jid] = s.to
        self.changed[s.jid] = True
        self.b.version += 1
        self._cpus(a, -1)

    # ------------------------------------------------------------------ reasons

    def pend_reason(self, j: JobView) -> None:
        hull = self.cv.hull(j)
        if not hull:
            self.b.pend(j, PendingKind.FITS_NOWHERE,
                        "morphling: no plan of this job runs on any GPU count of this cluster")
            return
        p = hull[0]
        self.b.pend(j, PendingKind.NO_ROOM_NOW,
                    f"morphling: waiting; its best step ({p.gpus} x {p.gpu_type}, plan {p.plan or 'best'}) "
                    f"gains less than shrinking running jobs would lose; {free_text(self.ctx)}")
