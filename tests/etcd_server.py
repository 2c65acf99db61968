"""A real `etcd` (Debian's etcd-server) for the tests of the etcd store and of leader failover.

Each server is a process on loopback with free ports and a temporary data dir, stopped at the end.
Without the binary the test is skipped, except under CI (`CI` set, as for the seed data in
tests/shared_data.py), where it fails: the HA tests cannot pass by not running.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tessera.controller.election import Leadership
from tessera.controller.etcd import EtcdClient, EtcdConfig
from tessera.controller.etcdstore import EtcdStore
from tests.procs import wait_for
from tests.shared_data import in_ci


def require_etcd() -> str:
    path = shutil.which("etcd")
    if path:
        return path
    why = "etcd not found (Debian package etcd-server; scripts/setup.sh installs it as root)"
    if in_ci():
        pytest.fail(f"{why}; CI is set, so a test that needs it fails instead of skipping", pytrace=False)
    pytest.skip(why)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EtcdServer:
    proc: subprocess.Popen[bytes]
    endpoint: str
    log_path: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@contextmanager
def etcd_server(tmp: Path) -> Iterator[EtcdServer]:
    """One etcd member on 127.0.0.1, serving clients when yielded."""
    binary = require_etcd()
    client, peer = free_port(), free_port()
    data = tmp / "etcd-data"
    log_path = tmp / "etcd.log"
    argv = [binary, "--name", "t", "--data-dir", str(data),
            "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"t=http://127.0.0.1:{peer}", "--logger", "zap", "--log-outputs", "stderr",
            # A test machine's disk is slow and shared: no snapshot or quota surprises mid-test.
            "--quota-backend-bytes", str(1 << 30)]
    with open(log_path, "ab") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    server = EtcdServer(proc, f"127.0.0.1:{client}", log_path)
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"etcd exited {proc.returncode}: {log_path.read_text()[-2000:]}")
            return "serving client traffic" in log_path.read_text(errors="replace")

        wait_for(ready, 30, "etcd serving client traffic")
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def etcd_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One etcd for a test module; each test keeps to a prefix of its own (`leading_store`)."""
    with etcd_server(tmp_path_factory.mktemp("etcd")) as srv:
        yield srv.endpoint


@contextmanager
def leading_store(endpoint: str, prefix: str, address: str = "test:1", ttl_s: int = 5,
                  marker: Path | None = None) -> Iterator[EtcdStore]:
    """An EtcdStore whose controller has won the election on `prefix` (its writes carry the fence)."""
    client = EtcdClient(EtcdConfig((endpoint,), prefix=prefix))
    try:
        lead = Leadership(client, address, ttl_s=ttl_s)
        client.call(lead.campaign(), 30)
        store = EtcdStore(client, lead, marker)
        try:
            yield store
        finally:
            lead.resign()
    finally:
        client.close()
