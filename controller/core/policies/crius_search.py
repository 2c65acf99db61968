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
        if self.best is not None and bound + left * self.best_step_gain <= self.best.value:
            return
        self.visits += 1
        if self.visits > sched.opts.search_budget or not sched.ctx.spend():
            left = 0
        nodes = trial.fits(t, n)
        if nodes:
            value = gain_sum + sched.throughput(self.job, t, n, nodes)
            if value > 0 and (self.best is None or value > self.best.value):
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
            if (self.best is not None
                    and gain_sum + gain_bound + self.ideal_throughput + (left - 1) * self.best_step_gain
                    <= self.best.value):
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
