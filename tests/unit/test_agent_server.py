"""The servicer's shell: epoch fence, drain, error mapping; and the registration backoff."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from tessera.common import rpc
from tessera.nodeagent.errors import FailedPrecondition
from tessera.nodeagent.registration import Backoff
from tessera.nodeagent.server import DrainFlag, EpochFence, NodeAgentServicer
from tessera.nodeagent.supervisor import Supervisor
from tessera.nodeagent.testing import launch_request
from tessera.v1 import agent_pb2


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class FakeContext:
    """A call over TCP (the controller's) or, with `local`, over the workers' unix socket carrying
    `token` in its metadata."""

    def __init__(self, local: bool = False, token: str = "") -> None:
        self.local = local
        self.token = token

    def peer(self) -> str:
        return "unix:" if self.local else "ipv4:127.0.0.1:5555"

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("tessera-worker-token", self.token),) if self.token else ()

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


def test_fence_refuses_older_epochs_and_rises() -> None:
    raised: list[int] = []
    fence = EpochFence(on_raise=raised.append)
    fence.check(0)  # before any registration, an unset epoch passes
    fence.observe(5)
    fence.check(5)
    with pytest.raises(FailedPrecondition, match=r"^stale controller epoch 4 < 5$"):
        fence.check(4)
    fence.check(7)
    assert fence.epoch == 7 and raised == [5, 7]
    fence.observe(3)  # never goes down
    assert fence.epoch == 7


def test_backoff_is_bounded() -> None:
    b = Backoff(initial=0.1, cap=2.0)
    delays = [b.next() for _ in range(8)]
    assert delays[:5] == [0.1, 0.2, 0.4, 0.8, 1.6] and max(delays) == 2.0
    b.reset()
    assert b.next() == 0.1


@pytest.fixture
def servicer(worker_dir: Path) -> NodeAgentServicer:
    sup = Supervisor(worker_dir, range(2), declared=True, poll_interval=0.05, allowed_env=frozenset({"LD_BIND_NOW"}))
    # authenticate=False: the shell's own checks here; who may call is in tests/security.
    return NodeAgentServicer(sup, EpochFence(epoch=3), DrainFlag(), authenticate=False)


async def call(coro: Any, method: str = "Method") -> Aborted:
    """What the agent's server answers: the servicer raises, rpc.status_of (its interceptor) maps."""
    with pytest.raises(Exception) as err:  # any error: the mapping is what is checked
        await coro
    return Aborted(*rpc.status_of(err.value, method, "agent"))


async def test_errors_map_to_status_codes(servicer: NodeAgentServicer) -> None:
    ctx: Any = FakeContext()
    err = await call(servicer.Launch(launch_request(epoch=2), ctx))
    assert (err.code, err.details) == (grpc.StatusCode.FAILED_PRECONDITION, "stale controller epoch 2 < 3")
    err = await call(servicer.Launch(launch_request(epoch=3, argv=[]), ctx))
    assert (err.code, err.details) == (grpc.StatusCode.INVALID_ARGUMENT, "argv: must not be empty")
    worker: Any = FakeContext(local=True, token=servicer.tokens.token("x", 1))
    err = await call(servicer.ReportProgress(agent_pb2.ReportProgressRequest(job_id="x", attempt=1), worker))
    assert err.code == grpc.StatusCode.NOT_FOUND
    err = await call(servicer.ReportProgress(agent_pb2.ReportProgressRequest(job_id="x", attempt=1), ctx))
    assert err.code == grpc.StatusCode.PERMISSION_DENIED  # not over TCP
    err = await call(servicer.Launch(launch_request(epoch=3), worker))
    assert err.code == grpc.StatusCode.PERMISSION_DENIED  # a worker's socket launches nothing
    err = await call(
        servicer.Stop(agent_pb2.StopRequest(controller_epoch=3, job_id="j", grace_seconds=-1), ctx)
    )
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details == "grace_seconds: must be a finite number >= 0, got -1.0"


async def test_an_unexpected_exception_is_internal_not_a_crash(servicer: NodeAgentServicer) -> None:
    def boom(*_: object) -> None:
        raise RuntimeError("disk on fire")

    servicer.supervisor.read_log_chunk = boom  # type: ignore[method-assign,assignment]
    ctx: Any = FakeContext()
    err = await call(servicer.ReadLog(agent_pb2.ReadLogRequest(controller_epoch=3, job_id="j"), ctx), "ReadLog")
    # The text of a bug stays in the agent's log; the caller learns where to look.
    assert (err.code, err.details) == (grpc.StatusCode.INTERNAL, "ReadLog failed; see the agent log")


async def test_drain_refuses_new_launches_but_answers_retries(servicer: NodeAgentServicer) -> None:
    ctx: Any = FakeContext()
    first = await servicer.Launch(launch_request(argv=["true"], epoch=3), ctx)
    assert first.started
    resp = await servicer.Drain(agent_pb2.DrainRequest(controller_epoch=3, drain=True), ctx)
    assert resp.draining
    again = await servicer.Launch(launch_request(argv=["true"], epoch=3), ctx)
    assert not again.started and again.workers[0].pid == first.workers[0].pid
    err = await call(servicer.Launch(launch_request("other", argv=["true"], gpus=[[1]], epoch=3), ctx))
    assert (err.code, err.details) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "node is draining: no new launches",
    )
    assert not (await servicer.Drain(agent_pb2.DrainRequest(controller_epoch=3, drain=False), ctx)).draining
    assert (await servicer.Launch(launch_request("other", argv=["true"], gpus=[[1]], epoch=3), ctx)).started
    await servicer.supervisor.shutdown(kill_workers=True, grace=0)


async def test_launch_refuses_loader_and_interpreter_hooks(servicer: NodeAgentServicer) -> None:
    """Defence in depth: a Launch sent straight to the agent meets the controller's env policy."""
    ctx: Any = FakeContext()
    for name in ("LD_PRELOAD", "LD_AUDIT", "PYTHONPATH", "BASH_ENV", "NODE_OPTIONS"):
        err = await call(servicer.Launch(launch_request(env={name: "/tmp/x"}, epoch=3), ctx))
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT
        assert err.details.startswith(f"env.{name}: refused: "), err.details
        assert f"--allow-env {name}" in err.details
    assert servicer.supervisor.statuses() == []
    # A name the agent's --allow-env lets through is launched.
    assert (await servicer.Launch(launch_request(env={"LD_BIND_NOW": "1"}, epoch=3), ctx)).started
    await servicer.supervisor.shutdown(kill_workers=True, grace=0)
