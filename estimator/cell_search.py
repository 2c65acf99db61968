"""The search inside a Cell: stage layouts, the micro-batch count, and the exact best assembled plan.

A Cell (estimator/cells.py) fixes the GPU type, the GPU count and the pipeline stages; what is left
is, per stage, how its GPUs split into data and tensor parallelism (and whether the data-parallel
ranks shard the model state, estimator/cell_fsdp.py), and the number of micro-batches B the global
batch is cut into. This module chooses both.

Stage layouts (`stage_layouts`): every (dp, tp) with dp * tp = the stage's GPUs, tp a power of two
that stays within one node and divides the model's heads. Crius Sec. 5.1 takes only DP-only and
TP-only per stage (2^Ns plans); the hybrids are what its Sec. 5.2 tuning searches afterwards, and
they are cheap to cost, so the Cell's estimate takes them at once.

The micro-batch count (`search_cell`), per Cell:
- a runtime that fixes B (`CellConfig.num_microbatches`, e.g. the Crius artifact's 16): that B,
  doubled while no plan fits and it divides the batch (the estimator's earlier rule, kept);
- one stage: there is no pipeline, so B only trades memory for per-micro-batch costs (launch
  overheads, collective latencies) over the same work. Each layout takes the smallest B that divides
  the batch into whole samples per rank and fits in memory (B = 1 when it fits: no gradient
  accumulation), and the fastest layout wins;
- Ns > 1 stages: every divisor B of the batch from Ns up to `microbatches_per_stage` x Ns (the
  paper's 4 x Ns, GPipe, Figure 10, as the upper choice) is tried, each with the layouts whose DP
  ranks get whole samples, and the fastest feasible plan is kept; when none fits, larger divisors
  are tried in order until one does. Fewer micro-batches than stages (some stage always idle) are
  tried only when the batch has no divisor in that range: they can win only where per-micro-batch
  overheads outweigh the compute, where a Cell with fewer stages is the better Cell anyway, and
  they would double the search's cost.
Before this, B was 4 x Ns for every Cell, also with one stage, and a DP layout with more ranks than
samples per micro-batch was dropped instead of retried with fewer micro-batches: an 8B job at
global batch 16 on 8 GPUs never got plain DP.

The exact best plan (`exact_best`): T = sum_i lat_i + (B - 1) * max_i busy_i + max_i sync_i. For
a bound x on max busy and s on max sync, each stage independently takes its cheapest-latency option
within the bounds; at the optimum's own (x*, s*) that choice is no worse than the optimum, so the
least bound sum_i lat_i + (B - 1) x + s over all observed (x, s) is the optimum. This holds for any
number of options per stage (it never used that there were two). For each x, one sweep over the
options sorted by sync gives every s: O(|X| * sum of options), not O(|X| * |S| * sum).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tessera.estimator.cell_types import CellPlan, PlanEstimate, StageCost, iteration_time

Layouts = Sequence[Sequence[tuple[int, int]]]
# The costed options of every stage for some layouts at B micro-batches (CellEstimator's, with the
# FSDP variants it offers); the search calls it once per micro-batch count it tries.
Rows = Callable[[Layouts, int], list[list[StageCost]]]


def divisors(n: int) -> tuple[int, ...]:
    """The divisors of n, ascending."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return tuple(small + large[::-1])


def stage_layouts(gpus: int, gpus_per_node: int | None = None, num_heads: int | None = None) -> tuple[tuple[int, int], ...]:
    """Every (dp, tp) of a stage of `gpus` GPUs, DP-only first: tp a power of two dividing `gpus`,
    at most `gpus_per_node` (a TP group's all-reduces stay on the node's link) and dividing
    `num_heads` (whole heads per rank); None = no such limit. DP-only is always there."""
    out = [(gpus, 1)]
    tp = 2
    while tp <= gpus:
        if gpus % tp == 0 and (gpus_per_node is None or tp <= gpus_per_node) and \
                (num_heads is None or num_heads % tp == 0):
            out.append((gpus // tp, tp))
        tp *= 2
    return tuple(out)


@dataclass(frozen=True)
class CellSearch:
    """What the search of one Cell found: the best plan (None: nothing fits), the stage GPU counts,
    how many assembled plans it formed and how many of them fit (closed form, over every micro-batch
    count tried), the counts tried, and why nothing fits when nothing does. `need_bytes`, when nothing
    fits for memory: the least per-GPU memory of a stage none of whose layouts fits, over the counts
    tried (no plan of the Cell needs less on its most loaded GPU); 0 otherwise."""

    best: PlanEstimate | None
    stage_gpus: tuple[int, ...]
    assembled: int
    feasible: int
    tried: tuple[int, ...]
    reason: str = ""
    need_bytes: float = 0.0


def _key(c: StageCost) -> tuple[float, int, bool]:
    """Cheapest latency first; on a tie the less tensor-parallel, then the unsharded option."""
    return (c.latency, c.plan.tp, c.plan.sharding != "none")


def exact_best(options: Sequence[Sequence[StageCost]], num_microbatches: int) -> PlanEstimate | None:
    """The fastest combination of one memory-feasible option per stage, exactly (module doc)."""
    feas = [[c for c in opts if c.fits] for opts in options]
    if not feas or any(not f for f in feas):
        return None
    n, b1 = len(feas), num_microbatches - 1
    lat_floor = sum(min(c.latency for c in f) for f in feas)
    sync_floor = max(min(c.sync for c in f) for f in feas)
    x_floor = max(min(c.busy for c in f) for f in feas)
    xs = sorted({c.busy for f in feas for c in f if c.busy >= x_floor})
    events = sorted(((c.sync, i, c) for i, f in enumerate(feas) for c in f), key=lambda e: e[0])
    bound, arg = math.inf, (xs[0], events[-1][0])
    for x in xs:
        if lat_floor + b1 * x + sync_floor >= bound:
            break  # x only grows from here
        floor_x = sum(min(c.latency for c in f if c.busy <= x) for f in feas)
        cur = [math.inf] * n
        missing, total, k = n, 0.0, 0
        while k < len(events):
            s = events[k][0]
            # Every event of this sync time; each pass takes at least one (a NaN time, never equal
            # to itself, once kept this loop from ever advancing).
            while True:
                _, i, c = events[k]
                k += 1
                if c.busy <= x and c.latency < cur[i]:
                    total += c.latency - (0.0 if cur[i] == math.inf else cur[i])
                    missing -= cur[i] == math.inf
                    cur[i] = c.latency
                if k >= len(events) or events[k][0] != s:
                    break
            if missing == 0:
                val = total + b1 * x + s
                if val < bound * (1 - 1e-12):
                    bound, arg = val, (x, s)
                if total <= floor_x * (1 + 1e-12):
                    break  # the latencies cannot drop further; a larger s only adds
    x, s = arg
    pick = [min((c for c in f if c.busy <= x and c.sync <= s), key=_key) for f in feas]
    return PlanEstimate(CellPlan(tuple(c.plan for c in pick), num_microbatches), iteration_time(pick, num_microbatches),
                        tuple(pick))


def _whole(layouts: Layouts, mb: int) -> list[list[tuple[int, int]]]:
    """The layouts whose DP ranks get whole samples of a micro-batch of `mb`."""
    return [[(dp, tp) for dp, tp in opts if mb % dp == 0] for opts in layouts]


def _why(rows: Sequence[Sequence[StageCost]], b: int, memory_gb: float, least: float) -> tuple[str, float]:
    """Why no plan of `b` micro-batches fits, and the least of `least` and what its first stage with
    no fitting layout needs per GPU (`least` when it is not memory)."""
    worst = next(i for i, row in enumerate(rows) if not any(c.fits for c in row))
    if rows[worst]:
        need = min(c.memory_bytes for c in rows[worst])
        # The figures first: a table cuts the reason at 40 characters (tessctl estimate cells).
        return (f"memory: needs {need / 1e9:.1f} GB per GPU, {memory_gb:.1f} usable (no layout of stage {worst} "
                f"fits with {b} micro-batches)"), min(need, least) if least else need
    return f"plan: stage {worst} has no valid (dp, tp) for {b} micro-batches", least


def search_cell(rows: Rows, layouts: Layouts, stage_gpus: tuple[int, ...], global_batch: int, *,
                fixed_microbatches: int = 0, microbatches_per_stage: int = 4, memory_gb: float = 0.0) -> CellSearch:
    """The best plan of a Cell over its stage layouts and micro-batch counts (module doc).

    `rows(layouts, b)` costs the stages' options; `layouts` are every stage's (dp, tp) candidates;
    `fixed_microbatches` > 0 is a runtime's fixed B; `memory_gb` (what a GPU gives a plan: the
    usable fraction of its memory) is for the reason given when nothing fits."""
    if fixed_microbatches:
        return _fixed(rows, layouts, stage_gpus, global_batch, fixed_microbatches, memory_gb)
    if len(stage_gpus) == 1:
        return _one_stage(rows, layouts[0], stage_gpus, global_batch, memory_gb)
    return _pipelined(rows, layouts, stage_gpus, global_batch, microbatches_per_stage, memory_gb)


def _fixed(rows_of: Rows, layouts: Layouts, stage_gpus: tuple[int, ...], g: int, fixed: int,
           memory_gb: float) -> CellSearch:
    """A runtime's fixed B (at most the batch), doubled while nothing fits and it divides the batch;
    a DP layout with more ranks than samples per micro-batch is left out (the runtime cannot run it)."""
    b = min(fixed, g)
    assembled = feasible = 0
    tried = []
    need = 0.0
    while True:
        rows = rows_of(layouts, b)
        tried.append(b)
        assembled += math.prod(len(r) for r in rows)
        feasible += math.prod(sum(c.fits for c in r) for r in rows)
        best = exact_best(rows, b)
        if best is not None:
            return CellSearch(best, stage_gpus, assembled, feasible, tuple(tried))
        reason, need = _why(rows, b, memory_gb, need)
        if 2 * b > g or g % (2 * b):
            return CellSearch(None, stage_gpus, assembled, feasible, tuple(tried), reason, need)
        b *= 2


def _one_stage(rows_of: Rows, layouts: Sequence[tuple[int, int]], stage_gpus: tuple[int, ...], g: int,
               memory_gb: float) -> CellSearch:
    """Each layout (and its FSDP variant where offered) at its smallest fitting B; the fastest wins."""
    found: dict[tuple[int, int], tuple[float, int, StageCost]] = {}  # by (dp, tp): the twin that fits
    sharded: dict[tuple[int, int], tuple[float, int, StageCost]] = {}  # FSDP variants that fit first
    assembled, tried, reason, need = 0, [], "", 0.0
    for b in divisors(g):
        todo = [lay for lay in _whole([layouts], g // b)[0] if lay not in found]
        if not todo:
            if len(found) == len(layouts):
                break
            continue
        rows = rows_of([todo], b)
        tried.append(b)
        assembled += len(rows[0])
        for c in rows[0]:
            if not c.fits:
                continue
            lay = (c.plan.dp, c.plan.tp)
            target = sharded if c.plan.sharding != "none" else found
            if lay not in target:
                target[lay] = (iteration_time([c], b), b, c)
        if not any(c.fits for c in rows[0]) and not found and not sharded:
            reason, need = _why(rows, b, memory_gb, need)
        if len(found) == len(layouts):
            break
    if not found and not sharded:
        return CellSearch(None, stage_gpus, assembled, 0, tuple(tried),
                          reason or f"plan: no (dp, tp) of {stage_gpus[0]} GPUs splits a batch of {g}", need)
    entries = list(found.values()) + list(sharded.values())
    t, b, c = min(entries, key=lambda e: (e[0], _key(e[2])[1:]))
    best = PlanEstimate(CellPlan((c.plan,), b), t, (c,))
    return CellSearch(best, stage_gpus, assembled, len(entries), tuple(tried))


def _pipelined(rows_of: Rows, layouts: Layouts, stage_gpus: tuple[int, ...], g: int, per_stage: int,
               memory_gb: float) -> CellSearch:
    """Every divisor B of the batch from Ns up to microbatches_per_stage x Ns (from 1 when none is in
    that range), the fastest feasible plan; when none fits, the larger divisors in order until one does."""
    ns = len(stage_gpus)
    upper = min(per_stage * ns, g)
    divs = divisors(g)
    low = ns if any(ns <= d <= upper for d in divs) else 1
    assembled = feasible = 0
    tried: list[int] = []
    best: PlanEstimate | None = None
    reason, need = "", 0.0
    for b in divs:
        if b < low:
            continue
        if b > upper and best is not None:
            break
        opts = _whole(layouts, g // b)
        if any(not o for o in opts):
            continue
        rows = rows_of(opts, b)
        tried.append(b)
        assembled += math.prod(len(r) for r in rows)
        feasible += math.prod(sum(c.fits for c in r) for r in rows)
        cand = exact_best(rows, b)
        if cand is None:
            if best is None:
                reason, need = _why(rows, b, memory_gb, need)
            continue
        if best is None or cand.iter_time < best.iter_time * (1 - 1e-12):
            best = cand
    if best is None:
        return CellSearch(None, stage_gpus, assembled, feasible, tuple(tried),
                          reason or f"plan: no micro-batch count gives every stage whole samples per DP rank "
                                    f"(batch {g})", need)
    return CellSearch(best, stage_gpus, assembled, feasible, tuple(tried))

