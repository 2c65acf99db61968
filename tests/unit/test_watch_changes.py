"""The watches over a real engine (tests/unit/test_engine.py's Harness): a wake-up with nothing new
costs a WatchJobs stream no scan of its tenant's jobs, and every change a client should see still
comes, exactly once (controller/changes.py, controller/watching.py, controller/view.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest

from tessera.controller import watching
from tessera.controller.changes import Changes
from tessera.controller.retention import Retention, RetentionConfig
from tessera.controller.store import JobRecord
from tessera.controller.watching import watch_events, watch_job, watch_jobs
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2
from tests.unit.test_engine import Harness, run_to_running, tiny


async def settle() -> None:
    """Let the watches run until they wait again."""
    for _ in range(50):
        await asyncio.sleep(0)


class Reader:
    """Consumes a stream in a task; `take()` returns what came since the last call."""

    def __init__(self, stream: AsyncIterator[Any]) -> None:
        self.stream = stream
        self.got: list[Any] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for x in self.stream:
            self.got.append(x)

    async def take(self) -> list[Any]:
        await settle()
        out, self.got = self.got, []
        return out

    async def close(self) -> None:
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


def shown(updates: list[controller_pb2.JobUpdate]) -> list[tuple[str, str, bool]]:
    """(job id, state, removed) of each job update, then ("", "", True) for a batch_end."""
    def one(u: controller_pb2.JobUpdate) -> tuple[str, str, bool]:
        if u.batch_end:
            return "", "", True
        return u.job.id, "" if u.removed else P.JobState.Name(u.job.state)[10:], u.removed

    return [one(u) for u in updates]


class Scans:
    """Counts the view's `jobs` calls for one tenant: a WatchJobs scan."""

    def __init__(self, h: Harness, tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = h.engine.view.jobs

        def jobs(states: Iterable[int] = (), tenant_: str = "") -> list[JobRecord]:
            if tenant_ == tenant:
                self.calls += 1
            return real(states, tenant_)

        monkeypatch.setattr(h.engine.view, "jobs", jobs)


def serializations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the jobs the watches serialize (watching.job_pb), in order, from now on."""
    seen: list[str] = []
    real = watching.job_pb
    monkeypatch.setattr(watching, "job_pb", lambda rec, *a, **kw: seen.append(rec.id) or real(rec, *a, **kw))
    return seen


async def harness(jobs: int = 3) -> tuple[Harness, list[str]]:
    h = Harness()
    await h.register("a", "b")
    ids = [await h.submit(tiny(f"t{i}", gpus=64)) for i in range(jobs)]  # too large to place: stay PENDING
    await h.round()
    return h, ids


async def test_an_idle_list_watch_never_scans_again(monkeypatch: pytest.MonkeyPatch) -> None:
    h, ids = await harness()
    scans = Scans(h, "default", monkeypatch)
    serialized = serializations(monkeypatch)
    reader = Reader(watch_jobs(h.engine.view, [], "default", idle_s=0.001))
    first = await reader.take()
    assert shown(first) == [(i, "PENDING", False) for i in ids] + [("", "", True)]
    assert scans.calls == 1 and sorted(serialized) == sorted(ids)
    for _ in range(5):  # liveness passes with nothing new, forced wake-ups, idle timeouts
        await h.engine.liveness_tick()
        await h.engine.view.notify()
        await asyncio.sleep(0.005)
    assert await reader.take() == [] and scans.calls == 1 and len(serialized) == len(ids)
    await reader.close()


async def test_each_change_comes_once_and_only_the_changed_job_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    h, ids = await harness()
    scans = Scans(h, "default", monkeypatch)
    serialized = serializations(monkeypatch)
    everything = Reader(watch_jobs(h.engine.view, [], "default"))
    pending = Reader(watch_jobs(h.engine.view, [P.JOB_STATE_PENDING], "default"))
    await everything.take(), await pending.take()
    serialized.clear()
    # A state change: the job in its new state in one list, removed from the other.
    await h.engine.cancel(ids[0])
    assert shown(await everything.take()) == [(ids[0], "CANCELLED", False), ("", "", True)]
    assert shown(await pending.take()) == [(ids[0], "", True), ("", "", True)]
    assert serialized == [ids[0]]  # the other jobs' counts did not move: not serialized again
    # A new job: in both lists.
    new = await h.submit(tiny("new", gpus=64))
    assert shown(await everything.take()) == [(new, "PENDING", False), ("", "", True)]
    assert shown(await pending.take()) == [(new, "PENDING", False), ("", "", True)]
    # Another tenant's job: no scan of this tenant's lists, nothing sent.
    calls = scans.calls
    await h.submit(P.JobSpec(name="other", tenant="team-b", entrypoint=["/bin/true"], hint=P.ResourceHint(gpus=64)))
    assert await everything.take() == [] and await pending.take() == [] and scans.calls == calls
    await everything.close()
    await pending.close()


async def test_the_event_watch_of_an_ended_job_ends_after_its_events() -> None:
    """WatchJobEvents ends on a read that finds no new events of an ended job, whether the job ended
    before the watch (its events all in the first read) or while it ran (the CANCELLED event last)."""
    h, ids = await harness(2)
    await h.engine.cancel(ids[0])
    ended = await asyncio.wait_for(_kinds(watch_events(h.engine.view, ids[0], 0, idle_s=30)), 5)
    assert ended[0] == "SUBMITTED" and ended[-1] == "CANCELLED"
    live = asyncio.create_task(_kinds(watch_events(h.engine.view, ids[1], 0, idle_s=30)))
    await settle()
    assert not live.done()
    await h.engine.cancel(ids[1])
    kinds = await asyncio.wait_for(live, 5)
    assert kinds[-1] == "CANCELLED" and kinds.count("CANCELLED") == 1


async def _kinds(stream: AsyncIterator[P.JobEvent]) -> list[str]:
    return [e.kind async for e in stream]


async def test_a_progress_report_wakes_the_watches_at_the_next_liveness_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness()
    await h.register("a", "b")
    jid = await h.submit(tiny())
    await h.round()
    attempt = await run_to_running(h, jid)
    h.agents.report(jid, attempt, iteration=5)
    await h.heartbeat("a")
    await h.engine.liveness_tick()
    listed = Reader(watch_jobs(h.engine.view, [], "default"))
    one = Reader(watch_job(h.engine.view, jid))
    events = Reader(watch_events(h.engine.view, jid, 10**9))
    assert [u.job.progress.iteration for u in await listed.take() if u.HasField("job")] == [5]
    assert [u.job.progress.iteration for u in await one.take()] == [5]
    assert [e.message for e in await events.take()] == ["iteration 5/40 step 0.5s"]
    for _ in range(3):  # the same report again: nothing new
        await h.heartbeat("a")
        await h.engine.liveness_tick()
    assert await listed.take() == [] and await one.take() == [] and await events.take() == []
    h.agents.report(jid, attempt, iteration=6)
    await h.heartbeat("a")  # counted, announced by the next pass
    assert await listed.take() == [] and await one.take() == [] and await events.take() == []
    await h.engine.liveness_tick()
    got = await listed.take()
    assert [(u.job.id, u.job.progress.iteration) for u in got[:-1]] == [(jid, 6)] and got[-1].batch_end
    assert [u.job.progress.iteration for u in await one.take()] == [6]
    assert [e.message for e in await events.take()] == ["iteration 6/40 step 0.5s"]
    for r in (listed, one, events):
        await r.close()


async def test_progress_is_counted_then_announced_once() -> None:
    h = Harness()
    await h.register("a")
    jid = await h.submit(tiny())
    view = h.engine.view
    before = (view.generation(), view.generation("default"), view.generation("team-b"), view.job_generation(jid))
    waiter = asyncio.create_task(view.wait_changed(60))
    await settle()
    view.set_progress(jid, P.Progress(iteration=3))
    await settle()
    assert not waiter.done()  # counted, not announced
    after = (view.generation(), view.generation("default"), view.generation("team-b"), view.job_generation(jid))
    assert [a > b for a, b in zip(after, before, strict=True)] == [True, True, False, True]
    await view.flush()
    await settle()
    assert waiter.done()
    view.set_progress(jid, P.Progress(iteration=3))  # the same report: no change
    assert view.generation() == after[0]
    waiter = asyncio.create_task(view.wait_changed(60))
    await view.flush()  # nothing new since the last notify
    await settle()
    assert not waiter.done()
    waiter.cancel()  # a waiter cancelled while it waits: no error but the cancellation
    with pytest.raises(asyncio.CancelledError):
        await waiter
    # A change while the caller was not waiting: its next wait returns at once.
    seen = view.generation()
    await h.engine.cancel(jid)
    await asyncio.wait_for(view.wait_changed(60, seen), 1)


async def test_jobs_leaving_the_store_leave_the_lists(tmp_path: Any) -> None:
    h, ids = await harness(2)
    await h.engine.cancel(ids[0])
    ended = Reader(watch_jobs(h.engine.view, [P.JOB_STATE_CANCELLED], "default"))
    assert shown(await ended.take()) == [(ids[0], "CANCELLED", False), ("", "", True)]
    h.clock.advance(10 * 86400)
    retention = Retention(h.engine.store, str(tmp_path), RetentionConfig(job_ttl_s=86400), wall=h.clock)
    await retention.sweep()
    h.submitted.remove(ids[0])
    await h.engine.view.notify()  # as retention.loop does after a sweep that deleted jobs
    assert shown(await ended.take()) == [(ids[0], "", True), ("", "", True)]
    await ended.close()


def test_changes_counts() -> None:
    c = Changes()
    c.job("j-1", "a")
    c.job("j-2", "b")
    assert (c.count, c.of_tenant(""), c.of_tenant("a"), c.of_tenant("b"), c.of_tenant("c")) == (2, 2, 1, 2, 0)
    assert (c.of_job("j-1"), c.of_job("j-2"), c.tenant_of("j-1")) == (1, 2, "a")
    c.removed(["j-1"])  # every job's count moves: a text naming j-1 now reads otherwise
    assert (c.of_job("j-2"), c.of_tenant("c"), c.tenant_of("j-1")) == (3, 3, None)
