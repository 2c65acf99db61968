"""Morphling's resource-sensitivity curves and guarantees (Morphling, MLSys'25, Sec. 5).

A job's GPU curve has one point per GPU count the estimates can run it on, placed compactly (the
fewest nodes), each with the fastest plan there and that plan's name (the estimates give one Cell
per plan: `CellEstimate.plan_name`). The curve "only connects the highest points" (Sec. 5, Fig. 6):
a count that is not faster than a smaller one is left out. The CPU curve is a demand per plan (a
ZeRO-Offload plan needs CPU threads for its optimizer step, Sec. 2.2): points whose plan does not
fit a node's free CPUs fall back to the next plan that does.

The value of a point is the job's completion rate 1 / T, T = the time its remaining iterations
take there, plus one reconfiguration when the point is not where the job runs now. A slope is the
change of that value per GPU. With value = raw throughput (Morphling's own slope: samples/s per
GPU) a short job and a long one at the same speed look the same; with the completion rate the
slope-based allocation serves the job that finishes soonest per GPU first, which is what average
JCT rewards (shortest-remaining-time first), and a reconfiguration that does not pay its cost over
the remaining time is never a gain.

Guarantees: a guaranteed job admitted within its tenant's quota (the guarantee layer's admission,
`RoundContext.guaranteed`) with promise P has t_P, the iteration time of P's plan on P's GPUs
(compact; the same function the layer holds it to), and minRes, the fewest GPUs whose best plan is
at least as fast (Algorithm 1's first step; "possibly a better plan"); it never exceeds P's GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera.common.errors import InvalidInput
from tessera.controller.core.guarantees import EPS, promise_time
from tessera.controller.core.policy import CellEstimate, RoundContext
from tessera.controller.core.snapshot import JobView, Promise

OFFLOAD_PLANS = frozenset({"zero-offload"})


class MorphlingInputError(InvalidInput, ValueError):
    """A Morphling option or promise that cannot be used; the message names the field."""


@dataclass(frozen=True)
class Point:
    """One point of a GPU curve: `gpus` GPUs of `gpu_type` on `nodes` nodes, the estimate of the
    plan chosen there."""

    gpu_type: str
    gpus: int
    nodes: int
    est: CellEstimate

    @property
    def it(self) -> float:
        return self.est.iteration_s

    @property
    def plan(self) -> str:
        return self.est.plan_name


def is_offload(est: CellEstimate) -> bool:
    if est.plan_name in OFFLOAD_PLANS:
        return True
    ex = est.plan.execution if est.plan is not None else None
    return ex is not None and ex.offload != "none"


@dataclass(frozen=True)
class CpuNeed:
    """CPU threads a plan needs per GPU (0 = CPUs are not scheduled)."""

    per_gpu: int = 0
    offload_per_gpu: int = 0

    def of(self, est: CellEstimate, gpus: int) -> int:
        return gpus * (self.per_gpu + (self.offload_per_gpu if is_offload(est) else 0))


class Curves:
    """Curves, promises and minimum demands of the jobs of one round, memoised."""

    def __init__(self, ctx: RoundContext, cpu: CpuNeed) -> None:
        self.ctx = ctx
        self.cpu = cpu
        self._all: dict[str, list[Point]] = {}
        self._hull: dict[str, list[Point]] = {}
        self._steps: dict[str, list[Point]] = {}
        self._tp: dict[str, float] = {}
        self._min: dict[str, Point | None] = {}

    # ------------------------------------------------------------------ GPU curve

    def plans(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> list[CellEstimate]:
        """The job's plans on this resource, fastest first."""
        cells = self.ctx.estimates.cells(job, gpu_type, gpus, nodes)
        return sorted((c for c in cells if c.iteration_s > 0), key=lambda c: (c.iteration_s, c.plan_name))

    def points(self, job: JobView) -> list[Point]:
        """Every feasible compact point, ascending GPUs (then type)."""
        got = self._all.get(job.id)
        if got is not None:
            return got
        out: list[Point] = []
        cap = self.ctx.max_gpus()
        for t in self.ctx.types():
            if not job.may_use(t):
                continue
            per = self.ctx.max_per_node(t)
            for g in self.ctx.gpu_counts(job, t):
                if g <= 0 or g > self.ctx.total_gpus(t) or (cap and g > cap):
                    continue
                k = self.ctx.ideal_nodes(t, g)
                if k <= 0 or g % k or g // k > per:
                    continue
                best = self.ctx.best(job, t, g, k)
                if best is not None:
                    out.append(Point(t, g, k, best))
        out.sort(key=lambda p: (p.gpus, p.it, p.gpu_type))
        self._all[job.id] = out
        return out

    def hull(self, job: JobView) -> list[Point]:
        """The sensitivity curve: points strictly faster than every smaller count."""
        got = self._hull.get(job.id)
        if got is not None:
            return got
        out: list[Point] = []
        for p in self.points(job):
            if out and p.gpus == out[-1].gpus:
                continue  # same count on another type: the fastest came first
            if not out or p.it < out[-1].it:
                out.append(p)
        self._hull[job.id] = out
        return out

    def steps(self, job: JobView) -> list[Point]:
        """Every type's sensitivity curve (points strictly faster than every smaller count of that
        type), ascending GPUs: where the fastest type's point does not fit, a slower type's may (a
        job waited on busy A100s while every A10 was idle). One type: the hull."""
        got = self._steps.get(job.id)
        if got is not None:
            return got
        out: list[Point] = []
        best: dict[str, float] = {}
        for p in self.points(job):
            if p.it < best.get(p.gpu_type, math.inf):
                best[p.gpu_type] = p.it
                out.append(p)
        self._steps[job.id] = out
        return out

    def at(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> Point | None:
        best = self.ctx.best(job, gpu_type, gpus, nodes)
        return Point(gpu_type, gpus, nodes, best) if best is not None else None

    def with_cpus(self, job: JobView, p: Point, free_cpus: float) -> Point | None:
        """The point with the fastest plan whose CPU demand fits `free_cpus` (per node, the
        tightest node of the placement); None when no plan fits."""
        if not self.cpu.per_gpu and not self.cpu.offload_per_gpu:
            return p
        per = p.gpus // p.nodes
        if self.cpu.of(p.est, per) <= free_cpus:
            return p
        for c in self.plans(job, p.gpu_type, p.gpus, p.nodes):
            if self.cpu.of(c, per) <= free_cpus:
                return Point(p.gpu_type, p.gpus, p.nodes, c)
        return None

    # ------------------------------------------------------------------ guarantees

    def guaranteed(self, job: JobView) -> bool:
        """Admitted within its tenant's quota this round (the guarantee layer's admission,
        controller/core/quotas.py: `RoundContext.guaranteed`)."""
        return job.id in self.ctx.guaranteed

    def promise(self, job: JobView) -> Promise | None:
        return self.ctx.guaranteed.get(job.id)

    def promised_time(self, job: JobView) -> float:
        """t_P: seconds per iteration of the promised plan on the promised GPUs, compact, as the
        guarantee layer counts it (the estimates' `promise_time`, else the best plan there);
        0 = not guaranteed or cannot run."""
        got = self._tp.get(job.id)
        if got is None:
            pr = self.promise(job)
            got = promise_time(self.ctx, job, pr) if pr is not None and pr.gpu_type else 0.0
            self._tp[job.id] = got
        return got

    def min_res(self, job: JobView) -> Point | None:
        """Algorithm 1's minRes: the fewest GPUs (compact, any plan) at least as fast as the
        promise, never more GPUs than promised; the promise itself when nothing smaller is; None
        for a best-effort job (its minimum is 0) or a promise that cannot run."""
        if job.id in self._min:
            return self._min[job.id]
        out: Point | None = None
        pr = self.promise(job)
        tp = self.promised_time(job)
        if pr is not None and tp > 0:
            for p in self.points(job):
                if p.gpu_type == pr.gpu_type and p.gpus <= pr.gpus and p.it <= tp * (1 + EPS):
                    out = p
                    break
        self._min[job.id] = out
        return out

    def slack_s(self, job: JobView, now: float, restart_cost_s: float) -> float:
        """Seconds a guaranteed job is ahead of its promise (the SLA of docs/scheduler-morphling.md):
        done x t_P - (now - s_j - R), s_j its admission (JobView.admitted_at) where the caller
        records it, else its submission (earlier: stricter); +inf when it has no promise."""
        tp = self.promised_time(job)
        if tp <= 0:
            return math.inf
        since = job.admitted_at if job.admitted_at is not None else job.submit_time
        return job.done_iterations * tp - max(0.0, now - since - restart_cost_s)


def remaining_time(job: JobView, it: float, unknown_iterations: float) -> float:
    """Seconds the job's remaining iterations take at `it` s/iteration (a job that does not say how
    many iterations it has counts `unknown_iterations`)."""
    left = job.remaining_iterations if job.iterations > 0 else unknown_iterations
    return max(left, 1e-9) * it
