"""The search inside Crius's CellBasedSched (crius.py): for one job and one target Cell, a
depth-first walk over scaling steps of running jobs, on a virtual overlay of free-GPU counts.

Terms (Crius: "A Codesign of Scheduling and Parallelization for Large Model Training in
Heterogeneous Clusters", Xue et al.; Sec. 6.1):
- a scaling step changes one running job: "shrink" halves its GPUs (the paper's adaptivity
  scaling; Crius-NA turns it off); "type-change" moves it, same GPU count, to another GPU type
  (the paper's heterogeneity scaling; Crius-NH turns it off). This code called a type change
  `htc` before (heterogeneous type change).
- throughput: samples per second of a job in its best Cell there, by the Cell estimates (0 when it
  cannot run or would miss its deadline); a choice is worth the cluster throughput it leads to.
- search depth: the most scaling steps one choice may make (Sec. 6.1, 8.7).

Restarts (paper mode, `upgrade_min_gain` m > 0: the controller's --min-gain, 0.2 by default):
every scaling step stops, checkpoints and restarts a running job (13-88 s each on a live cluster),
which the estimates do not see. So a choice with steps that gives the job n GPUs must beat, by the
factor 1 + m, the best choice without steps that gives it at least n on the fewest nodes that hold
them (free GPUs, of any type it may use: a live audit saw two jobs halved for a newcomer 1.2% faster
on A100 than on the idle A40), and of two choices worth the same (up to float rounding, TIE) the
one with fewer steps wins (two jobs were halved where halving one gave the same throughput). No
margin is asked over a choice without steps on fewer GPUs or more nodes: the upgrade step would
grow or gather such a job later, a restart too (measured on the replays at m = 0.2: with every
choice without steps as the floor, crius's average JCT on morphling-base rose from 4,592 to 5,473 s;
with the spread ones, morphling-mt's from 4,812 to 5,124 s). With m = 0 (the replays' setting) the
search compares throughput alone, as the paper and the artifact do: preferring fewer steps on ties
there cost 2% of average JCT on morphling-mt and a finished job on arena-philly (500 rounds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from tessera.controller.core.placement import Group, Trial
from tessera.controller.core.policies.common import Alloc, Board
from tessera.controller.core.policy import Mode, RoundContext
from tessera.controller.core.snapshot import JobView

SHRINK: Literal["shrink"] = "shrink"
TYPE_CHANGE: Literal["type-change"] = "type-change"

# (throughput gain of the step, the job it changes), best first.
Candidates = list[tuple[float, Alloc]]

TIE = 1e-9  # choices whose values differ by at most this share are worth the same ("Restarts")


class SearchOptions(Protocol):
    """The options of the Crius policy the search reads (CriusOptions has them)."""

    @property
    def mode(self) -> Mode: ...

    @property
    def search_budget(self) -> int: ...

    @property
    def change_type(self) -> bool: ...

    @property
    def scale_count(self) -> bool: ...

    @property
    def upgrade_min_gain(self) -> float: ...


class Scheduler(Protocol):
    """What the search needs of one Crius round (crius.py's `_Round`): declared here, so that the
    search does not import the policy that drives it."""

    @property
    def opts(self) -> SearchOptions: ...

    @property
    def ctx(self) -> RoundContext: ...

    @property
    def board(self) -> Board: ...

    def throughput(self, job: JobView, gpu_type: str, gpus: int, nodes: int, restart: bool = True) -> float: ...

    def alloc_throughput(self, a: Alloc) -> float: ...

    def shrink_list(self, t: str, exclude: set[str]) -> Candidates: ...

    def type_change_list(self, src: str, dst: str, exclude: set[str]) -> Candidates: ...


@dataclass
class Step:
    """One scaling step of a running job, as a choice would make it."""

    kind: Literal["shrink", "type-change"]
    alloc: Alloc
    to_type: str  # the job's GPU type after the step (a shrink keeps its type)
    gain: float  # cluster throughput it adds (negative: a cost)
    released: list[tuple[Group, int]] = field(default_factory=list)  # a shrink's freed GPUs


@dataclass
class Choice:
    """A scheduling choice: the job on `gpus` GPUs of `gpu_type` over `nodes` nodes, after `steps`."""

    value: float  # estimated cluster throughput gained: the job's own plus the steps' gains
    gpu_type: str
    gpus: int
    nodes: int
    steps: list[Step]


class Explorer:
    """Depth-first walk over scaling steps for one job (CellBasedSched's SCALERESOURCE + BESTPERF).

    `search` in crius.py sets a target Cell (`target`), then `explore` walks from the current free
    GPUs; `best` keeps the best choice over all targets. A branch is cut when even its upper bound
    (gains so far + the target's ideal throughput + `best_step_gain` per step left) cannot beat it.
    """

    def __init__(self, sched: Scheduler, job: JobView, exclude: set[str]) -> None:
        self.sched = sched
        self.job = job
        self.exclude = exclude  # jobs no step may change
        self.types = sched.ctx.types()
        self.best: Choice | None = None
        self._shrinks: dict[str, Candidates] = {}
        self._type_changes: dict[tuple[str, str], Candidates] = {}
        self._type_changes_sized: dict[tuple[str, str], dict[int, Candidates]] = {}
        self._freeable: dict[str, list[int]] = {}
        # The target Cell and its throughput on its ideal (fewest) nodes.
        self.gpu_type, self.gpus, self.ideal_throughput = "", 0, 0.0
        self.ideal_nodes = 0
        # Largest gain one step can add (the bound per level left).
        self.best_step_gain = 0.0
        self.visits = 0
        self.seen: set[frozenset[tuple[str, str, str]]] = set()
        # Paper mode: a scaling step counts as a cost of making room; steps that raise throughput
        # on their own belong to the extra-scheduling step (upgrade), so their gain is capped at 0.
        self.clamp = sched.opts.mode != Mode.ARTIFACT
        # Paper mode with a margin ("Restarts"): its factor, the choices without steps on their
        # fewest nodes (GPUs, value), and what one with steps must exceed for the target Cell.
        gain = sched.opts.upgrade_min_gain
        self.careful = self.clamp and gain > 0
        self.factor = 1.0 + gain if self.careful else 1.0
        self.direct: list[tuple[int, float]] = []
        self.floor = 0.0

    def seed(self, cells: list[tuple[float, str, int, int]], base: Trial) -> None:
        """Direct fits first (no steps): the incumbent that bounds the search of the Cells
        (ideal throughput, type, GPUs, cost) that need room."""
        for _, t, n, _ in cells:
            nodes = base.fits(t, n)
            v = self.sched.throughput(self.job, t, n, nodes) if nodes else 0.0
            if v > 0:
                if self.careful and nodes <= self.sched.ctx.ideal_nodes(t, n):
                    self.direct.append((n, v))
                if self.best is None or v > self.best.value:
                    self.best = Choice(v, t, n, nodes, [])

    def better(self, value: float, steps: int) -> bool:
        """Whether a feasible choice of `value` after `steps` scaling steps replaces `best`."""
        best = self.best
        if value <= 0 or (steps and value <= self.floor):
            return False
        if best is None:
            return True
        if self.careful and abs(value - best.value) <= TIE * max(value, best.value):
            return steps < len(best.steps)
        return value > best.value

    def cut(self, bound: float, steps: int) -> bool:
        """Whether no choice of at most `bound` after at least `steps` steps can replace `best`."""
        best = self.best
        if steps and self.floor and bound <= self.floor:
            return True
        if best is None:
            return False
        if not self.careful:
            return bound <= best.value
        tol = TIE * max(bound, best.value)
        return bound < best.value - tol or (bound <= best.value + tol and steps >= len(best.steps))

    def shrinks(self, gpu_type: str) -> Candidates:
        if gpu_type not in self._shrinks:
            self._shrinks[gpu_type] = self.sched.shrink_list(gpu_type, self.exclude)
        return self._shrinks[gpu_type]

    def type_changes(self, src: str, dst: str) -> Candidates:
        if (src, dst) not in self._type_changes:
            self._type_changes[(src, dst)] = self.sched.type_change_list(src, dst, self.exclude)
        return self._type_changes[(src, dst)]

    def type_changes_by_size(self, src: str, dst: str) -> dict[int, Candidates]:
        got = self._type_changes_sized.get((src, dst))
        if got is None:
            got = {}
            for gain, alloc in self.type_changes(src, dst):
                got.setdefault(alloc.gpus, []).append((gain, alloc))
            self._type_changes_sized[(src, dst)] = got
        return got

    def freeable(self, gpu_type: str, steps: int) -> int:
        """Most GPUs of a type that `steps` scaling steps could free (halving or moving jobs)."""
        got = self._freeable.get(gpu_type)
        if got is None:
            o = self.sched.opts
            sizes = []
            for a in self.sched.board.allocs.values():
                if a.gpu_type != gpu_type or a.job.id in self.exclude:
                    continue
                best = a.gpus if o.change_type else (a.gpus // 2 if o.scale_count else 0)
                sizes.append(best)
            got = sorted(sizes, reverse=True)
            self._freeable[gpu_type] = got
        return sum(got[:steps])

    def target(self, gpu_type: str, gpus: int, ideal_throughput: float, steps_left: int) -> None:
        self.gpu_type, self.gpus, self.ideal_throughput = gpu_type, gpus, ideal_throughput
        self.ideal_nodes = self.sched.ctx.ideal_nodes(gpu_type, gpus)
        if self.careful:
            self.floor = self.factor * max((v for g, v in self.direct if g >= gpus), default=0.0)
        self.seen = set()
        gain = 0.0
        if steps_left > 0 and not self.clamp:
            for dst in self.types:
                if dst != gpu_type:
                    moves = self.type_changes(gpu_type, dst)
                    if moves:
                        gain = max(gain, moves[0][0])
        self.best_step_gain = gain

    def explore(self, trial: Trial, steps: list[Step], gain_sum: float, left: int) -> None:
        sched, t, n = self.sched, self.gpu_type, self.gpus
        bound = gain_sum + self.ideal_throughput
        if self.cut(bound + left * self.best_step_gain, len(steps)):
            return
        self.visits += 1
        if self.visits > sched.opts.search_budget or not sched.ctx.spend():
            left = 0
        nodes = trial.fits(t, n)
        if nodes:
            value = gain_sum + sched.throughput(self.job, t, n, nodes)
            if self.better(value, len(steps)):
                self.best = Choice(value, t, n, nodes, list(steps))
            if nodes <= self.ideal_nodes:
                return
        if left <= 0:
            return
        changed = {s.alloc.job.id for s in steps}
        cand: list[Step] = []
        for gain, a in self.shrinks(t):
            if a.job.id not in changed:
                freed, _, _ = sched.board.shrink_parts(a)
                cand.append(Step(SHRINK, a, t, gain, freed))
                break
        for dst in self.types:
            if dst == t:
                continue
            room: dict[int, bool] = {}
            moved_one = False
            pick: tuple[float, int, Alloc] | None = None
            for size, lst in self.type_changes_by_size(t, dst).items():
                ok = room[size] = bool(trial.fits(dst, size))
                if not ok:
                    continue
                for i, (gain, a) in enumerate(lst):
                    if a.job.id not in changed:
                        if pick is None or (gain, -i) > (pick[0], -pick[1]):
                            pick = (gain, i, a)
                        break
            if pick is not None:
                cand.append(Step(TYPE_CHANGE, pick[2], dst, pick[0]))
                moved_one = True
            # Halving a job on dst only helps a later move to dst that lacks room.
            if left >= 2 and not moved_one and room:
                for gain, a in self.shrinks(dst):
                    if a.job.id not in changed:
                        freed, _, _ = sched.board.shrink_parts(a)
                        cand.append(Step(SHRINK, a, dst, gain, freed))
                        break
        done = {(s.kind, s.alloc.job.id, s.to_type) for s in steps}
        for step in cand:
            gain_bound = min(step.gain, 0.0) if self.clamp else step.gain
            if self.cut(gain_sum + gain_bound + self.ideal_throughput + (left - 1) * self.best_step_gain,
                        len(steps) + 1):
                continue
            key = frozenset(done | {(step.kind, step.alloc.job.id, step.to_type)})
            if key in self.seen:
                continue
            self.seen.add(key)
            trial2 = trial.copy()
            if step.kind == SHRINK:
                trial2.give(step.released)
                gain = step.gain
            else:
                trial2.give(sched.board.parts(step.alloc))
                got = trial2.take(step.to_type, step.alloc.gpus)
                if got is None:
                    continue
                gain = (sched.throughput(step.alloc.job, step.to_type, step.alloc.gpus, len(got))
                        - sched.alloc_throughput(step.alloc))
            if self.clamp:
                gain = min(gain, 0.0)
            self.explore(trial2, [*steps, Step(step.kind, step.alloc, step.to_type, gain, step.released)],
                         gain_sum + gain, left - 1)
