"""New jobs' first Cell estimates within a round's budget (controller/warming.py): literal jobs, a
fake estimator that takes a set time per job on a fake clock."""

from __future__ import annotations

from collections.abc import Sequence

from tessera.controller.core.snapshot import JobView
from tessera.controller.warming import Warmer, turns
from tessera.estimator.models import ModelDims

M = ModelDims(64, 2, 4, 256, 64, "m")


def job(jid: str, t: float, tenant: str, opaque: bool = False) -> JobView:
    return JobView(jid, t, M, 16, estimate_key=jid, tenant=tenant, opaque=opaque)


class Slow:
    """Estimates: each job's GPU counts on a type take `seconds` of the clock."""

    def __init__(self, seconds: float) -> None:
        self.now, self.seconds, self.asked = 0.0, seconds, []  # type: ignore[var-annotated]
        self.known: set[tuple[str, str]] = set()

    def clock(self) -> float:
        return self.now

    def gpu_counts(self, j: JobView, gpu_type: str) -> Sequence[int]:
        self.now += self.seconds
        self.asked.append((j.id, gpu_type))
        self.known.add((j.key, gpu_type))
        return (1,)

    def is_known(self, j: JobView, gpu_type: str) -> bool:
        return (j.key, gpu_type) in self.known


def test_tenants_take_turns_each_oldest_first() -> None:
    jobs = [job("a1", 1, "A"), job("a2", 2, "A"), job("a3", 3, "A"), job("b1", 4, "B"), job("c1", 5, "C")]
    assert [j.id for j in turns(jobs)] == ["a1", "b1", "c1", "a2", "a3"]
    # The tenant whose jobs took the fewest estimation seconds goes first.
    assert [j.id for j in turns(jobs, {"A": 9.0, "B": 1.0})] == ["c1", "b1", "a1", "a2", "a3"]


def test_a_round_estimates_until_its_budget_is_spent_at_least_one_job() -> None:
    # A hostile burst: tenant A's 3 large models, each 4 s to estimate; B's one job behind them.
    est, w = Slow(4.0), Warmer()
    jobs = [job("a1", 1, "A"), job("a2", 2, "A"), job("a3", 3, "A"), job("b1", 9, "B")]
    assert w.warm(est, est.is_known, jobs, ["X"], 5.0, est.clock) == {"a2", "a3"} == w.cold  # type: ignore[arg-type]
    assert [a[0] for a in est.asked] == ["a1", "b1"]  # 8 s: over 5 after the second
    assert w.spent == {"A": 4.0, "B": 4.0}
    # The next round goes on with what is left (known jobs cost nothing); none left: the tally is cleared.
    assert w.warm(est, est.is_known, jobs, ["X"], 5.0, est.clock) == set()  # type: ignore[arg-type]
    assert [a[0] for a in est.asked] == ["a1", "b1", "a2", "a3"] and w.spent == {}
    # No budget: one job a round, never none.
    est, w = Slow(1.0), Warmer()
    assert w.warm(est, est.is_known, jobs, ["X", "Y"], 0.0, est.clock) == {"b1", "a2", "a3"}  # type: ignore[arg-type]
    assert est.asked == [("a1", "X"), ("a1", "Y")]
    # A's first job took 2 s: B's goes first in the next round, though A's is older.
    assert w.warm(est, est.is_known, jobs, ["X", "Y"], 0.0, est.clock) == {"a2", "a3"}  # type: ignore[arg-type]
    assert est.asked[-1] == ("b1", "Y")


def test_opaque_jobs_need_no_estimate() -> None:
    est = Slow(10.0)
    assert Warmer().warm(est, est.is_known, [job("o", 1, "A", opaque=True)], ["X"], 0.0, est.clock) == set()  # type: ignore[arg-type]
    assert est.asked == []


def test_jobs_submitted_during_the_warm_up_wait_for_the_next_round_unless_known() -> None:
    """The round's snapshot lists the pending jobs after the warm-up: one submitted meanwhile was
    planned without estimates, its Cells computed on the event loop (an audit held every call 7.3 s
    with 6 large models submitted during a warm-up)."""
    est, w = Slow(1.0), Warmer()
    seen = [job("a1", 1, "A")]
    w.warm(est, est.is_known, seen, ["X"], 5.0, est.clock)  # type: ignore[arg-type]
    est.known.add(("known", "X"))
    late = [job("b1", 2, "B"), job("known", 3, "B"), job("o", 4, "B", opaque=True)]
    assert [j.id for j in w.ready(seen + late, lambda j: j)] == ["a1", "known", "o"]
    assert w.cold == {"b1"}
    assert w.warm(est, est.is_known, seen + late, ["X"], 5.0, est.clock) == set()  # type: ignore[arg-type]
    assert [j.id for j in w.ready(seen + late, lambda j: j)] == ["a1", "b1", "known", "o"]


def test_a_job_with_no_cell_on_any_type_has_its_memory_need_found_in_the_warm_up() -> None:
    # So the round's reason finds it memoised (it took 0.3-0.5 s for a large model, on the event loop).
    class NoCells(Slow):
        def gpu_counts(self, j: JobView, gpu_type: str) -> Sequence[int]:
            super().gpu_counts(j, gpu_type)
            return () if j.id.startswith("big") else (1,)

    asked: list[str] = []
    est, w = NoCells(1.0), Warmer(lambda j: asked.append(j.id))
    w.warm(est, est.is_known, [job("big1", 1, "A"), job("small", 2, "A")], ["X", "Y"], 60.0, est.clock)  # type: ignore[arg-type]
    assert asked == ["big1"]
