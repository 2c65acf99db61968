"""A worker found on a GPU its attempt was not given is evicted (nodeagent/gpuguard.py): a real
agent with a real worker process, and a prober standing in for NVML that reports the worker's
session on another GPU, as NVML does for a worker that changed its CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from pathlib import Path

import pytest

from tessera.nodeagent.agent import Agent
from tessera.nodeagent.testing import FakeRegistry, launch_request, wait_until
from tessera.v1 import agent_pb2_grpc, common_pb2
from tests.integration.test_agent_grpc import (
    EPOCH,
    TIMEOUT,
    WAIT_FOR_TERM,
    controller_channel,
    make_agent,
    ready,
    registered,
    registry,
    worker_in,
)
from tests.workerenv import worker_dir

__all__ = ["registry", "worker_dir"]


class Prober:
    """NVML's view: each worker session seen on the GPU `on` says (GPU index -> its given GPU)."""

    def __init__(self, agent: Agent, moved: dict[int, int]) -> None:
        self.agent, self.moved, self.calls = agent, moved, 0

    def __call__(self, own_pids: Collection[int], *, sessions: dict[int, set[int]]) -> common_pb2.NodeInventory:
        self.calls += 1
        for w in self.agent.supervisor.statuses():
            if w.pid in own_pids:
                for g in w.gpu_indices:
                    sessions.setdefault(self.moved.get(g, g), set()).add(w.pid)
        return self.agent.inventory


@pytest.fixture
async def guarded(registry: tuple[FakeRegistry, str], worker_dir: Path) -> AsyncIterator[tuple[Agent, Prober]]:
    a = make_agent(registry[1], worker_dir, inventory_refresh_seconds=0.05)
    prober = Prober(a, {})
    a._prober = prober
    await a.start()
    yield a, prober
    await a.close(grace=0)


async def test_a_worker_on_a_gpu_it_was_not_given_is_evicted(registry: tuple[FakeRegistry, str],
                                                             guarded: tuple[Agent, Prober]) -> None:
    fake, _ = registry
    agent, prober = guarded
    await registered(agent)
    channel = controller_channel(agent)
    stub = agent_pb2_grpc.NodeAgentStub(channel)
    try:
        await stub.Launch(launch_request("job-1", argv=WAIT_FOR_TERM, gpus=[[0]], epoch=EPOCH), timeout=5)
        await ready(agent)
        seen = prober.calls
        await wait_until(lambda: prober.calls > seen + 2, TIMEOUT, "probes while it stays on GPU 0")
        w = worker_in(fake.last_status(), "job-1")
        assert w is not None and w.state == common_pb2.WORKER_STATE_RUNNING
        prober.moved[0] = 3  # it now runs on GPU 3, another tenant's for all it knows

        def evicted() -> bool:
            w = worker_in(fake.last_status(), "job-1")
            return w is not None and w.state == common_pb2.WORKER_STATE_EXITED

        await wait_until(evicted, TIMEOUT, "the eviction in a heartbeat")
        w = worker_in(fake.last_status(), "job-1")
        assert w is not None and w.reason.startswith(
            "evicted by the agent: attempt 1 ran on GPU 3 of this node, which was not given to it (its GPUs here: 0)")
    finally:
        await channel.close()
