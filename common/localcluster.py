"""A local cluster of real daemons (controller, agents) for the demo, the tests and the benchmarks.

Daemons log JSON lines to a file; callers synchronise on those events (bounded waits), never on
fixed sleeps.

Every daemon runs with mTLS from one dev PKI (`DevPki`): `use_pki(DIR)` picks its directory (the
tests: one per pytest session; the demo: its state root), else one is made in a temporary directory
on first use. A node's certificate is issued when its agent first starts. `insecure=True` starts a
daemon in plaintext (--insecure) instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.common import identity, tls
from tessera.common.pki import CertificateAuthority, identity_dir_name
from tessera.common.tls import TlsConfig

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


class DevPki:
    """A CA and the certificates of a local cluster, made on demand in `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._ca: CertificateAuthority | None = None

    @property
    def ca_file(self) -> Path:
        self.authority()
        return self.root / "ca.pem"

    def authority(self) -> CertificateAuthority:
        if self._ca is None:
            exists = (self.root / "ca.key").exists()
            self._ca = CertificateAuthority.load(self.root) if exists else CertificateAuthority.init(self.root)
        return self._ca

    def tls_dir(self, who: identity.Identity) -> Path:
        """The --tls-dir of `who`, issued (localhost and 127.0.0.1) if it is not there yet."""
        d = self.root / identity_dir_name(who)
        if not (d / "key.pem").exists():
            self.authority().issue(who, out=d)
        return d


_pki: DevPki | None = None


def use_pki(root: Path) -> DevPki:
    """Make `root` (created if missing) the PKI of the daemons started from now on, and point
    tessctl and the SDK of this process and its children at its CA (TESSERA_CA)."""
    global _pki
    _pki = DevPki(root)
    os.environ["TESSERA_CA"] = str(_pki.ca_file)
    return _pki


def pki() -> DevPki:
    if _pki is None:
        import tempfile

        return use_pki(Path(tempfile.mkdtemp(prefix="tessera-pki-")))
    return _pki


def tls_config(who: identity.Identity) -> TlsConfig:
    """The loaded certificate of `who` from the local PKI (in-process servers and channels)."""
    return tls.load_dir(pki().tls_dir(who))


def _tls_args(who: identity.Identity, insecure: bool, extra: tuple[str, ...]) -> list[str]:
    if "--insecure" in extra or any(a.startswith("--tls-dir") for a in extra):
        return []
    return ["--insecure"] if insecure else ["--tls-dir", str(pki().tls_dir(who))]


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    address: str = ""
    argv: list[str] = field(default_factory=list)
    # The controller's agent port (its --agent-listen), which agents dial.
    agent_address: str = ""

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


def start_controller(state_dir: Path, *extra: str, listen: str = "127.0.0.1:0", fast: bool = True,
                     agent_listen: str = "", insecure: bool = False) -> Daemon:
    """`agent_listen`: its --agent-listen (default: port 0 when `listen` has port 0)."""
    argv = [str(BIN / "tessera-controller"), "--listen", listen, "--state-dir", str(state_dir)]
    argv += ["--agent-listen", agent_listen] if agent_listen else []
    argv += _tls_args(identity.CONTROLLER, insecure, extra)
    argv += (FAST_CONTROLLER if fast else []) + list(extra)
    d = _start("controller", argv, state_dir.parent / f"{state_dir.name}-controller.log", "controller_started",
               "listen")
    return d


def _start(name: str, argv: list[str], log_path: Path, ready_event: str, address_key: str) -> Daemon:
    """Spawn and wait for its ready line. A restart appends to the same log, so the line to wait
    for is the first one after those already there."""
    before = sum(1 for line in log_path.read_text(errors="replace").splitlines()
                 if f'"event": "{ready_event}"' in line) if log_path.exists() else 0
    d = _spawn(name, argv, log_path)
    ready = d.wait_event(ready_event, 30, skip=before)
    d.address = ready[address_key]
    d.agent_address = ready.get("agent_listen", "")
    return d


def start_estimator(log_path: Path, *extra: str, listen: str = "127.0.0.1:0", insecure: bool = False) -> Daemon:
    """A tessera-estimator on `listen`; its address once it logged estimator_started."""
    argv = [str(BIN / "tessera-estimator"), "--listen", listen, *_tls_args(identity.ESTIMATOR, insecure, extra),
            *extra]
    return _start("estimator", argv, log_path, "estimator_started", "listen")


def start_agent(controller: Daemon | str, node_id: str, inventory: Path | str | None, work_dir: Path, *extra: str,
                insecure: bool = False) -> Daemon:
    """An agent with a declared inventory file, or reading NVML when `inventory` is None.
    `controller`: the controller Daemon (its agent port), or the host:port to dial."""
    target = controller if isinstance(controller, str) else controller.agent_address
    argv = [str(BIN / "tessera-agent"), "--controller", target, "--node-id", node_id]
    argv += ["--inventory", str(inventory)] if inventory is not None else []
    argv += _tls_args(identity.node(node_id), insecure, extra)
    argv += ["--work-dir", str(work_dir), "--listen", "127.0.0.1:0", *extra]
    return _start(f"agent {node_id}", argv, work_dir.parent / f"{node_id}-agent.log", "agent serving", "address")


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
