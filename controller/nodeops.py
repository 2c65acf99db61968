"""What happens to a node: the admin's DrainNode, UndrainNode and RemoveNode, an agent's Register
and Heartbeat, and the liveness pass. Moved out of controller/engine.py (the composition root) as
functions of the engine: the engine's `drain`, `undrain`, `remove_node`, `register`, `heartbeat` and
`liveness_tick` call them, and they call back into the engine's job steps (`_migrate_off`,
`_requeue`, `_observe`, `liveness_tick`) and its live state. `NodeHost` names what they use of the
engine, so this module does not import it (the tree has no import cycle, pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import structlog

from tessera.common.errors import FailedPrecondition
from tessera.controller.agents import AgentCalls
from tessera.controller.errors import NodeNotFound
from tessera.controller.registry import (
    LivenessConfig,
    LiveNode,
    fence_seconds,
    fenced,
    lease_lost,
    liveness_at,
    lost_reason,
    requeue_after,
)
from tessera.controller.snapshots import jobs_on
from tessera.controller.store import ACTIVE, JobRecord, NodeRecord, Store
from tessera.controller.view import LiveState, LiveView
from tessera.v1 import agent_pb2, common_pb2

P = common_pb2
log = structlog.get_logger("controller")


class _Config(Protocol):
    @property
    def liveness(self) -> LivenessConfig: ...


class NodeHost(Protocol):
    """What these functions use of the engine (controller/engine.py's Engine)."""

    store: Store
    agents: AgentCalls
    epoch: int
    view: LiveView
    wall: Callable[[], float]
    mono: Callable[[], float]
    _live: LiveState
    _removals: dict[str, str]

    @property
    def cfg(self) -> _Config: ...

    def kick(self) -> None: ...

    def _put_node(self, rec: NodeRecord) -> None: ...

    async def _requeue(self, job: JobRecord, why: str, kind: str, retry: bool = False, stop: str = "") -> None: ...

    async def _migrate_off(self, job: JobRecord, why: str) -> None: ...

    async def _observe(self, live: LiveNode, status: agent_pb2.NodeStatus) -> None: ...

    async def liveness_tick(self) -> None: ...


async def drain(engine: NodeHost, node_id: str, reason: str) -> tuple[NodeRecord, str]:
    """Drain in the controller's state (no placements there, jobs moved off) whatever the agent
    says; the second value is why the agent did not confirm ("" when it did)."""
    rec, unconfirmed = await set_drain(engine, node_id, True, reason or "drained by admin")
    for job in engine.view.jobs_on(node_id):
        if job.state != P.JOB_STATE_MIGRATING:
            await engine._migrate_off(job, f"node {node_id} is draining: {rec.drain_reason}")
    await engine.view.notify()
    return rec, unconfirmed


async def undrain(engine: NodeHost, node_id: str) -> tuple[NodeRecord, str]:
    rec, unconfirmed = await set_drain(engine, node_id, False, "")
    engine.kick()
    await engine.view.notify()
    return rec, unconfirmed


async def set_drain(engine: NodeHost, node_id: str, drained: bool, reason: str) -> tuple[NodeRecord, str]:
    rec = engine._live.records.get(node_id)
    if rec is None:
        raise NodeNotFound(node_id)
    engine._put_node(rec := rec.with_(drained=drained, drain_reason=reason))
    live = engine._live.nodes.get(node_id)
    log.info("node_drain", node_id=node_id, drained=drained, reason=reason)
    if live is None or live.liveness != P.NODE_STATE_READY:
        state = P.NodeState.Name(live.liveness if live else P.NODE_STATE_UNREACHABLE)[11:]
        return rec, f"node {node_id} is {state}: its agent is told when it registers again"
    err = await engine.agents.drain(live.id, live.address, engine.epoch, drained)
    return rec, f"the agent did not confirm: {err}" if err else ""


async def remove_node(engine: NodeHost, node_id: str, force: bool, request_id: str) -> bool:
    """Forget a node (RemoveNode): FailedPrecondition while attempts run on it unless `force`,
    which requeues them as for a lost node. A node that heartbeats again is told to register
    and comes back (an agent drained before keeps its drain: `register`)."""
    if engine._removals.get(request_id) == node_id:  # a retry: the node may be back, leave it be
        return True
    rec = engine._live.records.get(node_id)
    if rec is not None:
        jobs = engine.view.jobs_on(node_id)
        if jobs and not force:
            ids = ", ".join(j.id for j in jobs[:5])
            if rec.drained:  # "drain it first" read as if the drain had not been asked
                raise FailedPrecondition(f"node {node_id} is draining: {len(jobs)} attempt(s) on it have not "
                                         f"stopped yet ({ids}); wait until it is DRAINED (tessctl get nodes), "
                                         "or force (requeues them)")
            raise FailedPrecondition(f"node {node_id} holds {len(jobs)} running attempt(s) ({ids}): drain it "
                                     "first, or force")
        for job in jobs:
            await engine._requeue(job, f"node {node_id} was removed by an admin", "NODE_LOST",
                                  stop=f"node {node_id} removed")
    if not engine.store.remove_node(node_id, request_id, engine.wall()):
        raise NodeNotFound(node_id)
    engine._removals[request_id] = node_id
    while len(engine._removals) > 1024:
        del engine._removals[next(iter(engine._removals))]
    if engine._live.records.pop(node_id, None) is not None:
        engine._live.nodes.pop(node_id, None)
        log.info("node_removed", node_id=node_id, force=force)
        await engine.view.notify()
        engine.kick()
    return True


async def register(engine: NodeHost, status: agent_pb2.NodeStatus) -> None:
    node_id = status.node_id
    rec = engine._live.records.get(node_id)
    if rec is None or rec.address != status.address or rec.inventory != status.inventory:
        # A node new to the store (or removed) keeps the drain its agent remembers.
        if rec is None:
            rec = NodeRecord(node_id, status.address, drained=status.draining,
                             drain_reason="drained before it registered" if status.draining else "")
        engine._put_node(rec.with_(address=status.address, inventory=status.inventory))
    now = engine.mono()
    live = LiveNode(node_id, status.address, status.inventory, status, now, engine.wall(), registered=True,
                    marks={m.job_id: m.attempt for m in status.attempt_marks})
    old = engine._live.nodes.get(node_id)
    engine._live.nodes[node_id] = live
    if old is not None:
        await back_after(engine, node_id, now - old.last_seen)
    log.info("node_registered", node_id=node_id, address=status.address, gpus=len(status.inventory.gpus),
             source=P.InventorySource.Name(status.inventory.source), workers=len(status.workers),
             returned=old is not None)
    if engine._live.records[node_id].drained != status.draining:
        # The admin's word, kept by the controller, wins over what the agent remembers.
        await engine.agents.drain(node_id, status.address, engine.epoch, engine._live.records[node_id].drained)
    await engine._observe(live, status)
    await engine.liveness_tick()
    engine.kick()


async def heartbeat(engine: NodeHost, status: agent_pb2.NodeStatus, epoch: int) -> bool:
    """Record a heartbeat; False when the agent must register again."""
    live = engine._live.nodes.get(status.node_id)
    if live is None or not live.registered or epoch != engine.epoch or live.address != status.address:
        return False
    if not same_hardware(live.inventory, status.inventory):
        # A GPU fell off the bus (or came back): registering again stores the new set as a first
        # Register does. Before, the controller kept placing work on the GPU that was gone.
        return False
    live.inventory = status.inventory  # the foreign memory of each GPU, as the agent probes it now
    silent = engine.mono() - live.last_seen
    live.last_seen, live.last_seen_wall, live.status = engine.mono(), engine.wall(), status
    await back_after(engine, live.id, silent)
    await engine._observe(live, status)
    if live.liveness != P.NODE_STATE_READY:
        await engine.liveness_tick()
    return True


async def liveness_tick(engine: NodeHost) -> None:
    """Move each node to the liveness its last heartbeat allows; requeue the jobs of nodes past
    their lease. Then wake the watches if something changed that no notification announced yet: a
    node's liveness, or the heartbeats' new progress reports since the last pass (counted, not
    announced, as they came: controller/view.py); a pass with nothing new wakes no one."""
    if engine._live.due(engine.wall()):
        engine.kick()  # a job's launch backoff or a node's unhealthy period ran out
    now, moved = engine.mono(), False
    for live in list(engine._live.nodes.values()):
        new = liveness_at(live, now, engine.cfg.liveness)
        if new != live.liveness:
            old, live.liveness, moved = live.liveness, new, True
            log.info("node_liveness", node_id=live.id, old=P.NodeState.Name(old), new=P.NodeState.Name(new))
            if new == P.NODE_STATE_READY:
                engine.kick()
        if not lease_lost(live, new, now, engine.cfg.liveness):
            continue
        for job in engine.view.jobs_on(live.id):
            await engine._requeue(job, lost_reason(live.id, new, engine.cfg.liveness), "NODE_LOST",
                                  stop=f"node {live.id} lost")
    await (engine.view.notify() if moved else engine.view.flush())


def same_hardware(a: common_pb2.NodeInventory, b: common_pb2.NodeInventory) -> bool:
    """The same GPUs, links and host facts: inventories that differ at most in the memory other
    processes hold on the GPUs (`foreign_used_bytes`, which changes from one probe to the next)."""
    if len(a.gpus) != len(b.gpus):
        return False
    a, b = _without_foreign(a), _without_foreign(b)
    return a == b


def _without_foreign(inv: common_pb2.NodeInventory) -> common_pb2.NodeInventory:
    out = common_pb2.NodeInventory()
    out.CopyFrom(inv)
    for g in out.gpus:
        g.foreign_used_bytes = 0
    return out


async def back_after(engine: NodeHost, node_id: str, silent: float) -> None:
    """Heard from after a silence past the fence: its agent has stopped the workers of its current
    attempts, whose exits are no verdict on the job. Requeued first, not judged."""
    if not fenced(silent, engine.cfg.liveness):
        return
    why = f"node {node_id} was silent {silent:.1f}s, past the {fence_seconds(engine.cfg.liveness):g}s fence"
    for job in engine.view.jobs_on(node_id):
        if not job.stop_requested:  # a job asked to stop is settled by its exits as usual
            await engine._requeue(job, f"{why}: its agent stopped the workers", "NODE_LOST", stop=why)


async def requeue_on_unknown_nodes(engine: NodeHost, active: list[JobRecord], now: float) -> None:
    """Requeue the active jobs placed on a node this controller has no record of and that has not
    registered since (its record was unreadable, or the store was restored from before it joined),
    once it has been missing for as long as a lost node's lease and fence grace: nothing else would
    ever end them, since only known nodes lose their lease. `now` is monotonic."""
    since = engine._live.unknown_since
    missing = {s.node_id for j in active if j.placement for s in j.placement.slices} - set(engine._live.nodes)
    for node_id in set(since) - missing:
        del since[node_id]
    bound = requeue_after(engine.cfg.liveness)
    for node_id in sorted(missing):
        first = since.setdefault(node_id, now)
        if now - first <= bound:
            continue
        log.warning("jobs_on_unknown_node", node_id=node_id, missing_s=round(now - first, 1))
        for job in jobs_on(engine.store.list_jobs(states=ACTIVE), node_id):  # as they are now
            await engine._requeue(job, f"node {node_id} is unknown to the controller (no record in its store, no "
                                       f"registration for {now - first:.0f}s)", "NODE_LOST", stop="node unknown")
