"""The Frenzy policy (Frenzy Sec. IV) behind the Policy protocol: MARP resource plans per job,
placed by HAS best fit (controller/core/frenzy.py does the work; this adapter only adds the Cell and
the estimated iteration time to each start). Frenzy: "Frenzy: A Memory-Aware Serverless LLM Training
System for Heterogeneous GPU Clusters", arXiv 2024 (arXiv:2412.14479; docs/reference/papers.md).

Simplifies, as the original: no scaling or migration of running jobs, no GPU-type preference
beyond the memory fit, jobs in submission order with backfill. "artifact" and "paper" are the same
(Frenzy's artifact is its paper's algorithm).

Extends: a job MARP has no plan for (its DP x TP space cannot hold it: it needs pipeline stages,
ZeRO or offload, or its heads do not split over the TP degrees) but that the estimates can run
takes, in its turn, a Cell of the estimates: its requested GPU count (else the fewest GPUs the
estimates have a Cell for), on the GPU type with the least memory that has one, on the fewest
nodes the estimates cover, best fit. Without it such jobs never started (Morphling's trace: 175 of
406 jobs; docs/simulator.md). And a HAS placement on a GPU type or spread where the estimates have no
Cell for a job they know is refused (the job would hold the GPUs without progress).
"""

from __future__ import annotations

from dataclasses import replace

from tessera.controller.core import frenzy
from tessera.controller.core.placement import quotas
from tessera.controller.core.policies import why_not
from tessera.controller.core.policy import Mode, RoundContext
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    Decision,
    JobView,
    NodeView,
    PendingKind,
    Slice,
    Snapshot,
)


class FrenzyPolicy:
    def __init__(self, cfg: frenzy.FrenzyConfig | None = None, mode: Mode = Mode.PAPER) -> None:
        self.cfg = cfg or frenzy.FrenzyConfig()
        self.mode = Mode(mode)

    @property
    def name(self) -> str:
        return "frenzy"

    def plan(self, ctx: RoundContext) -> list[Decision]:
        snap = ctx.snap
        inner = Snapshot(snap.nodes, snap.pending, snap.cluster_gpus)
        jobs = {j.id: j for j in snap.pending}
        out: list[Decision] = []

        def fallback(job: JobView, nodes: dict[str, NodeView], why: str) -> Decision | None:
            return estimated_start(ctx, job, nodes, why)

        known: dict[str, bool] = {}

        def runs(job: JobView, model: str, gpus: int, nodes: int) -> bool:
            # A job the estimates know nothing of keeps MARP's word alone; known on any registered
            # type, READY or not (a job whose only type is down is no less known).
            if job.id not in known:
                types = set(why_not.by_type(snap)) | set(ctx.types())
                known[job.id] = any(ctx.gpu_counts(job, t) for t in sorted(types))
            return not known[job.id] or ctx.best(job, model, gpus, nodes) is not None

        for d in frenzy.plan_round(inner, self.cfg, fallback, runs).decisions:
            if d.action is not Action.START or d.plan is None:
                out.append(replace(d, reason=f"frenzy: {d.reason}"))
                continue
            # HAS keeps a gang on one GPU model, the plan's: that is the Cell.
            cell = Cell(d.plan.gpu_model, d.plan.gpus, d.plan.pp)
            est = ctx.best(jobs[d.job_id], cell.gpu_type, cell.gpus, len(d.slices))
            out.append(replace(d, reason=f"frenzy: {d.reason}", cell=cell,
                               iteration_s=est.iteration_s if est else 0.0))
        return out


def estimated_start(ctx: RoundContext, job: JobView, nodes: dict[str, NodeView], why: str) -> Decision | None:
    """A START on a Cell of the estimates for a job MARP has no plan for; a PENDING when the
    estimates have Cells but none fits the free GPUs now (or only registered nodes that are not
    READY hold them: it waits for nodes); None when they have none either."""
    mem = {m: b for m, b, _ in ctx.snap.cluster_gpus}
    reg = why_not.by_type(ctx.snap)  # the registered GPUs by type, READY or not
    types = sorted((t for t in set(ctx.types()) | set(reg) if job.may_use(t)),
                   key=lambda t: (mem.get(t, 0), t))
    options: list[tuple[int, str]] = []
    for t in types:
        for n in ctx.gpu_counts(job, t):
            if n <= max(ctx.total_gpus(t), reg.get(t, 0)) and (not job.gpus_hint or n == job.gpus_hint):
                # A count the READY nodes of the type cannot lay out evenly never runs there (5 GPUs
                # on nodes of 4 waited for ever, "not free now"; a live audit).
                k = ctx.ideal_nodes(t, n) if t in ctx.types() else 1
                if k > 0 and n % k == 0:
                    options.append((n, t))
    if not options:
        return None
    # fewest GPUs first (MARP's ranking), then the least GPU memory (HAS's order)
    options.sort(key=lambda o: (o[0], types.index(o[1])))
    for n, t in options:
        if n > ctx.total_gpus(t):  # only registered nodes that are not READY hold it
            continue
        sl = _place(ctx, job, t, n, nodes)
        if sl is None:
            continue
        est = ctx.best(job, t, n, len(sl))
        assert est is not None  # _place only returns spreads the estimates cover
        where = " + ".join(f"{len(s.gpu_indices)} on {s.node_id}" for s in sl)
        return Decision(job.id, Action.START,
                        f"no MARP plan ({why}); the estimates run it on {n} x {t}: {where}",
                        slices=sl, cell=est.cell, iteration_s=est.iteration_s)
    counts = ", ".join(sorted({f"{n} x {t}" for n, t in options}))
    if all(n > ctx.total_gpus(t) for n, t in options):  # nodes coming back would run it
        ready = ", ".join(f"{ctx.total_gpus(t)} x {t}" for t in sorted({t for _, t in options}))
        return Decision(job.id, Action.PENDING, f"waiting for nodes: no MARP plan ({why}); the estimates run it on "
                        f"{counts}, more than READY nodes have ({ready})", pending=PendingKind.NO_ROOM_NOW)
    return Decision(job.id, Action.PENDING,
                    f"waiting for GPUs: no MARP plan ({why}); the estimates run it on {counts}; not free now",
                    pending=PendingKind.NO_ROOM_NOW)


def _place(ctx: RoundContext, job: JobView, t: str, n: int, nodes: dict[str, NodeView]) -> tuple[Slice, ...] | None:
    """n idle GPUs of type t on the fewest nodes the estimates have a Cell for, evenly spread (the
    estimates time a spread by its node count), each node best fit (fewest idle GPUs that suffice)."""
    idle: list[tuple[int, str, list[int]]] = []
    for nid in sorted(nodes):
        got = [g.index for g in nodes[nid].idle() if g.model == t]
        if got:
            idle.append((len(got), nid, sorted(got)))
    for q in quotas(n, ctx.max_per_node(t)):
        k = n // q
        if ctx.best(job, t, n, k) is None:
            continue
        fit = sorted((c, nid, gs) for c, nid, gs in idle if c >= q)
        if len(fit) >= k:
            return tuple(Slice(nid, tuple(gs[:q])) for _, nid, gs in sorted(fit[:k], key=lambda x: x[1]))
    return None
