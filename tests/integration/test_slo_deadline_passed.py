"""A job whose SLO deadline has already passed when it is submitted is refused at once
(INVALID_ARGUMENT naming slo.deadline, nothing stored); before, it was stored and waited for ever
("its SLO deadline has passed: no plan can meet it"). A retry of a job stored before its deadline
passed still gets that job. Real gRPC on loopback (tests/engine_api.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tessera.clients.sdk import Client, RpcError
from tessera.common.objective import deadline_passed
from tessera.controller.engine import EngineConfig
from tessera.v1 import common_pb2 as P
from tests.engine_api import serve_engine
from tests.unit.test_engine import Harness, tiny


def cost_job(deadline: float) -> P.JobSpec:
    s = tiny("cheap", gpus=1)
    s.objective = P.OBJECTIVE_COST
    s.slo.deadline = deadline
    return s


def test_only_a_deadline_at_or_before_now_is_refused() -> None:
    assert deadline_passed(cost_job(100.0), now=200.0) is not None
    assert deadline_passed(cost_job(200.0), now=200.0) is not None
    assert deadline_passed(cost_job(300.0), now=200.0) is None
    assert deadline_passed(tiny("no-slo"), now=200.0) is None


async def test_a_past_deadline_is_refused_at_submit_and_a_retry_gets_its_job(tmp_path: Path) -> None:
    h = Harness(nodes=("a",))
    h.cfg = EngineConfig(prices=(("A10-24GB", 1.0),))
    h.engine = h._engine()
    h.clock.advance(1e6)  # a deadline an hour ago is a valid Unix time
    await h.register("a")
    now = h.engine.wall()
    async with serve_engine(h.engine, tmp_path) as (address, tokens):
        def submit(deadline: float, request_id: str) -> P.JobSpec:
            with Client(address, token=tokens["admin"], timeout=30) as c:
                return c.submit(cost_job(deadline), request_id=request_id).spec

        with pytest.raises(RpcError) as e:
            await asyncio.to_thread(submit, now - 3600, "late")
        assert e.value.code == "INVALID_ARGUMENT" and e.value.message.startswith("slo.deadline: ") and \
            "has passed (the controller's clock reads " in e.value.message
        assert h.store.list_jobs() == []
        stored = await asyncio.to_thread(submit, now + 60, "early")
        h.clock.advance(120)  # its deadline passes; the client retries the same submit
        again = await asyncio.to_thread(submit, now + 60, "early")
        assert again == stored and len(h.store.list_jobs()) == 1
