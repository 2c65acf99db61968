"""The agent assembled: state file, fence, drain flag, supervisor, gRPC server, registration loop.

main.py parses the command line and hands an AgentConfig and an inventory to `Agent`; tests build an
`Agent` directly. `start()` serves and begins registering; `close()` stops serving and, by default,
leaves the workers running for the next agent to re-adopt.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc.aio
import structlog

from tessera.common import rpc
from tessera.common.identity import CONTROLLER
from tessera.common.tls import TlsConfig
from tessera.nodeagent import metrics
from tessera.nodeagent.registration import Registrar
from tessera.nodeagent.server import DrainFlag, EpochFence, NodeAgentServicer, WorkerTokens
from tessera.nodeagent.state import FILE_NAME, StateFile
from tessera.nodeagent.supervisor import Supervisor
from tessera.nodeagent.version import __version__
from tessera.v1 import agent_pb2, agent_pb2_grpc, common_pb2

log = structlog.get_logger("tessera.nodeagent.agent")

_WILDCARDS = {"", "0.0.0.0", "::", "[::]"}

# Re-probes NVML (foreign memory, GPUs that vanished) off the event loop.
Prober = Callable[[Collection[int]], common_pb2.NodeInventory]


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
    # This node's certificate (mTLS both ways); None only with `insecure` (tessera-agent --insecure).
    tls: TlsConfig | None = None
    insecure: bool = False


SOCKET_NAME = "agent.sock"
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
        self.supervisor = Supervisor(
            config.work_dir,
            [g.index for g in inventory.gpus],
            declared=inventory.source == common_pb2.INVENTORY_SOURCE_DECLARED,
            on_change=self._workers_changed,
            persist=self._persist,
            poll_interval=config.poll_interval,
            omp_threads=config.worker_threads,
        )
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.address = ""
        self._channel: grpc.aio.Channel | None = None
        self.registrar: Registrar | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._restoring = False

    # --- wiring callbacks -----------------------------------------------------------------------------

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
        )

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
        rpc.add_port(self.server, f"unix:{sock}", insecure=True)
        self.supervisor.agent_addr = f"unix:{sock}"
        self.supervisor.worker_token = self.tokens.token
        adopted = self.supervisor.restore(state)
        metrics.WORKERS_RUNNING.set(self.supervisor.running_count())
        await self.server.start()
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
        if self.config.tls is None:
            self._channel = rpc.aio_channel(self.config.controller, insecure=True)
        else:
            self._channel = rpc.aio_channel(self.config.controller, tls=self.config.tls, peer=CONTROLLER)
        self.registrar = Registrar(
            agent_pb2_grpc.AgentRegistryStub(self._channel),
            self.node_status,
            self.fence,
            self.wake,
            deadline=self.config.rpc_deadline,
            max_backoff=self.config.max_backoff,
            on_result=metrics.heartbeat_result,
        )
        self._tasks.append(asyncio.create_task(self.registrar.run(), name="registration"))
        if self._prober is not None:
            self._tasks.append(asyncio.create_task(self._refresh_inventory(), name="inventory"))

    def _bind(self, servicer: NodeAgentServicer, previous_port: object) -> tuple[grpc.aio.Server, int]:
        """Bind the NodeAgent server; raises OSError when the listen address cannot be bound.

        With port 0, the port of the previous run is tried first: the controller still has the
        address of that run until the agent registers again.
        """
        registrations = [(agent_pb2_grpc.add_NodeAgentServicer_to_server, servicer)]
        security: dict[str, Any] = {"tls": self.config.tls, "insecure": self.config.insecure, "client_cert": True}
        host, _, port = self.config.listen.rpartition(":")
        if port == "0" and isinstance(previous_port, int) and 0 < previous_port < 65536:
            try:
                return rpc.aio_server(f"{host}:{previous_port}", registrations, name="agent", **security)
            except (OSError, RuntimeError):
                log.info("previous port is taken; binding a new one", port=previous_port)
        try:
            return rpc.aio_server(self.config.listen, registrations, name="agent", **security)
        except RuntimeError as exc:  # grpc reports a failed bind as RuntimeError
            raise OSError(str(exc)) from None

    async def _refresh_inventory(self) -> None:
        """Re-probe NVML now and then: foreign memory changes, and a GPU can fall off the bus.
        The first probe runs at once, so re-adopted workers' memory stops counting as foreign."""
        assert self._prober is not None
        while True:
            try:
                inv = await asyncio.to_thread(self._prober, self.supervisor.own_pids())
            except Exception as exc:  # noqa: BLE001 (any NVML failure: keep the last good inventory)
                log.warning("inventory refresh failed", error=str(exc))
                await asyncio.sleep(self.config.inventory_refresh_seconds)
                continue
            before = [(g.index, g.uuid) for g in self.inventory.gpus]
            after = [(g.index, g.uuid) for g in inv.gpus]
            if before != after:
                log.error("GPU set changed", before=[u for _, u in before], after=[u for _, u in after])
                self.supervisor.gpu_indices = frozenset(g.index for g in inv.gpus)
                self.wake.set()
            self.inventory = inv
            await asyncio.sleep(self.config.inventory_refresh_seconds)

    async def close(self, grace: float = 2.0) -> None:
        """Stop serving and registering; stop the workers only with kill_workers_on_exit."""
        if self.server is not None:
            await rpc.stop_server(self.server, grace)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self.supervisor.shutdown(
            kill_workers=self.config.kill_workers_on_exit, grace=self.config.stop_grace_on_exit
        )
        if self._channel is not None:
            await self._channel.close()
        log.info(
            "agent stopped",
            workers_left_running=0 if self.config.kill_workers_on_exit else self.supervisor.running_count(),
        )
