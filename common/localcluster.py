"""A local cluster of real daemons (controller, agents) for the demo, the tests and the benchmarks.

Daemons log JSON lines to a file; callers synchronise on those events (bounded waits), never on
fixed sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent  # the checkout, for relative example paths


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"
    e["PYTHONUNBUFFERED"] = "1"
    e.pop("NOTIFY_SOCKET", None)
    return e


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll pred until it returns a truthy value; fail with `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    address: str = ""
    argv: list[str] = field(default_factory=list)

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
        return out

    def wait_event(self, event: str, timeout: float = 30.0, skip: int = 0, **match: Any) -> dict[str, Any]:
        """The (skip+1)-th logged event named `event` whose fields equal `match`; fails if the
        daemon exits first or after `timeout` seconds."""
        def find() -> dict[str, Any] | None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
            hits = [e for e in self.events() if e.get("event") == event and all(e.get(k) == v for k, v in match.items())]
            return hits[skip] if len(hits) > skip else None

        found: dict[str, Any] = wait_for(find, timeout, f"{self.name} log event {event} {match}")
        return found

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _spawn(name: str, argv: list[str], log_path: Path) -> Daemon:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env(),
                                cwd=REPO)
    return Daemon(name, proc, log_path, argv=argv)


FAST_CONTROLLER = ["--round-interval", "30", "--inspect-interval", "1", "--debounce", "0.2", "--lease", "3",
                   "--heartbeat-interval", "0.5", "--down-after", "30", "--stop-grace", "10"]


def start_controller(state_dir: Path, *extra: str, listen: str = "127.0.0.1:0", fast: bool = True) -> Daemon:
    argv = [str(BIN / "tessera-controller"), "--listen", listen, "--state-dir", str(state_dir)]
    argv += (FAST_CONTROLLER if fast else []) + list(extra)
    return _start("controller", argv, state_dir.parent / f"{state_dir.name}-controller.log", "controller_started",
                  "listen")


def _start(name: str, argv: list[str], log_path: Path, ready_event: str, address_key: str) -> Daemon:
    """Spawn and wait for its ready line. A restart appends to the same log, so the line to wait
    for is the first one after those already there."""
    before = sum(1 for line in log_path.read_text(errors="replace").splitlines()
                 if f'"event": "{ready_event}"' in line) if log_path.exists() else 0
    d = _spawn(name, argv, log_path)
    d.address = d.wait_event(ready_event, 30, skip=before)[address_key]
    return d


def start_estimator(log_path: Path, *extra: str, listen: str = "127.0.0.1:0") -> Daemon:
    """A tessera-estimator on `listen`; its address once it logged estimator_started."""
    argv = [str(BIN / "tessera-estimator"), "--listen", listen, *extra]
    return _start("estimator", argv, log_path, "estimator_started", "listen")


def start_agent(controller: str, node_id: str, inventory: Path | str | None, work_dir: Path, *extra: str) -> Daemon:
    """An agent with a declared inventory file, or reading NVML when `inventory` is None."""
    argv = [str(BIN / "tessera-agent"), "--controller", controller, "--node-id", node_id]
    argv += ["--inventory", str(inventory)] if inventory is not None else []
    argv += ["--work-dir", str(work_dir), "--listen", "127.0.0.1:0", *extra]
    return _start(f"agent {node_id}", argv, work_dir.parent / f"{node_id}-agent.log", "agent serving", "address")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_etcd(root: Path, binary: str = "etcd", tls: tuple[Path, Path, Path] | None = None) -> Daemon:
    """One etcd member (Debian's etcd-server) on 127.0.0.1 with free ports and its data under `root`,
    serving clients when returned; `address` is its client endpoint. `tls` = (CA, certificate, key):
    clients over TLS, with a client certificate signed by that CA required."""
    client, peer = free_port(), free_port()
    log_path = root / "etcd.log"
    scheme = "https" if tls else "http"
    secure = ["--trusted-ca-file", str(tls[0]), "--cert-file", str(tls[1]), "--key-file", str(tls[2]),
              "--client-cert-auth"] if tls else []
    argv = [binary, "--name", "t", "--data-dir", str(root / "etcd-data"), *secure,
            "--listen-client-urls", f"{scheme}://127.0.0.1:{client}",
            "--advertise-client-urls", f"{scheme}://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"t=http://127.0.0.1:{peer}", "--logger", "zap", "--log-outputs", "stderr"]
    d = _spawn("etcd", argv, log_path)
    d.address = f"127.0.0.1:{client}"

    def serving() -> bool:
        if d.proc.poll() is not None:
            raise RuntimeError(f"etcd exited {d.proc.returncode}: {log_path.read_text()[-2000:]}")
        return "serving client traffic" in log_path.read_text(errors="replace")

    try:
        wait_for(serving, 30, "etcd serving client traffic")
    except BaseException:
        d.stop()
        raise
    return d


def tessctl(controller: str, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    cp = subprocess.run([str(BIN / "tessctl"), "--controller", controller, *args], capture_output=True, text=True,
                        env=env(), timeout=timeout, cwd=REPO, check=False)
    if check and cp.returncode != 0:
        raise AssertionError(f"tessctl {' '.join(args)} exited {cp.returncode}: {cp.stderr}")
    return cp


def tessctl_json(controller: str, *args: str) -> Any:
    return json.loads(tessctl(controller, *args, "-o", "json").stdout)


def kill_strays(root: Path) -> int:
    """SIGKILL every process whose working directory is under `root` (workers orphaned by a test
    that kill -9'd their agent). Returns how many were killed."""
    killed = 0
    root = root.resolve()
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == os.getpid():
            continue
        try:
            cwd = (pid_dir / "cwd").resolve()
        except OSError:
            continue
        if cwd == root or root in cwd.parents:
            try:
                os.kill(int(pid_dir.name), signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed
