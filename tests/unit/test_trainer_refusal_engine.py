"""The engine fails a reference-trainer job at its first refusal (exit 3: a model or plan option the
trainer does not build): a live audit saw a GShard MoE placed, launched and refused three times
before it FAILED, each attempt spending one of its retries."""

from __future__ import annotations

from tests.unit.test_engine import Harness, run_to_running, tiny


async def test_a_refused_job_fails_at_its_first_attempt() -> None:
    h = Harness(nodes=("a",))
    await h.register("a")
    jid = await h.submit(tiny(gpus=1, max_retries=2))
    await h.round()
    attempt = await run_to_running(h, jid)
    h.agents.exit(jid, attempt, 3)
    await h.heartbeat("a")
    assert h.state(jid) == "FAILED" and h.job(jid).attempt == 1
    assert "no retry" in h.job(jid).reason
