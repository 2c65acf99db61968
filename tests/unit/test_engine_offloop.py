"""What the controller does off its event loop, and what an agent's error on a log read becomes.

A job's first Cell estimates may take seconds (bench/estimator_bounds.py); the round computes them
in a thread (`warming.Warmer.warm`, within --estimate-budget) so heartbeats and RPCs are served meanwhile. GetJobLogs relays an
agent's NOT_FOUND / UNAVAILABLE as the caller's own status, never as INTERNAL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from dataclasses import dataclass

import grpc
import pytest

from tessera.common.errors import FailedPrecondition, NotFound
from tessera.common.tokens import ADMIN, Principal
from tessera.controller import warming
from tessera.controller.service import ControllerService
from tessera.v1 import controller_pb2
from tests.unit.test_engine import Harness, run_to_running, tiny


async def test_a_slow_first_estimate_is_computed_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness(policy="crius", nodes=("a",))
    await h.register("a")
    jid = await h.submit(tiny())
    entered, release = threading.Event(), threading.Event()
    loop_thread = threading.get_ident()
    seen: list[int] = []
    real = warming.Warmer.warm

    def slow(*args):  # type: ignore[no-untyped-def]
        seen.append(threading.get_ident())
        entered.set()
        assert release.wait(60)
        return real(*args)

    monkeypatch.setattr(warming.Warmer, "warm", slow)
    task = asyncio.create_task(h.engine.run_round())
    assert await asyncio.to_thread(entered.wait, 60)
    await h.heartbeat("a")  # served while the estimate is being computed
    assert not task.done()
    release.set()
    await task
    assert seen and seen[0] != loop_thread
    assert h.state(jid) == "STARTING"


@dataclass
class Context:
    principal: Principal


async def test_get_job_logs_answers_the_agents_error_as_the_callers() -> None:
    h = Harness(policy="crius", nodes=("a",))
    await h.register("a")
    jid = await h.submit(tiny())
    await h.round()
    attempt = await run_to_running(h, jid)
    svc = ControllerService(h.engine)
    ctx = Context(Principal("ops", "default", ADMIN))
    got = await svc.GetJobLogs(controller_pb2.GetJobLogsRequest(job_id=jid), ctx)
    assert got.node_id == "a"
    with pytest.raises(NotFound, match=f"job {jid} has no attempt {attempt + 1} \\(its latest is {attempt}\\)"):
        await svc.GetJobLogs(controller_pb2.GetJobLogsRequest(job_id=jid, attempt=attempt + 1), ctx)
    h.agents.fail_read_log["a"] = grpc.StatusCode.NOT_FOUND
    with pytest.raises(NotFound, match=f"no log of rank 0 attempt {attempt} of job {jid} on node a"):
        await svc.GetJobLogs(controller_pb2.GetJobLogsRequest(job_id=jid), ctx)
    h.agents.fail_read_log["a"] = grpc.StatusCode.UNAVAILABLE
    with pytest.raises(FailedPrecondition, match="node a holding the log did not answer \\(UNAVAILABLE\\)"):
        await svc.GetJobLogs(controller_pb2.GetJobLogsRequest(job_id=jid), ctx)


async def test_a_round_estimates_new_jobs_within_its_budget() -> None:
    """controller/warming.py: with no budget left, a round estimates one new job (the oldest) and
    schedules it; the other waits with the reason and is estimated and placed by the next round."""
    h = Harness(policy="crius", nodes=("a",))
    h.engine.cfg = dataclasses.replace(h.engine.cfg, estimate_budget_s=0.0)
    await h.register("a")
    first = await h.submit(tiny("first", gpus=1))
    other = tiny("other", gpus=1)
    other.model.hidden_size = 128  # another model: nothing of its estimates is cached
    second = await h.submit(other)
    await h.round()
    assert h.state(first) == "STARTING"
    assert h.state(second) == "PENDING" and h.job(second).reason == warming.COLD_REASON
    await h.round()
    assert h.state(second) == "STARTING"


async def test_a_round_plans_off_the_event_loop_and_keeps_what_was_written_meanwhile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 10,000 pending jobs made a round take seconds on the loop, and heartbeats waited it out long
    # enough to fence other tenants' workers. Now the plan and the pending reasons are computed in
    # a thread; a job cancelled meanwhile stays cancelled (its pending reason is not written back).
    from tessera.controller import engine as engine_mod

    h = Harness(policy="crius", nodes=("a",))
    await h.register("a")
    runs, waits, gone = await h.submit(tiny()), await h.submit(tiny("big", gpus=64)), await h.submit(tiny("x", gpus=64))
    entered, release = threading.Event(), threading.Event()
    loop_thread = threading.get_ident()
    seen: list[int] = []
    real = engine_mod.plan_round

    def slow(*args):  # type: ignore[no-untyped-def]
        seen.append(threading.get_ident())
        entered.set()
        assert release.wait(30)
        return real(*args)

    monkeypatch.setattr(engine_mod, "plan_round", slow)
    task = asyncio.create_task(h.engine.run_round())
    assert await asyncio.to_thread(entered.wait, 30)
    await h.heartbeat("a")  # served while the round plans
    await h.engine.cancel(gone)
    assert not task.done()
    release.set()
    await task
    h.check()
    assert seen and seen[0] != loop_thread
    assert (h.state(runs), h.state(waits), h.state(gone)) == ("STARTING", "PENDING", "CANCELLED")
    assert h.job(waits).reason.startswith("crius"), h.job(waits).reason
    assert not h.job(gone).reason.startswith("crius"), h.job(gone).reason
