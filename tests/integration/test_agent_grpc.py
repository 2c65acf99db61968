"""A real agent (server, supervisor, registration loop) against a fake AgentRegistry, over loopback gRPC."""

from __future__ import annotations

import asyncio
import re
import socket
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from tessera.common import identity, rpc
from tessera.common.localcluster import tls_config
from tessera.common.nodespec import status_errors
from tessera.nodeagent.agent import Agent, AgentConfig
from tessera.nodeagent.inventory import host_facts, parse_declared
from tessera.nodeagent.keeping import DEFAULT_LOG_MAX_BYTES
from tessera.nodeagent.testing import FakeRegistry, launch_request, wait_until
from tessera.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from tests.workerenv import worker_python

RUNNING = common_pb2.WORKER_STATE_RUNNING
EXITED = common_pb2.WORKER_STATE_EXITED
TIMEOUT = 10.0
EPOCH = 5


def py(code: str) -> list[str]:
    return ["{python}", "-c", textwrap.dedent(code)]


WAIT_FOR_TERM = py(
    """
    import signal, sys, pathlib, os
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    pathlib.Path(f"ready-{os.environ['RANK']}").touch()
    signal.pause()
    """
)

# A worker that reports progress to its agent the way the trainer SDK does, then waits for SIGTERM.
REPORTS_PROGRESS = py(
    """
    import os, signal, sys
    from tessera.v1 import agent_pb2, agent_pb2_grpc, common_pb2
    from tessera.common import rpc
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    stub = agent_pb2_grpc.NodeAgentStub(rpc.sync_channel(os.environ["TESSERA_AGENT_ADDR"], insecure=True))
    resp = stub.ReportProgress(
        agent_pb2.ReportProgressRequest(
            job_id=os.environ["TESSERA_JOB_ID"], attempt=int(os.environ["TESSERA_ATTEMPT"]),
            rank=int(os.environ["RANK"]),
            progress=common_pb2.Progress(iteration=7, loss=1.25, samples_per_second=80.0, checkpoint_iteration=-1),
        ),
        timeout=5, metadata=(("tessera-worker-token", os.environ["TESSERA_WORKER_TOKEN"]),),
    )
    print("reported; stop_requested =", resp.stop_requested, flush=True)
    signal.pause()
    """
)


@pytest.fixture
async def registry() -> AsyncIterator[tuple[FakeRegistry, str]]:
    fake = FakeRegistry(epoch=EPOCH, interval=30.0)
    server, port = rpc.aio_server("127.0.0.1:0", [(agent_pb2_grpc.add_AgentRegistryServicer_to_server, fake)],
                                  tls=tls_config(identity.CONTROLLER))
    await server.start()
    yield fake, f"127.0.0.1:{port}"
    await rpc.stop_server(server, grace=0)


def make_agent(controller: str, work_dir: Path, log_max_bytes: int = DEFAULT_LOG_MAX_BYTES, **kw: Any) -> Agent:
    inv = parse_declared(
        {"gpus": [{"model": "A100-80GB", "count": 4, "nvlink": True}]}, "node-1", host_facts()
    )
    config = AgentConfig(
        controller=controller,
        node_id="node-1",
        work_dir=work_dir,
        listen="127.0.0.1:0",
        kill_workers_on_exit=True,  # leave no process behind a test
        stop_grace_on_exit=2.0,
        rpc_deadline=2.0,
        max_backoff=0.2,
        poll_interval=0.05,
        worker_python=worker_python(),
        tls=tls_config(identity.node("node-1")),
        log_max_bytes=log_max_bytes,
        **kw,
    )
    return Agent(config, inv)


def controller_channel(agent: Agent) -> grpc.aio.Channel:
    """A channel to the agent as the controller has one: its certificate, the node's identity checked."""
    return rpc.aio_channel(agent.address, tls=tls_config(identity.CONTROLLER), peer=identity.node("node-1"))


@pytest.fixture
async def agent(registry: tuple[FakeRegistry, str], worker_dir: Path) -> AsyncIterator[Agent]:
    a = make_agent(registry[1], worker_dir)
    await a.start()
    yield a
    await a.close(grace=0)


@pytest.fixture
async def stub(agent: Agent) -> AsyncIterator[agent_pb2_grpc.NodeAgentStub]:
    channel = controller_channel(agent)
    yield agent_pb2_grpc.NodeAgentStub(channel)
    await channel.close()


async def registered(agent: Agent) -> None:
    assert agent.registrar is not None
    await wait_until(agent.registrar.registered.is_set, TIMEOUT, "registration")


async def ready(agent: Agent, ranks: int = 1, job: str = "job-1", attempt: int = 1) -> None:
    """Wait until WAIT_FOR_TERM workers have installed their SIGTERM handler."""
    d = agent.config.work_dir / "jobs" / job / f"attempt-{attempt}"
    await wait_until(lambda: all((d / f"ready-{r}").exists() for r in range(ranks)), TIMEOUT, "workers ready")


def worker_in(
    status: agent_pb2.NodeStatus | None, job_id: str, rank: int = 0
) -> agent_pb2.WorkerStatus | None:
    for w in status.workers if status else ():
        if w.job_id == job_id and w.rank == rank:
            return w
    return None


async def test_registers_with_inventory_then_heartbeats(
    registry: tuple[FakeRegistry, str], agent: Agent
) -> None:
    fake, _ = registry
    fake.interval = 0.05  # applies from the next registration; ask for one
    await registered(agent)
    fake.reregister_next = True
    await wait_until(lambda: len(fake.registers) >= 2, TIMEOUT, "second registration")
    await wait_until(lambda: len(fake.heartbeats) >= 3, TIMEOUT, "heartbeats at the short interval")
    reg = fake.registers[0]
    assert re.fullmatch(r"[0-9a-f-]{36}", reg.request_id)
    assert reg.request_id != fake.registers[1].request_id
    st = reg.status
    assert (st.node_id, st.address, st.draining) == ("node-1", agent.address, False)
    assert st.address == f"127.0.0.1:{agent.port}" and st.agent_version
    assert st.inventory.source == common_pb2.INVENTORY_SOURCE_DECLARED
    assert st.gpu_isolation == common_pb2.GPU_ISOLATION_NONE  # declared, and no device cgroups asked for
    assert [g.uuid for g in st.inventory.gpus] == [f"DECLARED-node-1-{i}" for i in range(4)]
    assert list(st.inventory.gpus[0].nvlink_peers) == [1, 2, 3]
    hb = fake.heartbeats[-1]
    assert (
        hb.controller_epoch == EPOCH and hb.status.node_id == "node-1" and hb.status.inventory == st.inventory
    )
    assert agent.fence.epoch == EPOCH


async def test_reregisters_on_reregister_new_epoch_and_not_found(
    registry: tuple[FakeRegistry, str], agent: Agent
) -> None:
    fake, _ = registry
    fake.interval = 0.05
    await registered(agent)
    fake.reregister_next = True
    await wait_until(lambda: len(fake.registers) == 2, TIMEOUT, "re-registration after reregister=True")
    fake.epoch = EPOCH + 1  # the controller restarted: heartbeats now answer another epoch
    await wait_until(lambda: len(fake.registers) == 3, TIMEOUT, "re-registration after an epoch change")
    await wait_until(lambda: agent.fence.epoch == EPOCH + 1, TIMEOUT, "fence raised")
    fake.heartbeat_errors = [grpc.StatusCode.NOT_FOUND]
    await wait_until(lambda: len(fake.registers) == 4, TIMEOUT, "re-registration after NOT_FOUND")
    await wait_until(
        lambda: fake.heartbeats and fake.heartbeats[-1].controller_epoch == EPOCH + 1, TIMEOUT, "hb"
    )


async def test_keeps_retrying_an_unreachable_controller(
    registry: tuple[FakeRegistry, str], worker_dir: Path
) -> None:
    fake, address = registry
    fake.fail_with = grpc.StatusCode.UNAVAILABLE  # a controller that is down
    a = make_agent(address, worker_dir)
    await a.start()
    channel = controller_channel(a)
    try:
        stub = agent_pb2_grpc.NodeAgentStub(channel)
        resp = await stub.Launch(launch_request(argv=WAIT_FOR_TERM, epoch=1), timeout=5)
        assert resp.started  # workers start while the controller is away
        registrar = a.registrar
        assert registrar is not None
        await wait_until(lambda: registrar.failures >= 2, TIMEOUT, "repeated registration attempts")
        assert not registrar.registered.is_set()
        fake.fail_with = None
        await wait_until(lambda: fake.registers, TIMEOUT, "registration once the controller is back")
        # The status sent (a registration built before the launch, or the heartbeat right after it)
        # reports the worker that started while the controller was away.
        w = await wait_until(lambda: worker_in(fake.last_status(), "job-1"), TIMEOUT, "worker reported")
        assert w.state == RUNNING
    finally:
        await channel.close()
        await a.close(grace=0)


async def test_launch_stop_and_epoch_fencing(
    registry: tuple[FakeRegistry, str], agent: Agent, stub: agent_pb2_grpc.NodeAgentStub
) -> None:
    fake, _ = registry
    await registered(agent)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Launch(launch_request(argv=WAIT_FOR_TERM, epoch=EPOCH - 1), timeout=5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.details() == f"stale controller epoch {EPOCH - 1} < {EPOCH}"

    resp = await stub.Launch(launch_request(argv=WAIT_FOR_TERM, gpus=[[0], [1]], epoch=EPOCH), timeout=5)
    assert resp.started and [w.state for w in resp.workers] == [RUNNING, RUNNING]
    again = await stub.Launch(launch_request(argv=WAIT_FOR_TERM, gpus=[[0], [1]], epoch=EPOCH), timeout=5)
    assert not again.started and [w.pid for w in again.workers] == [w.pid for w in resp.workers]

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Launch(launch_request("job-2", argv=["true"], env={"RANK": "1"}, epoch=EPOCH), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("env.RANK: ")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Launch(launch_request("job-2", argv=["true"], gpus=[[1]], epoch=EPOCH), timeout=5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "GPU 1 is held" in err.value.details()

    # A newer epoch is accepted and becomes the floor.
    drained = await stub.Drain(
        agent_pb2.DrainRequest(request_id="d1", controller_epoch=EPOCH + 2, drain=True)
    )
    assert drained.draining and agent.fence.epoch == EPOCH + 2
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Stop(agent_pb2.StopRequest(job_id="job-1", attempt=1, controller_epoch=EPOCH), timeout=5)
    assert err.value.details() == f"stale controller epoch {EPOCH} < {EPOCH + 2}"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Launch(launch_request("job-3", argv=["true"], gpus=[[3]], epoch=EPOCH + 2), timeout=5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "draining" in err.value.details()
    await wait_until(lambda: any(st.draining for st in fake.received), TIMEOUT, "drain in a heartbeat")

    await ready(agent, ranks=2)
    stop = agent_pb2.StopRequest(
        request_id="s1",
        controller_epoch=EPOCH + 2,
        job_id="job-1",
        attempt=1,
        grace_seconds=10,
        reason="cancel",
    )
    stopped = await stub.Stop(stop, timeout=5)
    assert len(stopped.workers) == 2

    def exited() -> bool:
        ws = [worker_in(fake.last_status(), "job-1", r) for r in (0, 1)]
        return all(w is not None and w.state == EXITED for w in ws)

    await wait_until(exited, TIMEOUT, "exits in a heartbeat")
    w0 = worker_in(fake.last_status(), "job-1", 0)
    assert w0 is not None and (w0.exit_code, w0.reason) == (0, "stopped by controller (cancel), exit code 0")
    assert list(w0.gpu_indices) == [0] and w0.log_path.endswith("jobs/job-1/attempt-1/rank-0.log")

    log = await stub.ReadLog(agent_pb2.ReadLogRequest(controller_epoch=EPOCH + 2, job_id="job-1", rank=0))
    assert log.path == w0.log_path
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ReadLog(agent_pb2.ReadLogRequest(controller_epoch=1, job_id="job-1", rank=0))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ReadLog(agent_pb2.ReadLogRequest(controller_epoch=EPOCH + 2, job_id="nope", rank=0))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_progress_from_a_worker_reaches_the_heartbeat(
    registry: tuple[FakeRegistry, str], agent: Agent, stub: agent_pb2_grpc.NodeAgentStub
) -> None:
    fake, _ = registry
    fake.interval = 0.05
    await registered(agent)
    fake.reregister_next = True  # pick up the short interval
    await wait_until(lambda: len(fake.registers) >= 2, TIMEOUT, "re-registration")
    await stub.Launch(launch_request(argv=REPORTS_PROGRESS, epoch=EPOCH), timeout=5)

    def progressed() -> agent_pb2.WorkerStatus | None:
        w = worker_in(fake.heartbeats[-1].status if fake.heartbeats else None, "job-1")
        return w if w is not None and w.progress.iteration == 7 else None

    w = await wait_until(progressed, TIMEOUT, "progress in a heartbeat")
    assert (w.progress.loss, w.progress.samples_per_second, w.state) == (1.25, 80.0, RUNNING)
    # Workers report on the agent's unix socket; its TCP port refuses even the controller.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ReportProgress(agent_pb2.ReportProgressRequest(job_id="job-1", attempt=1, rank=0), timeout=5)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    token = (("tessera-worker-token", agent.tokens.token("job-1", 1)),)
    local = rpc.aio_channel(agent.supervisor.agent_addr, insecure=True)
    worker = agent_pb2_grpc.NodeAgentStub(local)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await worker.ReportProgress(
                agent_pb2.ReportProgressRequest(job_id="job-1", attempt=1, rank=5), timeout=5, metadata=token
            )
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        # The same call, from the worker's side, learns that a stop was asked for.
        await stub.Stop(
            agent_pb2.StopRequest(controller_epoch=EPOCH, job_id="job-1", grace_seconds=10), timeout=5
        )
        resp = await worker.ReportProgress(
            agent_pb2.ReportProgressRequest(job_id="job-1", attempt=1, rank=0, progress=w.progress), timeout=5,
            metadata=token,
        )
        assert resp.stop_requested
    finally:
        await local.close()

    async def logged() -> bytes:
        req = agent_pb2.ReadLogRequest(controller_epoch=EPOCH, job_id="job-1", rank=0)
        return (await stub.ReadLog(req, timeout=5)).data

    text = b""
    for _ in range(500):  # the worker prints right after its answer: read until it shows, bounded
        text = await logged()
        if b"reported" in text:
            break
        await asyncio.sleep(0.01)
    assert b"reported; stop_requested = False" in text


async def test_the_worker_socket_refuses_large_messages(agent: Agent) -> None:
    """Anyone on the node may connect to the workers' socket, and the token is checked only once a
    whole message arrived: 80 concurrent 15 MB calls with a wrong token held 2 GB of the agent.
    The socket is now a server of its own that takes 64 KiB a message."""
    local = rpc.aio_channel(agent.supervisor.agent_addr, insecure=True)
    worker = agent_pb2_grpc.NodeAgentStub(local)
    wrong = (("tessera-worker-token", "x" * 64),)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await worker.ReportProgress(agent_pb2.ReportProgressRequest(job_id="j" * (1 << 20), attempt=1),
                                        timeout=5, metadata=wrong)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.aio.AioRpcError) as err:  # still serving, and still checking tokens
            await worker.ReportProgress(agent_pb2.ReportProgressRequest(job_id="job-1", attempt=1),
                                        timeout=5, metadata=wrong)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await local.close()


async def test_worker_exit_triggers_a_prompt_heartbeat(
    registry: tuple[FakeRegistry, str], agent: Agent, stub: agent_pb2_grpc.NodeAgentStub
) -> None:
    fake, _ = registry  # heartbeat interval 30 s: only a prompt heartbeat can beat the timeout below
    await registered(agent)
    await stub.Launch(
        launch_request(
            argv=py("import pathlib, time; pathlib.Path('started').touch(); raise SystemExit(3)"), epoch=EPOCH
        ),
        timeout=5,
    )

    def exit_seen() -> agent_pb2.WorkerStatus | None:
        for hb in fake.heartbeats:
            w = worker_in(hb.status, "job-1")
            if w is not None and w.state == EXITED:
                return w
        return None

    w = await wait_until(exit_seen, 5.0, "a heartbeat reporting the exit well before the 30 s interval")
    assert (w.exit_code, w.reason) == (3, "exit code 3")


async def test_a_rank_log_is_kept_under_the_agents_cap(registry: tuple[FakeRegistry, str], worker_dir: Path) -> None:
    """The agent opens the log and hands its cap to the keeper (nodeagent/logcap.py): a worker that
    prints 2 MB leaves a log under 64 KiB that starts with the keeper's note and ends with the
    worker's last line, and ReadLog reads it."""
    fake, controller = registry
    agent = make_agent(controller, worker_dir, log_max_bytes=64 * 1024)
    await agent.start()
    channel = controller_channel(agent)
    try:
        stub = agent_pb2_grpc.NodeAgentStub(channel)
        await registered(agent)
        argv = ["{python}", "-c", "import sys\nfor i in range(100000): print(f'line {i:08d}')\nprint('last')"]
        await stub.Launch(launch_request(argv=argv, epoch=EPOCH), timeout=5)

        def exited() -> agent_pb2.WorkerStatus | None:
            w = worker_in(fake.last_status(), "job-1")
            return w if w is not None and w.state == EXITED else None

        w = await wait_until(exited, TIMEOUT, "the worker's exit")
        assert w.exit_code == 0
        log = await stub.ReadLog(agent_pb2.ReadLogRequest(controller_epoch=EPOCH, job_id="job-1", rank=0,
                                                          tail_bytes=4 * 1024 * 1024), timeout=5)
        assert (log.offset, log.size) == (0, len(log.data)) and log.size <= 64 * 1024
        lines = log.data.decode().splitlines()
        assert lines[0].startswith("tessera-keeper[job-1/1/0]: this log passed its cap of 65536 bytes;")
        assert lines[-1] == "last" and lines[-2] == "line 00099999"
    finally:
        await channel.close()
        await agent.close(grace=0)


async def test_a_job_over_the_disk_limit_is_killed_and_says_why(registry: tuple[FakeRegistry, str],
                                                                worker_dir: Path) -> None:
    """--job-disk-limit (nodeagent/diskuse.py): a worker that writes 4 MiB into its folder against a
    2 MiB limit is SIGKILLed (its SIGTERM handler never runs) and its status says why; a job beside
    it that writes nothing runs on."""
    fake, controller = registry
    agent = make_agent(controller, worker_dir, job_disk_limit=2 * 1024 * 1024, disk_check_seconds=0.1)
    await agent.start()
    channel = controller_channel(agent)
    try:
        stub = agent_pb2_grpc.NodeAgentStub(channel)
        await registered(agent)
        writer = py(
            """
            import os, pathlib, signal
            signal.signal(signal.SIGTERM, lambda *a: pathlib.Path("got-sigterm").touch())
            pathlib.Path("data.bin").write_bytes(os.urandom(4 * 1024 * 1024))
            while True:
                signal.pause()
            """
        )
        await stub.Launch(launch_request(argv=writer, epoch=EPOCH), timeout=5)
        await stub.Launch(launch_request(job_id="job-2", argv=WAIT_FOR_TERM, gpus=[[1]], epoch=EPOCH), timeout=5)
        await ready(agent, job="job-2")

        def exited() -> agent_pb2.WorkerStatus | None:
            w = worker_in(fake.last_status(), "job-1")
            return w if w is not None and w.state == EXITED else None

        w = await wait_until(exited, TIMEOUT, "the eviction")
        assert w.exit_code == -9
        # Any size over the limit: on a loaded machine a check may land while the 4 MiB are written.
        # Just over, both would read 2.0 MiB: the reason gives bytes then (diskuse.human_over).
        held = re.fullmatch(r"evicted by the agent: the job's files on this node hold (?:([\d.]+) MiB, over the agent's "
                            r"--job-disk-limit of 2\.0 MiB|([\d,]+) B, over the agent's --job-disk-limit of "
                            r"2,097,152 B), killed by SIGKILL", w.reason)
        assert held is not None, w.reason
        mib = float(held.group(1)) if held.group(1) else int(held.group(2).replace(",", "")) / 2**20
        assert 2.0 <= mib <= 4.1, w.reason
        assert not (worker_dir / "jobs" / "job-1" / "attempt-1" / "got-sigterm").exists()
        other = worker_in(fake.last_status(), "job-2")
        assert other is not None and other.state == RUNNING
    finally:
        await channel.close()
        await agent.close(grace=0)


async def test_a_launch_whose_rendezvous_port_is_held_is_refused(agent: Agent,
                                                                 stub: agent_pb2_grpc.NodeAgentStub) -> None:
    """Another process listening on rank 0's rendezvous port (nodeagent/ports.py): rank 0's Launch is
    refused before anything starts; a Launch of other ranks of the job, whose rank 0 is elsewhere,
    is not checked here."""
    await registered(agent)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        req = launch_request(argv=WAIT_FOR_TERM, epoch=EPOCH, rendezvous=f"127.0.0.1:{port}")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Launch(req, timeout=5)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert err.value.details() == (f"rendezvous port {port} is already held by another process on this node; "
                                       "the job's next attempt gets another port")
        assert agent.supervisor.statuses() == []
        other = launch_request(argv=WAIT_FOR_TERM, epoch=EPOCH, rendezvous=f"10.0.0.9:{port}", first_rank=1,
                               world_size=2)
        assert (await stub.Launch(other, timeout=5)).started


async def test_a_long_stop_reason_leaves_the_nodes_status_one_the_controller_accepts(
    registry: tuple[FakeRegistry, str], agent: Agent, stub: agent_pb2_grpc.NodeAgentStub
) -> None:
    """A Stop's reason goes into each stopped worker's reason. A controller repeats peers' text
    there (another node's Launch error): 5,000 characters of it once made the controller refuse
    every heartbeat of this node, which then fenced all its workers."""
    fake, _ = registry
    await registered(agent)
    await stub.Launch(launch_request(argv=WAIT_FOR_TERM, gpus=[[0]], epoch=EPOCH), timeout=5)
    await ready(agent, ranks=1)
    await stub.Stop(agent_pb2.StopRequest(request_id="s1", controller_epoch=EPOCH, job_id="job-1", attempt=1,
                                          grace_seconds=10, reason="\0" + "X" * 5000), timeout=5)

    def exited() -> agent_pb2.WorkerStatus | None:
        w = worker_in(fake.last_status(), "job-1", 0)
        return w if w is not None and w.state == EXITED else None

    w = await wait_until(exited, TIMEOUT, "the exit in a heartbeat")
    assert w.reason.startswith("stopped by controller (\\x00XXX") and "[...]" in w.reason, w.reason[:60]
    assert status_errors(fake.last_status(), "status") == []


async def test_a_register_says_which_attempts_this_agent_ran(
    registry: tuple[FakeRegistry, str], agent: Agent, stub: agent_pb2_grpc.NodeAgentStub
) -> None:
    """NodeStatus.attempt_marks, in Register only: what a controller restored from an older copy
    needs to relaunch a job above the attempts this node ran (docs/operations.md, "Restoring")."""
    fake, _ = registry
    fake.interval = 0.05
    await registered(agent)
    assert not fake.registers[0].status.attempt_marks
    await stub.Launch(launch_request("job-7", argv=["true"], attempt=3, epoch=EPOCH), timeout=5)
    fake.reregister_next = True
    await wait_until(lambda: len(fake.registers) == 2, TIMEOUT, "re-registration")
    assert list(fake.registers[1].status.attempt_marks) == [agent_pb2.AttemptMark(job_id="job-7", attempt=3)]
    assert not any(hb.status.attempt_marks for hb in fake.heartbeats)
