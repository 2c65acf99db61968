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

from tessera.controller.core.policy import Estimates
from tessera.controller.core.snapshot import JobView

COLD_REASON = ("waiting for its first Cell estimates: each round estimates new jobs for at most the "
               "controller's --estimate-budget, tenants in turn")


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

    def __init__(self) -> None:
        self.cold: set[str] = set()
        self.spent: dict[str, float] = {}

    def warm(self, estimates: Estimates, known: Callable[[JobView, str], bool], jobs: Sequence[JobView],
             gpu_types: Sequence[str], budget_s: float, clock: Callable[[], float]) -> set[str]:
        """Ask `estimates` what a round asks first of each job not `known` yet, its GPU counts on
        each type (that computes its Cells into the caches), in `turns` order, until `budget_s` has
        passed (at least one job). Returns, and keeps as `cold`, the ids left unestimated."""
        todo = turns([j for j in jobs if not j.opaque and not all(known(j, t) for t in gpu_types)], self.spent)
        t0 = clock()
        self.cold = set()
        for i, job in enumerate(todo):
            if i and clock() - t0 >= budget_s:
                self.cold = {j.id for j in todo[i:]}
                break
            t = clock()
            for g in gpu_types:
                estimates.gpu_counts(job, g)
            self.spent[job.tenant] = self.spent.get(job.tenant, 0.0) + clock() - t
        if not self.cold:
            self.spent.clear()
        return self.cold
