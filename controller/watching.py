"""Server-streaming watches of the Controller API: one job as it changes (WatchJob, WatchJobEvents),
and a list of jobs as it changes (WatchJobs).

They are driven by the engine's change notification (EngineView.wait_changed), never by a client
polling, and look again only when what they show may have changed: the view counts every change of
a job's message (its stored record, its live progress, jobs leaving the store: controller/changes.py)
and a watch compares the counts it last looked at (EngineView.generation, job_generation). A wake-up
with nothing new to a watch costs it O(1); a list watch with something new re-reads its tenant's
jobs and serializes only those whose own count moved. An update goes out only when what the caller
sees changed. The service checks who may watch what before these run (controller/access.py).

What a stream keeps while it waits is bounded per job, whatever the specs: a list watch remembers
each job's count and a 16-byte digest of its message as last sent (not the message: 2,000 jobs of
60 KB specs were 250 MB per stream, and a principal may hold 16 of them), and lets go of each update
once it has gone out.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterable

from tessera.controller.convert import event_pb, job_pb
from tessera.controller.listing import _listed
from tessera.controller.redact import Hide
from tessera.controller.store import TERMINAL
from tessera.controller.view import EngineView
from tessera.v1 import common_pb2, controller_pb2

# The longest a watch sleeps without looking (a missed notification costs at most this).
IDLE_S = 5.0


def progress_event(job_id: str, seq: int, p: common_pb2.Progress, iterations: int) -> common_pb2.JobEvent:
    """A PROGRESS event of a report (not stored: `seq` is the last stored event's, so a client that
    resumes after it loses nothing)."""
    text = f"iteration {p.iteration}" + (f"/{iterations}" if iterations else "")
    if p.loss:
        text += f" loss {p.loss:.4g}"
    if p.step_time_seconds > 0:
        text += f" step {p.step_time_seconds:.3g}s"
    return common_pb2.JobEvent(seq=seq, job_id=job_id, time=p.time, kind="PROGRESS", message=text)


async def watch_events(view: EngineView, job_id: str, after_seq: int, idle_s: float = IDLE_S,
                       hide: Hide | None = None) -> AsyncIterator[common_pb2.JobEvent]:
    """WatchJobEvents: the stored events after `after_seq`, then new ones, and a PROGRESS event for
    each new report of rank 0 while the job is active; ends when the job has ended."""
    seq = after_seq
    last: common_pb2.Progress | None = None
    seen: int | None = None  # the job's change count when it was last read
    while True:
        everything, mine = view.generation(), view.job_generation(job_id)
        if mine != seen:
            seen = mine
            rec = view.get(job_id)
            events = view.events(job_id, seq)
            for e in events:
                seq = e.seq
                yield event_pb(e, hide)
            prog = view.progress(job_id)
            if prog is not None and rec.state not in TERMINAL and prog != last:
                last = prog
                yield progress_event(job_id, seq, prog, rec.spec.iterations)
            if rec.state in TERMINAL:
                if not events:
                    return
                seen = None  # it ends on a read that finds no new events: read again now
                continue
        await view.wait_changed(idle_s, everything)


async def watch_job(view: EngineView, job_id: str, idle_s: float = IDLE_S,
                    hide: Hide | None = None) -> AsyncIterator[controller_pb2.JobUpdate]:
    """The job now (with its events so far), then an update each time its state, reason, progress or
    events change; ends after the update that shows it ended."""
    seq = 0
    last = b""  # the digest of the job's message as last sent
    seen: int | None = None  # the job's change count when it was last read
    while True:
        everything, mine = view.generation(), view.job_generation(job_id)
        if mine != seen:
            seen = mine
            rec = view.get(job_id)
            events = view.events(job_id, seq)
            job = job_pb(rec, view.progress(job_id), hide=hide)
            key = digest(job)
            if events or key != last:
                last = key
                if events:
                    seq = events[-1].seq
                yield controller_pb2.JobUpdate(job=job, events=[event_pb(e, hide) for e in events])
            if rec.state in TERMINAL:
                return
        await view.wait_changed(idle_s, everything)


async def watch_jobs(view: EngineView, states: Iterable[int], tenant: str, idle_s: float = IDLE_S,
                     hide: Hide | None = None) -> AsyncIterator[controller_pb2.JobUpdate]:
    """The jobs of `tenant` ("" = all the caller may see: the service has scoped it) in `states`
    (all when empty): each one first, then batch_end; after every change, the jobs that changed,
    those that left the list (removed), then batch_end. Never ends by itself.

    A wake-up reads the jobs only when the tenant's change count moved, and serializes only the jobs
    whose own count moved since they were last sent (or that are new to the list)."""
    wanted = list(states)
    sent: dict[str, tuple[int, bytes]] = {}  # job id -> its change count and its message's digest, as last sent
    seen: int | None = None  # the tenant's change count at the last read
    while True:
        everything, mine = view.generation(), view.generation(tenant)
        if mine != seen:
            first, seen = seen is None, mine
            sent, out = _changed(view, wanted, tenant, sent, hide)
            news = bool(out)
            out.reverse()
            while out:  # each update let go of as it goes out: none is held while the stream waits
                yield out.pop()
            if news or first:
                yield controller_pb2.JobUpdate(batch_end=True)
        await view.wait_changed(idle_s, everything)


def digest(job: controller_pb2.Job) -> bytes:
    """What a watch remembers of a message it sent: 16 bytes, equal for equal messages."""
    return hashlib.blake2b(job.SerializeToString(deterministic=True), digest_size=16).digest()


def _changed(view: EngineView, wanted: list[int], tenant: str, sent: dict[str, tuple[int, bytes]],
             hide: Hide | None) -> tuple[dict[str, tuple[int, bytes]], list[controller_pb2.JobUpdate]]:
    """One read of a list watch: what it remembers now of each job listed (its change count, its
    message's digest), and the updates to send: each job whose message differs from the one last
    sent (or new to the list), then those that left it. Only the jobs whose count moved since they
    were sent are serialized again. The records and messages are let go of on return."""
    now: dict[str, tuple[int, bytes]] = {}
    out: list[controller_pb2.JobUpdate] = []
    for rec in view.jobs(wanted, tenant):
        count, before = view.job_generation(rec.id), sent.get(rec.id)
        if before is not None and before[0] == count:
            now[rec.id] = before  # unchanged since it was sent
            continue
        job = _listed(job_pb(rec, view.progress(rec.id), hide=hide))
        key = digest(job)
        now[rec.id] = (count, key)
        if before is None or before[1] != key:
            out.append(controller_pb2.JobUpdate(job=job))
    for gone in sorted(sent.keys() - now.keys()):
        out.append(controller_pb2.JobUpdate(job=controller_pb2.Job(id=gone), removed=True))
    return now, out
