"""Cell-guided parallelism tuning: the pruned search of Crius Sec. 5.2 (Figure 11).

Crius: "A Codesign of Scheduling and Parallelization for Large Model Training in Heterogeneous
Clusters", arXiv 2024 (arXiv:2403.16125; docs/reference/papers.md).

Once a Cell is chosen, the job needs its best plan inside the Cell, which may mix data and tensor
parallelism within a stage. A stage of N GPUs has the plans (dp, tp) = (N, 1), (N/2, 2), ..., (1, N)
(powers of two). The Cell's estimate already chose, per stage, DP-only or TP-only: that is the stage's
"favour". The tuner keeps, per stage, only the half of the space on the favoured side of the
half-hybrid plan (sqrt(N) x sqrt(N)):

- DP favoured: tp in 1 .. 2^floor(log2(N) / 2)  (DP-only to half-hybrid)
- TP favoured: tp in 2^ceil(log2(N) / 2) .. N   (half-hybrid to TP-only)

and searches the product of the kept stage plans. Plans are evaluated either by the Cell cost model
(the default: exact search, cells.best_plan) or by a caller-supplied `measure(plan) -> seconds` (a real
profiling run), which is enumerated up to `max_evaluations` and otherwise searched stage by stage.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tessera.estimator.cells import (
    CellEstimator,
    CellInputError,
    CellModel,
    CellPlan,
    GpuPool,
    StagePlan,
    best_plan,
    iteration_time,
)


def _log2(n: int) -> int:
    if n < 1 or n & (n - 1):
        raise CellInputError("gpus", f"stage GPU counts must be powers of two, got {n}")
    return n.bit_length() - 1


def stage_space(gpus: int) -> tuple[tuple[int, int], ...]:
    """All (dp, tp) with dp * tp = gpus, powers of two, from DP-only to TP-only."""
    k = _log2(gpus)
    return tuple((gpus >> i, 1 << i) for i in range(k + 1))


def pruned_stage_space(gpus: int, favour: str) -> tuple[tuple[int, int], ...]:
    """The half of `stage_space(gpus)` on the favoured side of the half-hybrid plan (inclusive)."""
    k = _log2(gpus)
    if favour == "dp":
        keep = range(k // 2 + 1)
    elif favour == "tp":
        keep = range((k + 1) // 2, k + 1)
    else:
        raise CellInputError("favour", f"must be 'dp' or 'tp', got {favour!r}")
    return tuple((gpus >> i, 1 << i) for i in keep)


@dataclass(frozen=True)
class TuningResult:
    plan: CellPlan
    iter_time: float
    source: str  # "formula:..." (cost model) or "measured"
    full_space: int  # plans in the Cell (product over stages of all (dp, tp))
    pruned_space: int  # plans left after Cell-guided pruning
    evaluated: int  # plans actually evaluated (measure) or the pruned space (cost model)
    estimate_plan: CellPlan  # the Cell estimate's plan that guided the pruning


def favours(plan: CellPlan) -> list[str]:
    """Per stage: 'tp' when its layout is past the half-hybrid point towards TP (tp^2 > GPUs: TP-only
    and the TP-heavy hybrids the Cell estimate now also takes), else 'dp'; either pruned half then
    holds the estimate's own layout."""
    return ["tp" if s.tp * s.tp > s.gpus else "dp" for s in plan.stages]


def tune_cell(
    estimator: CellEstimator,
    model: CellModel,
    pool: GpuPool,
    num_gpus: int,
    num_stages: int,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    measure: Callable[[CellPlan], float] | None = None,
    max_evaluations: int = 256,
) -> TuningResult | None:
    """Best plan inside a Cell by the pruned search; None when the Cell does not fit at all."""
    cell = estimator.cell(model, pool, num_gpus, num_stages, nodes, gpus_per_node)
    if not cell.fits or cell.plan is None or cell.iter_time is None:
        return None
    guide = cell.plan
    spaces = [pruned_stage_space(s.gpus, f) for s, f in zip(guide.stages, favours(guide))]
    full = math.prod(len(stage_space(s.gpus)) for s in guide.stages)
    pruned = math.prod(len(sp) for sp in spaces)
    b = guide.num_microbatches
    if measure is None:
        opts, _, _ = estimator.stage_costs(model, pool, num_gpus, num_stages, cell.nodes, cell.gpus_per_node,
                                           options=spaces, num_microbatches=b)
        best = best_plan(opts, b)
        # the pruned space holds the estimate's layouts but not its FSDP stages: never tune to slower
        if best is None or best.iter_time > iteration_time(cell.stage_costs, b):
            return TuningResult(guide, cell.iter_time.value, cell.iter_time.source, full, pruned, pruned, guide)
        src = "+".join(sorted({s.compute_source for s in best.stages} | {s.comm_source for s in best.stages}
                              - {"formula:none"}))
        return TuningResult(best.plan, best.iter_time, src, full, pruned, pruned, guide)
    return _search_measured(guide, spaces, measure, max_evaluations, full, pruned)


def _plan(guide: CellPlan, choice: Sequence[tuple[int, int]]) -> CellPlan:
    return CellPlan(tuple(StagePlan(s.start, s.end, dp, tp) for s, (dp, tp) in zip(guide.stages, choice)),
                    guide.num_microbatches)


def _search_measured(guide: CellPlan, spaces: Sequence[Sequence[tuple[int, int]]],
                     measure: Callable[[CellPlan], float], max_evaluations: int, full: int,
                     pruned: int) -> TuningResult:
    seen: dict[tuple[tuple[int, int], ...], float] = {}

    def run(choice: tuple[tuple[int, int], ...]) -> float:
        if choice not in seen:
            t = float(measure(_plan(guide, choice)))
            if not t > 0:
                t = math.inf  # a plan that failed (OOM, error) is never chosen
            seen[choice] = t
        return seen[choice]

    if pruned <= max_evaluations:
        for choice in itertools.product(*spaces):
            run(tuple(choice))
    else:  # coordinate descent from the estimate's plan, one stage at a time
        cur = tuple((s.dp, s.tp) for s in guide.stages)
        best_t = run(cur)
        improved = True
        while improved and len(seen) < max_evaluations:
            improved = False
            for i, sp in enumerate(spaces):
                for opt in sp:
                    cand = cur[:i] + (opt,) + cur[i + 1:]
                    t = run(cand)
                    if t < best_t:
                        cur, best_t, improved = cand, t, True
                    if len(seen) >= max_evaluations:
                        break
    choice, t = min(seen.items(), key=lambda kv: (kv[1], kv[0]))
    return TuningResult(_plan(guide, choice), t, "measured", full, pruned, len(seen), guide)
