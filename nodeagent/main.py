"""tessera-agent: command line, logging, metrics, signals and systemd notify around `Agent`.

Exit status: 0 after SIGTERM/SIGINT, 2 for bad arguments, an invalid inventory or no NVML without
--inventory (one line on stderr), 1 for an unexpected failure. stdout stays empty; logs go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

import structlog

from tessera.common import clihelp, envpolicy, identity, logs, rpc, tls
from tessera.common import metrics as common_metrics
from tessera.common.buildinfo import version_line
from tessera.common.errors import InvalidArgument, InvalidInput
from tessera.common.notify import notify, watchdog_loop
from tessera.common.privatefile import make_dir
from tessera.nodeagent import cgroups, devicefilter, diskuse, inventory, users
from tessera.nodeagent.agent import MAX_SOCKET_PATH, SOCKET_NAME, Agent, AgentConfig, Prober, socket_path
from tessera.nodeagent.controllers import split_addresses
from tessera.nodeagent.keeping import DEFAULT_FENCE_GRACE, DEFAULT_LOG_MAX_BYTES
from tessera.nodeagent.logcap import MIN_MAX_BYTES
from tessera.nodeagent.retention import DEFAULT_TTL_S
from tessera.v1 import common_pb2

log = structlog.get_logger("tessera.nodeagent.main")


class AgentUsageError(InvalidInput):
    """A bad tessera-agent command line: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise AgentUsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tessera-agent", description="Tessera node agent: one per GPU server.", **clihelp.PARSER)
    p.add_argument("--controller", required=True, metavar="HOST:PORT[,HOST:PORT...]",
                   help="the controller's agent port (its --agent-listen); several, comma-separated, for a "
                        "highly available controller (the agent follows the leader: docs/ha.md)")
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
    p.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus /metrics here; a host other than loopback needs --metrics-token-file",
    )
    p.add_argument(
        "--metrics-token-file",
        metavar="FILE",
        help="a bearer token every scrape of /metrics must carry (Authorization: Bearer ...; mode 600)",
    )
    p.add_argument("--log-level", default="info", choices=logs.LEVELS)
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
    p.add_argument(
        "--attempt-ttl",
        type=float,
        default=DEFAULT_TTL_S,
        metavar="SECONDS",
        help="remove an exited attempt's folder and logs this long after its last write "
        "(default 7 days; 0 = keep forever)",
    )
    p.add_argument(
        "--worker-user",
        action="append",
        default=[],
        metavar="TENANT=USER[:GROUP]",
        help="run this tenant's workers as USER (name or uid) and GROUP; repeatable",
    )
    p.add_argument(
        "--default-worker-user",
        default=users.DEFAULT_USER,
        metavar="USER[:GROUP]",
        help=f"run other tenants' workers as USER (default {users.DEFAULT_USER}); never root",
    )
    p.add_argument(
        "--tenant-uids",
        default="",
        metavar="START-END",
        help="run each tenant --worker-user does not map as a uid of its own, derived from its name, in "
        "this range (the same on every node); without it they share --default-worker-user",
    )
    p.add_argument(
        "--worker-python",
        metavar="PATH",
        help="the interpreter {python} names for workers (default: the agent's own); the worker users must "
        "be able to run it",
    )
    p.add_argument(
        "--allow-env",
        action="append",
        default=[],
        metavar="NAME",
        help="let a Launch set this variable although the environment policy refuses it; repeatable",
    )
    p.add_argument(
        "--fence-grace",
        type=float,
        default=DEFAULT_FENCE_GRACE,
        metavar="SECONDS",
        help=f"SIGTERM to SIGKILL of workers fenced by a lapsed lease (default {DEFAULT_FENCE_GRACE:g})",
    )
    p.add_argument(
        "--log-max-bytes",
        type=int,
        default=DEFAULT_LOG_MAX_BYTES,
        metavar="BYTES",
        help="keep each rank's log under this size, its newest part: past it the older half is dropped "
        f"(default {DEFAULT_LOG_MAX_BYTES}; 0 = no cap)",
    )
    p.add_argument(
        "--job-disk-limit",
        default="0",
        metavar="SIZE",
        help="kill a job's workers on this node once its files here (its folder in the work dir, logs "
        "included, and checkpoints on the same file system) pass SIZE, e.g. 50G (default 0 = no limit)",
    )
    p.add_argument(
        "--min-free-disk",
        default="0",
        metavar="SIZE|N%",
        help="below this much free on the work dir's file system, kill the workers of the job whose files "
        "grew the most since the last check, e.g. 5%% or 20G (default 0 = not checked)",
    )
    p.add_argument(
        "--disk-check-interval",
        type=float,
        default=diskuse.INTERVAL_S,
        metavar="SECONDS",
        help=f"how often the disk limits are checked (default {diskuse.INTERVAL_S:g})",
    )
    p.add_argument(
        "--device-isolation",
        choices=("auto", "on", "off"),
        default="auto",
        help="each worker may open only its own GPUs' device files (a cgroup with an eBPF device program; "
        "needs root and cgroup v2): on = refuse to start without it, auto (default) = where possible",
    )
    p.add_argument(
        "--gpu-recovery-check",
        choices=("on", "off"),
        default="on",
        help="on (default): a GPU for which NVML names a recovery action (a reset, a reboot) is not "
        "offered until it clears; off: offered anyway, for a driver that names one on healthy GPUs",
    )
    p.add_argument("--version", action="version", version=f"tessera-agent {version_line()}")
    tls.add_arguments(p)
    return p


def _address(check: Callable[[str, str, int], str], value: str, flag: str, example_port: int) -> str:
    """`value` checked by rpc.check_address (an address the agent dials) or rpc.check_listen (one it
    binds: port 0 too; an empty host refused), stripped; AgentUsageError "FLAG: reason" otherwise."""
    try:
        return check(value, flag, example_port)
    except InvalidArgument as exc:
        raise AgentUsageError(str(exc)) from None


def _disk_limits(limit: str, min_free: str, work_dir: Path) -> tuple[int, int]:
    """--job-disk-limit and --min-free-disk in bytes (a percentage of the work dir's file system)."""
    try:
        job = diskuse.parse_bytes(limit)
    except ValueError as exc:
        raise AgentUsageError(f"--job-disk-limit: {exc}") from None
    text = min_free.strip()
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            pct = -1.0
        if not 0 <= pct < 100:
            raise AgentUsageError(f"--min-free-disk: {min_free!r} is not a percentage in 0..100")
        st = os.statvfs(work_dir)
        return job, int(st.f_blocks * st.f_frsize * pct / 100)
    try:
        return job, diskuse.parse_bytes(text)
    except ValueError as exc:
        raise AgentUsageError(f"--min-free-disk: {exc}") from None


def parse_config(argv: Sequence[str] | None) -> tuple[AgentConfig, argparse.Namespace]:
    """Parse and validate the command line; AgentUsageError with a one-line message on any problem."""
    args = build_parser().parse_args(argv)
    if not identity.valid_node_id(args.node_id):
        raise AgentUsageError(f"--node-id: {args.node_id!r} does not match {identity.NODE_ID_PATTERN}")
    controllers = split_addresses(args.controller)
    if not controllers:
        raise AgentUsageError("--controller: at least one HOST:PORT")
    for address in controllers:  # the controllers' agent port: their --agent-listen, 50054 by default
        _address(rpc.check_address, address, "--controller", 50054)
    args.listen = _address(rpc.check_listen, args.listen, "--listen", 7070)
    if args.listen.startswith(("unix:", "unix-abstract:")):  # the controller dials the host:port it reports
        raise AgentUsageError(f"--listen: {args.listen!r} is not host:port: the controller dials the agent over TCP")
    if args.metrics_listen:
        args.metrics_listen = _address(rpc.check_listen, args.metrics_listen, "--metrics-listen", 9452)
    try:
        common_metrics.check(args.metrics_listen, args.metrics_token_file)
    except common_metrics.MetricsConfigError as exc:
        raise AgentUsageError(str(exc)) from None
    if args.advertise is not None and (not args.advertise.strip("[]") or "/" in args.advertise):
        raise AgentUsageError(f"--advertise: {args.advertise!r} is not a host name or address")
    if args.worker_threads is not None and args.worker_threads < 1:
        raise AgentUsageError(f"--worker-threads: must be >= 1, got {args.worker_threads}")
    if not args.attempt_ttl >= 0:
        raise AgentUsageError(f"--attempt-ttl: must be >= 0 (0 = keep forever), got {args.attempt_ttl}")
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
        # 0711 whatever the umask: the workers' users pass it to their attempt folders and to
        # agent.sock, but may not list it; what the agent keeps in it is 0600 (docs/agent.md).
        make_dir(work_dir, 0o711)
        work_dir = work_dir.resolve()
        probe = work_dir / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise AgentUsageError(
            f"--work-dir: {work_dir} is not a writable directory: {exc.strerror or exc}"
        ) from None
    if not 0 <= args.fence_grace <= 3600:
        raise AgentUsageError(f"--fence-grace: must be in 0..3600 seconds, got {args.fence_grace}")
    if args.log_max_bytes and args.log_max_bytes < MIN_MAX_BYTES:
        raise AgentUsageError(f"--log-max-bytes: must be 0 (no cap) or at least {MIN_MAX_BYTES}, "
                              f"got {args.log_max_bytes}")
    job_disk_limit, min_free_disk = _disk_limits(args.job_disk_limit, args.min_free_disk, work_dir)
    if not 0.1 <= args.disk_check_interval <= 86400:
        raise AgentUsageError(f"--disk-check-interval: must be in 0.1..86400 seconds, got {args.disk_check_interval}")
    for name in args.allow_env:
        if not envpolicy.NAME_RE.fullmatch(name):
            raise AgentUsageError(f"--allow-env: {name!r} is not a variable name ([A-Z_][A-Z0-9_]*)")
    worker_python = args.worker_python or sys.executable
    try:
        user_map = users.build(args.worker_user, args.default_worker_user, tenant_uids=args.tenant_uids)
    except users.UserConfigError as exc:
        raise AgentUsageError(str(exc)) from None
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
        attempt_ttl_seconds=args.attempt_ttl,
        users=user_map,
        worker_python=worker_python,
        allowed_env=frozenset(args.allow_env),
        fence_grace=args.fence_grace,
        log_max_bytes=args.log_max_bytes,
        job_disk_limit=job_disk_limit,
        min_free_disk=min_free_disk,
        disk_check_seconds=args.disk_check_interval,
        tls=tls_config,
        insecure=tls_config is None,
    )
    return config, args


def check_worker_access(config: AgentConfig) -> None:
    """Fail at start, not at every launch, when the workers' users cannot reach the work dir or run
    the interpreter (a venv under /root, a work dir under a 0700 folder)."""
    if config.users is None or not config.users.switch:
        return
    python = config.worker_python or sys.executable
    for user in config.users.users():
        why = users.probe_access(user, python, str(config.work_dir))
        if why is not None:
            raise AgentUsageError(
                f"--work-dir/--worker-python: {why}; workers need to reach the work dir and run the "
                "interpreter (install Tessera where they can read it, or pass --worker-python)"
            )


def load_inventory(args: argparse.Namespace) -> tuple[common_pb2.NodeInventory, Prober | None]:
    """The declared file when given, else NVML; (inventory, the probe the agent runs again later:
    None for a declared file)."""
    if args.inventory:
        try:
            return inventory.load_declared(args.inventory, args.node_id), None
        except inventory.InventoryError as exc:
            raise AgentUsageError(f"--inventory: {exc}") from None
    probe = functools.partial(inventory.probe_nvml, recovery_check=args.gpu_recovery_check == "on")
    try:
        inv = probe()
    except inventory.NvmlUnavailable as exc:
        raise AgentUsageError(
            f"{exc}; on a node without NVML pass --inventory FILE (see docs/inventory.md)"
        ) from None
    for g in inv.left_out:
        log.warning("GPU left out: not offered for scheduling", index=g.index, uuid=g.uuid, model=g.model,
                    why=g.reason)
    if not inv.gpus:
        found = "; ".join(f"GPU {g.index}: {g.reason}" for g in inv.left_out[:2]) or "NVML lists none"
        raise AgentUsageError(f"no GPU to offer ({found})")
    return inv, probe


def isolation_available() -> tuple[bool, str]:
    """Whether keepers can make cgroups with device programs where they will run: under systemd
    only in a transient scope it delegates (systemd's cgroups are its own), else below the agent's."""
    if os.geteuid() != 0:
        return False, "the agent is not root"
    if not cgroups.systemd_runs():
        return devicefilter.probe()
    scopes, why = cgroups.probe()
    if not scopes:
        return False, (f"systemd runs this machine but keepers get no scope of their own ({why}), and the "
                       "agent's cgroup is systemd's")
    return cgroups.run_delegated([sys.executable, "-I", "-m", "tessera.nodeagent.devicefilter"])


def ptrace_open(path: str = "/proc/sys/kernel/yama/ptrace_scope") -> bool:
    """Whether any process may ptrace another of its uid (Yama's scope 0, or no Yama)."""
    try:
        with open(path) as f:
            return f.read().strip() == "0"
    except OSError:
        return True


def gpu_minors(mode: str, inv: common_pb2.NodeInventory) -> tuple[dict[int, int] | None, str]:
    """--device-isolation: the GPUs' minor numbers when workers are to be confined to their own, else
    None and why not (for the node's status); AgentUsageError when `on` cannot be had."""
    if mode == "off":
        return None, "--device-isolation off"
    ok, why = isolation_available()
    if ok:
        if ptrace_open():
            log.warning("device isolation holds between users: kernel.yama.ptrace_scope is 0 (or there is no "
                        "Yama), so a worker can ptrace another process of its uid in another cgroup and open "
                        "that one's GPUs; give tenants users of their own (--tenant-uids) or raise ptrace_scope")
        try:
            return inventory.minor_numbers(inv), ""
        except inventory.NvmlUnavailable as exc:
            ok, why = False, str(exc)
    if mode == "on":
        raise AgentUsageError(f"--device-isolation on: {why}")
    if inv.source == common_pb2.INVENTORY_SOURCE_NVML:
        log.warning("device isolation is unavailable: a worker that changes CUDA_VISIBLE_DEVICES can open "
                    "any GPU of the node until the next NVML probe sees it", why=why)
    else:
        log.info("device isolation is off (a declared inventory: no GPU to guard)", why=why)
    return None, printable(why)[:300]


def printable(text: str) -> str:
    """`text` on one line of printable ASCII (the status's note is checked so by the controller)."""
    return "".join(c if " " <= c <= "~" else "?" for c in " ".join(text.split()))


async def run(config: AgentConfig, inv: common_pb2.NodeInventory, prober: Prober | None) -> int:
    agent = Agent(config, inv, prober=prober)
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
        inv, prober = load_inventory(args)
        check_worker_access(config)
        minors, note = gpu_minors(args.device_isolation, inv)
        config = dataclasses.replace(config, gpu_minors=minors, gpu_isolation_note=note)
        if args.metrics_listen:
            try:
                port = common_metrics.serve(args.metrics_listen, args.metrics_token_file)
            except OSError as exc:
                raise AgentUsageError(f"--metrics-listen: cannot serve on {args.metrics_listen}: {exc}") from None
            log.info("metrics serving", listen=args.metrics_listen, port=port)
    except AgentUsageError as exc:
        print(f"tessera-agent: error: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(run(config, inv, prober))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
