"""In-memory node agents behind the engine's `AgentCalls` protocol (controller/agents.py), for engine
unit tests without processes or sockets.

Each call is checked against the store at the moment it is made: the engine must have stored the
state a call acts on before making it (a Launch finds its attempt STARTING on that node; a Stop
finds the attempt no longer the job's current running one, or asked to stop; a Drain finds the
node's drained flag). Calls from an older controller epoch than one already seen are refused, as a
real agent fences a stale controller. A violation is recorded and raised, so the engine's caller
fails the test.

The agents keep worker tables like real ones: a Launch starts one RUNNING worker per rank (a repeat
of the same request starts nothing), a Stop ends them with `stop_exit_code` (0: a cooperative stop
after a checkpoint). The test decides the rest: progress, exits, failed launches (`fail_launch`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc

from tessera.common.nodespec import RENDEZVOUS_KEY_FEATURE
from tessera.controller.store import ACTIVE, Store
from tessera.v1 import agent_pb2, common_pb2

P = common_pb2


class Violation(AssertionError):
    pass


class ControllerKilled(BaseException):
    """Raised by a Launch listed in `FakeAgents.kill_on_launch`: the controller dies as it makes
    the call (the agent never gets it). BaseException, so no handler in the engine swallows it."""


@dataclass(frozen=True)
class Call:
    kind: str  # "launch" | "stop" | "drain" | "read_log"
    node_id: str
    job_id: str = ""
    attempt: int = 0
    detail: str = ""


@dataclass
class FakeNode:
    node_id: str
    address: str
    inventory: common_pb2.NodeInventory
    workers: dict[tuple[str, int, int], agent_pb2.WorkerStatus] = field(default_factory=dict)
    draining: bool = False
    # NodeStatus.features, a current agent's (an older one's: [])
    features: list[str] = field(default_factory=lambda: [RENDEZVOUS_KEY_FEATURE])


def inventory(model: str, count: int, memory_gb: int, source: int = P.INVENTORY_SOURCE_DECLARED) -> common_pb2.NodeInventory:
    return common_pb2.NodeInventory(source=source, gpus=[
        common_pb2.Gpu(index=i, model=model, memory_bytes=memory_gb << 30) for i in range(count)])


def _without_epoch(req: agent_pb2.LaunchRequest) -> agent_pb2.LaunchRequest:
    out = agent_pb2.LaunchRequest()
    out.CopyFrom(req)
    out.controller_epoch = 0
    return out


class FakeAgents:
    """`AgentCalls` over in-memory agents, checking the crash-safety rule on every call."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.nodes: dict[str, FakeNode] = {}
        self.calls: list[Call] = []
        self.violations: list[str] = []
        # (job, attempt, node) -> the LaunchRequest that started it: each started once.
        self.started: dict[tuple[str, int, str], agent_pb2.LaunchRequest] = {}
        self.fail_launch: dict[str, grpc.StatusCode] = {}
        self.fail_details = "fake agent refused"  # the text a failed launch answers with
        # node id -> the error a Drain on it answers (the agent refused it, e.g. a raised epoch floor)
        self.fail_drain: dict[str, str] = {}
        self.stop_exit_code = 0
        self.log_lines: dict[tuple[str, int], str] = {}
        self.fail_read_log: dict[str, grpc.StatusCode] = {}  # node id -> the status its ReadLog answers
        self.kill_on_launch: set[str] = set()
        # node id -> an event its Launches wait for (an agent slow to answer), and the most in flight at once
        self.launch_gate: dict[str, asyncio.Event] = {}
        self.in_flight = self.most_in_flight = 0
        self._epoch = 0

    # ------------------------------------------------------------ the test's side

    def add_node(self, node_id: str, inv: common_pb2.NodeInventory, address: str = "") -> FakeNode:
        n = FakeNode(node_id, address or f"10.0.0.{len(self.nodes) + 1}:7070", inv)
        self.nodes[node_id] = n
        return n

    def status(self, node_id: str) -> agent_pb2.NodeStatus:
        n = self.nodes[node_id]
        return agent_pb2.NodeStatus(node_id=n.node_id, address=n.address, inventory=n.inventory,
                                    workers=list(n.workers.values()), draining=n.draining, features=n.features)

    def workers(self, job_id: str, attempt: int | None = None) -> list[tuple[str, agent_pb2.WorkerStatus]]:
        return [(n.node_id, w) for n in self.nodes.values() for (j, a, _), w in sorted(n.workers.items())
                if j == job_id and (attempt is None or a == attempt)]

    def report(self, job_id: str, attempt: int, iteration: int, step_s: float = 0.5, time: float = 0.0) -> None:
        """Rank 0 of the attempt reports progress (seen by the controller at the next heartbeat)."""
        for _, w in self.workers(job_id, attempt):
            if w.rank == 0:
                w.progress.CopyFrom(common_pb2.Progress(iteration=iteration, step_time_seconds=step_s, time=time,
                                                        checkpoint_iteration=-1))

    def exit(self, job_id: str, attempt: int, code: int = 0, ranks: set[int] | None = None) -> None:
        for _, w in self.workers(job_id, attempt):
            if ranks is None or w.rank in ranks:
                w.state, w.exit_code = P.WORKER_STATE_EXITED, code

    def crash(self, node_id: str) -> None:
        """The node's host died: its workers are gone with it."""
        self.nodes[node_id].workers.clear()

    def launches(self) -> list[Call]:
        return [c for c in self.calls if c.kind == "launch"]

    def stops(self) -> list[Call]:
        return [c for c in self.calls if c.kind == "stop"]

    # ------------------------------------------------------------ AgentCalls

    def _node(self, node_id: str, address: str) -> FakeNode:
        n = self.nodes[node_id]
        if n.address != address:
            self._violate(f"call meant for {node_id} sent to {address}, its address is {n.address}")
        return n

    def _fence(self, epoch: int) -> None:
        if epoch < self._epoch:
            self._violate(f"call from epoch {epoch} after epoch {self._epoch}")
        self._epoch = max(self._epoch, epoch)

    def _violate(self, why: str) -> None:
        self.violations.append(why)
        raise Violation(why)

    async def launch(self, node_id: str, address: str, req: agent_pb2.LaunchRequest) -> agent_pb2.LaunchResponse:
        n = self._node(node_id, address)
        self._fence(req.controller_epoch)
        self.calls.append(Call("launch", n.node_id, req.job_id, req.attempt, req.request_id))
        job = self.store.get_job(req.job_id)
        if job is None or job.state != P.JOB_STATE_STARTING or job.attempt != req.attempt:
            self._violate(f"launch of {req.job_id} attempt {req.attempt} on {n.node_id}, stored as "
                          f"{'nothing' if job is None else P.JobState.Name(job.state)} attempt "
                          f"{job.attempt if job else '-'}")
        assert job is not None and job.placement is not None
        if n.node_id not in [s.node_id for s in job.placement.slices] or job.placement.rendezvous != req.rendezvous:
            self._violate(f"launch of {req.job_id} on {n.node_id}: not the stored placement")
        if req.job_id in self.kill_on_launch:
            self.kill_on_launch.discard(req.job_id)
            raise ControllerKilled(req.request_id)
        if n.node_id in self.launch_gate:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                await self.launch_gate[n.node_id].wait()
            finally:
                self.in_flight -= 1
        if n.node_id in self.fail_launch:
            raise grpc.aio.AioRpcError(self.fail_launch[n.node_id], grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       details=self.fail_details)
        key = (req.job_id, req.attempt, n.node_id)
        if key in self.started:
            # A restarted controller resends the attempt's request under its own, newer epoch.
            if _without_epoch(self.started[key]) != _without_epoch(req):
                self._violate(f"attempt {key} launched again with a different request")
            return agent_pb2.LaunchResponse(started=False)
        self.started[key] = req
        for r in req.ranks:
            n.workers[(req.job_id, req.attempt, r.rank)] = agent_pb2.WorkerStatus(
                job_id=req.job_id, attempt=req.attempt, rank=r.rank, state=P.WORKER_STATE_RUNNING,
                gpu_indices=r.gpu_indices)
        return agent_pb2.LaunchResponse(started=True)

    async def stop(self, node_id: str, address: str, epoch: int, job_id: str, attempt: int, grace_s: float,
                   reason: str) -> None:
        n = self._node(node_id, address)
        self._fence(epoch)
        self.calls.append(Call("stop", n.node_id, job_id, attempt, reason))
        job = self.store.get_job(job_id)
        placed = job is not None and job.placement is not None and n.node_id in {s.node_id for s in job.placement.slices}
        if job is not None and job.state in ACTIVE and job.attempt == attempt and not job.stop_requested and placed:
            self._violate(f"stop of {job_id} attempt {attempt} ({reason}) while stored as its current "
                          f"{P.JobState.Name(job.state)} attempt")
        for (j, a, _), w in n.workers.items():
            if j == job_id and (attempt == 0 or a == attempt) and w.state != P.WORKER_STATE_EXITED:
                w.state, w.exit_code, w.stop_requested = P.WORKER_STATE_EXITED, self.stop_exit_code, True

    async def drain(self, node_id: str, address: str, epoch: int, drain: bool) -> str:
        n = self._node(node_id, address)
        self._fence(epoch)
        self.calls.append(Call("drain", n.node_id, detail=str(drain)))
        rec = self.store.get_node(n.node_id)
        if rec is None or rec.drained != drain:
            self._violate(f"drain={drain} of {n.node_id} before the store says so")
        if n.node_id in self.fail_drain:
            return self.fail_drain[n.node_id]
        n.draining = drain
        return ""

    async def read_log(self, node_id: str, address: str, req: agent_pb2.ReadLogRequest) -> agent_pb2.ReadLogResponse:
        n = self._node(node_id, address)
        self.calls.append(Call("read_log", n.node_id, req.job_id, req.attempt, str(req.rank)))
        if n.node_id in self.fail_read_log:
            raise grpc.aio.AioRpcError(self.fail_read_log[n.node_id], grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       details="fake agent: no such log")
        line = self.log_lines.get((req.job_id, req.rank), "")
        return agent_pb2.ReadLogResponse(path=f"/logs/{req.job_id}/{req.rank}.log", data=line.encode())
