"""New jobs' first Cell estimates before a round, within a budget (docs/operations.md,
`--estimate-budget`).

A job's first Cells take from milliseconds to about 15 s for the largest model a job may name
(bench/estimator_bounds.py). The round must not compute them on the event loop, so it waits for
them in a thread first. Unbounded, that wait let one tenant hold every tenant's scheduling: a
burst of large distinct models (none cached) delayed each round by the sum of their estimates. So
a round estimates new jobs until the budget is spent, at least one job a round, the tenants in
turn (each tenant's oldest job first, the tenant whose jobs took the fewest seconds so far first).
The jobs left are not in that round's snapshot: they wait with `COLD_REASON` and ask for the next
round at once (the engine kicks it), while the round schedules the others.

Pure but for the clock the caller passes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from tessera.controller.core.policy import Estimates
from tessera.controller.core.snapshot import JobView

COLD_REASON = ("waiting for its first Cell estimates: each round estimates new jobs for at most the "
               "controller's --estimate-budget, tenants in turn")


class _HasId(Protocol):
    @property
    def id(self) -> str: ...


J = TypeVar("J", bound=_HasId)


def turns(jobs: Sequence[JobView], spent: Mapping[str, float] | None = None) -> list[JobView]:
    """The tenants in turn, each tenant's jobs in queue order; the tenants ordered by the estimation
    seconds their jobs took (`spent`, least first), then by their oldest job."""
    by: dict[str, list[JobView]] = {}
    for j in sorted(jobs, key=lambda j: (j.submit_time, j.id)):
        by.setdefault(j.tenant, []).append(j)
    queues = sorted(by.values(), key=lambda q: ((spent or {}).get(q[0].tenant, 0.0), q[0].submit_time, q[0].id))
    out: list[JobView] = []
    for i in range(max((len(q) for q in queues), default=0)):
        out += [q[i] for q in queues if i < len(q)]
    return out


class Warmer:
    """What the rounds' estimation keeps between rounds: the jobs left without estimates, and the
    seconds each tenant's new jobs took while some were left (cleared once none is)."""

    def __init__(self, need: Callable[[JobView], object] | None = None) -> None:
        # The memory a job that fits nowhere needs (StepLearner.least_need): asked here, in the thread,
        # for a job with no Cell on any type, so that the round's reason finds it memoised (a 1T-
        # parameter model's took 0.3-0.5 s, on the event loop).
        self.need = need
        self.cold: set[str] = set()
        self.spent: dict[str, float] = {}
        self.seen: set[str] = set()  # the pending jobs the last warm-up listed
        self._known: Callable[[JobView, str], bool] = lambda j, t: True
        self._types: Sequence[str] = ()

    def warm(self, estimates: Estimates, known: Callable[[JobView, str], bool], jobs: Sequence[JobView],
             gpu_types: Sequence[str], budget_s: float, clock: Callable[[], float]) -> set[str]:
        """Ask `estimates` what a round asks first of each job not `known` yet, its GPU counts on
        each type (that computes its Cells into the caches), in `turns` order, until `budget_s` has
        passed (at least one job). Returns, and keeps as `cold`, the ids left unestimated."""
        self.seen, self._known, self._types = {j.id for j in jobs}, known, gpu_types
        todo = turns([j for j in jobs if not self._estimated(j)], self.spent)
        t0 = clock()
        self.cold = set()
        for i, job in enumerate(todo):
            if i and clock() - t0 >= budget_s:
                self.cold = {j.id for j in todo[i:]}
                break
            t = clock()
            counts = [estimates.gpu_counts(job, g) for g in gpu_types]
            if self.need is not None and not any(counts):
                self.need(job)
            self.spent[job.tenant] = self.spent.get(job.tenant, 0.0) + clock() - t
        if not self.cold:
            self.spent.clear()
        return self.cold

    def ready(self, jobs: Sequence[J], view: Callable[[J], JobView]) -> list[J]:
        """The pending `jobs` a round may plan: neither left cold by the warm-up nor submitted
        during it without estimates (`view` gives a job's JobView). Those late ones join `cold`;
        their submission's kick asks for the next round, which warms them within the budget.
        Before, they entered the snapshot and the round computed their Cells on the event loop: a
        burst of large models submitted while a warm-up ran held every call for 7.3 s."""
        out = []
        for j in jobs:
            if j.id not in self.cold and (j.id in self.seen or self._estimated(view(j))):
                out.append(j)
            elif j.id not in self.cold:
                self.cold.add(j.id)
        return out

    def _estimated(self, job: JobView) -> bool:
        """Whether a round needs nothing computed for `job` (opaque, or known on every type)."""
        return job.opaque or all(self._known(job, t) for t in self._types)
