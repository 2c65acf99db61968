"""The nodes as one caller may read them: ListNodes's answer, which the dashboard shows too (`/`,
`/nodes`, `/api/nodes`). One function for both, so they cannot drift: the dashboard used to build
its own nodes, without the CPUs promised to guaranteed jobs and without a user's hidden GPUs, and
then told a user a GPU was held by a job while listing none on it."""

from __future__ import annotations

from tessera.common.tokens import Principal
from tessera.controller.access import may_see
from tessera.controller.convert import node_pb
from tessera.controller.snapshots import busy_cpus, unseen_gpus
from tessera.controller.store import ACTIVE
from tessera.controller.view import EngineView
from tessera.v1 import controller_pb2


def list_nodes(view: EngineView, who: Principal) -> list[controller_pb2.Node]:
    """Every node, its busy GPUs and CPUs; for a caller that does not see every tenant, also the
    busy GPUs held by jobs it may not list (`hidden_gpus`), so it can say why they are busy."""
    busy = view.busy_gpus()
    active = view.jobs(ACTIVE)
    cpus = busy_cpus(active)
    nodes = [node_pb(view.node(n), busy, cpus) for n in view.node_ids()]
    if not who.sees_all:
        hidden = unseen_gpus(active, lambda tenant: may_see(who, tenant))
        for node in nodes:
            node.hidden_gpus.extend(sorted(hidden.get(node.id, set()) & set(node.busy_gpus)))
    return nodes
