"""A job's state changes as values: each function takes a stored record and returns the record to
store next with the events to append. Pure (times are passed in); the engine stores the result
before it makes the agent calls that act on it (the crash-safety rule of controller/engine.py).
"""

from __future__ import annotations

from tessera.common import jobspec
from tessera.common.contract import TRAINER_REFUSED_EXIT
from tessera.controller.convert import placement_pb, plan_pb
from tessera.controller.core.backoff import BackoffConfig, job_delay, node_unhealthy_for
from tessera.controller.core.snapshot import Decision, PlanChoice, Slice
from tessera.controller.judging import processes, processes_text, retries_text
from tessera.controller.store import JobRecord, NodeRecord
from tessera.v1 import common_pb2

P = common_pb2
EARLIER_KEPT = 32  # earlier attempts whose nodes a job's placement keeps (Placement.earlier)
Events = list[tuple[str, str]]
Change = tuple[JobRecord, Events]


def request_key(tenant: str, request_id: str) -> str:
    """The store's idempotency key of a submit: "tenant/request_id" (a tenant never holds a "/"), so
    one tenant's retry never returns, or collides with, another tenant's job."""
    return f"{tenant or 'default'}/{request_id}"


def submitted(job_id: str, request_id: str, spec: common_pb2.JobSpec, now: float) -> tuple[JobRecord, tuple[str, str]]:
    rec = JobRecord(id=job_id, request_id=request_id, spec=spec, state=P.JOB_STATE_PENDING,
                    reason="waiting for the next scheduling round", submit_time=now)
    return rec, ("SUBMITTED", f"submitted by tenant {spec.tenant}")


def cancelled(job: JobRecord, now: float, by: str = "user") -> Change:
    """`by`: who asked, "NAME (ROLE)" from the caller's token: the job's record is the audit trail of
    who ended it (an admin's cancel read the same as its owner's)."""
    why = f"cancelled by {by}"
    return job.with_(state=P.JOB_STATE_CANCELLED, reason=why, end_time=now, stop_requested=True), [("CANCELLED", why)]


def pending(job: JobRecord, why: str) -> Change:
    """Still PENDING, for `why`: an event when the reason is new (a start that waits for a victim's
    checkpoint is decided again each round until then)."""
    return job.with_(reason=why), [] if job.reason == why else [("PENDING", why)]


def started(job: JobRecord, plan: PlanChoice, slices: tuple[Slice, ...], rendezvous: str, reason: str, kind: str,
            now: float, floor: int = 0, opportunistic: bool = False) -> Change:
    """The job's next attempt (plan, placement, rendezvous) as STARTING; `kind` is the event's
    (PLACED for a round's start, MIGRATED for a relaunch after a move). The placement keeps where
    the earlier attempts ran (the last EARLIER_KEPT), for their logs. `floor`: an attempt number
    the agents have used (controller/registry.py attempt_floor): the new one is above it too.
    `opportunistic`: the decision's mark (Placement.opportunistic), which the next rounds read back."""
    attempt = max(job.attempt, floor) + 1
    recipe = job.spec.plan if job.spec.HasField("plan") else None
    placement = placement_pb(slices, rendezvous)
    placement.placed_at, placement.opportunistic = now, opportunistic
    if job.placement is not None and job.plan is not None and job.attempt > 0:
        placement.earlier.extend(list(job.placement.earlier)[-(EARLIER_KEPT - 1):])
        placement.earlier.add(attempt=job.attempt, slices=job.placement.slices, world_size=processes(job))
    return (job.with_(state=P.JOB_STATE_STARTING, reason=reason, attempt=attempt, plan=plan_pb(plan, recipe),
                      placement=placement, start_time=job.start_time or now, stop_requested=False),
            [(kind, f"attempt {attempt}: {reason}")])


def unheard_text(nodes: list[str]) -> str:
    """Why a start waits after the controller's (re)start (Engine._place)."""
    shown = ", ".join(nodes[:5]) + (", ..." if len(nodes) > 5 else "")
    return (f"waiting for node{'s' if len(nodes) > 1 else ''} {shown} to report after the controller's start: "
            "a node may still run an attempt of this job the state does not record (restored from an older "
            "copy), so the next attempt's number is chosen once every node has reported or its lease has passed")


def held_text(stopping: list[str]) -> str:
    """Why a start the round decided waits: its GPUs are still held (by jobs checkpointing to stop)."""
    if stopping:
        return (f"waiting for {', '.join(stopping)} to checkpoint and stop: it starts on their GPUs once they "
                "are free")
    return "placement conflict: its GPUs are still held; the next round decides again"


def stopping_text(job: JobRecord) -> str:
    """How the attempt is stopped: the reference trainer checkpoints on SIGTERM; a program of the
    job's own (opaque or not) gets SIGTERM and saves what it will, if anything
    (docs/opaque-jobs.md); Tessera takes no checkpoint of it."""
    if not job.spec.HasField("model") or jobspec.runs_own_program(job.spec):
        return f"stopping attempt {job.attempt} (SIGTERM; its program may save to $TESSERA_CHECKPOINT_DIR)"
    return f"stopping attempt {job.attempt} with a checkpoint"


def migrating(job: JobRecord, d: Decision) -> Change:
    """A round moves the running job: stop it with a checkpoint, relaunch on `d` once stopped."""
    what = f"{d.change or 'move'} {d.previous or ''} -> {d.cell or ''}".replace("  ", " ")
    return (job.with_(state=P.JOB_STATE_MIGRATING, reason=f"migrating: {d.reason}", stop_requested=True),
            [("MIGRATING", f"{what}: {d.reason}; {stopping_text(job)}")])


def migrating_off(job: JobRecord, why: str) -> Change:
    """Off its node (drain) or suspended by the policy: stopped with a checkpoint, then requeued."""
    return (job.with_(state=P.JOB_STATE_MIGRATING, reason=why, stop_requested=True),
            [("MIGRATING", f"{why}: {stopping_text(job)}")])


def requeued(job: JobRecord, why: str, kind: str, retry: bool, progress: common_pb2.Progress | None) -> Change:
    return (job.with_(state=P.JOB_STATE_PENDING, reason=f"requeued: {why}", restarts=job.restarts + 1,
                      retries=job.retries + (1 if retry else 0), stop_requested=False, progress=progress),
            [(kind, why)])


# The reason of a RUNNING job of its own program that counts no iterations and has reported no
# progress (an opaque script): "training" was said of it, which nothing it reported says.
NO_PROGRESS = "running (the program reports no progress)"


def running_reason(job: JobRecord, progress: common_pb2.Progress | None) -> str:
    """"training" for the reference trainer, a job that counts iterations or one that has
    reported; NO_PROGRESS for a program of its own that does neither (docs/opaque-jobs.md)."""
    if progress is not None or job.spec.iterations or not jobspec.runs_own_program(job.spec):
        return "training"
    return NO_PROGRESS


def progressed(job: JobRecord, progress: common_pb2.Progress) -> JobRecord:
    """The record with its latest progress; a job that read NO_PROGRESS reads "training" once its
    program reports (it kept the no-progress reason for good)."""
    return job.with_(progress=progress, reason="training" if job.reason == NO_PROGRESS else job.reason)


def running(job: JobRecord, world: int, progress: common_pb2.Progress | None) -> Change:
    """`world`: the processes of the attempt (judging.processes): ranks, or per-node launchers."""
    return (job.with_(state=P.JOB_STATE_RUNNING, reason=running_reason(job, progress), progress=progress),
            [("RUNNING", f"{processes_text(job, world)} running (attempt {job.attempt})")])


def succeeded(job: JobRecord, why: str, progress: common_pb2.Progress | None, now: float) -> Change:
    return (job.with_(state=P.JOB_STATE_SUCCEEDED, reason=why, end_time=now, progress=progress),
            [("SUCCEEDED", why)])


def failed(job: JobRecord, why: str, progress: common_pb2.Progress | None, now: float) -> Change:
    return job.with_(state=P.JOB_STATE_FAILED, reason=why, end_time=now, progress=progress), [("FAILED", why)]


def attempt_failed(job: JobRecord, reason: str, progress: common_pb2.Progress | None, now: float,
                   exit_code: int | None = None) -> Change:
    """User code failed the attempt: requeued for a retry within max_retries, else the job failed.
    The reference trainer's refusal (TRAINER_REFUSED_EXIT: a model or plan it does not build) fails
    the job at once: each retry was placed, launched and refused the same way (a live audit)."""
    if exit_code == TRAINER_REFUSED_EXIT and not jobspec.runs_own_program(job.spec):
        return failed(job, f"attempt {job.attempt} failed: {reason} (the reference trainer refuses the job as "
                           "configured: no retry)", progress, now)
    why = f"attempt {job.attempt} failed: {reason}{retries_text(job)}"
    if job.retries < job.spec.max_retries:
        return requeued(job, why, "ATTEMPT_FAILED", True, progress)
    return failed(job, why, progress, now)


def resumed_text(attempt: int, first_s: float, total_s: float) -> str:
    return (f"first progress of attempt {attempt} {first_s:.1f}s after relaunch; "
            f"migration cost {total_s:.1f}s (stop + restart + first report)")


def launch_failed(job: JobRecord, why: str, progress: common_pb2.Progress | None, now: float,
                  cfg: BackoffConfig) -> Change:
    """A Launch of the attempt failed: back to PENDING, not placed again before the backoff runs
    out (no retry is spent: the agent refused, the job's code never ran)."""
    n = job.launch_failures + 1
    delay = job_delay(n, cfg)
    after, events = requeued(job, f"{why}; launch failure {n}, next try in {delay:g}s", "LAUNCH_FAILED", False,
                             progress)
    return after.with_(launch_failures=n, next_launch_time=now + delay), events


def launch_succeeded(job: JobRecord) -> JobRecord:
    return job.with_(launch_failures=0, next_launch_time=0.0)


def node_launched(rec: NodeRecord, ok: bool, now: float, cfg: BackoffConfig) -> NodeRecord:
    """The node after a Launch on it: a success resets its count; a failure adds one, and from the
    threshold on the node is unhealthy (no placements) for a doubling period."""
    if ok:
        return rec.with_(launch_failures=0, unhealthy_until=0.0)
    n = rec.launch_failures + 1
    hold = node_unhealthy_for(n, cfg)
    return rec.with_(launch_failures=n, unhealthy_until=now + hold if hold else rec.unhealthy_until)
