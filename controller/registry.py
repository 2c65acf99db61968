"""Node liveness from heartbeats: READY while the lease holds, then UNREACHABLE, then DOWN; and the
fencing bound after which a silent node's jobs may run elsewhere (docs/fencing.md).

In memory only: after a controller restart every node starts unknown (UNREACHABLE) and gets a full
lease (plus the fence grace) to register again before its jobs are considered lost.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from tessera.v1 import agent_pb2, common_pb2

P = common_pb2

# A node's reported workers by (job, attempt).
Workers = dict[tuple[str, int], list[agent_pb2.WorkerStatus]]


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
    running: Workers = field(default_factory=dict)
    # Per job, the highest attempt the agent launched or stopped, as its last Register said.
    marks: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class LivenessConfig:
    lease_s: float = 15.0
    heartbeat_interval_s: float = 5.0
    down_after_s: float = 120.0
    # An agent that has had no heartbeat acknowledged for fence_s (measured on its own monotonic
    # clock from the acknowledged heartbeat's send time) SIGTERMs its workers, and SIGKILLs them
    # fence_grace_s later. 0 = derived from the lease (`fence_seconds`).
    fence_s: float = 0.0
    fence_grace_s: float = 10.0


# Added to the requeue bound for what the arithmetic leaves out: the two monotonic clocks' rate
# difference (NTP slews at most 500 ppm: 20 ms over 40 s), signal delivery and process exit.
FENCE_MARGIN_S = 1.0


def default_fence(lease_s: float, heartbeat_interval_s: float) -> float:
    """Half the lease, but never under two heartbeat intervals (one lost heartbeat must not fence)."""
    return max(lease_s / 2, 2 * heartbeat_interval_s)


def fence_seconds(cfg: LivenessConfig) -> float:
    """The bound sent to agents in RegisterResponse.fence_seconds."""
    return cfg.fence_s or default_fence(cfg.lease_s, cfg.heartbeat_interval_s)


def fence_problem(lease_s: float, heartbeat_interval_s: float, fence_s: float) -> str:
    """Why these liveness settings cannot fence ("" when they can)."""
    if fence_s < 2 * heartbeat_interval_s:
        return (f"the fence ({fence_s:g}s) must be at least 2 heartbeat intervals "
                f"({2 * heartbeat_interval_s:g}s): one late heartbeat would stop every worker")
    if fence_s >= lease_s:
        return (f"the fence ({fence_s:g}s) must be shorter than the lease ({lease_s:g}s): workers must stop "
                "before the controller gives up on their node")
    return ""


def requeue_after(cfg: LivenessConfig) -> float:
    """Seconds after a node's last heartbeat receipt before its jobs may run elsewhere.

    The agent's fence deadline runs from the send time of its last acknowledged heartbeat, which
    is no later than the controller's receipt of its last heartbeat (an acknowledged one was
    received; a later one that was received but whose answer was lost only moves the agent's
    deadline earlier). So by receipt + fence + fence grace, on any clock that runs at the same
    rate, the workers have been killed; the lease is longer than the fence, which leaves room.
    No clock offsets are compared, only durations.
    """
    return cfg.lease_s + cfg.fence_grace_s + FENCE_MARGIN_S


def liveness_at(node: LiveNode, now: float, cfg: LivenessConfig) -> int:
    """The liveness a node should have at monotonic time `now`."""
    age = now - node.last_seen
    if node.registered and age <= cfg.lease_s:
        return P.NODE_STATE_READY
    if age <= cfg.down_after_s:
        return P.NODE_STATE_UNREACHABLE
    return P.NODE_STATE_DOWN


def index_workers(status: agent_pb2.NodeStatus) -> Workers:
    out: Workers = {}
    for w in status.workers:
        out.setdefault((w.job_id, w.attempt), []).append(w)
    return out


def by_job(workers: Workers) -> dict[str, list[tuple[int, list[agent_pb2.WorkerStatus]]]]:
    """Each job's (attempt, workers) pairs: a heartbeat's records looked up per job once. Before, each
    job touched scanned every record of the node: 4,096 records (the bound) held the event loop 4 to
    6 s per heartbeat, and every node's agents fenced (a live audit)."""
    out: dict[str, list[tuple[int, list[agent_pb2.WorkerStatus]]]] = {}
    for (job_id, attempt), ws in workers.items():
        out.setdefault(job_id, []).append((attempt, ws))
    return out


def to_look_at(previous: Workers, mine: Mapping[str, list[tuple[int, list[agent_pb2.WorkerStatus]]]],
               watched: Collection[str]) -> set[str]:
    """The jobs of a node's status (`mine`: by_job of it) and of its last one (`previous`) that the
    engine must look at: all but those whose workers all exited, reported exactly as last time, of a
    job not `watched` (the engine's attempts in flight and migrations). An agent keeps exited records
    for an hour (up to 2,000): before, each heartbeat read every such job from the store (one etcd
    read each under --store etcd) to find it ended and do nothing."""
    last = by_job(previous)
    settled = {j for j, now in mine.items() if j not in watched and last.get(j) == now
               and all(w.state == P.WORKER_STATE_EXITED for _, ws in now for w in ws)}
    return (set(mine) | set(last)) - settled


def replace_workers(live: LiveNode, status: agent_pb2.NodeStatus) -> tuple[Workers, bool]:
    """The node's workers as `status` reports them: the previous ones, and whether GPUs were freed
    (a cancelled job's workers done stopping: no other event asks for the round that may use them)."""
    previous, live.running = live.running, index_workers(status)
    return previous, bool(held_gpus(previous) - held_gpus(live.running))


# The most attempt numbers a relaunch skips on the agents' word, and the highest it skips to: a
# node may speak for the jobs it runs, but must not be able to push a job's attempt number to the
# int32 limit (the API's), whatever it says at each relaunch.
MAX_ATTEMPT_SKIP = 10_000
MAX_ATTEMPT_FLOOR = 1_000_000_000


def attempt_floor(nodes: Iterable[LiveNode], job_id: str, attempt: int,
                  everywhere: Iterable[LiveNode] = ()) -> int:
    """The attempt number to launch the job's next attempt above: `attempt`, or the highest that
    the given nodes (the ones it will run on) launched or stopped, or any node (`everywhere`)
    reports workers of, at most MAX_ATTEMPT_SKIP higher. Above `attempt` only after a restore from
    an older copy of the state (docs/operations.md, "Restoring"): an agent refuses a Launch of an
    attempt as old as one it ran, or answers with that attempt's workers, long exited; and a node
    still running a later attempt would run a second copy under the same number."""
    marks = (n.marks.get(job_id, 0) for n in nodes)
    workers = (a for n in (*nodes, *everywhere) for (j, a) in n.running if j == job_id)
    ran = max((*marks, *workers), default=0)
    return max(attempt, min(ran, attempt + MAX_ATTEMPT_SKIP, MAX_ATTEMPT_FLOOR))


def running_gpus(live: LiveNode, exclude: str = "") -> set[int]:
    """GPUs the node's agent reports held by workers not yet exited (all but job `exclude`'s own)."""
    return held_gpus(live.running, exclude)


def held_gpus(workers: Workers, exclude: str = "") -> set[int]:
    """GPUs held by the workers not yet exited (all but job `exclude`'s own)."""
    return {i for (job_id, _), ws in workers.items() if job_id != exclude for w in ws
            if w.state != P.WORKER_STATE_EXITED for i in w.gpu_indices}


def node_state(drained: bool, drain_reason: str, live: LiveNode | None, now: float,
               holds_work: Callable[[], bool]) -> tuple[int, str]:
    """A node's state and why: admin state over liveness, DRAINING/DRAINED win while it is alive.
    `holds_work` (asked only of a drained live node) says whether jobs or workers still hold it."""
    liveness = live.liveness if live else P.NODE_STATE_UNREACHABLE
    if liveness != P.NODE_STATE_READY:
        age = now - live.last_seen if live else 0.0
        why = "not registered since the controller started" if live and not live.registered \
            else f"no heartbeat for {age:.0f}s"
        return liveness, why
    if drained:
        return (P.NODE_STATE_DRAINING if holds_work() else P.NODE_STATE_DRAINED), drain_reason
    return P.NODE_STATE_READY, ""


def fenced(silent_s: float, cfg: LivenessConfig) -> bool:
    """Whether a node heard from again after `silent_s` seconds has stopped its workers meanwhile:
    the agent went at least that long without an acknowledgement (its last acknowledged heartbeat
    was sent before the controller's last receipt, and the next acknowledgement reaches it after
    the controller's new receipt), so past the fence it has fenced."""
    return silent_s > fence_seconds(cfg)


def lease_lost(live: LiveNode, state: int, now: float, cfg: LivenessConfig) -> bool:
    """Past its lease and the fence grace (or never back since a controller restart): the node's
    workers have stopped themselves, its jobs may run elsewhere."""
    return state != P.NODE_STATE_READY and now - live.last_seen > requeue_after(cfg)


def lost_reason(node_id: str, state: int, cfg: LivenessConfig) -> str:
    return (f"node {node_id} is {P.NodeState.Name(state)[11:]} (no heartbeat within the {cfg.lease_s:g}s lease "
            f"+ {cfg.fence_grace_s:g}s fence grace: its agent has stopped the workers)")
