"""Node liveness from heartbeats: READY while the lease holds, then UNREACHABLE, then DOWN.

In memory only: after a controller restart every node starts unknown (UNREACHABLE) and gets a full
lease to register again before its jobs are considered lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera.v1 import agent_pb2, common_pb2

P = common_pb2


@dataclass
class LiveNode:
    id: str
    address: str
    inventory: common_pb2.NodeInventory
    status: agent_pb2.NodeStatus
    last_seen: float  # monotonic seconds
    last_seen_wall: float
    registered: bool = False
    # The liveness state the controller has acted on (READY, UNREACHABLE or DOWN).
    liveness: int = P.NODE_STATE_UNREACHABLE
    running: dict[tuple[str, int], list[agent_pb2.WorkerStatus]] = field(default_factory=dict)


@dataclass(frozen=True)
class LivenessConfig:
    lease_s: float = 15.0
    heartbeat_interval_s: float = 5.0
    down_after_s: float = 120.0


def liveness_at(node: LiveNode, now: float, cfg: LivenessConfig) -> int:
    """The liveness a node should have at monotonic time `now`."""
    age = now - node.last_seen
    if node.registered and age <= cfg.lease_s:
        return P.NODE_STATE_READY
    if age <= cfg.down_after_s:
        return P.NODE_STATE_UNREACHABLE
    return P.NODE_STATE_DOWN


def index_workers(status: agent_pb2.NodeStatus) -> dict[tuple[str, int], list[agent_pb2.WorkerStatus]]:
    out: dict[tuple[str, int], list[agent_pb2.WorkerStatus]] = {}
    for w in status.workers:
        out.setdefault((w.job_id, w.attempt), []).append(w)
    return out
