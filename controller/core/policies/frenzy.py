"""The Frenzy policy (Frenzy Sec. IV) behind the Policy protocol: MARP resource plans per job,
placed by HAS best fit (controller/core/frenzy.py does the work; this adapter only adds the Cell and
the estimated iteration time to each start). Frenzy: "Frenzy: A Memory-Aware Serverless LLM Training
System for Heterogeneous GPU Clusters", arXiv 2024 (arXiv:2412.14479; docs/reference/papers.md).

Simplifies, as the original: no scaling or migration of running jobs, no GPU-type preference
beyond the memory fit, jobs in submission order with backfill. "artifact" and "paper" are the same
(Frenzy's artifact is its paper's algorithm)."""

from __future__ import annotations

from dataclasses import replace

from tessera.controller.core import frenzy
from tessera.controller.core.policy import Mode, RoundContext
from tessera.controller.core.snapshot import Action, Cell, Decision, Snapshot


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
        for d in frenzy.plan_round(inner, self.cfg).decisions:
            if d.action is not Action.START or d.plan is None:
                out.append(replace(d, reason=f"frenzy: {d.reason}"))
                continue
            # HAS keeps a gang on one GPU model, the plan's: that is the Cell.
            cell = Cell(d.plan.gpu_model, d.plan.gpus, d.plan.pp)
            est = ctx.best(jobs[d.job_id], cell.gpu_type, cell.gpus, len(d.slices))
            out.append(replace(d, reason=f"frenzy: {d.reason}", cell=cell,
                               iteration_s=est.iteration_s if est else 0.0))
        return out
