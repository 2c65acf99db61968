"""Calls from the controller to node agents, with the controller's epoch on every call.

Every call names the node it means (`node_id`) as well as its address: over TLS the channel checks
that the agent answering at that address holds that node's certificate (docs/security.md), so a node
that registered another node's address receives nothing meant for the other.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

import grpc
import structlog

from tessera.common import identity
from tessera.common.nodespec import report_text
from tessera.common.rpc import aio_channel
from tessera.common.tls import TlsConfig
from tessera.controller.failure_line import failure_line
from tessera.controller.launches import rank_node
from tessera.controller.registry import LiveNode
from tessera.controller.store import JobRecord
from tessera.v1 import agent_pb2, agent_pb2_grpc, common_pb2

log = structlog.get_logger("tessera.controller.agents")
CALL_TIMEOUT_S = 5.0
# A Stop is repeated at most this often for the same attempt on the same node while its workers exit.
STOP_RESEND_S = 10.0
# How much of a failed rank's log is read for its error: torchrun's summary and its own traceback
# (2-3 KiB) come after the rank's error, and other ranks' tracebacks may too.
FAILURE_TAIL_BYTES = 32 * 1024


def peer_details(e: grpc.aio.AioRpcError, limit: int = 512) -> str:
    """An agent's error text as the controller may repeat it (a job's reason, a Stop's reason, a
    client's error): clipped, NUL and lone surrogates escaped. A node's text reached other nodes'
    workers' reasons through the Stop of a failed launch, and 5,000 characters there made the
    controller refuse every heartbeat of an honest node."""
    return report_text(e.details() or "", limit)


class AgentCalls(Protocol):
    """What the engine asks of node agents. `launch` and `read_log` raise grpc.aio.AioRpcError when
    the call fails; `stop` and `drain` are best effort and never raise (`drain` answers why the
    agent did not confirm, "" when it did)."""

    async def launch(self, node_id: str, address: str, req: agent_pb2.LaunchRequest) -> agent_pb2.LaunchResponse: ...

    async def stop(self, node_id: str, address: str, epoch: int, job_id: str, attempt: int, grace_s: float,
                   reason: str) -> None: ...

    async def drain(self, node_id: str, address: str, epoch: int, drain: bool) -> str: ...

    async def read_log(self, node_id: str, address: str,
                       req: agent_pb2.ReadLogRequest) -> agent_pb2.ReadLogResponse: ...


async def last_log_line(agents: AgentCalls, nodes: Mapping[str, LiveNode], epoch: int, job: JobRecord,
                        rank: int) -> str:
    """The line of a failed rank's log that says why (controller/failure_line.py: its last line
    that is not a rule or a border, or for a torchrun log its root cause's rank and error line);
    empty when unavailable."""
    node_id = rank_node(job, rank)
    live = nodes.get(node_id) if node_id else None
    if live is None or live.liveness != common_pb2.NODE_STATE_READY:
        return ""
    try:
        resp = await agents.read_log(live.id, live.address, agent_pb2.ReadLogRequest(
            controller_epoch=epoch, job_id=job.id, attempt=job.attempt, rank=rank, tail_bytes=FAILURE_TAIL_BYTES))
    except grpc.aio.AioRpcError:
        return ""
    return failure_line(resp.data.decode(errors="replace"))


class AgentClients:
    """`AgentCalls` over gRPC, one channel per (node, address). `tls`: the controller's certificate,
    presented to agents, whose own must name the node called; None = the controller's --insecure."""

    def __init__(self, tls: TlsConfig | None = None) -> None:
        self.tls = tls
        self._stubs: dict[tuple[str, str], tuple[grpc.aio.Channel, agent_pb2_grpc.NodeAgentStub]] = {}
        self._stops: dict[tuple[str, str, int], float] = {}

    def stub(self, node_id: str, address: str) -> agent_pb2_grpc.NodeAgentStub:
        key = (node_id, address)
        if key not in self._stubs:
            if self.tls is None:
                ch = aio_channel(address, insecure=True)
            else:
                ch = aio_channel(address, tls=self.tls, peer=identity.node(node_id))
            self._stubs[key] = (ch, agent_pb2_grpc.NodeAgentStub(ch))
        return self._stubs[key][1]

    async def launch(self, node_id: str, address: str, req: agent_pb2.LaunchRequest) -> agent_pb2.LaunchResponse:
        resp: agent_pb2.LaunchResponse = await self.stub(node_id, address).Launch(req, timeout=CALL_TIMEOUT_S)
        log.info("launch", address=address, job_id=req.job_id, attempt=req.attempt,
                 ranks=[r.rank for r in req.ranks], started=resp.started)
        return resp

    async def stop(self, node_id: str, address: str, epoch: int, job_id: str, attempt: int, grace_s: float,
                   reason: str) -> None:
        """Best effort: a node that cannot be reached has its stale workers stopped when it returns."""
        key, now = (address, job_id, attempt), time.monotonic()
        if now - self._stops.get(key, -1e9) < STOP_RESEND_S:
            return
        self._stops[key] = now
        if len(self._stops) > 10_000:
            self._stops = {k: t for k, t in self._stops.items() if now - t < STOP_RESEND_S}
        req = agent_pb2.StopRequest(request_id=f"stop/{job_id}/{attempt}/{epoch}", controller_epoch=epoch,
                                    job_id=job_id, attempt=attempt, grace_seconds=grace_s, reason=reason)
        try:
            await self.stub(node_id, address).Stop(req, timeout=CALL_TIMEOUT_S)
            log.info("stop", address=address, job_id=job_id, attempt=attempt, reason=reason)
        except grpc.aio.AioRpcError as e:
            log.warning("stop_failed", address=address, job_id=job_id, attempt=attempt, code=e.code().name,
                        details=e.details())

    async def drain(self, node_id: str, address: str, epoch: int, drain: bool) -> str:
        try:
            await self.stub(node_id, address).Drain(agent_pb2.DrainRequest(request_id=f"drain/{drain}/{epoch}",
                                                                  controller_epoch=epoch, drain=drain),
                                           timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            log.warning("drain_failed", address=address, code=e.code().name, details=e.details())
            return f"{e.code().name}: {peer_details(e)}"
        return ""

    async def read_log(self, node_id: str, address: str,
                       req: agent_pb2.ReadLogRequest) -> agent_pb2.ReadLogResponse:
        resp: agent_pb2.ReadLogResponse = await self.stub(node_id, address).ReadLog(req, timeout=CALL_TIMEOUT_S)
        return resp

    async def close(self) -> None:
        for ch, _ in self._stubs.values():
            await ch.close()
        self._stubs.clear()
