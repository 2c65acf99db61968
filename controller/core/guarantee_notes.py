"""The guarantee layer's last word on a round's decisions (controller/core/guarantees.py `repair`):
the reasons of the jobs whose class the layer decided but whose decision it left as made.

- A guaranteed job over quota waits with the admission's reason (or, borrowing, runs as
  best-effort with it).
- A running guaranteed job its tenant's quota no longer covers (`Admission.unguarded`: a reloaded
  tenants file cut the quota under it) runs as best-effort: whatever the round does with it says
  so. Before, nothing did: its quota cut, a job read "guaranteed" and "training", and a later
  preemption read as another tenant breaking its guarantee (a live audit).
- An admitted job that the policy started itself (Morphling's Algorithm 1 places admitted jobs;
  another policy where the layer's placement found no room) says it is guaranteed, how its GPUs
  stand to its promise, and that it was admitted within quota, as the layer's own starts do.
  Before, morphling's read "morphling: Cell 2 x A100-80GB ...; plan best", and crius's start of a
  job promised 4 x A40-48GB on the 2 registered, with no estimate of the promise, read as any
  best-effort start.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from tessera.controller.core.guarantee_texts import tag
from tessera.controller.core.quotas import Admission, registered
from tessera.controller.core.snapshot import PLACED, Action, Decision, JobView, PendingKind, Snapshot


def finish(snap: Snapshot, adm: Admission, decisions: Sequence[Decision], t_p: Mapping[str, float]) -> list[Decision]:
    """`decisions` with the reasons of the module docstring, plus a wait for every job over quota the
    policy did not see; `t_p`: the admitted jobs' promise times (absent: no estimate of the promise)."""
    jobs = {j.id: j for j in snap.pending}
    out = []
    for d in decisions:
        over, unguarded, charge = adm.over_quota.get(d.job_id), adm.unguarded.get(d.job_id), adm.charges.get(d.job_id)
        if over is not None and d.action in PLACED:
            # Borrowing: best-effort (opportunistic: the mark that it was never admitted) until admitted.
            d = dataclasses.replace(d, reason=f"borrowing idle GPUs as best-effort until admitted ({over}): "
                                    f"{d.reason}", opportunistic=True)
        elif over is not None and d.action is Action.PENDING:
            d = Decision(d.job_id, Action.PENDING, over, pending=PendingKind.WAITING)
        elif unguarded is not None and unguarded.split(": ", 1)[1] not in d.reason:
            said = unguarded.replace("running", "it ran", 1) if d.action is Action.STOP else unguarded
            d = dataclasses.replace(d, reason=f"{d.reason}; {said}")
        elif charge is not None and d.action is Action.START and d.job_id in jobs \
                and tag(jobs[d.job_id]) not in d.reason:
            d = dataclasses.replace(d, reason=f"{d.reason}; {admitted_note(snap, adm, jobs[d.job_id], d, t_p)}")
        out.append(d)
    decided = {d.job_id for d in decisions}
    out += [Decision(j, Action.PENDING, why, pending=PendingKind.WAITING) for j, why in adm.over_quota.items()
            if j not in decided]
    return out


def admitted_note(snap: Snapshot, adm: Admission, job: JobView, d: Decision, t_p: Mapping[str, float]) -> str:
    """`guaranteed (tenant A): <its GPUs against its promise>; admitted within quota (...)`."""
    c = adm.charges[job.id]
    t, want = c.gpu_type, c.promise.gpus
    n = sum(len(s.gpu_indices) for s in d.slices)
    if job.id not in t_p:  # no estimate of the promise: charged and admitted, not held to a speed
        have = registered(snap, t)
        short = f" (the cluster has {have} registered)" if have < want else ""
        what = (f"below its promise of {want} x {t}{short}" if n < want else f"its promise's {want} x {t}") + \
            ", not held to a speed: no estimate of its promise"
    elif n == want:
        what = "its promise"
    else:
        what = (f"as fast as its promise of {want} x {t} by the estimates" if n < want else
                f"over its promise of {want} x {t}")
    used, q = adm.used_before.get(job.id, 0), adm.quota.get((c.tenant, t), 0)
    return f"{tag(job)}: {what}; admitted within quota ({used} of {q} x {t} in use before it)"
