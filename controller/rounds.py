"""A scheduling round of the live controller, as values: which policy, what it decides, and what
the engine must store and do for each decision, in order.

Pure. The engine snapshots (controller/snapshots.py), runs `plan_round` (controller/core/policy.py)
and `pending_updates` in a thread (over 10,000 pending jobs they took seconds, which heartbeats
waited out on the event loop, long enough to fence the workers of other tenants), stores the
updates of the jobs no one wrote meanwhile in one transaction, then carries out `steps` one at a
time: before each it reads the job again and skips the step unless `applies` (a job may be
cancelled while the round planned or an earlier launch of the round is awaited), stores the step's
transition (controller/transitions.py) and only then calls the agents.

Policies are built by the one factory (`make_policy(name, mode, options)`); what a waiting job waits
for is the decision's typed `pending` kind, never its reason text.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from tessera.controller.cell_estimates import MemoryNeed, recipe_refusal
from tessera.controller.core import frenzy, opaque
from tessera.controller.core.policies import PolicyOptions, make_policy
from tessera.controller.core.policies.crius import CriusOptions
from tessera.controller.core.policies.gavel import GavelOptions
from tessera.controller.core.policies.morphling import MorphlingOptions
from tessera.controller.core.policy import Policy
from tessera.controller.core.quotas import UNGUARDED
from tessera.controller.core.snapshot import (
    Action,
    Decision,
    JobView,
    Objective,
    PendingKind,
    Priority,
    RoundPlan,
    Snapshot,
)
from tessera.controller.store import JobRecord
from tessera.controller.transitions import Change
from tessera.controller.transitions import pending as pending_change
from tessera.controller.warming import COLD_REASON
from tessera.v1 import common_pb2

P = common_pb2


class PolicyFlags(Protocol):
    """The controller's flags that build its policy (EngineConfig's fields of the same names)."""

    @property
    def policy(self) -> str: ...
    @property
    def policy_mode(self) -> str: ...
    @property
    def min_gain(self) -> float: ...
    @property
    def frenzy(self) -> frenzy.FrenzyConfig: ...
    @property
    def critical_factor(self) -> float: ...


def policy_from_config(cfg: PolicyFlags) -> Policy:
    """The controller's policy from its flags."""
    options: PolicyOptions | None = None
    if cfg.policy == "frenzy":
        options = cfg.frenzy
    elif cfg.policy == "crius":
        # A restart costs real time on a live cluster: a running job moves only for a clear gain.
        options = CriusOptions(upgrade_min_gain=cfg.min_gain)
    elif cfg.policy == "gavel":
        options = GavelOptions(move_min_gain=cfg.min_gain)
    elif cfg.policy == "morphling":
        options = MorphlingOptions(critical_factor=cfg.critical_factor)
    return make_policy(cfg.policy, cfg.policy_mode, options)


def waiting_for_nodes(snap: Snapshot, policy: str) -> RoundPlan:
    """The round's plan while no GPU is registered: whatever the policy, nothing can be placed or
    estimated yet (`plan_round` runs only once the cluster has GPUs)."""
    return RoundPlan(tuple(Decision(j.id, Action.PENDING, "waiting for nodes: no GPUs registered",
                                    pending=PendingKind.NO_ROOM_NOW) for j in snap.pending),
                     policy=policy)


# What memory per GPU a job's plans need where none fits (the live Cells': StepLearner.least_need):
# () when memory is not why it waits, None when the Cells give no figure (MARP's account stands).
Needs = Callable[[JobView], Sequence[MemoryNeed] | None]


def pending_reason(d: Decision, views: Mapping[str, JobView], snap: Snapshot, policy: str,
                   frenzy_cfg: frenzy.FrenzyConfig, needs: Needs | None = None) -> str:
    """The PENDING reason to store for a job the round left waiting (or dropped); `views`: the
    snapshot's pending jobs by id."""
    why = d.reason
    view = views.get(d.job_id)
    if view is not None and view.opaque:
        # No memory to name: what the job asked for and what the cluster has (docs/opaque-jobs.md).
        # A policy that names the cause itself (Crius) already says it: never twice.
        nowhere = opaque.fits_nowhere(view, snap.cluster_gpus)
        return f"{why}; {nowhere}" if nowhere and nowhere not in why else why
    # A policy that declines (drops) a job has no pending kind: a decline for want of memory gets the
    # figures too (elasticflow's had none; a live audit), one for a deadline none (`needs` below).
    drop = d.action is Action.DROP and view is not None
    if d.pending is PendingKind.FITS_NOWHERE or drop:
        # A recipe the Cells cannot express leaves the job without Cells: name the field.
        refused = recipe_refusal(views[d.job_id])
        if refused:
            why = f"{why}; the Cells cannot estimate the job: {refused}"
    view = views.get(d.job_id)
    cost = view is not None and view.objective is Objective.COST  # its reason is the cost tree's (cost_objective.py)
    if view is not None and (gap := promise_over_cluster(view, snap)):
        why = f"{why}; {gap}"
    if (d.pending is PendingKind.FITS_NOWHERE or drop) and not cost:
        # Say what memory the job needs and what exists, whatever the policy. The Cells' figure
        # first: MARP's plans have no pipeline stages, ZeRO or gradient accumulation, and overstate
        # a large model's need by far. Frenzy's reasons are MARP's (or the recipe formula's) already;
        # its fallback runs the Cells, whose figure follows. The Cells' () says memory is not why (a
        # decline for a deadline, or a count); without their figure, MARP's could read as the cause
        # of declining a job with a deadline: it gets none.
        got = needs(views[d.job_id]) if needs is not None else None
        if got is None:
            marp = policy != "frenzy" and not (drop and views[d.job_id].deadline > 0)
            memory = frenzy.memory_reason(views[d.job_id], snap, frenzy_cfg) if marp else ""
        else:
            memory = needs_text(got, snap, cluster="the cluster has" not in why)
        if memory.startswith("fits nowhere: "):
            if "fits nowhere" in why:  # said once (a live audit: "fits nowhere: ...; fits nowhere: ...")
                memory = memory.removeprefix("fits nowhere: ")
            if memory not in why:  # e.g. Crius names missing GPU types itself
                why = f"{why}; {memory}"
    return why


def needs_text(needs: Sequence[MemoryNeed], snap: Snapshot, cluster: bool = True) -> str:
    """"fits nowhere: its plans need at least ... per GPU on ..." from the Cells' least needs, or "";
    `cluster`: with "the cluster has ..." (which a reason may have said already)."""
    if not needs:
        return ""
    gib = 1 << 30
    parts = [f"{n.bytes_per_gpu / gib:,.1f} GiB on {n.gpus} x {n.gpu_type} ({n.stages} stage{'s' * (n.stages > 1)}; "
             f"{n.usable_bytes / gib:,.1f} GiB usable)" for n in sorted(needs, key=lambda n: n.bytes_per_gpu)]
    return (f"fits nowhere: its plans need at least {parts[0].replace(' on ', ' per GPU on ', 1)}"
            f"{''.join(', ' + p for p in parts[1:])} (pipeline stages, TP, ZeRO and gradient accumulation "
            f"considered)" + (f"; the cluster has {frenzy.cluster_text(snap)}" if cluster else ""))


def promise_over_cluster(job: JobView, snap: Snapshot) -> str:
    """For a guaranteed job whose promise needs more GPUs of its type than the cluster has registered
    (a quota over the cluster, docs/tenants.md "Live"): what exists, so the wait says why; else ""."""
    p = job.promise
    if p is None or not p.gpu_type or not snap.tenants:
        return ""
    have = sum(c for m, _, c in snap.cluster_gpus if m == p.gpu_type)
    if p.gpus <= have:
        return ""
    return (f"its promise needs {p.gpus} x {p.gpu_type} and the cluster has {have} registered: it waits until "
            "nodes join")


SUSPENDED = "requeued: suspended by "
SINCE = "; waiting since it was "


def suspension(reason: str) -> str:
    """What a policy said when it suspended a job now pending ("suspended by crius: its GPUs went to
    j-..."), read from the job's stored reason: the requeue's words the round after, then the tail
    each later reason carries (SINCE), until the job starts again; "" for one never suspended. Before,
    the next round's reason ("waiting: no room now") replaced it, and only the job's STOPPED event
    named the job that took its GPUs."""
    if reason.startswith(SUSPENDED):
        return reason.removeprefix("requeued: ")
    at = reason.find(SINCE)
    return reason[at + len(SINCE):] if at >= 0 else ""


def pending_updates(plan: RoundPlan, pending: Mapping[str, JobRecord], snap: Snapshot,
                    frenzy_cfg: frenzy.FrenzyConfig, unhealthy: Sequence[str] = (),
                    cold: Collection[str] = (), needs: Needs | None = None) -> list[Change]:
    """New reasons of the jobs the round leaves PENDING, for one transaction. A job the policy
    drops stays PENDING with the reason: the user decides whether to cancel it. `unhealthy`: the
    nodes the round left out for their failing launches (named, as the policy never saw them);
    `cold`: the jobs left out for want of Cell estimates (controller/warming.py); `needs`: the
    memory a job's plans need, for one that fits nowhere (pending_reason)."""
    views = {j.id: j for j in snap.pending}
    out = [pending_change(pending[j], COLD_REASON) for j in sorted(cold)
           if j in pending and pending[j].reason != COLD_REASON]
    for d in plan.decisions:
        if d.action not in (Action.PENDING, Action.DROP) or d.job_id not in pending:
            continue
        why = pending_reason(d, views, snap, plan.policy, frenzy_cfg, needs)
        if unhealthy:
            why += f"; left out as unhealthy (launches failing): {', '.join(unhealthy)}"
        if was := suspension(pending[d.job_id].reason):
            why += f"{SINCE}{was}"
        if pending[d.job_id].reason != why:
            out.append(pending_change(pending[d.job_id], why))
    return out


def kept_notes(plan: RoundPlan, snap: Snapshot, get: Callable[[str], JobRecord | None]) -> list[Change]:
    """The running jobs the round keeps, where what it says of them changed:
    - the stored reason of a guaranteed job: one its tenant's quota no longer covers runs as
      best-effort (quotas.UNGUARDED), and says so until the quota covers it again. Before,
      `describe job` read "training" while `get tenants` warned of it (a live audit);
    - the placement's opportunistic mark (Placement.opportunistic), as the simulator keeps it: the
      next round reads it back (crius suspends such a job for the earlier one; a borrower is
      charged as one). Before, the live controller kept none, so crius never suspended an
      opportunistic job and the job it had jumped waited until it ended (a live audit).
    `get`: the job as stored now (no await before the save)."""
    guaranteed = {r.job.id for r in snap.running if r.job.priority is Priority.GUARANTEED}
    marked = {r.job.id: r.opportunistic for r in snap.running}
    out: list[Change] = []
    for d in plan.of(Action.KEEP):
        if d.job_id not in guaranteed and marked.get(d.job_id, d.opportunistic) == d.opportunistic:
            continue
        job = get(d.job_id)
        if job is None or job.state != P.JOB_STATE_RUNNING or job.placement is None:
            continue
        reason = job.reason
        if d.job_id in guaranteed:
            base = job.reason.split(f"; {UNGUARDED}", 1)[0]
            note = d.reason[d.reason.find(UNGUARDED):] if UNGUARDED in d.reason else ""
            reason = f"{base}; {note}" if note else base
        if reason != job.reason or job.placement.opportunistic != d.opportunistic:
            placement = common_pb2.Placement()
            placement.CopyFrom(job.placement)
            placement.opportunistic = d.opportunistic
            out.append((job.with_(reason=reason, placement=placement), []))
    return out


@dataclass(frozen=True)
class RoundStep:
    # "migrate": stop the running job with a checkpoint, relaunch it on the decision's target;
    # "suspend": stop it with a checkpoint back to PENDING; "start": launch a pending job.
    kind: Literal["migrate", "suspend", "start"]
    decision: Decision


def steps(plan: RoundPlan) -> tuple[RoundStep, ...]:
    """The decisions to carry out, in order: moves and suspensions first, as they free GPUs that
    this round's starts may use."""
    out = [RoundStep("migrate" if d.action is Action.MIGRATE else "suspend", d)
           for d in plan.migrations() + plan.of(Action.STOP)]
    return tuple(out + [RoundStep("start", d) for d in plan.starts()])


def applies(step: RoundStep, job: JobRecord | None) -> bool:
    """Whether the job, as stored when the step comes, is still the one the round decided on: a
    move or suspension needs it RUNNING (still starting: the next round decides again), a start
    needs it PENDING (e.g. not cancelled meanwhile)."""
    if job is None:
        return False
    return bool(job.state == (P.JOB_STATE_PENDING if step.kind == "start" else P.JOB_STATE_RUNNING))
