"""What every policy needs inside a round: the current allocation of each job, applied changes,
and the decisions they turn into at the end (virtual allocation, applied once: Crius Sec. 6.1)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

# Moved to controller/core/decisions.py (the guarantee layer builds decisions too); still exported
# here for the policies that import them from this module.
from tessera.controller.core.decisions import change_kind as change_kind  # noqa: PLC0414
from tessera.controller.core.decisions import synth_plan as synth_plan  # noqa: PLC0414
from tessera.controller.core.decisions import thr_part
from tessera.controller.core.decisions import thr_text as thr_text  # noqa: PLC0414
from tessera.controller.core.decisions import where as where  # noqa: PLC0414
from tessera.controller.core.placement import BEST_FIT, Group, Trial
from tessera.controller.core.policy import CellEstimate, RoundContext, queue_key
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    Decision,
    JobView,
    PendingKind,
    RunningView,
    Slice,
)


@dataclass
class Alloc:
    """A job's allocation as the round has it so far."""

    job: JobView
    gpu_type: str
    gpus: int
    slices: tuple[Slice, ...]
    est: CellEstimate | None
    orig: RunningView | None = None
    note: str = ""
    opportunistic: bool = False

    @property
    def nodes(self) -> int:
        return len(self.slices)

    @property
    def thr(self) -> float:
        e = self.est
        return self.job.global_batch_size / e.iteration_s if e and e.iteration_s > 0 else 0.0


FREE_NOW = re.compile(r"free now: [^;]*")  # free_text's part of a reason, up to the next clause


def free_text(ctx: RoundContext, state_free: dict[str, int] | None = None) -> str:
    parts = []
    for t in ctx.types():
        f = state_free[t] if state_free is not None else ctx.state.free_gpus(t)
        parts.append(f"{f}/{ctx.total_gpus(t)} {t}")
    return "free now: " + ", ".join(parts)


def with_note(had: str, note: str) -> str:
    """A job's round note with `note` added once, however many times a step applies to it in the
    round (gandiva's notes read "grown ...; grown ..." when it doubled a job twice: a live audit)."""
    if note in had.split("; "):
        return had
    return f"{had}; {note}" if had else note


@dataclass
class Board:
    """The round's working allocation over `ctx.state` (running jobs' GPUs held)."""

    ctx: RoundContext
    name: str
    allocs: dict[str, Alloc] = field(default_factory=dict)
    waiting: dict[str, JobView] = field(default_factory=dict)
    # Pending jobs' reasons and kinds, set together by `pend`.
    reasons: dict[str, str] = field(default_factory=dict)
    kinds: dict[str, PendingKind] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    suspended: dict[str, str] = field(default_factory=dict)
    version: int = 0

    def __post_init__(self) -> None:
        for r in self.ctx.running.values():
            n = len(r.slices)
            est = self.ctx.best(r.job, r.cell.gpu_type, r.cell.gpus, n)
            self.allocs[r.job.id] = Alloc(r.job, r.cell.gpu_type, r.cell.gpus, r.slices, est, r,
                                          opportunistic=r.opportunistic)
        for j in self.ctx.pending:
            self.waiting[j.id] = j

    # ------------------------------------------------------------------ virtual parts

    def parts(self, a: Alloc) -> list[tuple[Group, int]]:
        st = self.ctx.state
        return [(st.group(s.node_id, a.gpu_type), len(s.gpu_indices)) for s in a.slices]

    def shrink_parts(self, a: Alloc) -> tuple[list[tuple[Group, int]], tuple[Slice, ...], tuple[Slice, ...]]:
        """Halving a job: (released parts, kept slices, released slices). One node keeps its lowest
        half; several nodes keep the first half of the nodes."""
        st = self.ctx.state
        keep: tuple[Slice, ...]
        rel: tuple[Slice, ...]
        if len(a.slices) == 1:
            s = a.slices[0]
            half = len(s.gpu_indices) // 2
            keep = (Slice(s.node_id, s.gpu_indices[:half]),)
            rel = (Slice(s.node_id, s.gpu_indices[half:]),)
        else:
            k = len(a.slices) // 2
            keep, rel = a.slices[:k], a.slices[k:]
        return [(st.group(s.node_id, a.gpu_type), len(s.gpu_indices)) for s in rel], keep, rel

    def trial(self) -> Trial:
        return Trial(self.ctx.state)

    # ------------------------------------------------------------------ real changes

    def place(self, gpu_type: str, gpus: int, prefer: str = BEST_FIT, tp: int = 1) -> tuple[Slice, ...] | None:
        return self.ctx.state.place(gpu_type, gpus, tp, prefer)

    def start(self, job: JobView, gpu_type: str, slices: tuple[Slice, ...], note: str,
              est: CellEstimate | None = None) -> Alloc:
        self.ctx.state.take(slices, gpu_type)
        if est is None:
            est = self.ctx.best(job, gpu_type, len([i for s in slices for i in s.gpu_indices]), len(slices))
        a = Alloc(job, gpu_type, sum(len(s.gpu_indices) for s in slices), slices, est, None, note)
        self.allocs[job.id] = a
        self.waiting.pop(job.id, None)
        self.reasons.pop(job.id, None)
        self.kinds.pop(job.id, None)
        self.version += 1
        return a

    def release(self, a: Alloc) -> None:
        self.ctx.state.release(a.slices, a.gpu_type)
        self.version += 1

    def reassign(self, a: Alloc, gpu_type: str, slices: tuple[Slice, ...], note: str,
                 already_released: bool = False) -> None:
        """Give a job new GPUs (its old ones are released first unless already released)."""
        if not already_released:
            self.release(a)
        self.ctx.state.take(slices, gpu_type)
        a.gpu_type = gpu_type
        a.slices = slices
        a.gpus = sum(len(s.gpu_indices) for s in slices)
        a.est = self.ctx.best(a.job, gpu_type, a.gpus, len(slices))
        a.note = with_note(a.note, note)
        self.version += 1

    def shrink(self, a: Alloc, note: str, released: bool = False) -> None:
        """Halve a job (shrink_parts); `released`: its freed half was already given back."""
        _, keep, rel = self.shrink_parts(a)
        if not released:
            self.ctx.state.release(rel, a.gpu_type)
        a.slices = keep
        a.gpus = sum(len(s.gpu_indices) for s in keep)
        a.est = self.ctx.best(a.job, a.gpu_type, a.gpus, len(keep))
        a.note = with_note(a.note, note)
        self.version += 1

    def suspend(self, a: Alloc, reason: str, kind: PendingKind = PendingKind.WAITING) -> None:
        """Take a job's GPUs back: a running job stops; one started this round is simply pending
        again, of `kind`."""
        self.release(a)
        del self.allocs[a.job.id]
        if a.orig is not None:
            self.suspended[a.job.id] = reason
        else:
            self.waiting[a.job.id] = a.job
            self.pend(a.job, kind, reason)

    def pend(self, job: JobView, kind: PendingKind, reason: str) -> None:
        """Leave a job pending this round: `kind` for the engine, `reason` for people."""
        self.reasons[job.id] = reason
        self.kinds[job.id] = kind

    def drop(self, job: JobView, reason: str) -> None:
        self.waiting.pop(job.id, None)
        self.dropped[job.id] = reason

    # ------------------------------------------------------------------ the end of the round

    def earliest_waiting(self) -> tuple[float, str] | None:
        """The queue key of the first job left waiting that could start some day: one that fits
        nowhere makes no later job opportunistic (every placement read "opportunistic: an earlier job
        is still waiting" behind a job too large for any GPU; a live audit)."""
        keys = [queue_key(j) for j in self.waiting.values()
                if j.id not in self.dropped and self.kinds.get(j.id) is not PendingKind.FITS_NOWHERE]
        return min(keys) if keys else None

    def decisions(self, opportunistic: bool = True) -> list[Decision]:
        out: list[Decision] = []
        first_wait = self.earliest_waiting() if opportunistic else None
        for a in self.allocs.values():
            cell = Cell(a.gpu_type, a.gpus, a.est.cell.stages if a.est else 0)
            opp = first_wait is not None and queue_key(a.job) > first_wait
            it = a.est.iteration_s if a.est else 0.0
            plan = synth_plan(a.job, a.est, cell)
            if a.orig is None:
                why = f"{self.name}: Cell {cell} on {where(a.slices)}{thr_part(a.job, a.est)}"
                if a.note:
                    why += f"; {a.note}"
                if opp:
                    why += "; opportunistic: an earlier job is still waiting"
                out.append(Decision(a.job.id, Action.START, why, plan, a.slices, cell, iteration_s=it,
                                    opportunistic=opp))
            elif a.slices == a.orig.slices and a.gpu_type == a.orig.cell.gpu_type:
                out.append(Decision(a.job.id, Action.KEEP, f"{self.name}: running in {cell}",
                                    a.orig.plan or plan, a.slices, cell, iteration_s=it,
                                    opportunistic=opp and a.orig.opportunistic))
            else:
                kind = change_kind(a.orig.cell, cell)
                why = f"{self.name}: {kind} from {a.orig.cell} to {cell} on {where(a.slices)}{thr_part(a.job, a.est)}"
                if a.note:
                    why += f"; {a.note}"
                out.append(Decision(a.job.id, Action.MIGRATE, why, plan, a.slices, cell, a.orig.cell, kind,
                                    it, opp and a.orig.opportunistic))
        for jid, why in self.suspended.items():
            out.append(Decision(jid, Action.STOP, why))
        for jid, why in self.dropped.items():
            out.append(Decision(jid, Action.DROP, why))
        # A reason written early in the round counted GPUs that later starts took (a live audit: "free
        # now: 8/8 A10-24GB" beside a job that had just taken all 8): all say what the round leaves.
        left = free_text(self.ctx)
        for jid in self.waiting:
            if jid in self.dropped:
                continue
            why = FREE_NOW.sub(left, self.reasons.get(jid, f"{self.name}: waiting"))
            out.append(Decision(jid, Action.PENDING, why, pending=self.kinds.get(jid, PendingKind.WAITING)))
        return out


def place_as_requested(b: Board, job: JobView, gpu_type: str, gpus: int, prefer: str, relaxed: bool,
                       feasible: Callable[[int], bool]) -> tuple[Slice, ...] | None:
    """The Crius artifact's baseline placement: the best locality (per node min(n, node size)),
    then, if allowed, halving the per-node share while `feasible(nodes)` holds."""
    ctx = b.ctx
    k = ctx.ideal_nodes(gpu_type, gpus)
    if k <= 0 or not feasible(k):
        return None
    sl = ctx.state.place(gpu_type, gpus, 1, prefer, nodes=k)
    if sl is not None or not relaxed:
        return sl
    per = gpus // k
    while per > 1:
        per //= 2
        k = gpus // per
        if not feasible(k):
            return None
        sl = ctx.state.place(gpu_type, gpus, 1, prefer, nodes=k)
        if sl is not None:
            return sl
    return None
