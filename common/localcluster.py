"""A local cluster of real daemons (controller, agents) for the demo, the tests and the benchmarks.

Daemons log JSON lines to a file; callers synchronise on those events (bounded waits), never on
fixed sleeps.

A controller started here authenticates its API (docs/auth.md): `start_controller` gives it a
tokens file `STATE-tokens.yaml` beside its state dir with the tokens of CREDENTIALS (an admin of
tenant "default", users of tenants "team-a" and "team-b"), and keeps the tokens themselves, for the
harness only, in `STATE-credentials.json` (0600) so a restart gets the same ones. `Daemon.token` is
the admin token; `tessctl(address, ...)` uses the admin token of the controller at that address.

Every daemon runs with mTLS from one dev PKI (`DevPki`): `use_pki(DIR)` picks its directory (the
tests: one per pytest session; the demo: its state root), else one is made in a temporary directory
on first use. A node's certificate is issued when its agent first starts. `insecure=True` starts a
daemon in plaintext (--insecure) instead.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from tessera.common import identity, rpc, tls
from tessera.common.pki import DEFAULT_HOSTS, CertificateAuthority, identity_dir_name
from tessera.common.privatefile import write_private
from tessera.common.tls import TlsConfig
from tessera.common.tokens import TokenEntry, hash_token, new_token, write_tokens_file
from tessera.common.workerusers import agent_flags

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent  # the checkout, for relative example paths


def env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    e = dict(os.environ)
    e.update(extra or {})
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

    def tls_dir(self, who: identity.Identity, hosts: Sequence[str] = ()) -> Path:
        """The --tls-dir of `who`, issued for localhost, 127.0.0.1 and `hosts` if it is not there yet
        or does not name all of `hosts` (then issued again, for every host named so far)."""
        d = self.root / identity_dir_name(who)
        named = d / "hosts"
        known = named.read_text().split() if named.exists() else []
        if not (d / "key.pem").exists() or not set(hosts) <= set(known):
            known = list(dict.fromkeys([*DEFAULT_HOSTS, *known, *hosts]))
            self.authority().issue(who, known, out=d, fit=True)  # a dev CA in its last year: cut, not refused
            named.write_text("\n".join(known) + "\n")
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


def ca_only() -> TlsConfig:
    """A client's TLS that trusts the local PKI's CA and presents no certificate (users: tessctl,
    the SDK, raw test channels to the controller's users' port)."""
    return TlsConfig(ca=pki().ca_file.read_bytes())


def tls_config(who: identity.Identity) -> TlsConfig:
    """The loaded certificate of `who` from the local PKI (in-process servers and channels)."""
    return tls.load_dir(pki().tls_dir(who))


def _tls_args(who: identity.Identity, insecure: bool, extra: tuple[str, ...], listen: str = "") -> list[str]:
    """--tls-dir (a certificate that also names the host of `listen`, when it is not loopback, so
    clients dialling it verify it) or --insecure; nothing when `extra` already chose."""
    if "--insecure" in extra or any(a.startswith("--tls-dir") for a in extra):
        return []
    host = listen.rpartition(":")[0].strip("[]")
    hosts = [host] if host and host not in (*DEFAULT_HOSTS, "0.0.0.0", "::") else []
    return ["--insecure"] if insecure else ["--tls-dir", str(pki().tls_dir(who, hosts))]


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    address: str = ""
    argv: list[str] = field(default_factory=list)
    # name -> bearer token of the callers this controller knows (empty: not a controller, or insecure).
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def token(self) -> str | None:
        """The admin token (None when the controller runs without authentication)."""
        return self.tokens.get("admin")
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


def _spawn(name: str, argv: list[str], log_path: Path, extra_env: Mapping[str, str] | None = None) -> Daemon:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env(extra_env), cwd=REPO)
    return Daemon(name, proc, log_path, argv=argv)


FAST_CONTROLLER = ["--round-interval", "30", "--inspect-interval", "1", "--debounce", "0.2", "--lease", "3",
                   "--heartbeat-interval", "0.5", "--down-after", "30", "--stop-grace", "10",
                   "--fence", "2.5", "--fence-grace", "2"]


# The callers of a local controller: name -> (tenant, role).
CREDENTIALS = {"admin": ("default", "admin"), "alice": ("team-a", "user"), "bob": ("team-b", "user")}
# Admin tokens of the controllers this process started, by address: what tessctl() calls with.
_ADMIN_TOKENS: dict[str, str] = {}


def local_tokens(state_dir: Path) -> tuple[Path, dict[str, str]]:
    """The tokens file for a controller of `state_dir` and the tokens in it, made on first use and
    reused after (see the module's docstring)."""
    tokens_file = state_dir.parent / f"{state_dir.name}-tokens.yaml"
    creds = state_dir.parent / f"{state_dir.name}-credentials.json"
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    if creds.exists() and tokens_file.exists():
        return tokens_file, dict(json.loads(creds.read_text()))
    tokens = {name: new_token() for name in CREDENTIALS}
    write_private(creds, json.dumps(tokens) + "\n")
    write_tokens_file(tokens_file, [TokenEntry(n, t, r, hash_token(tokens[n])) for n, (t, r) in CREDENTIALS.items()])
    return tokens_file, tokens


def start_controller(state_dir: Path, *extra: str, listen: str = "127.0.0.1:0", fast: bool = True,
                     agent_listen: str = "", insecure: bool = False, auth: bool = True,
                     extra_env: Mapping[str, str] | None = None) -> Daemon:
    """A controller with the local tokens file (auth=False, or a --tokens of the caller's in `extra`:
    without); its address once it logged controller_started. `agent_listen`: its --agent-listen
    (default: port 0 when `listen` has port 0). `extra_env`: e.g. TESSERA_CRASH_AT
    (common/crashpoints.py) for this controller only."""
    argv = [str(BIN / "tessera-controller"), "--listen", listen, "--state-dir", str(state_dir)]
    argv += ["--agent-listen", agent_listen] if agent_listen else []
    argv += _tls_args(identity.CONTROLLER, insecure, extra, listen)
    tokens: dict[str, str] = {}
    if auth and "--tokens" not in extra:
        tokens_file, tokens = local_tokens(state_dir)
        argv += ["--tokens", str(tokens_file)]
    argv += (FAST_CONTROLLER if fast else []) + list(extra)
    d = _start("controller", argv, state_dir.parent / f"{state_dir.name}-controller.log", "controller_started",
               "listen", extra_env)
    d.tokens = tokens
    if d.token:
        _ADMIN_TOKENS[d.address] = d.token
    return d


def _start(name: str, argv: list[str], log_path: Path, ready_event: str, address_key: str,
           extra_env: Mapping[str, str] | None = None) -> Daemon:
    """Spawn and wait for its ready line. A restart appends to the same log, so the line to wait
    for is the first one after those already there."""
    before = sum(1 for line in log_path.read_text(errors="replace").splitlines()
                 if f'"event": "{ready_event}"' in line) if log_path.exists() else 0
    d = _spawn(name, argv, log_path, extra_env)
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
                insecure: bool = False, listen: str = "127.0.0.1:0", wrap: Sequence[str] = ()) -> Daemon:
    """An agent with a declared inventory file, or reading NVML when `inventory` is None.
    `controller`: the controller Daemon (its agent port), or the host:port to dial; `wrap` runs it
    under another command (the partition test's `ip netns exec NS`)."""
    target = controller if isinstance(controller, str) else controller.agent_address
    argv = [*wrap, str(BIN / "tessera-agent"), "--controller", target, "--node-id", node_id]
    argv += ["--inventory", str(inventory)] if inventory is not None else []
    argv += _tls_args(identity.node(node_id), insecure, extra)
    argv += agent_flags(work_dir, extra)
    argv += ["--work-dir", str(work_dir), "--listen", listen, *extra]
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


def tessctl(controller: str, *args: str, check: bool = True, timeout: float = 30,
            token: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run tessctl against `controller`, as `token`'s holder (default: the admin of a controller this
    process started there). The token goes through the environment, never the command line."""
    e = env()
    e.pop("TESSERA_TOKEN", None)
    token = token or _ADMIN_TOKENS.get(controller)
    if token:
        e["TESSERA_TOKEN"] = token
    cp = subprocess.run([str(BIN / "tessctl"), "--controller", controller, *args], capture_output=True, text=True,
                        env=e, timeout=timeout, cwd=REPO, check=False)
    if check and cp.returncode != 0:
        raise AssertionError(f"tessctl {' '.join(args)} exited {cp.returncode}: {cp.stderr}")
    return cp


def tessctl_json(controller: str, *args: str, token: str | None = None) -> Any:
    return json.loads(tessctl(controller, *args, "-o", "json", token=token).stdout)


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


class _Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """Adds `authorization: Bearer TOKEN` to every call of a raw channel."""

    def __init__(self, token: str) -> None:
        self.metadata = (("authorization", f"Bearer {token}"),)

    def _details(self, details: Any) -> Any:
        return details._replace(metadata=[*(details.metadata or ()), *self.metadata])

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)


def user_channel(controller: Daemon, token: str | None = None) -> grpc.Channel:
    """A raw channel to the controller's users' port, over TLS, calling with `token` (default its
    admin's): for tests that speak the API without the SDK."""
    ch = rpc.sync_channel(controller.address, tls=ca_only())
    return grpc.intercept_channel(ch, _Bearer(token or controller.token or ""))


def node_channel(controller: Daemon, node_id: str) -> grpc.Channel:
    """A raw channel to the controller's agent port with node `node_id`'s certificate (what its
    agent would present): for tests that register or heartbeat by hand."""
    return rpc.sync_channel(controller.agent_address, tls=tls_config(identity.node(node_id)),
                            peer=identity.CONTROLLER)
