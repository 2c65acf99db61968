"""What an active attempt's reported workers mean for its job, and what the engine does next.

`judge` (controller/core/attempts.py) turns rank statuses into a verdict; `settle` turns the verdict
and the job's state into the engine's next step. Both pure: the engine gathers the worker reports
from its live node table, and carries out the step (store writes first, then agent calls).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from tessera.controller.core import launchers
from tessera.controller.core.attempts import EXIT_UNKNOWN, RankStatus, Verdict, ranks_text
from tessera.controller.launches import rank_node
from tessera.controller.registry import LivenessConfig, LiveNode
from tessera.controller.store import JobRecord
from tessera.v1 import common_pb2

P = common_pb2

# "wait": nothing to do yet; "running": every rank up, the job becomes RUNNING; "succeeded";
# "failed": user code failed the attempt (retry or fail); "interrupted": stop what is left, requeue;
# "relaunch": a migration's old attempt stopped, start the new one on the move's target;
# "requeue": stopped on request, back to PENDING; "retry": exited 0 too early, retried;
# "give_up": exited 0 too early with no retries left, the job failed.
Step = Literal["wait", "running", "succeeded", "failed", "interrupted", "relaunch", "requeue", "retry", "give_up"]


def processes(job: JobRecord) -> int:
    """How many worker processes the agents run for the attempt."""
    assert job.plan is not None and job.placement is not None
    if launchers.template_of(job.spec.launcher).per_node:
        return len(job.placement.slices)
    return world_ranks(job)


def world_ranks(job: JobRecord) -> int:
    """The job's ranks: its plan's dp x tp x pp, whatever starts them (a per-node launcher starts
    them itself)."""
    assert job.plan is not None
    return int(job.plan.dp * job.plan.tp * job.plan.pp)


def launcher_name(job: JobRecord) -> str:
    """The per-node launcher that runs each of the job's processes ("torchrun", "deepspeed",
    "launcher" for a template of the job's own); "" when a process is a rank."""
    if not launchers.template_of(job.spec.launcher).per_node:
        return ""
    return job.spec.launcher.name if job.spec.launcher.name in launchers.BUILTIN else "launcher"


def processes_text(job: JobRecord, n: int) -> str:
    """"its 1 rank", "all 4 ranks"; a per-node launcher's processes are launchers, each starting
    ranks ("its 1 torchrun launcher (2 ranks)"): a live audit read `its 1 rank running` of a
    torchrun job of 2 ranks."""
    name = launcher_name(job)
    if not name:
        return ranks_text(n)
    ranks = world_ranks(job)
    of = f" ({ranks} rank{'s' * (ranks != 1)})"
    unit = "launcher" if name == "launcher" else f"{name} launcher"
    return f"its 1 {unit}{of}" if n == 1 else f"all {n} {unit}s{of}"


def process_text(job: JobRecord, index: int) -> str:
    """"rank 3"; a per-node launcher's process is its node's rank, not a global rank ("node rank 0
    (torchrun on node-c)"): a torchrun job whose global rank 1 failed read `rank 0: exit code 1`."""
    name = launcher_name(job)
    if not name:
        return f"rank {index}"
    return f"node rank {index} ({name} on {rank_node(job, index) or 'an unknown node'})"


def in_launcher_words(job: JobRecord, text: str, verdict: Verdict) -> str:
    """`text` of a verdict (controller/core/attempts.py words processes as ranks) as it is true of
    the job's processes."""
    if not launcher_name(job):
        return text
    world = processes(job)
    said = ranks_text(world)
    if text.startswith(said):
        return processes_text(job, world) + text[len(said):]
    if verdict.rank >= 0 and text.startswith(rank := f"rank {verdict.rank}:"):
        return f"{process_text(job, verdict.rank)}:{text[len(rank):]}"
    return text


def killed_text(job: JobRecord, killed: tuple[tuple[int, str], ...]) -> str:
    """"rank 0 did not exit within the 10 s grace after SIGTERM, killed by SIGKILL", of the ranks a
    stop's SIGKILL ended (Verdict.killed; the first's words for all)."""
    shown, more = [r for r, _ in killed[:4]], f" and {len(killed) - 4} more" if len(killed) > 4 else ""
    if launcher_name(job):
        who = ", ".join(process_text(job, r) for r in shown)
    else:
        who = f"rank{'s' * (len(killed) > 1)} {', '.join(str(r) for r in shown)}"
    return f"{who}{more} {killed[0][1]}"


def rank_statuses(job: JobRecord, nodes: Mapping[str, LiveNode]) -> dict[int, RankStatus]:
    """The latest reported status of each rank of the job's current attempt, each from the node the
    placement puts it on: a node's report of another node's rank, or of a rank the attempt does not
    have, is not the job's (a node certificate speaks for its own workers only). A node that reports
    none of the attempt's workers but ran a later attempt of the job (its Register's marks: a
    controller restored from an older copy, past the agent's retention) has ended this one: its
    ranks there are reported gone, not awaited until the progress timeout."""
    out: dict[int, RankStatus] = {}
    for s in job.placement.slices if job.placement else ():
        live = nodes.get(s.node_id)
        if live is None:
            continue
        workers = live.running.get((job.id, job.attempt), [])
        for w in workers:
            if rank_node(job, w.rank) != s.node_id:
                continue
            out[w.rank] = RankStatus(w.rank, w.state != P.WORKER_STATE_EXITED, w.exit_code, w.reason,
                                     w.progress.iteration if w.HasField("progress") else 0, w.stop_requested)
        if not workers and (later := live.marks.get(job.id, 0)) > job.attempt:
            gone = f"node {s.node_id} has run attempt {later} of the job since: this one is over there"
            for rank in range(processes(job)):
                if rank_node(job, rank) == s.node_id:
                    out[rank] = RankStatus(rank, False, EXIT_UNKNOWN, gone)
    return out


def silent_peer(job: JobRecord, nodes: Mapping[str, LiveNode], verdict: Verdict, now: float,
                liveness: LivenessConfig) -> str:
    """For a "failed" verdict, a node of the job's placement other than the failed rank's that is
    not READY or has missed a heartbeat (silent 1.5 heartbeat intervals at monotonic `now`), else
    "". Its workers may have been
    fenced, and then `rank` failed in a collective with them: the node's loss, not the program's.
    The engine leaves such a failure unjudged: liveness requeues the job (NODE_LOST, no retry
    spent) or the node comes back and reports its fenced ranks (interrupted). A live audit saw a
    killed agent's pipeline charged a retry (`rank 1: exit code 1 ... Connection closed by peer`)."""
    if verdict.kind != "failed":
        return ""
    here, after_s = rank_node(job, verdict.rank) if verdict.rank >= 0 else "", 1.5 * liveness.heartbeat_interval_s
    for s in job.placement.slices if job.placement else ():
        live = nodes.get(s.node_id)
        if s.node_id != here and (live is None or live.liveness != P.NODE_STATE_READY or now - live.last_seen > after_s):
            return s.node_id
    return ""


def settle(job: JobRecord, verdict: Verdict, move_pending: bool, silent: str = "") -> tuple[Step, str]:
    """The engine's next step for an active job and the reason to record (for "relaunch", what the
    stop killed, or ""). `move_pending`: a round's migration of this job is waiting for its old
    attempt to stop; `silent`: a node of the job that missed a heartbeat (`silent_peer`), under which
    a failure is not judged yet."""
    kind = verdict.kind
    if kind == "failed" and silent:
        return "wait", ""
    if kind == "running":
        return ("running", "") if job.state == P.JOB_STATE_STARTING else ("wait", "")
    if kind == "succeeded":
        return "succeeded", in_launcher_words(job, verdict.reason, verdict)
    if kind == "failed":
        return "failed", in_launcher_words(job, verdict.reason, verdict)
    if kind == "interrupted":
        return "interrupted", f"attempt {job.attempt} interrupted: {in_launcher_words(job, verdict.reason, verdict)}"
    if kind != "stopped":
        return "wait", ""
    # What the stop did to a program that ignored its SIGTERM (the agent's account), said here:
    # before, only the agent's own log said it.
    killed = f"; {killed_text(job, verdict.killed)}" if verdict.killed else ""
    if move_pending and job.state == P.JOB_STATE_MIGRATING:
        return "relaunch", killed
    if job.state == P.JOB_STATE_MIGRATING or job.stop_requested:
        return "requeue", (job.reason or "stopped for migration") + killed
    return early_exit(job)


def early_exit(job: JobRecord) -> tuple[Step, str]:
    """All ranks exited 0 before rank 0 reported the job's iterations: retried, else failed, with the
    retries said as every final failure says them (transitions.attempt_failed). A live audit saw a
    plain script of an opaque job with `iterations: 5` fail so on every attempt, its reason silent
    on why: only the trainer SDK's progress reports count iterations."""
    why = f"before reaching {job.spec.iterations} iterations: only progress reports (the trainer SDK's) count them"
    if job.retries < job.spec.max_retries:
        return "retry", f"attempt {job.attempt} exited 0 {why}{retries_text(job)}"
    return "give_up", f"program exited 0 {why}{retries_text(job)}"


def retries_text(job: JobRecord) -> str:
    """What a failed attempt's reason ends with: "; retry N of M" when the job has a retry left,
    else " (after N retries)" (nothing without retries): the same words for every failure."""
    if job.retries < job.spec.max_retries:
        return f"; retry {job.retries + 1} of {job.spec.max_retries}"
    return f" (after {job.retries} {'retry' if job.retries == 1 else 'retries'})" if job.spec.max_retries else ""
