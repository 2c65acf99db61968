"""`tessera_jobs_finished_total{outcome}` counts every end once, when it is stored (Engine._save): a
live audit saw cancels (running or pending) counted in no outcome, and a job failed for exiting 0
before its iterations counted in none either, while `tessera_jobs{state}` showed them."""

from __future__ import annotations

from prometheus_client import REGISTRY

from tests.unit.test_engine import Harness, run_to_running, tiny


def finished(outcome: str) -> float:
    return REGISTRY.get_sample_value("tessera_jobs_finished_total", {"outcome": outcome}) or 0.0


async def test_cancels_and_early_exits_are_counted_once() -> None:
    before = {o: finished(o) for o in ("succeeded", "failed", "cancelled")}
    h = Harness(nodes=("a",))
    await h.register("a")
    running = await h.submit(tiny("running", gpus=1))
    early = await h.submit(tiny("early", gpus=1))
    done = await h.submit(tiny("done", gpus=1))
    waiting = await h.submit(tiny("waiting", gpus=4))
    await h.round()
    for j in (running, early, done):
        await run_to_running(h, j)
    await h.engine.cancel(running)
    await h.engine.cancel(waiting)
    await h.engine.cancel(waiting)  # a second cancel of an ended job changes nothing
    h.agents.exit(early, h.job(early).attempt, 0)  # exits 0 before its 40 iterations, no retries: FAILED
    h.agents.report(done, h.job(done).attempt, 40)
    h.agents.exit(done, h.job(done).attempt, 0)
    await h.heartbeat("a")
    assert (h.state(running), h.state(waiting), h.state(early), h.state(done)) == (
        "CANCELLED", "CANCELLED", "FAILED", "SUCCEEDED")
    assert {o: finished(o) - before[o] for o in before} == {"succeeded": 1, "failed": 1, "cancelled": 2}
