"""Guaranteed jobs whose promise has no estimate hold no more GPUs than they were promised.

The guarantee layer (guarantees.py) holds an admitted job to t_P, its promise's time on the round's
estimates, and gives GPUs over the promise to best-effort work. Where the estimates cannot time the
promise (no Cell of the model on the promised GPUs: it does not fit their memory, say) the job is
charged its promise's GPUs but nothing held it: a policy started it on 8 GPUs against a charge of
1, and as a guaranteed job it was never shrunk or preempted for anyone, so its tenant held GPUs
past its quota and another tenant's guaranteed job within quota waited without end. Here such a
start or move past the promise is refused; the job waits, and its reason says why.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera.controller.core.guarantees import RoundView, promise_time
from tessera.controller.core.quotas import Admission
from tessera.controller.core.snapshot import Action, Decision, PendingKind


def cap_untimed(ctx: RoundView, adm: Admission, decisions: Sequence[Decision], policy_name: str) -> list[Decision]:
    """`decisions` with every START or MIGRATE of an admitted job whose promise has no estimate
    onto more GPUs than its promise undone: a pending job waits, a running one keeps its place (or
    stops, where the round gave its GPUs to another job). A move of a running job onto no more GPUs
    than it holds stands: it brings the job no further from its promise, and refusing the policy's
    shrink stopped the guaranteed job while best-effort work started on its GPUs."""
    jobs = {j.id: j for j in ctx.pending} | {k: r.job for k, r in ctx.running.items()}
    taken = {(s.node_id, i) for d in decisions if d.action in (Action.START, Action.MIGRATE, Action.KEEP)
             for s in d.slices for i in s.gpu_indices}
    out = []
    for d in decisions:
        c = adm.charges.get(d.job_id)
        gpus = sum(len(s.gpu_indices) for s in d.slices)
        if (c is None or d.action not in (Action.START, Action.MIGRATE) or gpus <= c.promise.gpus
                or (d.action is Action.MIGRATE and gpus <= ctx.running[d.job_id].cell.gpus)
                or promise_time(ctx, jobs[d.job_id], c.promise) > 0):
            out.append(d)
            continue
        why = (f"guaranteed (tenant {c.tenant}): {policy_name}'s {d.action} to {d.cell or f'{gpus} GPUs'} would hold "
               f"more than its promise's {c.promise.gpus} x {c.gpu_type}, and the estimates cannot time the "
               f"promise (no Cell of the job on {c.promise.gpus} x {c.gpu_type}): it runs on at most the GPUs its "
               "tenant is charged for, its promise's (GPUs over a promise go to best-effort work)")
        if d.action is Action.START:
            out.append(Decision(d.job_id, Action.PENDING, f"waiting: {why}", pending=PendingKind.WAITING))
            continue
        r = ctx.running[d.job_id]
        mine = {(s.node_id, i) for s in d.slices for i in s.gpu_indices}
        if not ({(s.node_id, i) for s in r.slices for i in s.gpu_indices} & (taken - mine)):
            out.append(Decision(d.job_id, Action.KEEP, f"running; {why}", r.plan, r.slices, r.cell))
        else:
            out.append(Decision(d.job_id, Action.STOP, f"stopped: {why}"))
    return out
