"""The tessera-agent program itself: command line errors, SIGTERM, workers outliving the agent and
re-adopted by the next one. The controller is a fake AgentRegistry in the test process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO

import pytest

from tessera.common import identity, rpc
from tessera.common.localcluster import pki, tls_config
from tessera.nodeagent import process
from tessera.nodeagent.testing import FakeRegistry, launch_request, wait_until
from tessera.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from tests.workerenv import worker_python

RUNNING = common_pb2.WORKER_STATE_RUNNING
EXITED = common_pb2.WORKER_STATE_EXITED
TIMEOUT = 15.0
EPOCH = 5

_SCRIPT = Path(sys.executable).parent / "tessera-agent"
AGENT = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "tessera.nodeagent.main"]

WAIT_FOR_TERM = [
    "{python}",
    "-c",
    textwrap.dedent(
        """
        import signal, sys, pathlib
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
        pathlib.Path("ready").touch()
        signal.pause()
        """
    ),
]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AGENT, *args], capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"--node-id": "Bad_Name"}, "--node-id: 'Bad_Name' does not match"),
        ({"--controller": "nohost"}, "--controller: 'nohost' has no port: expected host:port, e.g. nohost:50054"),
        ({"--inventory": "/nonexistent.yaml"}, "--inventory: /nonexistent.yaml: cannot read"),
        ({"--listen": "127.0.0.1:99999"}, "--listen: '127.0.0.1:99999' is not host:port (port 0-65535"),
        ({"--log-level": "loud"}, "--log-level: invalid choice: 'loud'"),
        ({"--controller": None}, "the following arguments are required: --controller"),
        ({"--default-worker-user": "root"}, "--default-worker-user: 'root' is root"),
        ({"--default-worker-user": "nobody:0"}, "workers never run as root"),
        ({"--worker-user": "team=no-such-user"}, "--worker-user team: no user 'no-such-user'"),
        ({"--allow-env": "ld_preload"}, "--allow-env: 'ld_preload' is not a variable name"),
        ({"--fence-grace": "-1"}, "--fence-grace: must be in 0..3600"),
        ({"--log-max-bytes": "100"}, "--log-max-bytes: must be 0 (no cap) or at least 65536, got 100"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    tmp_path: Path, override: dict[str, str | None], message: str
) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("gpus:\n  - model: T4\n    count: 1\n")
    flags: dict[str, str | None] = {
        "--controller": "127.0.0.1:1",
        "--node-id": "n1",
        "--work-dir": str(tmp_path),
        "--inventory": str(inv),
        **override,
    }
    # --insecure: these are about the other flags (tests/security checks the TLS ones).
    result = run_cli(*[x for flag, value in flags.items() if value is not None for x in (flag, value)], "--insecure")
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tessera-agent: error: ") and message in lines[0], lines


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root agent runs workers as another user")
def test_a_work_dir_the_worker_user_cannot_reach_is_refused_at_start(tmp_path: Path) -> None:
    # tmp_path lies under /tmp/pytest-of-root (0700): nobody cannot reach it, so no worker could start.
    inv = tmp_path / "inv.yaml"
    inv.write_text("gpus:\n  - model: T4\n    count: 1\n")
    result = run_cli("--controller", "127.0.0.1:1", "--node-id", "n1", "--work-dir", str(tmp_path / "w"),
                     "--inventory", str(inv), "--worker-python", worker_python(), "--insecure")
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("tessera-agent: error: --work-dir/--worker-python: nobody (uid 65534, gid 65534) "
                           "cannot run"), line
    assert "Permission denied" in line and "install Tessera where they can read it" in line


def test_invalid_inventory_names_the_field(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("gpus:\n  - model: Z9000\n    count: 2\n")
    result = run_cli(
        "--controller", "127.0.0.1:1", "--node-id", "n1", "--work-dir", str(tmp_path), "--inventory", str(inv),
        "--insecure",
    )
    assert result.returncode == 2
    assert "gpus[0].model: unknown GPU model 'Z9000'" in result.stderr


@pytest.fixture
async def registry() -> AsyncIterator[tuple[FakeRegistry, str]]:
    fake = FakeRegistry(epoch=EPOCH, interval=30.0)
    server, port = rpc.aio_server("127.0.0.1:0", [(agent_pb2_grpc.add_AgentRegistryServicer_to_server, fake)],
                                  tls=tls_config(identity.CONTROLLER))
    await server.start()
    yield fake, f"127.0.0.1:{port}"
    await rpc.stop_server(server, grace=0)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def _append(path: Path) -> IO[bytes]:
    return open(path, "ab")


async def start_agent(
    controller: str, work_dir: Path, inventory: Path, log: Path
) -> asyncio.subprocess.Process:
    with _append(log) as err:
        return await asyncio.create_subprocess_exec(
            *AGENT,
            "--controller",
            controller,
            "--node-id",
            "node-p",
            "--inventory",
            str(inventory),
            "--work-dir",
            str(work_dir),
            "--metrics-listen",
            "127.0.0.1:0",
            "--worker-python",
            worker_python(),
            "--tls-dir",
            str(pki().tls_dir(identity.node("node-p"))),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
        )


async def stop_agent(agent: asyncio.subprocess.Process) -> tuple[int, bytes]:
    agent.send_signal(signal.SIGTERM)
    out, _ = await asyncio.wait_for(agent.communicate(), TIMEOUT)
    assert agent.returncode is not None
    return agent.returncode, out


async def test_workers_outlive_the_agent_and_are_readopted(
    registry: tuple[FakeRegistry, str], tmp_path: Path, worker_dir: Path
) -> None:
    fake, controller = registry
    work_dir, inv, log = worker_dir / "work", tmp_path / "inv.yaml", tmp_path / "agent.log"
    inv.write_text("gpus:\n  - model: A100-80GB\n    count: 2\n")
    agents: list[asyncio.subprocess.Process] = []
    worker_pid = 0
    try:
        agents.append(await start_agent(controller, work_dir, inv, log))
        reg = await wait_until(
            lambda: fake.registers and fake.registers[0], TIMEOUT, "first agent registered"
        )
        assert reg.status.node_id == "node-p" and len(reg.status.inventory.gpus) == 2
        channel = rpc.aio_channel(reg.status.address, tls=tls_config(identity.CONTROLLER), peer=identity.node("node-p"))
        stub = agent_pb2_grpc.NodeAgentStub(channel)
        launched = await stub.Launch(launch_request(argv=WAIT_FOR_TERM, epoch=EPOCH), timeout=5)
        worker_pid = launched.workers[0].pid
        await wait_until((work_dir / "jobs/job-1/attempt-1/ready").exists, TIMEOUT, "worker ready")
        await channel.close()

        code, out = await stop_agent(agents[0])
        assert (code, out) == (0, b"")  # nothing on stdout, ever
        assert process.is_alive(worker_pid, None), "the worker must outlive the agent"
        first_lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        serving = next(e for e in first_lines if e["event"] == "agent serving")
        assert serving["address"] == reg.status.address

        agents.append(await start_agent(controller, work_dir, inv, log))
        reg2 = await wait_until(
            lambda: len(fake.registers) >= 2 and fake.registers[1], TIMEOUT, "re-registered"
        )
        (w,) = reg2.status.workers
        assert (w.job_id, w.state, w.pid) == ("job-1", RUNNING, worker_pid)
        metrics_port = [
            json.loads(line) for line in log.read_text().splitlines() if "metrics serving" in line
        ][-1]
        metrics = await asyncio.to_thread(_get, f"http://127.0.0.1:{metrics_port['port']}/metrics")
        assert "tessera_agent_registered 1.0" in metrics and "tessera_agent_workers_running 1.0" in metrics
        # Same port as before (the controller knows that address until the agent registers again).
        assert reg2.status.address == reg.status.address

        channel = rpc.aio_channel(reg2.status.address, tls=tls_config(identity.CONTROLLER), peer=identity.node("node-p"))
        stub = agent_pb2_grpc.NodeAgentStub(channel)
        stop = agent_pb2.StopRequest(
            controller_epoch=EPOCH, job_id="job-1", attempt=1, grace_seconds=10, reason="cancel"
        )
        await stub.Stop(stop, timeout=5)

        def exit_reported() -> agent_pb2.WorkerStatus | None:
            st = fake.last_status()
            ws = [x for x in (st.workers if st else ()) if x.state == EXITED]
            return ws[0] if ws else None

        done = await wait_until(exit_reported, TIMEOUT, "exit of the re-adopted worker reported")
        # The keeper recorded the real exit for the agent that did not start the worker.
        assert (done.exit_code, done.reason) == (0, "stopped by controller (cancel), exit code 0")
        await channel.close()
        code, out = await stop_agent(agents[1])
        assert (code, out) == (0, b"")
    finally:
        for a in agents:
            if a.returncode is None:
                a.kill()
                await a.wait()
        if worker_pid and process.is_alive(worker_pid, None):
            os.killpg(worker_pid, signal.SIGKILL)
