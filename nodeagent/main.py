"""tessera-agent: command line, logging, metrics, signals and systemd notify around `Agent`.

Exit status: 0 after SIGTERM/SIGINT, 2 for bad arguments, an invalid inventory or no NVML without
--inventory (one line on stderr), 1 for an unexpected failure. stdout stays empty; logs go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import structlog

from tessera.common import identity, logs, tls
from tessera.common import metrics as common_metrics
from tessera.common.errors import InvalidInput
from tessera.common.notify import notify, watchdog_loop
from tessera.nodeagent import inventory
from tessera.nodeagent.agent import MAX_SOCKET_PATH, SOCKET_NAME, Agent, AgentConfig, socket_path
from tessera.nodeagent.version import __version__
from tessera.v1 import common_pb2

log = structlog.get_logger("tessera.nodeagent.main")

LOG_LEVELS = ("debug", "info", "warning", "error")


class AgentUsageError(InvalidInput):
    """A bad tessera-agent command line: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise AgentUsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tessera-agent", description="Tessera node agent: one per GPU server.")
    p.add_argument("--controller", required=True, metavar="HOST:PORT",
                   help="the controller's agent port (its --agent-listen)")
    p.add_argument(
        "--node-id", required=True, metavar="NAME", help="this node's name, [a-z0-9][a-z0-9._-]{0,62}"
    )
    p.add_argument("--inventory", metavar="FILE", help="declared GPU inventory (YAML); omit to probe NVML")
    p.add_argument(
        "--work-dir", required=True, metavar="DIR", help="worker directories, logs and agent state"
    )
    p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT", help="NodeAgent gRPC address")
    p.add_argument(
        "--advertise", metavar="HOST", help="host reported to the controller (default: listen host)"
    )
    p.add_argument("--metrics-listen", metavar="HOST:PORT", help="serve Prometheus /metrics here")
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    p.add_argument(
        "--kill-workers-on-exit",
        action="store_true",
        help="stop workers (SIGTERM, grace, SIGKILL) when the agent exits; default: leave them running",
    )
    p.add_argument(
        "--stop-grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="grace between SIGTERM and SIGKILL with --kill-workers-on-exit (default 10)",
    )
    p.add_argument(
        "--worker-threads",
        type=int,
        metavar="N",
        help="OMP_NUM_THREADS of workers whose job does not set it (default: usable CPUs / GPUs)",
    )
    p.add_argument("--version", action="version", version=f"tessera-agent {__version__}")
    tls.add_arguments(p)
    return p


def _host_port(value: str, flag: str, allow_port0: bool) -> str:
    host, sep, port = value.rpartition(":")
    low = 0 if allow_port0 else 1
    if not sep or not host.strip("[]") or not port.isdigit() or not low <= int(port) <= 65535:
        raise AgentUsageError(f"{flag}: {value!r} is not HOST:PORT with a port in {low}..65535")
    return value


def parse_config(argv: Sequence[str] | None) -> tuple[AgentConfig, argparse.Namespace]:
    """Parse and validate the command line; AgentUsageError with a one-line message on any problem."""
    args = build_parser().parse_args(argv)
    if not identity.valid_node_id(args.node_id):
        raise AgentUsageError(f"--node-id: {args.node_id!r} does not match {identity.NODE_ID_PATTERN}")
    _host_port(args.controller, "--controller", allow_port0=False)
    _host_port(args.listen, "--listen", allow_port0=True)
    if args.metrics_listen:
        _host_port(args.metrics_listen, "--metrics-listen", allow_port0=True)
    if args.advertise is not None and (not args.advertise.strip("[]") or "/" in args.advertise):
        raise AgentUsageError(f"--advertise: {args.advertise!r} is not a host name or address")
    if args.worker_threads is not None and args.worker_threads < 1:
        raise AgentUsageError(f"--worker-threads: must be >= 1, got {args.worker_threads}")
    if not args.stop_grace >= 0:
        raise AgentUsageError(f"--stop-grace: must be >= 0, got {args.stop_grace}")
    tls_config = tls.from_args(args, build_parser().error)
    if tls_config is not None and tls_config.identity != identity.node(args.node_id):
        raise AgentUsageError(
            f"--tls-dir: {tls_config.source} holds a certificate of {tls_config.identity or 'no Tessera identity'}, "
            f"not of node {args.node_id} (tessctl admin pki issue --node {args.node_id})"
        )
    work_dir = Path(args.work_dir).expanduser()
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
        work_dir = work_dir.resolve()
        probe = work_dir / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise AgentUsageError(
            f"--work-dir: {work_dir} is not a writable directory: {exc.strerror or exc}"
        ) from None
    if len(str(socket_path(work_dir))) > MAX_SOCKET_PATH:
        raise AgentUsageError(
            f"--work-dir: {work_dir} is too long: the workers' socket {SOCKET_NAME} in it would pass the "
            f"{MAX_SOCKET_PATH}-byte limit of a unix socket path"
        )
    config = AgentConfig(
        controller=args.controller,
        node_id=args.node_id,
        work_dir=work_dir,
        listen=args.listen,
        advertise=args.advertise,
        kill_workers_on_exit=args.kill_workers_on_exit,
        stop_grace_on_exit=args.stop_grace,
        worker_threads=args.worker_threads,
        tls=tls_config,
        insecure=tls_config is None,
    )
    return config, args


def load_inventory(args: argparse.Namespace) -> tuple[common_pb2.NodeInventory, bool]:
    """The declared file when given, else NVML; (inventory, probe again later?)."""
    if args.inventory:
        try:
            return inventory.load_declared(args.inventory, args.node_id), False
        except inventory.InventoryError as exc:
            raise AgentUsageError(f"--inventory: {exc}") from None
    try:
        return inventory.probe_nvml(), True
    except inventory.NvmlUnavailable as exc:
        raise AgentUsageError(
            f"{exc}; on a node without NVML pass --inventory FILE (see docs/inventory.md)"
        ) from None


async def run(config: AgentConfig, inv: common_pb2.NodeInventory, nvml: bool) -> int:
    agent = Agent(config, inv, prober=inventory.probe_nvml if nvml else None)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tls.announce("tessera-agent", config.tls)
    try:
        await agent.start()
    except OSError as exc:
        print(f"tessera-agent: error: --listen: cannot serve on {config.listen}: {exc}", file=sys.stderr)
        return 2
    notify("READY=1")
    notify(f"STATUS=serving on {agent.address}")
    watchdog = asyncio.create_task(watchdog_loop(), name="watchdog")
    await stop.wait()
    log.info("signal received; shutting down")
    notify("STOPPING=1")
    watchdog.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watchdog
    await agent.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config, args = parse_config(argv)
        logs.configure(args.log_level)
        inv, nvml = load_inventory(args)
        if args.metrics_listen:
            try:
                port = common_metrics.serve(args.metrics_listen)
            except OSError as exc:
                raise AgentUsageError(f"--metrics-listen: cannot serve on {args.metrics_listen}: {exc}") from None
            log.info("metrics serving", listen=args.metrics_listen, port=port)
    except AgentUsageError as exc:
        print(f"tessera-agent: error: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(run(config, inv, nvml))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
