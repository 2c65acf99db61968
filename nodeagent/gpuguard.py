"""Workers on GPUs they were not given (docs/agent.md, "GPU isolation").

The agent gives each rank its GPUs through CUDA_VISIBLE_DEVICES alone; a worker that sets its own
(or calls NVML or the driver directly) can run on any GPU of the node, another tenant's included.
The NVML re-probe (nodeagent/inventory.py, every 10 s: AgentConfig.inventory_refresh_seconds) lists
the processes on each GPU; those of the agent's workers (their sessions) are matched here against
the GPUs their attempt was given on this node, and an attempt found on another GPU is evicted: its workers are
killed, and the controller counts the attempt failed, as its program's doing. It is detection
after the fact, within a refresh, beside the prevention of nodeagent/devicefilter.py (which needs
a root agent and cgroup v2). Where NVML hides the processes (a container without the host's PID
namespace) nothing is seen.

Pure: statuses and the probe's findings in, evictions out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tessera.common.contract import EVICTED_REASON
from tessera.v1 import agent_pb2, common_pb2


def trespasses(statuses: Iterable[agent_pb2.WorkerStatus],
               sessions: Mapping[int, Iterable[int]]) -> dict[str, str]:
    """Job id -> the eviction reason, for each job whose worker sessions (`sessions`: GPU index ->
    the session leader pids seen on it) use a GPU its attempt was not given on this node."""
    given: dict[tuple[str, int], set[int]] = {}
    owner: dict[int, tuple[str, int]] = {}
    for w in statuses:
        if w.state == common_pb2.WORKER_STATE_EXITED:
            continue
        key = (w.job_id, w.attempt)
        given.setdefault(key, set()).update(w.gpu_indices)
        if w.pid > 0:
            owner[w.pid] = key
    out: dict[str, str] = {}
    for gpu in sorted(sessions):
        for pid in sorted(sessions[gpu]):
            who = owner.get(pid)
            if who is None or gpu in given[who] or who[0] in out:
                continue
            mine = ",".join(map(str, sorted(given[who]))) or "none"
            out[who[0]] = (f"{EVICTED_REASON}attempt {who[1]} ran on GPU {gpu} of this node, which was not given "
                           f"to it (its GPUs here: {mine}); GPUs are given by CUDA_VISIBLE_DEVICES, which the "
                           "job must not change")
    return out


def isolation(device_cgroups: bool, nvml: bool) -> common_pb2.GpuIsolation.ValueType:
    """What keeps this node's workers off GPUs they were not given, as its status reports it."""
    if device_cgroups:
        return common_pb2.GPU_ISOLATION_DEVICE_CGROUPS
    return common_pb2.GPU_ISOLATION_DETECTION if nvml else common_pb2.GPU_ISOLATION_NONE
