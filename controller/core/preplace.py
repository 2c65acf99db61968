"""Admitted guaranteed jobs placed at their promise before a policy that does not keep guarantees
itself (docs/tenants.md, "Placed before the policy").

The repair step (guarantees.py) runs after the policy. By then a policy such as crius has started
other jobs, guaranteed ones included, on the nodes where admission laid out a pending job's minimum
demand, or started the job itself below its promise; the search then found no room, and the job
waited with its SLA clock running, or ran slower and paid a second start when moved to its promise.
So, before such a policy plans, each admitted pending job gets the repair's own placement (its
promise's GPUs from free GPUs and best-effort work, in admission order, the same victims), and the
policy plans the rest: it sees neither these jobs nor their victims, and their GPUs are busy. A job
the search cannot place is left to the policy and the repair, as before. Morphling's policy places
admitted jobs first itself (Algorithm 1, lines 2-3), so for a policy that handles guarantees
`plan_round` keeps of this step only the jobs placed on GPUs being freed (`releasing_only`:
`NodeView.releasing`, a victim of an earlier round still checkpointing, with free GPUs), which such
a policy does not see coming: it preempted a second victim for the job (a live audit).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tessera.controller.core.guarantees import Guard, RoundView
from tessera.controller.core.quotas import Admission
from tessera.controller.core.snapshot import PLACED, Action, Decision, Snapshot


def preplace(full: RoundView, adm: Admission, seen: Snapshot, placed: Sequence[Decision],
             policy_name: str, releasing_only: bool = False) -> tuple[Snapshot, list[Decision]]:
    """The policy's snapshot and the decisions taken before it. `full`: the whole round; `seen`:
    what the policy would see (without the cost objective's jobs); `placed`: the cost objective's
    decisions. Returns `seen` less the jobs decided here (the admitted jobs started, their victims),
    its nodes' GPUs busy as those decisions leave them, and the decisions. `releasing_only`: only
    the starts on GPUs being freed (and free ones), no victim's."""
    base = {r.job.id: Decision(r.job.id, Action.KEEP, "running", r.plan, r.slices, r.cell)
            for r in full.running.values()}
    base.update((j.id, Decision(j.id, Action.PENDING, "waiting")) for j in full.pending)
    base.update((d.job_id, d) for d in placed)
    changed = [d for d in Guard(full, adm, policy_name).preplace(list(base.values())) if d != base[d.job_id]]
    if releasing_only:
        changed = [d for d in changed if d.action is Action.START and _on_releasing(d, full.snap)]
    if not changed:
        return seen, []
    freed: dict[str, set[int]] = {}
    held: dict[str, set[int]] = {}
    for d in changed:
        for dec, into in ((base[d.job_id], freed), (d, held)):
            if dec.action in PLACED:
                for s in dec.slices:
                    into.setdefault(s.node_id, set()).update(s.gpu_indices)
    nodes = tuple(dataclasses.replace(n, busy=frozenset((n.busy - freed.get(n.id, set())) | held.get(n.id, set())),
                                      releasing=n.releasing - held.get(n.id, set()))
                  if n.id in freed or n.id in held else n for n in seen.nodes)
    gone = {d.job_id for d in changed}
    arr = seen.arrivals
    view = dataclasses.replace(
        seen, nodes=nodes, pending=tuple(j for j in seen.pending if j.id not in gone),
        running=tuple(r for r in seen.running if r.job.id not in gone),
        arrivals=None if arr is None else tuple(a for a in arr if a not in gone))
    return view, changed


def _on_releasing(d: Decision, snap: Snapshot) -> bool:
    """Whether the start is on GPUs that are free or being freed, some of them being freed."""
    nodes = {n.id: n for n in snap.nodes}
    gpus = [(nodes.get(s.node_id), i) for s in d.slices for i in s.gpu_indices]
    return all(n is not None and (i not in n.busy or i in n.releasing) for n, i in gpus) and any(
        n is not None and i in n.releasing for n, i in gpus)
