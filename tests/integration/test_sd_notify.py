"""The daemons speak systemd's notify protocol: READY=1 once serving, watchdog pings, STOPPING=1."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tessera.common import identity
from tessera.common.localcluster import pki
from tests.procs import BIN, REPO, env, start_controller
from tests.workerenv import worker_python

pytestmark = pytest.mark.slow


def _listen(tmp_path: Path) -> tuple[socket.socket, str]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(30)
    return sock, path


def _recv_until(sock: socket.socket, needle: str) -> list[str]:
    got: list[str] = []
    while not any(needle in m for m in got):
        got.append(sock.recv(4096).decode())
    return got


def _run(argv: list[str], notify_path: str, log: Path) -> subprocess.Popen[bytes]:
    e = env()
    e.update({"NOTIFY_SOCKET": notify_path, "WATCHDOG_USEC": "400000"})
    e.pop("WATCHDOG_PID", None)
    with open(log, "ab") as f:
        return subprocess.Popen(argv, env=e, stdout=f, stderr=subprocess.STDOUT, cwd=REPO)


def test_controller_notifies_ready_watchdog_stopping(tmp_path: Path) -> None:
    sock, path = _listen(tmp_path)
    proc = _run([str(BIN / "tessera-controller"), "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "s"),
                 "--tls-dir", str(pki().tls_dir(identity.CONTROLLER))], path, tmp_path / "c.log")
    try:
        msgs = _recv_until(sock, "READY=1")
        assert any(m.startswith("READY=1") for m in msgs)
        assert "WATCHDOG=1" in _recv_until(sock, "WATCHDOG=1")[-1]
        proc.send_signal(signal.SIGTERM)
        assert "STOPPING=1" in _recv_until(sock, "STOPPING=1")[-1]
        assert proc.wait(15) == 0
    finally:
        proc.kill()
        sock.close()


def test_agent_notifies_ready(tmp_path: Path, worker_dir: Path) -> None:
    ctl = start_controller(tmp_path / "state")
    sock, path = _listen(tmp_path)
    # Run as root, the agent checks at start that its workers' user (nobody) can reach the work dir
    # and run {python}: tests/workerenv.py.
    proc = _run([str(BIN / "tessera-agent"), "--controller", ctl.agent_address, "--node-id", "n1", "--inventory",
                 str(REPO / "examples/inventories/a10-node.yaml"), "--work-dir", str(worker_dir / "w"),
                 "--worker-python", worker_python(), "--tls-dir", str(pki().tls_dir(identity.node("n1")))],
                path, tmp_path / "a.log")
    try:
        assert any(m.startswith("READY=1") for m in _recv_until(sock, "READY=1"))
        assert "WATCHDOG=1" in _recv_until(sock, "WATCHDOG=1")[-1]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        proc.kill()
        sock.close()
        ctl.stop()


def test_estimator_notifies_ready_watchdog_stopping(tmp_path: Path) -> None:
    sock, path = _listen(tmp_path)
    proc = _run([str(BIN / "tessera-estimator"), "--listen", "127.0.0.1:0", "--tls-dir",
                 str(pki().tls_dir(identity.ESTIMATOR))], path, tmp_path / "e.log")
    try:
        msgs = _recv_until(sock, "READY=1")
        assert any(m.startswith("READY=1") and "STATUS=serving on 127.0.0.1:" in m for m in msgs)
        assert "WATCHDOG=1" in _recv_until(sock, "WATCHDOG=1")[-1]
        proc.send_signal(signal.SIGTERM)
        assert "STOPPING=1" in _recv_until(sock, "STOPPING=1")[-1]
        assert proc.wait(15) == 0
    finally:
        proc.kill()
        sock.close()
