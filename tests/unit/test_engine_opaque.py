"""Opaque jobs through the engine (docs/opaque-jobs.md): placed as asked by the live policies, never
failed as hung without progress reports, SUCCEEDED when every rank exits 0, FAILED past max_runtime."""

from __future__ import annotations

import pytest

from tessera.v1 import common_pb2 as P
from tests.unit.test_engine import Harness


def plain(name: str, gpus: int = 2, **kw: object) -> P.JobSpec:
    return P.JobSpec(name=name, entrypoint=["{python}", "train.py"], hint=P.ResourceHint(gpus=gpus),
                     **kw)  # type: ignore[arg-type]


async def keep_alive(h: Harness, seconds: float) -> None:
    """Let `seconds` pass with the node heartbeating every 5 s (its lease holds)."""
    for _ in range(int(seconds // 5)):
        h.clock.advance(5)
        await h.heartbeat("a")


@pytest.mark.parametrize("policy", ["crius", "frenzy"])
async def test_an_opaque_job_runs_as_asked_and_succeeds_on_exit_0(policy: str) -> None:
    h = Harness(policy=policy, nodes=("a",))
    await h.register("a")
    jid = await h.submit(plain("two-gpus"))
    await h.round()
    job = h.job(jid)
    assert h.state(jid) == "STARTING" and job.plan is not None and job.placement is not None
    assert (job.plan.dp, job.plan.tp, job.plan.pp) == (2, 1, 1) and len(job.placement.slices[0].gpu_indices) == 2
    assert job.plan.memory_source == "opaque"
    # No estimate to show: the opaque Cell's 1 s/iteration is a placeholder (was "est. 1 s/iter, 1.0 samples/s").
    (placed,) = [e.message for e in h.store.events(jid) if e.kind == "PLACED"]
    assert placed.startswith("attempt 1: ") and "s/iter" not in placed, placed
    assert "samples/s" not in placed and "estimate" not in placed, placed
    await h.heartbeat("a")
    assert h.state(jid) == "RUNNING"
    await keep_alive(h, h.cfg.progress_timeout_s + 60)  # no report at all, longer than the timeout
    await h.inspect()
    assert h.state(jid) == "RUNNING"
    h.agents.exit(jid, 1, 0)
    await h.heartbeat("a")
    assert h.state(jid) == "SUCCEEDED" and h.job(jid).reason == "all 2 ranks exited 0"  # it counts none


async def test_max_runtime_fails_the_job_and_stops_its_attempt() -> None:
    h = Harness(nodes=("a",))
    await h.register("a")
    jid = await h.submit(plain("limited", max_runtime_seconds=600, max_retries=2))
    await h.round()
    await h.heartbeat("a")
    await keep_alive(h, 590)
    await h.inspect()
    assert h.state(jid) == "RUNNING"
    await keep_alive(h, 20)
    await h.inspect()
    assert h.state(jid) == "FAILED" and h.job(jid).reason == "max_runtime 10m exceeded"  # no retry
    assert [c.job_id for c in h.agents.stops()] == [jid]


async def test_an_opaque_job_that_reported_progress_is_checked_for_hangs() -> None:
    h = Harness(nodes=("a",))
    await h.register("a")
    jid = await h.submit(plain("reports"))
    await h.round()
    await h.heartbeat("a")
    h.agents.report(jid, 1, 3)
    await h.heartbeat("a")
    await keep_alive(h, h.cfg.progress_timeout_s + 10)
    await h.inspect()
    assert h.state(jid) == "FAILED" and "no progress from rank 0" in h.job(jid).reason
