"""The periodic inspection reads each job as stored when its step runs, not as the pass listed it:
a heartbeat handled in between had moved the job on, and the pass wrote its old record back (a
live audit: a job's RUNNING event twice, 1 ms apart). The engine harness of test_engine.py."""

from __future__ import annotations

import asyncio

from tests.unit.test_engine import Harness, tiny


async def test_a_heartbeat_during_the_inspection_pass_is_not_undone() -> None:
    h = Harness()
    await h.register("a", "b")
    jid = await h.submit(tiny())
    await h.round()
    assert h.state(jid) == "STARTING"
    h.agents.report(jid, 1, iteration=5)
    (node,) = h.nodes_of(jid)
    await asyncio.gather(h.engine.inspect(), h.heartbeat(node))  # the pass lists it STARTING first
    await h.inspect()
    assert h.state(jid) == "RUNNING"
    assert h.kinds(jid).count("RUNNING") == 1, h.kinds(jid)
