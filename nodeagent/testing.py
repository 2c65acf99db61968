"""Helpers for tests of the agent and of what talks to it: a fake AgentRegistry, request builders,
and a bounded wait. Shipped with the package so e2e and chaos tests can reuse them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc
import grpc.aio

from tessera.v1 import agent_pb2, agent_pb2_grpc, common_pb2


async def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll `predicate` until it returns something truthy (returned); AssertionError after `timeout`.

    A bounded wait on a condition, never a fixed sleep standing in for synchronisation.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


def launch_request(
    job_id: str = "job-1",
    attempt: int = 1,
    argv: Sequence[str] = ("true",),
    gpus: Iterable[Iterable[int]] = ((0,),),
    *,
    epoch: int = 0,
    world_size: int | None = None,
    first_rank: int = 0,
    env: Mapping[str, str] | None = None,
    rendezvous: str = "127.0.0.1:29500",
    checkpoint_dir: str = "",
    iterations: int = 100,
    tenant: str = "",
) -> agent_pb2.LaunchRequest:
    """A valid LaunchRequest: one rank per entry of `gpus` (each the rank's GPU indices)."""
    groups = [list(g) for g in gpus]
    return agent_pb2.LaunchRequest(
        request_id=f"launch/{job_id}/{attempt}",
        controller_epoch=epoch,
        job_id=job_id,
        attempt=attempt,
        world_size=world_size if world_size is not None else first_rank + len(groups),
        ranks=[
            agent_pb2.RankAssignment(rank=first_rank + i, local_rank=i, gpu_indices=g)
            for i, g in enumerate(groups)
        ],
        rendezvous=rendezvous,
        plan=common_pb2.Plan(dp=len(groups), tp=1, pp=1, micro_batch=2, grad_accum=4, gpu_model="A100-80GB"),
        argv=list(argv),
        env=dict(env or {}),
        checkpoint_dir=checkpoint_dir,
        iterations=iterations,
        global_batch_size=8 * len(groups),
        model=common_pb2.ModelSpec(name="gpt2-small"),
        tenant=tenant,
    )


class FakeRegistry(agent_pb2_grpc.AgentRegistryServicer):  # type: ignore[misc]  # generated, untyped
    """An AgentRegistry that records every call and answers as configured.

    `reregister_next` makes the next heartbeat answer reregister=True; `fail_with` makes every call
    fail with that status code (an unreachable or broken controller); `heartbeat_errors` fails the
    next heartbeats one by one.
    """

    def __init__(self, epoch: int = 1, interval: float = 30.0, lease: float = 90.0, fence: float = 0.0) -> None:
        self.epoch = epoch
        self.interval = interval
        self.lease = lease
        self.fence = fence  # RegisterResponse.fence_seconds (0: the agent uses lease / 2)
        self.registers: list[agent_pb2.RegisterRequest] = []
        self.heartbeats: list[agent_pb2.HeartbeatRequest] = []
        # Every NodeStatus received, registrations and heartbeats, in arrival order.
        self.received: list[agent_pb2.NodeStatus] = []
        self.reregister_next = False
        self.fail_with: grpc.StatusCode | None = None
        # Status codes the next heartbeats fail with, one per heartbeat.
        self.heartbeat_errors: list[grpc.StatusCode] = []
        self.refused = 0  # calls answered with an error

    async def Register(
        self, request: agent_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.RegisterResponse:
        if self.fail_with is not None:
            self.refused += 1
            await context.abort(self.fail_with, "fake registry refuses")
        self.registers.append(request)
        self._record(request.status)
        return agent_pb2.RegisterResponse(
            controller_epoch=self.epoch, lease_seconds=self.lease, heartbeat_interval_seconds=self.interval,
            fence_seconds=self.fence,
        )

    async def Heartbeat(
        self, request: agent_pb2.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.HeartbeatResponse:
        if self.fail_with is not None:
            self.refused += 1
            await context.abort(self.fail_with, "fake registry refuses")
        if self.heartbeat_errors:
            self.refused += 1
            await context.abort(self.heartbeat_errors.pop(0), "fake registry refuses this heartbeat")
        self.heartbeats.append(request)
        self._record(request.status)
        if self.reregister_next:
            self.reregister_next = False
            return agent_pb2.HeartbeatResponse(reregister=True, controller_epoch=self.epoch)
        return agent_pb2.HeartbeatResponse(reregister=False, controller_epoch=self.epoch)

    def _record(self, status: agent_pb2.NodeStatus) -> None:
        self.received.append(status)

    def last_status(self) -> agent_pb2.NodeStatus | None:
        return self.received[-1] if self.received else None
