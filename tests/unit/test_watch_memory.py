"""What an open WatchJobs stream keeps while it waits (controller/watching.py): a change count and
a 16-byte digest per job, whatever the size of the jobs' specs, and none of the updates it sent. A
stream used to keep every job's serialized message and its last batch of updates: with 2,000 jobs
of 61 KB specs, 250 MB per stream, 16 streams per principal.

Structural, not timed: the generator's own frame is walked while it waits for the next change."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from google.protobuf.message import Message

from tessera.controller.watching import digest, watch_jobs
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2
from tests.unit.test_engine import Harness, tiny

JOBS = 120
SPEC_BYTES = 20_000  # under MAX_SPEC_BYTES: listed whole, as in the report (61 KB specs)
PER_JOB = 128  # a job id, its count, a 16-byte digest and the containers' share, generously


def big(name: str) -> P.JobSpec:
    spec = tiny(name, gpus=64)  # too large to place: stays PENDING
    spec.env["BLOB"] = "x" * SPEC_BYTES
    return spec


def held(value: Any, seen: set[int] | None = None) -> tuple[int, int]:
    """(bytes of data, protobuf messages) reachable from `value` through builtin containers: what a
    stream's frame holds of its own. Other objects (the view, shared by every stream) are not walked."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return 0, 0
    seen.add(id(value))
    if isinstance(value, Message):
        return value.ByteSize(), 1
    if isinstance(value, bytes | bytearray | str):
        return len(value), 0
    items: list[Any] = []
    if isinstance(value, dict):
        items = [*value.keys(), *value.values()]
    elif isinstance(value, list | tuple | set | frozenset):
        items = list(value)
    size = messages = 0
    for item in items:
        s, m = held(item, seen)
        size, messages = size + s, messages + m
    return size, messages


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


async def test_a_waiting_list_watch_holds_digests_not_messages() -> None:
    h = Harness()
    await h.register("a", "b")
    ids = [await h.submit(big(f"j{i}")) for i in range(JOBS)]
    await h.round()
    stream = watch_jobs(h.engine.view, [], "default", idle_s=30)
    assert isinstance(stream, AsyncIterator)
    got: list[controller_pb2.JobUpdate] = []

    async def read() -> None:
        async for u in stream:
            got.append(u)

    task = asyncio.create_task(read())
    try:
        await settle()
        jobs = [u for u in got if u.HasField("job")]
        assert sorted(u.job.id for u in jobs) == sorted(ids) and got[-1].batch_end
        assert all(u.job.spec.env["BLOB"] == "x" * SPEC_BYTES for u in jobs)  # sent whole
        frame = stream.ag_frame  # type: ignore[attr-defined]
        assert frame is not None  # waiting for the next change, not ended
        size, messages = held(dict(frame.f_locals))
        assert messages == 0, "a waiting stream holds none of the messages it sent"
        assert size < JOBS * PER_JOB, f"{size:,} bytes held for {JOBS} jobs"
        sent = frame.f_locals["sent"]
        assert sorted(sent) == sorted(ids)
        assert all(len(d) == 16 for _, d in sent.values())
        assert sent[ids[0]][1] == digest(jobs[[u.job.id for u in jobs].index(ids[0])].job)

        # A change: the one job goes out again, and the stream lets go of it once sent.
        got.clear()
        await h.engine.cancel(ids[0])
        await settle()
        assert [(u.job.id, u.job.state) for u in got[:-1]] == [(ids[0], P.JOB_STATE_CANCELLED)] and got[-1].batch_end
        size, messages = held(dict(frame.f_locals))
        assert messages == 0 and size < JOBS * PER_JOB
        # A wake-up with nothing new to the list (another tenant's job): nothing sent, nothing kept.
        got.clear()
        other = big("other")
        other.tenant = "team-b"
        await h.submit(other)
        await settle()
        assert got == []
        assert held(dict(frame.f_locals))[1] == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
