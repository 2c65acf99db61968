"""A fake Controller servicer: jobs, events, nodes and logs in memory, served over real gRPC on
127.0.0.1:0 from its own event loop thread, with a seeded state (one running job on two nodes), for
tests of the clients (tessctl, the SDK) without a controller process.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from tessera.clients.jobfile import load_job_file
from tessera.common import rpc
from tessera.common.identity import CONTROLLER
from tessera.common.localcluster import tls_config
from tessera.v1 import common_pb2, controller_pb2, controller_pb2_grpc

JOBS = Path(__file__).resolve().parents[1] / "examples" / "jobs"
NOW = 1_700_000_000.0

S = common_pb2


class FakeController(controller_pb2_grpc.ControllerServicer):
    """In-memory controller: jobs, events, nodes, logs; mutated by tests through `FakeServer.call`."""

    def __init__(self) -> None:
        self.jobs: dict[str, controller_pb2.Job] = {}
        self.events: dict[str, list[common_pb2.JobEvent]] = {}
        self.nodes: dict[str, controller_pb2.Node] = {}
        self.logs: dict[tuple[str, int], bytes] = {}
        self.requests: dict[str, str] = {}
        self.log_requests: list[controller_pb2.GetJobLogsRequest] = []
        # What DrainNode/UndrainNode answer in Node.agent_unconfirmed (the agent refused the call).
        self.agent_unconfirmed = ""
        self.changed = asyncio.Condition()
        self.seq = 0

    # -- helpers used by tests (run on the server loop) --

    def add_job(self, job: controller_pb2.Job) -> None:
        self.jobs[job.id] = job
        self.events.setdefault(job.id, [])

    async def event(self, job_id: str, kind: str, message: str = "", state: int | None = None,
                    mutate: Callable[[controller_pb2.Job], None] | None = None) -> None:
        job = self.jobs[job_id]
        if state is not None:
            job.state = state
        if mutate:
            mutate(job)
        self.seq += 1
        self.events[job_id].append(S.JobEvent(seq=self.seq, job_id=job_id, time=NOW, kind=kind, message=message))
        async with self.changed:
            self.changed.notify_all()

    # -- the API --

    async def SubmitJob(self, request: Any, context: Any) -> Any:
        if not request.spec.name:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "spec.name: required")
        if request.request_id in self.requests:
            return controller_pb2.SubmitJobResponse(job=self.jobs[self.requests[request.request_id]], created=False)
        job_id = f"j-{len(self.jobs) + 1:06d}"
        job = controller_pb2.Job(id=job_id, spec=request.spec, state=S.JOB_STATE_PENDING, submit_time=NOW,
                                 reason="waiting for the next scheduling round")
        self.add_job(job)
        self.requests[request.request_id] = job_id
        await self.event(job_id, "SUBMITTED", "job submitted")
        return controller_pb2.SubmitJobResponse(job=job, created=True)

    async def _job(self, job_id: str, context: Any) -> controller_pb2.Job:
        if job_id not in self.jobs:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"job {job_id} not found")
        return self.jobs[job_id]

    async def GetJob(self, request: Any, context: Any) -> Any:
        job = controller_pb2.Job()
        job.CopyFrom(await self._job(request.job_id, context))
        if request.with_events:
            job.events.extend(self.events[job.id])
        return job

    async def ListJobs(self, request: Any, context: Any) -> Any:
        jobs = [j for j in self.jobs.values()
                if (not request.states or j.state in request.states)
                and (not request.tenant or j.spec.tenant == request.tenant)]
        return controller_pb2.ListJobsResponse(jobs=jobs)

    async def CancelJob(self, request: Any, context: Any) -> Any:
        job = await self._job(request.job_id, context)
        if job.state not in (S.JOB_STATE_SUCCEEDED, S.JOB_STATE_FAILED, S.JOB_STATE_CANCELLED):
            job.reason = "cancelled by the user"
            await self.event(job.id, "CANCELLED", "cancelled by the user", state=S.JOB_STATE_CANCELLED)
        return job

    async def WatchJobEvents(self, request: Any, context: Any) -> Any:
        job = await self._job(request.job_id, context)
        after = request.after_seq
        while True:
            for e in self.events[job.id]:
                if e.seq > after:
                    after = e.seq
                    yield e
            if job.state in (S.JOB_STATE_SUCCEEDED, S.JOB_STATE_FAILED, S.JOB_STATE_CANCELLED):
                return
            async with self.changed:
                await self.changed.wait()

    async def ListNodes(self, request: Any, context: Any) -> Any:
        return controller_pb2.ListNodesResponse(nodes=list(self.nodes.values()))

    async def _node(self, node_id: str, context: Any) -> controller_pb2.Node:
        if node_id not in self.nodes:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"node {node_id} not found")
        return self.nodes[node_id]

    async def DrainNode(self, request: Any, context: Any) -> Any:
        node = await self._node(request.node_id, context)
        node.state = S.NODE_STATE_DRAINING
        node.reason = request.reason or "drained by an operator"
        answer = controller_pb2.Node()
        answer.CopyFrom(node)
        answer.agent_unconfirmed = self.agent_unconfirmed
        return answer

    async def UndrainNode(self, request: Any, context: Any) -> Any:
        node = await self._node(request.node_id, context)
        node.state = S.NODE_STATE_READY
        node.reason = ""
        answer = controller_pb2.Node()
        answer.CopyFrom(node)
        answer.agent_unconfirmed = self.agent_unconfirmed
        return answer

    async def GetJobLogs(self, request: Any, context: Any) -> Any:
        await self._job(request.job_id, context)
        self.log_requests.append(request)
        data = self.logs.get((request.job_id, request.rank))
        if data is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no log for rank {request.rank} of job {request.job_id}")
        tail = request.tail_bytes or 65536
        return controller_pb2.GetJobLogsResponse(
            node_id="node-a", path=f"/var/lib/tessera/agent/jobs/{request.job_id}/attempt-1/rank-{request.rank}.log",
            data=data[-tail:],
        )


    # -- the streams (controller/watching.py, controller/logstream.py), over the same state --

    async def WatchJob(self, request: Any, context: Any) -> Any:
        job = await self._job(request.job_id, context)
        after, last = 0, b""
        while True:
            events = [e for e in self.events[job.id] if e.seq > after]
            key = job.SerializeToString(deterministic=True)
            if events or key != last:
                after = events[-1].seq if events else after
                last = key
                yield controller_pb2.JobUpdate(job=job, events=events)
                # The job may have changed (even ended) while this handler waited at the yield:
                # look again before waiting, or that change would go unsent.
                continue
            if job.state in (S.JOB_STATE_SUCCEEDED, S.JOB_STATE_FAILED, S.JOB_STATE_CANCELLED):
                return
            async with self.changed:
                await self.changed.wait()

    async def WatchJobs(self, request: Any, context: Any) -> Any:
        sent: dict[str, bytes] = {}
        first = True
        while True:
            now = {j.id: j.SerializeToString(deterministic=True) for j in self.jobs.values()
                   if not request.states or j.state in request.states}
            changed = [self.jobs[i] for i in now if sent.get(i) != now[i]]
            for job in changed:
                yield controller_pb2.JobUpdate(job=job)
            for gone in sent.keys() - now.keys():
                yield controller_pb2.JobUpdate(job=controller_pb2.Job(id=gone), removed=True)
            if changed or first or sent.keys() - now.keys():
                yield controller_pb2.JobUpdate(batch_end=True)
            sent, first = now, False
            async with self.changed:
                await self.changed.wait()

    async def StreamJobLogs(self, request: Any, context: Any) -> Any:
        job = await self._job(request.job_id, context)
        self.log_requests.append(request)
        ranks = sorted(r for (j, r) in self.logs if j == job.id) if request.all_ranks else [request.rank]
        if not request.all_ranks and (job.id, request.rank) not in self.logs:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no log for rank {request.rank} of job {job.id}")
        sent = {}
        for r in ranks:
            data = self.logs[(job.id, r)]
            lines = data.split(b"\n")[:-1]
            lines = lines[-request.tail_lines:] if request.tail_lines else lines
            sent[r] = len(data)
            yield controller_pb2.LogLines(rank=r, attempt=1, node_id="node-a", lines=lines)
        while request.follow:
            ended = job.state in (S.JOB_STATE_SUCCEEDED, S.JOB_STATE_FAILED, S.JOB_STATE_CANCELLED)
            got = False
            for r in ranks:
                data = self.logs[(job.id, r)]
                if len(data) > sent[r]:
                    got = True
                    yield controller_pb2.LogLines(rank=r, attempt=1, node_id="node-a",
                                                  lines=data[sent[r]:].split(b"\n")[:-1])
                    sent[r] = len(data)
            if ended and not got:
                return
            if not got:
                await asyncio.sleep(0.05)  # tests append to a log without notifying


class FakeServer:
    """Runs a FakeController on its own event loop thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.fake: FakeController = self.run(self._make())
        self.server, port = self.run(self._start())
        self.address = f"127.0.0.1:{port}"

    async def _make(self) -> FakeController:
        return FakeController()

    async def _start(self) -> tuple[Any, int]:
        # TLS like the real controller's client port: no client certificate; tessctl and the SDK
        # trust the session's CA through TESSERA_CA (tests/conftest.py).
        server, port = rpc.aio_server(
            "127.0.0.1:0", [(controller_pb2_grpc.add_ControllerServicer_to_server, self.fake)],
            tls=tls_config(CONTROLLER), client_cert=False,
        )
        await server.start()
        return server, port

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    def call(self, fn: Callable[[FakeController], Any]) -> Any:
        """Run fn(fake) on the server loop (awaiting it if it returns a coroutine)."""

        async def go() -> Any:
            result = fn(self.fake)
            if asyncio.iscoroutine(result):
                result = await result
            return result

        return self.run(go())

    def stop(self) -> None:
        self.run(rpc.stop_server(self.server, grace=0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


def running_job() -> controller_pb2.Job:
    spec = load_job_file(JOBS / "tiny.yaml")
    spec.tenant = "default"  # stored as the controller fills it (the file names none)
    return controller_pb2.Job(
        id="j-run", spec=spec, state=S.JOB_STATE_RUNNING, attempt=1, submit_time=NOW - 300, start_time=NOW - 200,
        reason="placed on 2xA100-80GB: best throughput",
        plan=S.Plan(dp=2, tp=1, pp=1, micro_batch=4, grad_accum=2, gpu_model="A100-80GB",
                    memory_per_gpu_bytes=3 * 1024**3, memory_source="formula"),
        placement=S.Placement(slices=[S.NodeSlice(node_id="node-a", gpu_indices=[0, 1])], rendezvous="10.0.0.1:29500"),
        progress=S.Progress(iteration=10, loss=2.5, samples_per_second=100.0, time=NOW - 1, checkpoint_iteration=-1),
    )


def nodes() -> list[controller_pb2.Node]:
    a100 = [S.Gpu(index=i, model="A100-80GB", memory_bytes=80 * 10**9, nvlink_peers=[j for j in range(4) if j != i])
            for i in range(4)]
    a40 = [S.Gpu(index=i, model="A40-48GB", memory_bytes=48 * 10**9) for i in range(2)]
    return [
        controller_pb2.Node(id="node-a", address="10.0.0.1:50052", state=S.NODE_STATE_READY, last_heartbeat=NOW,
                            busy_gpus=[0, 1], inventory=S.NodeInventory(
                                source=S.INVENTORY_SOURCE_DECLARED, gpus=a100, hostname="a", cpu_count=32,
                                host_memory_bytes=256 * 1024**3)),
        controller_pb2.Node(id="node-b", address="10.0.0.2:50052", state=S.NODE_STATE_READY, last_heartbeat=NOW,
                            inventory=S.NodeInventory(source=S.INVENTORY_SOURCE_NVML, gpus=a40, hostname="b")),
    ]


def seeded() -> FakeServer:
    """A started FakeServer holding running_job() (with its PLACED and STARTED events, and a log of
    rank 0) and nodes(); stop() it when done."""
    srv = FakeServer()

    def seed(fake: FakeController) -> None:
        fake.add_job(running_job())
        for n in nodes():
            fake.nodes[n.id] = n
        fake.logs[("j-run", 0)] = b"step 1 loss 5.0\nstep 2 loss 4.0\n"

    srv.call(seed)
    srv.call(lambda f: f.event("j-run", "PLACED", "placed on node-a GPUs 0,1"))
    srv.call(lambda f: f.event("j-run", "STARTED", "attempt 1 started"))
    return srv

