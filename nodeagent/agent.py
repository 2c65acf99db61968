"""The agent assembled: state file, fence, drain flag, supervisor, gRPC server, registration loop.

main.py parses the command line and hands an AgentConfig and an inventory to `Agent`; tests build an
`Agent` directly. `start()` serves and begins registering; `close()` stops serving and, by default,
leaves the workers running for the next agent to re-adopt.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import sys
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc.aio
import structlog

from tessera.common import nodespec, rpc
from tessera.common.buildinfo import build_info
from tessera.common.hooks import Hooks
from tessera.common.tls import TlsConfig
from tessera.nodeagent import cgroups, devicefilter, diskuse, gpuguard, metrics, retention
from tessera.nodeagent.controllers import ControllerSet, split_addresses
from tessera.nodeagent.keeping import DEFAULT_FENCE_GRACE, DEFAULT_KEEPER_POLL, DEFAULT_LOG_MAX_BYTES, Keepers
from tessera.nodeagent.registration import Registrar
from tessera.nodeagent.selffence import SelfFence
from tessera.nodeagent.server import DrainFlag, EpochFence, NodeAgentServicer, WorkerTokens
from tessera.nodeagent.state import FILE_NAME, StateFile
from tessera.nodeagent.supervisor import Supervisor
from tessera.nodeagent.users import UserMap, build
from tessera.nodeagent.version import __version__
from tessera.v1 import agent_pb2, agent_pb2_grpc, common_pb2

log = structlog.get_logger("tessera.nodeagent.agent")

_WILDCARDS = {"", "0.0.0.0", "::", "[::]"}
COMPONENT = "tessera-agent"

# Re-probes NVML (foreign memory, GPUs that vanished) off the event loop.
class Prober(Protocol):
    """inventory.probe_nvml: the node's inventory; `sessions` gets the workers seen on each GPU."""

    def __call__(self, own_pids: Collection[int], *, sessions: dict[int, set[int]]) -> common_pb2.NodeInventory: ...


@dataclass(frozen=True)
class AgentConfig:
    controller: str
    node_id: str
    work_dir: Path
    listen: str = "127.0.0.1:0"
    # Host put in the address reported to the controller; None = the listen host (or the hostname
    # when listening on a wildcard address, which no peer can dial).
    advertise: str | None = None
    kill_workers_on_exit: bool = False
    rpc_deadline: float = 5.0
    max_backoff: float = 2.0
    stop_grace_on_exit: float = 10.0
    inventory_refresh_seconds: float = 10.0
    poll_interval: float = 1.0
    # OMP_NUM_THREADS of workers whose job does not set it; None = usable CPUs / GPUs of the node.
    worker_threads: int | None = None
    # Exited attempts' folders and logs are removed this long after their last write (0 = never).
    attempt_ttl_seconds: float = retention.DEFAULT_TTL_S
    # Tenant -> worker uid/gid (tessera.nodeagent.users); None = the default map (nobody when root).
    users: UserMap | None = None
    # The interpreter `{python}` names for workers; None = the agent's own.
    worker_python: str | None = None
    # Environment names a Launch may carry although the environment policy refuses them.
    allowed_env: frozenset[str] = frozenset()
    # SIGTERM -> SIGKILL of a fenced worker, and how often keepers read the fence file.
    fence_grace: float = DEFAULT_FENCE_GRACE
    keeper_poll: float = DEFAULT_KEEPER_POLL
    # Each rank's log is kept under this many bytes, its newest part (0 = no cap).
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES
    # A job whose files on this node pass this many bytes is evicted; under this many bytes free
    # on the work dir's file system, the job filling it is (0 = not enforced; nodeagent/diskuse.py).
    job_disk_limit: int = 0
    min_free_disk: int = 0
    disk_check_seconds: float = diskuse.INTERVAL_S
    # GPU index -> NVIDIA minor number: each worker may open only its attempt's GPUs here (device
    # cgroups, nodeagent/devicefilter.py; tessera-agent --device-isolation); None = not enforced.
    gpu_minors: Mapping[int, int] | None = None
    # Why they are off, for operators (printable ASCII, at most 300 characters; "" when on).
    gpu_isolation_note: str = ""
    # This node's certificate (mTLS both ways); None only with `insecure` (tessera-agent --insecure).
    tls: TlsConfig | None = None
    insecure: bool = False


SOCKET_NAME = "agent.sock"
WORKER_MESSAGE_BYTES = 64 * 1024  # a ReportProgress is well under 1 KiB
WORKER_CONCURRENT_RPCS = 256  # workers on one node, each with a call or two in flight
# sun_path holds 108 bytes with its terminating NUL.
MAX_SOCKET_PATH = 107


def socket_path(work_dir: Path) -> Path:
    """The unix socket where this agent's workers report progress (docs/security.md)."""
    return work_dir / SOCKET_NAME


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen_host(listen: str) -> str:
    host, _, _ = listen.rpartition(":")
    return host


def advertise_host(config: AgentConfig) -> str:
    if config.advertise:
        return config.advertise.strip("[]")
    host = listen_host(config.listen)
    return socket.gethostname() if host in _WILDCARDS else host.strip("[]")


def local_host(listen: str) -> str:
    """The host a worker on this node dials to reach the agent."""
    host = listen_host(listen)
    if host in ("::", "[::]"):
        return "::1"
    return "127.0.0.1" if host in _WILDCARDS else host.strip("[]")


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        inventory: common_pb2.NodeInventory,
        prober: Prober | None = None,
    ) -> None:
        self.config = config
        self.inventory = inventory
        self._prober = prober
        self._state_file = StateFile(config.work_dir / FILE_NAME)
        self.wake = asyncio.Event()
        self.fence = EpochFence(on_raise=lambda _epoch: self._persist())
        self.tokens = WorkerTokens.load_or_create(config.work_dir)
        self.drain = DrainFlag(on_change=self._drain_changed)
        self.selffence = SelfFence(config.work_dir)
        self.keepers = Keepers(
            self.selffence.path, users=config.users or build(), grace=config.fence_grace, poll=config.keeper_poll,
            log_max_bytes=config.log_max_bytes, gpu_minors=config.gpu_minors,
        )
        self.supervisor = Supervisor(
            config.work_dir,
            [g.index for g in inventory.gpus],
            declared=inventory.source == common_pb2.INVENTORY_SOURCE_DECLARED,
            on_change=self._workers_changed,
            persist=self._persist,
            poll_interval=config.poll_interval,
            omp_threads=config.worker_threads,
            keepers=self.keepers,
            worker_python=config.worker_python or sys.executable,
            allowed_env=config.allowed_env,
            fence=self.selffence,
        )
        self.server: grpc.aio.Server | None = None
        self.worker_server: grpc.aio.Server | None = None
        self.port = 0
        self.address = ""
        self._controllers: ControllerSet | None = None
        self.registrar: Registrar | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._restoring = False
        # Health (docs/observability.md): NOT_SERVING until a controller acknowledged a Register or
        # Heartbeat, and again while the last call failed or the self-fence has lapsed.
        self.hooks = Hooks(COMPONENT, serving=False)
        self._acknowledged = False

    # --- wiring callbacks -----------------------------------------------------------------------------

    def _fence_grace(self, controller_grace: float) -> None:
        # The controller requeues lease + its grace after the last heartbeat: keepers started from
        # now on kill a fenced worker within the shorter of the two waits.
        self.keepers.grace = min(self.config.fence_grace, controller_grace)

    def _persist(self) -> None:
        if self._restoring:
            return  # the restore writes once at its end
        try:
            self._state_file.write(
                {
                    "controller_epoch": self.fence.epoch,
                    "draining": self.drain.draining,
                    "port": self.port,
                    **self.supervisor.export_state(),
                }
            )
        except OSError as exc:
            # Losing the file costs re-adoption after a restart, not the running workers.
            log.error("cannot write agent state", path=str(self._state_file.path), error=str(exc))

    def _workers_changed(self) -> None:
        metrics.WORKERS_RUNNING.set(self.supervisor.running_count())
        self.wake.set()

    def _heartbeat_result(self, ok: bool) -> None:
        metrics.heartbeat_result(ok)
        self._acknowledged = ok
        self._update_health()

    def _update_health(self) -> None:
        self.hooks.set_serving(self._acknowledged and not self.selffence.expired())

    def _drain_changed(self) -> None:
        self._persist()
        self.wake.set()

    def node_status(self) -> agent_pb2.NodeStatus:
        """The whole state sent in every Register and Heartbeat."""
        return agent_pb2.NodeStatus(
            node_id=self.config.node_id,
            address=self.address,
            inventory=self.inventory,
            workers=self.supervisor.statuses(),
            draining=self.drain.draining,
            agent_version=__version__,
            agent_commit=build_info().git_commit,
            gpu_isolation=gpuguard.isolation(self.config.gpu_minors is not None,
                                             self.inventory.source == common_pb2.INVENTORY_SOURCE_NVML),
            gpu_isolation_note=self.config.gpu_isolation_note,
            features=[nodespec.RENDEZVOUS_KEY_FEATURE],  # its workers seal with the attempt's key
        )

    def attempt_marks(self) -> list[agent_pb2.AttemptMark]:
        """Per job, the highest attempt launched or stopped here (Register): the newest jobs of each
        table (each is in the order its jobs were last marked), at most MAX_ATTEMPT_MARKS in all."""
        state = self.supervisor.export_state()
        half = nodespec.MAX_ATTEMPT_MARKS // 2
        marks: dict[str, int] = {}
        for table in (state["launched"], state["stopped"]):
            for job, n in list(table.items())[-half:]:
                marks[job] = max(n, marks.get(job, 0))
        return [agent_pb2.AttemptMark(job_id=j, attempt=n) for j, n in marks.items()]

    # --- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Restore state, serve NodeAgent, start registering. Raises OSError if the listen address
        cannot be bound."""
        state = self._state_file.load()
        self._restoring = True
        try:
            self.fence.observe(int(state.get("controller_epoch", 0)))
            self.drain.draining = bool(state.get("draining", False))
        finally:
            self._restoring = False
        servicer = NodeAgentServicer(self.supervisor, self.fence, self.drain, tokens=self.tokens,
                                     authenticate=not self.config.insecure)
        self.server, self.port = self._bind(servicer, state.get("port"))
        self.address = join_host_port(advertise_host(self.config), self.port)
        sock = socket_path(self.config.work_dir)
        sock.unlink(missing_ok=True)  # left by an agent that was killed
        # The workers' socket is a server of its own with small limits: anyone on the node may
        # connect, and the token is checked only once a whole message has arrived, so on the main
        # server (16 MiB messages, no bound on calls) 80 calls with a wrong token held 2 GB.
        self.worker_server, _ = rpc.aio_server(
            f"unix:{sock}", [(agent_pb2_grpc.add_NodeAgentServicer_to_server, servicer)], name="agent-workers",
            hooks=self.hooks, insecure=True, max_receive_bytes=WORKER_MESSAGE_BYTES,
            max_concurrent_rpcs=WORKER_CONCURRENT_RPCS)
        self.supervisor.agent_addr = f"unix:{sock}"
        self.supervisor.worker_token = self.tokens.token
        self._log_worker_users()
        adopted = self.supervisor.restore(state)
        metrics.WORKERS_RUNNING.set(self.supervisor.running_count())
        await self.server.start()
        await self.worker_server.start()
        # Workers may run as other users (unprivileged uids): anyone on the node may connect, and
        # only the attempt's secret lets a call through.
        sock.chmod(0o666)
        log.info(
            "agent serving",
            node_id=self.config.node_id,
            listen=join_host_port(listen_host(self.config.listen).strip("[]") or "0.0.0.0", self.port),
            address=self.address,
            controller=self.config.controller,
            workers_socket=str(sock),
            transport="insecure" if self.config.insecure else "tls",
            inventory_source=common_pb2.InventorySource.Name(self.inventory.source),
            gpus=len(self.inventory.gpus),
            worker_omp_threads=self.supervisor.omp_threads,
            readopted_workers=adopted,
            controller_epoch=self.fence.epoch,
            draining=self.drain.draining,
        )
        self._controllers = ControllerSet(split_addresses(self.config.controller), self.config.tls)
        self.registrar = Registrar(
            self._controllers,
            self.node_status,
            self.fence,
            self.wake,
            deadline=self.config.rpc_deadline,
            max_backoff=self.config.max_backoff,
            on_result=self._heartbeat_result,
            on_renewed=self.selffence.renew,
            on_fence_grace=self._fence_grace,
            marks=self.attempt_marks,
        )
        self._tasks.append(asyncio.create_task(self.registrar.run(), name="registration"))
        self._tasks.append(asyncio.create_task(self._watch_fence(), name="fence"))
        if self._prober is not None:
            self._tasks.append(asyncio.create_task(self._refresh_inventory(), name="inventory"))
        if self.config.attempt_ttl_seconds > 0:
            self._tasks.append(asyncio.create_task(self._prune_attempts(), name="retention"))
        if self.config.gpu_minors is not None and not self.keepers.scopes:  # (scopes: systemd removes them)
            self._tasks.append(asyncio.create_task(self._prune_device_cgroups(), name="device-cgroups"))
        if self.config.job_disk_limit or self.config.min_free_disk:
            self._tasks.append(asyncio.create_task(self._watch_disk(), name="disk"))

    def _log_worker_users(self) -> None:
        """Say once who workers run as, and whether they get a cgroup."""
        users = self.keepers.users
        if not users.switch:
            log.warning("the agent is not root: workers run as the agent's uid", uid=users.default.uid)
            why = "the agent is not root"
        else:
            log.info(
                "workers run as",
                default=users.default.describe(),
                tenants={t: u.describe() for t, u in sorted(users.tenants.items())},
                tenant_uids="-".join(map(str, users.uid_range)) if users.uid_range else "off",
            )
            if users.uid_range is None:
                log.warning("tenants without --worker-user share one user: their workers can read, overwrite "
                            "and kill each other's work; give --tenant-uids START-END for a uid per tenant",
                            user=users.default.describe())
            self.keepers.scopes, why = cgroups.probe()
        if not self.keepers.scopes:
            log.warning("cgroups are unavailable: workers run without a scope of their own", why=why)
        if self.config.gpu_minors is not None:  # (tessera-agent's start said why not, otherwise)
            if not self.keepers.scopes:  # in scopes, systemd removes a keeper's cgroup with its scope
                devicefilter.prune()
            log.info("workers may open only their own GPUs (device cgroups)",
                     minors={str(k): v for k, v in sorted(self.config.gpu_minors.items())})

    async def _watch_fence(self) -> None:
        """Log a lapse of the lease once, and heartbeat at once: the keepers act on their own."""
        while True:
            if self.selffence.check():
                self.wake.set()
            self._update_health()
            await asyncio.sleep(0.5)

    def _bind(self, servicer: NodeAgentServicer, previous_port: object) -> tuple[grpc.aio.Server, int]:
        """Bind the NodeAgent server; raises OSError when the listen address cannot be bound.

        With port 0, the port of the previous run is tried first: the controller still has the
        address of that run until the agent registers again.
        """
        registrations = [(agent_pb2_grpc.add_NodeAgentServicer_to_server, servicer)]
        # Callers refused before their requests are read, with HTTP/2 windows that do not grow: a
        # refused caller's upload is not taken in (rpc.aio_server's `grow_windows`).
        security: dict[str, Any] = {"tls": self.config.tls, "insecure": self.config.insecure, "client_cert": True,
                                    "interceptors": [rpc.Authorize(servicer.check_call)], "grow_windows": False}
        host, _, port = self.config.listen.rpartition(":")
        if port == "0" and isinstance(previous_port, int) and 0 < previous_port < 65536:
            try:
                return rpc.aio_server(f"{host}:{previous_port}", registrations, name="agent", hooks=self.hooks,
                                      **security)
            except (OSError, RuntimeError):
                log.info("previous port is taken; binding a new one", port=previous_port)
        try:
            return rpc.aio_server(self.config.listen, registrations, name="agent", hooks=self.hooks, **security)
        except RuntimeError as exc:  # grpc reports a failed bind as RuntimeError
            raise OSError(str(exc)) from None

    async def _refresh_inventory(self) -> None:
        """Re-probe NVML now and then: foreign memory changes, and a GPU can fall off the bus.
        The first probe runs at once, so re-adopted workers' memory stops counting as foreign."""
        assert self._prober is not None
        while True:
            try:
                seen: dict[int, set[int]] = {}
                inv = await asyncio.to_thread(functools.partial(self._prober, sessions=seen), self.supervisor.own_pids())
            except Exception as exc:  # noqa: BLE001 (any NVML failure: keep the last good inventory)
                log.warning("inventory refresh failed", error=str(exc))
                await asyncio.sleep(self.config.inventory_refresh_seconds)
                continue
            before = [(g.index, g.uuid) for g in self.inventory.gpus]
            after = [(g.index, g.uuid) for g in inv.gpus]
            if before != after:
                log.error("GPU set changed", before=[u for _, u in before], after=[u for _, u in after],
                          left_out={g.uuid: g.reason for g in inv.left_out},
                          note="" if inv.gpus else "no GPU left to offer: the controller refuses this node")
                self.supervisor.gpu_indices = frozenset(g.index for g in inv.gpus)
                self.wake.set()
            self.inventory = inv
            for job, why in gpuguard.trespasses(self.supervisor.statuses(), seen).items():
                self.supervisor.evict(job, why)
            await asyncio.sleep(self.config.inventory_refresh_seconds)

    async def _prune_attempts(self) -> None:
        while True:
            keep = {(w.job_id, w.attempt) for w in self.supervisor.statuses()}
            try:
                await asyncio.to_thread(retention.prune_attempts, self.config.work_dir,
                                        self.config.attempt_ttl_seconds, keep, time.time())
            except Exception as exc:  # noqa: BLE001 (a failed sweep is retried at the next one)
                log.warning("attempt prune failed", error=str(exc))
            await asyncio.sleep(retention.INTERVAL_S)

    async def _prune_device_cgroups(self) -> None:
        """The cgroups of keepers SIGKILLed since start's sweep, every retention interval (with
        --attempt-ttl 0 too; start swept once already)."""
        while True:
            await asyncio.sleep(retention.INTERVAL_S)
            await asyncio.to_thread(devicefilter.prune)

    async def _watch_disk(self) -> None:
        """Measure each live job's files, and evict those over the disk limits (nodeagent/diskuse.py)."""
        cfg, before, free_before = self.config, dict[str, diskuse.Usage](), None
        while True:
            jobs = self.supervisor.live_jobs()
            try:
                usage = await asyncio.to_thread(diskuse.measure_jobs, cfg.work_dir, jobs)
                free = await asyncio.to_thread(diskuse.free_bytes, cfg.work_dir) if cfg.min_free_disk else None
            except OSError as exc:
                log.warning("disk check failed", error=str(exc))
            else:
                consumed = free_before - free if free is not None and free_before is not None else None
                low = free is not None and free < cfg.min_free_disk
                if low != (free_before is not None and free_before < cfg.min_free_disk):
                    log.warning("work dir file system under --min-free-disk" if low else "free disk space recovered",
                                free=free, min_free=cfg.min_free_disk)
                for job, why in diskuse.evictions(usage, before, cfg.job_disk_limit, free, cfg.min_free_disk,
                                                  consumed).items():
                    self.supervisor.evict(job, why)
                before, free_before = usage, free
            await asyncio.sleep(cfg.disk_check_seconds)

    async def close(self, grace: float = 2.0) -> None:
        """Stop serving and registering; stop the workers only with kill_workers_on_exit."""
        self.hooks.shutdown()
        for server in (self.server, self.worker_server):
            if server is not None:
                await rpc.stop_server(server, grace)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self.supervisor.shutdown(
            kill_workers=self.config.kill_workers_on_exit, grace=self.config.stop_grace_on_exit
        )
        if self._controllers is not None:
            await self._controllers.close()
        log.info(
            "agent stopped",
            workers_left_running=0 if self.config.kill_workers_on_exit else self.supervisor.running_count(),
        )
