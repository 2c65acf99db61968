"""`tessera-controller`: the asyncio controller daemon."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

import structlog

from tessera.common import clihelp, daemon, envpolicy, logs, metrics, rpc, tls
from tessera.common.buildinfo import version_line
from tessera.common.durations import MAX_SECONDS
from tessera.common.errors import InvalidArgument, InvalidInput, TesseraError
from tessera.common.hooks import Hooks
from tessera.common.netaddr import is_loopback
from tessera.common.objective import load_prices
from tessera.common.passable import NotPassable, closed_above, open_for_workers
from tessera.common.privatefile import key_file, make_dir
from tessera.controller.agents import AgentClients
from tessera.controller.auth import Authenticator, AuthInterceptor, InsecureAuthenticator, TokenAuthenticator
from tessera.controller.core.churn import ChurnConfig
from tessera.controller.core.forecast import ForecastConfig
from tessera.controller.core.frenzy import GIB, FrenzyConfig
from tessera.controller.core.policies import ALIASES, policy_names
from tessera.controller.dashboard import options as dashboard_options
from tessera.controller.dashboard.server import Dashboard
from tessera.controller.engine import Engine, EngineConfig
from tessera.controller.etcd import parse_endpoints
from tessera.controller.ha import COMPONENT, SERVICES, serve_ha
from tessera.controller.ha_settings import checkpoint_root_problem
from tessera.controller.loops import loops
from tessera.controller.registry import LivenessConfig, default_fence, fence_problem, requeue_after
from tessera.controller.retention import Retention, RetentionConfig
from tessera.controller.service import ControllerService, RegistryService, translate
from tessera.controller.statedir import StateDirLock, check_epoch
from tessera.controller.store import SqliteStore
from tessera.controller.tenants import on_sighup
from tessera.controller.tenantsfile import TenantsFileError, read_tenants_file
from tessera.v1 import agent_pb2_grpc, controller_pb2_grpc

log = structlog.get_logger("controller")

# The agents' port: AgentRegistry needs a client certificate, which gRPC can only require port-wide,
# while users connect without one (docs/security.md).
DEFAULT_AGENT_PORT = 50054

# What the agents' port lets one request be. The largest is an agent's Heartbeat/Register: a
# NodeStatus of up to 2,000 exited and the live workers (nodeagent/supervisor.py MAX_EXITED_RECORDS),
# a few hundred bytes each with their reasons, under 1 MiB in practice; 2,000 exited workers with the
# longest (fenced, stopped) reasons measured 3.45 MB. 8 MiB leaves room over that (a heartbeat refused
# is a node lost); gRPC's default 16 MiB (rpc.MAX_MESSAGE_BYTES) let anyone make the controller hold
# 16 MiB a call, before credentials were checked before the read (controller/auth.py).
API_MESSAGE_BYTES = 8 * 1024 * 1024
# What the users' port lets one request be: SubmitJob's spec is at most 64 KiB serialized
# (common/jobspec.py MAX_SPEC_BYTES), the rest ids, names and page tokens. With the agents' 8 MiB
# there, 150 SubmitJob calls at once of 7 MiB each, under a user's token, took the controller to
# 3.1 GB before each was refused (a hostile-peer audit): the two ports are two servers.
CLIENT_MESSAGE_BYTES = 256 * 1024
# No cap on the calls in progress at once (gRPC's maximum_concurrent_rpcs): an open stream holds its
# place for as long as it is open, and health watches need no credentials, so anyone could fill a
# cap and the agents' heartbeats, served by this same server, would be refused (nodes UNREACHABLE,
# their jobs requeued). What a caller without credentials makes the controller hold stays small
# without one: its requests are never read (controller/auth.py), and the windows below stay small.
# The server's HTTP/2 receive windows do not grow (rpc.aio_server grow_windows=False): the
# requests here are small, and the audit's refused 15 MiB requests were otherwise buffered by the
# windows gRPC grows: the audit's repro peaked at 274 MB with them grown, 91 MB without (86 MB idle).


def _refuse(p: argparse.ArgumentParser, message: str) -> NoReturn:
    """A flag whose file or folder cannot be used: one line and exit 2, without the usage block
    (p.error's), which says nothing about what is wrong inside the file."""
    p.exit(2, f"{p.prog}: error: {message}\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tessera-controller", description=__doc__, **clihelp.PARSER)
    p.add_argument("--version", action="version", version=f"tessera-controller {version_line()}")
    p.add_argument("--listen", default="127.0.0.1:50051",
                   help="host:port of the client API (TLS; users need no certificate)")
    p.add_argument("--agent-listen", default=None, metavar="HOST:PORT",
                   help="host:port of the agents' API (mTLS: node certificates); default the --listen host, "
                        f"port {DEFAULT_AGENT_PORT} (port 0 when --listen has port 0)")
    p.add_argument("--state-dir", required=True, help="directory for the SQLite state (created if missing)")
    p.add_argument("--round-interval", type=float, default=300.0, help="seconds between scheduling rounds")
    p.add_argument("--forecast-rounds", type=int, default=64, metavar="N",
                   help="forecasts of start and finish after each round: at most N policy rounds per replay "
                        "(0: no forecasts; docs/forecasts.md)")
    p.add_argument("--forecast-horizon", type=float, default=7 * 86400.0, metavar="SECONDS",
                   help="forecasts look this far ahead; a job not started by then has none")
    p.add_argument("--inspect-interval", type=float, default=20.0, help="seconds between running-job inspections")
    p.add_argument("--debounce", type=float, default=1.0, help="seconds a round waits after an arrival/departure")
    p.add_argument("--lease", type=float, default=15.0, help="seconds without heartbeat before UNREACHABLE")
    p.add_argument("--heartbeat-interval", type=float, default=5.0, help="heartbeat period asked of agents")
    p.add_argument("--down-after", type=float, default=120.0, help="seconds without heartbeat before DOWN")
    p.add_argument("--fence", type=float, default=0.0,
                   help="seconds without an acknowledged heartbeat after which an agent stops its workers "
                        "(default: max(lease/2, 2 heartbeat intervals); at least 2 intervals, under the lease)")
    p.add_argument("--fence-grace", type=float, default=10.0,
                   help="seconds an agent's fence waits between SIGTERM and SIGKILL; a silent node's jobs are "
                        "requeued after lease + this + 1s (docs/fencing.md)")
    p.add_argument("--stop-grace", type=float, default=30.0, help="seconds between SIGTERM and SIGKILL")
    p.add_argument("--policy", default="crius",
                   help=f"scheduling policy: {', '.join(policy_names())} (default crius)")
    p.add_argument("--policy-mode", default="paper", choices=("paper", "artifact"),
                   help="the policy as its paper describes it, or as the Crius artifact ran it")
    p.add_argument("--search-depth", type=int, default=3, help="Crius: scaling steps one choice may make")
    p.add_argument("--min-gain", type=float, default=0.2,
                   help="Crius: relative throughput gain a running job's scale-up or move must bring, and that "
                        "halving running jobs for a newcomer must bring over its best placement on free GPUs; "
                        "gavel: the gain a running job's move to another type must bring")
    p.add_argument("--critical-factor", type=float, default=0.85,
                   help="morphling: a best-effort job whose remaining time at its most efficient point is at least "
                        "this share of the drain time of all known work starts before the slope order (the "
                        "makespan guard, docs/scheduler-morphling.md; 0 = Algorithm 1 alone)")
    p.add_argument("--round-budget", type=float, default=10.0, help="wall-clock seconds a round may search")
    p.add_argument("--estimate-budget", type=float, default=5.0,
                   help="wall-clock seconds a round may spend on new jobs' first Cell estimates (at least one job "
                        "a round, tenants in turn; the others wait for a later round)")
    p.add_argument("--start-timeout", type=float, default=300.0,
                   help="seconds for every rank of an attempt to be running, else the attempt failed")
    p.add_argument("--progress-timeout", type=float, default=900.0,
                   help="seconds without progress from rank 0 before an attempt counts as hung (jobs may "
                        "override; <= 0 = never)")
    p.add_argument("--checkpoint-root", default="", help="shared checkpoint storage (default STATE_DIR/checkpoints; required with --store etcd: the "
                   "same shared folder for every controller, docs/ha.md)")
    p.add_argument("--gpu-reserve-gb", type=float, default=1.0, help="GiB kept free on every GPU")
    p.add_argument("--metrics-listen", default="", help="host:port for Prometheus /metrics (off when empty); a host "
                   "other than loopback needs --metrics-token-file (docs/observability.md)")
    p.add_argument("--metrics-token-file", default="", metavar="FILE",
                   help="a bearer token every scrape of /metrics must carry (Authorization: Bearer ...; mode 600)")
    p.add_argument("--estimator", default="",
                   help="host:port of a tessera-estimator that receives running jobs' step times (online refit)")
    p.add_argument("--learn-step-times", default="nvml", choices=("nvml", "all", "off"),
                   help="whose step times replace Cell estimates: nodes with NVML inventories (default), "
                        "all nodes (declared inventories too: demos and tests only), or none")
    p.add_argument("--job-ttl", type=float, default=RetentionConfig.job_ttl_s, metavar="SECONDS",
                   help="finished jobs and their events are removed this long after they ended "
                        "(default 7 days; 0 = keep forever)")
    p.add_argument("--checkpoint-ttl", type=float, default=RetentionConfig.checkpoint_ttl_s, metavar="SECONDS",
                   help="checkpoint folders of finished jobs are removed this long after the job ended "
                        "(default 30 days; 0 = keep forever)")
    p.add_argument("--retention-interval", type=float, default=RetentionConfig.interval_s, metavar="SECONDS",
                   help="seconds between retention sweeps (default 600)")
    p.add_argument("--tokens", default="", metavar="FILE",
                   help="tokens file of the Controller API (docs/auth.md); without it every caller is allowed "
                        "everything (logged as a warning), so a --listen other than loopback needs it")
    p.add_argument("--allow-anonymous", action="store_true",
                   help="serve the Controller API without --tokens on an address other machines reach: every "
                        "caller there is an anonymous admin (a closed test network only)")
    p.add_argument("--tenants", default="", metavar="FILE",
                   help="tenants file: GPU quotas per tenant (docs/tenants.md); reloaded on SIGHUP and when it "
                        "changes, a bad reload refused and the config before kept. Without it: no quotas, every "
                        "job best-effort, guaranteed jobs refused")
    p.add_argument("--max-unended-jobs", type=int, default=EngineConfig.max_unended_jobs, metavar="N",
                   help="the most jobs one tenant may have not yet ended (pending or running): SubmitJob answers "
                        "one more with RESOURCE_EXHAUSTED (default 10000; 0 = no cap); a tenant's max_unended_jobs "
                        "in the tenants file wins")
    p.add_argument("--max-unended-jobs-total", type=int, default=EngineConfig.max_unended_jobs_total, metavar="N",
                   help="the most jobs all tenants together may have not yet ended: SubmitJob answers one more with "
                        "RESOURCE_EXHAUSTED (default 100000; 0 = no cap); what holds where tenants are free-form "
                        "(no tenants file, anonymous or admin callers)")
    churn = ChurnConfig()
    p.add_argument("--churn-limit", type=int, default=churn.limit, metavar="N",
                   help="churn guard (docs/tenants.md): a tenant with N guaranteed jobs that preempted others and "
                        "were cancelled or failed within --churn-quick of their start, within --churn-window, may not preempt for "
                        "--churn-cooloff (default 3; 0 = off)")
    p.add_argument("--churn-window", type=float, default=churn.window_s, metavar="SECONDS",
                   help="churn guard: the window its events are counted in (default 3600)")
    p.add_argument("--churn-quick", type=float, default=churn.quick_s, metavar="SECONDS",
                   help="churn guard: a preempting guaranteed job ending this soon after its start is an event "
                        "(default 600)")
    p.add_argument("--churn-cooloff", type=float, default=churn.cooloff_s, metavar="SECONDS",
                   help="churn guard: how long a tenant may not preempt after its last event (default 3600)")
    p.add_argument("--min-run", type=float, default=EngineConfig.min_run_s, metavar="SECONDS",
                   help="a best-effort job placed (started or moved) less than SECONDS ago is not preempted, "
                        "shrunk, moved or suspended by a round, as Slurm's PreemptExemptTime; guaranteed jobs may "
                        "wait that long for quota best-effort work borrowed (docs/tenants.md; default 0 = off)")
    p.add_argument("--store", default="sqlite", choices=("sqlite", "etcd"),
                   help="where the state lives: SQLite under --state-dir (default), or etcd, with leader "
                        "election among several controllers (docs/ha.md)")
    p.add_argument("--etcd-endpoints", default="", metavar="HOST:PORT[,HOST:PORT...]",
                   help="etcd client endpoints (with --store etcd)")
    p.add_argument("--etcd-prefix", default="/tessera/", help="key prefix of this cluster's state in etcd")
    p.add_argument("--etcd-lease-ttl", type=int, default=5,
                   help="seconds of the leader's etcd lease: a dead leader is replaced within about this")
    p.add_argument("--etcd-ca", default="", help="CA bundle (PEM) of etcd's TLS; TLS to etcd when set")
    p.add_argument("--etcd-cert", default="", help="client certificate (PEM) for etcd's client-cert auth")
    p.add_argument("--etcd-key", default="", help="key (PEM) of --etcd-cert")
    p.add_argument("--etcd-plaintext", action="store_true",
                   help="talk to etcd endpoints other machines reach without TLS and client certificates: "
                        "anyone there may rewrite every job, node and the leader key (a closed network only)")
    p.add_argument("--advertise", default="", metavar="HOST:PORT",
                   help="the address standbys give clients and agents for this controller when it leads "
                        "(default: the --listen host and bound port)")
    p.add_argument("--log-level", default="info", choices=logs.LEVELS,
                   help="the least severe level logged")
    p.add_argument("--allow-env", action="append", default=[], metavar="NAME",
                   help="let jobs set this variable although the environment policy refuses it "
                        "(LD_LIBRARY_PATH, PYTHONPATH, ...; docs/job-file.md); repeatable")
    p.add_argument("--prices", default="", metavar="FILE",
                   help="YAML {GPU type: price per GPU-hour}: jobs with objective cost get the cheapest mix of "
                        "GPU types meeting their SLO at these prices (docs/cost-objective.md); without it such jobs "
                        "are refused")
    dashboard_options.add_arguments(p)
    tls.add_arguments(p)
    args = p.parse_args(argv)
    try:
        args.listen = rpc.check_listen(args.listen, "--listen", 50051)
        if args.agent_listen is not None:
            args.agent_listen = rpc.check_listen(args.agent_listen, "--agent-listen", DEFAULT_AGENT_PORT)
        if args.metrics_listen:
            args.metrics_listen = rpc.check_listen(args.metrics_listen, "--metrics-listen", 9451)
    except InvalidArgument as e:
        p.error(str(e))
    dashboard_options.check(args, p.error)
    args.tls = tls.from_args(args, p.error)
    if args.tls is not None and (args.tls.identity is None or args.tls.identity.kind != "controller"):
        _refuse(p, f"--tls-dir: {args.tls.source} holds a certificate of {args.tls.identity or 'no Tessera identity'}, "
                "not of the controller (tessctl admin pki issue --controller)")
    if args.agent_listen is None:
        host, _, port = args.listen.rpartition(":")
        args.agent_listen = f"{host}:{0 if port == '0' else DEFAULT_AGENT_PORT}"
    for name in ("job_ttl", "checkpoint_ttl"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0 (0 = keep forever)")
    if args.retention_interval <= 0:
        p.error("--retention-interval must be > 0")
    if args.max_unended_jobs < 0:
        p.error("--max-unended-jobs must be >= 0 (0 = no cap)")
    if args.max_unended_jobs_total < 0:
        p.error("--max-unended-jobs-total must be >= 0 (0 = no cap)")
    if not 0 <= args.churn_limit <= 1_000_000:
        p.error(f"--churn-limit must be a number of events in 0..1,000,000 (0 = off), got {args.churn_limit}")
    for name in ("churn_window", "churn_quick", "churn_cooloff"):
        if not 0 < getattr(args, name) <= MAX_SECONDS:  # NaN too
            p.error(f"--{name.replace('_', '-')} must be seconds in (0, {MAX_SECONDS:,}], got {getattr(args, name)}")
    if not 0 <= args.min_run <= MAX_SECONDS:  # NaN too
        p.error(f"--min-run must be seconds in [0, {MAX_SECONDS:,}] (0 = off), got {args.min_run}")
    if args.forecast_rounds < 0:
        p.error("--forecast-rounds must be >= 0 (0 = no forecasts)")
    if not args.forecast_horizon > 0:
        p.error("--forecast-horizon must be > 0 seconds")
    if args.store == "etcd":
        if not args.etcd_endpoints:
            p.error("--store etcd needs --etcd-endpoints HOST:PORT[,HOST:PORT...]")
        try:
            endpoints = parse_endpoints(args.etcd_endpoints)
        except InvalidInput as e:
            p.error(str(e))
        if not 2 <= args.etcd_lease_ttl <= 60:
            p.error("--etcd-lease-ttl must be 2..60 seconds")
        if problem := checkpoint_root_problem(args.store, args.checkpoint_root):
            p.error(problem)
        if bool(args.etcd_cert) != bool(args.etcd_key) or (args.etcd_cert and not args.etcd_ca):
            p.error("--etcd-cert and --etcd-key go together, with --etcd-ca")
        remote = [ep for ep in endpoints if not is_loopback(ep.rpartition(":")[0])]
        if remote and not args.etcd_cert and not args.etcd_plaintext:
            _refuse(p, f"--etcd-endpoints: {remote[0]} is reachable from other machines, and without --etcd-ca, "
                       "--etcd-cert and --etcd-key anyone there may read and rewrite the cluster's whole state: "
                       "give them (docs/ha.md, \"etcd over TLS\"), or --etcd-plaintext")
    for name in ("round_interval", "inspect_interval", "lease", "heartbeat_interval", "down_after"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if args.policy.strip().lower() not in policy_names() and args.policy not in ALIASES:
        p.error(f"--policy: unknown policy {args.policy!r}; use one of {', '.join(policy_names())}")
    if args.search_depth < 0:
        p.error("--search-depth must be >= 0")
    if not (math.isfinite(args.estimate_budget) and args.estimate_budget >= 0):
        p.error(f"--estimate-budget must be a finite number of seconds >= 0, got {args.estimate_budget!r}")
    if not (math.isfinite(args.critical_factor) and args.critical_factor >= 0):
        p.error(f"--critical-factor must be a finite number >= 0, got {args.critical_factor!r}")
    if args.heartbeat_interval >= args.lease:
        p.error("--heartbeat-interval must be shorter than --lease")
    if args.fence < 0 or args.fence_grace < 0:
        p.error("--fence and --fence-grace must be >= 0")
    fence = args.fence or default_fence(args.lease, args.heartbeat_interval)
    problem = fence_problem(args.lease, args.heartbeat_interval, fence)
    if problem:
        hint = "choose --fence" if args.fence else "lengthen --lease or shorten --heartbeat-interval"
        p.error(f"--fence: {problem} ({hint})")
    requeue = requeue_after(LivenessConfig(args.lease, args.heartbeat_interval, fence_grace_s=args.fence_grace))
    if args.down_after < requeue:
        p.error(f"--down-after ({args.down_after:g}s) must be at least lease + fence grace + 1s ({requeue:g}s): "
                "a DOWN node's jobs have been requeued")
    # Not rpc.host_of: its "" -> 127.0.0.1 would pass ":PORT", which binds every address.
    listen_host = args.listen.rpartition(":")[0]
    if not args.tokens and not args.allow_anonymous and not is_loopback(listen_host):
        _refuse(p, f"--listen: {listen_host or 'every address'} is reachable from other machines, and without --tokens every caller "
                   "there may submit, cancel and read any tenant's jobs and drain nodes: give --tokens "
                   "(docs/auth.md), a loopback --listen, or --allow-anonymous")
    if args.tenants:
        try:
            read_tenants_file(args.tenants)
        except TenantsFileError as e:
            _refuse(p, f"--tenants: {e}")
    for name in args.allow_env:
        if not envpolicy.NAME_RE.fullmatch(name):
            p.error(f"--allow-env: {name!r} is not a variable name ([A-Z_][A-Z0-9_]*)")
    try:
        args.price_table = tuple(load_prices(args.prices).items()) if args.prices else ()
    except InvalidInput as e:
        _refuse(p, f"--prices: {e}")
    try:
        metrics.check(args.metrics_listen, args.metrics_token_file)
    except metrics.MetricsConfigError as e:
        if e.flag == metrics.TOKEN_FLAG:
            _refuse(p, str(e))  # the file: one line, as --tenants and --prices
        p.error(str(e))  # the address: as --dashboard-addr
    return args


def authenticator(tokens: str) -> Authenticator:
    """The Controller API's authenticator; TesseraError naming file, line and field for a bad file."""
    return TokenAuthenticator(tokens) if tokens else InsecureAuthenticator()


def log_auth(auth: Authenticator) -> None:
    if isinstance(auth, TokenAuthenticator):
        log.info("tokens_loaded", file=str(auth.path), tokens=len(auth.entries))
    else:
        log.warning("insecure_api", detail="no --tokens file: every caller of the Controller API is "
                    "'anonymous' and may submit, cancel and read any tenant's jobs and drain nodes")


def engine_config(args: argparse.Namespace, ckpt: Path) -> EngineConfig:
    return EngineConfig(
        round_interval_s=args.round_interval, inspect_interval_s=args.inspect_interval, debounce_s=args.debounce,
        stop_grace_s=args.stop_grace, checkpoint_root=str(ckpt), start_timeout_s=args.start_timeout,
        policy=args.policy, policy_mode=args.policy_mode, search_depth=args.search_depth,
        round_budget_s=args.round_budget, estimate_budget_s=args.estimate_budget, min_gain=args.min_gain,
        critical_factor=args.critical_factor,
        progress_timeout_s=args.progress_timeout, estimator=args.estimator,
        learn_step_times=args.learn_step_times,
        allowed_env=frozenset(args.allow_env), tenants_file=os.path.abspath(args.tenants) if args.tenants else "",
        max_unended_jobs=args.max_unended_jobs, max_unended_jobs_total=args.max_unended_jobs_total,
        churn=ChurnConfig(args.churn_limit, args.churn_window, args.churn_quick, args.churn_cooloff),
        min_run_s=args.min_run,
        liveness=LivenessConfig(args.lease, args.heartbeat_interval, args.down_after, args.fence, args.fence_grace),
        frenzy=FrenzyConfig(reserve_bytes=int(args.gpu_reserve_gb * GIB)), tls=args.tls,
        prices=getattr(args, "price_table", ()),
        forecast=ForecastConfig(max_rounds=args.forecast_rounds, horizon_s=args.forecast_horizon,
                                rounds_at_departures=True) if args.forecast_rounds > 0 else None)


def open_checkpoint_path(state: Path, ckpt: Path) -> None:
    """Make the folders from the state dir down to the checkpoint root below it passable by the
    workers' users: a state dir made by hand 0700 (or restored so) failed every attempt of every
    job with "Permission denied" on its checkpoint folder. NotPassable for one the controller does
    not own and others cannot pass: main() says it and exits 2."""
    for w in open_for_workers(state, ckpt):
        log.warning("folder_made_passable", path=str(w.path), old_mode=f"{w.old:04o}", new_mode=f"{w.new:04o}",
                    detail="the checkpoint root is below it: the workers' users must pass it (not list it)")


def check_checkpoint_ancestors(ckpt: Path, below: Path | None, me: int | None = None) -> list[tuple[Path, int, int]]:
    """The folders above what open_checkpoint_path handles (every one above a root outside the
    state dir) are not the controller's to change. One of root's that others cannot pass is
    NotPassable (workers never run as root: under the systemd unit's DynamicUser the default root
    lay below /var/lib/private, 0700, and every job failed). The others that others cannot pass are
    returned, for warn_closed_above once the state is open (their workers may run as their owner,
    as on a single-user machine; a start that fails on its state says that alone)."""
    me = os.geteuid() if me is None else me
    closed = closed_above(ckpt, below)
    for path, mode, owner in closed:
        if owner == 0 and me != 0:
            raise NotPassable(path, mode, owner, ckpt)
    return closed


def warn_closed_above(closed: list[tuple[Path, int, int]], ckpt: Path) -> None:
    for path, mode, owner in closed:
        log.warning("checkpoint_root_not_passable", path=str(path), mode=f"{mode:04o}", owner=owner,
                    checkpoint_root=str(ckpt),
                    detail="workers running as users other than its owner cannot reach their checkpoint folders")


def controller_server(args: argparse.Namespace, auth: Authenticator, registrations: list[tuple[Any, Any]],
                      hooks: Hooks) -> tuple[rpc.ServerGroup, int, int]:
    """Two servers with the same services: --listen (TLS without client certificates: users carry
    tokens; requests of at most CLIENT_MESSAGE_BYTES) and --agent-listen (mTLS requiring a node
    certificate, where alone AgentRegistry finds the identity it needs; API_MESSAGE_BYTES). Returns
    them as one group (not started) and both ports. `hooks`: health, reflection and Info on both
    (docs/observability.md)."""
    insecure = args.tls is None
    # With TLS, an AgentRegistry call without a certificate is refused before its request is read.
    interceptor = AuthInterceptor(auth, certificates=not insecure)
    servers = []
    for listen, limit, client_cert in ((args.listen, CLIENT_MESSAGE_BYTES, False),
                                       (args.agent_listen, API_MESSAGE_BYTES, True)):
        servers.append(rpc.aio_server(listen, registrations, interceptors=[interceptor], name="controller",
                                      translate=translate(), tls=args.tls, insecure=insecure, client_cert=client_cert,
                                      hooks=hooks, max_receive_bytes=limit, grow_windows=False))
    return rpc.ServerGroup(*(s for s, _ in servers)), servers[0][1], servers[1][1]


async def serve(args: argparse.Namespace, auth: Authenticator) -> None:
    state = Path(args.state_dir)
    ckpt = Path(args.checkpoint_root or state / "checkpoints").resolve()
    # Its files are 0600 whatever the umask; the folder 0700, or 0711 (passable, not listable) when
    # the checkpoint root is below it, as by default: the workers' users reach their job's folder there.
    below = ckpt.is_relative_to(state.resolve())
    # Before making anything in a folder that would refuse the start.
    closed = check_checkpoint_ancestors(ckpt, state.resolve() if below else None)
    make_dir(state, 0o711 if below else 0o700)
    if below:
        open_checkpoint_path(state.resolve(), ckpt)
    # Passable by the workers' users but not listable: a job id is private to its tenant. One already
    # there is the operator's, as they made it (below the state dir: made passable just above).
    make_dir(ckpt, 0o711)
    cfg = engine_config(args, ckpt)
    if args.store == "etcd":
        warn_closed_above(closed, ckpt)
        log_auth(auth)
        dashboard = await start_dashboard(args, auth, "this controller is a standby: open the leader's dashboard")
        try:
            await serve_ha(args, cfg, state, lambda regs, hooks: controller_server(args, auth, regs, hooks),
                           dashboard)
        finally:
            if dashboard is not None:
                await dashboard.close()
        return
    lock = StateDirLock(state)  # held until the process ends
    store = SqliteStore(state / "controller.db")
    epoch = store.next_epoch()
    check_epoch(state, epoch, store.path)
    structlog.contextvars.bind_contextvars(epoch=epoch)
    warn_closed_above(closed, ckpt)
    agents = AgentClients(args.tls)
    engine = Engine(store, agents, dataclasses.replace(cfg, rendezvous_key=key_file(state / RENDEZVOUS_KEY_FILE)),
                    epoch)
    # Through the engine's store: the jobs it deletes count for the watches (controller/changes.py).
    retention = Retention(engine.store, str(ckpt),
                          RetentionConfig(args.job_ttl, args.checkpoint_ttl, args.retention_interval))
    hooks = Hooks(COMPONENT, SERVICES)  # the store is open and the engine built: serving from the start
    server, port, agent_port = controller_server(args, auth, [
        (controller_pb2_grpc.add_ControllerServicer_to_server,
         ControllerService(engine, page_key=page_key(state / PAGE_KEY_FILE))),
        (agent_pb2_grpc.add_AgentRegistryServicer_to_server, RegistryService(engine, authenticate=args.tls is not None)),
    ], hooks)
    await server.start()
    mport = metrics.serve(args.metrics_listen, args.metrics_token_file)
    dashboard = await start_dashboard(args, auth)
    if dashboard is not None:
        dashboard.attach(engine)
    tls.announce("tessera-controller", args.tls)
    host = args.listen.rpartition(":")[0]
    log_auth(auth)
    agent_host = args.agent_listen.rpartition(":")[0]
    log.info("controller_started", listen=f"{host}:{port}", agent_listen=f"{agent_host}:{agent_port}", epoch=epoch,
             state_dir=str(state), checkpoint_root=str(ckpt), metrics_port=mport, pid=os.getpid(),
             transport="insecure" if args.tls is None else "tls", policy=args.policy, min_run_s=args.min_run)
    tasks = [asyncio.create_task(c) for c in (*loops(engine), retention.loop(engine.view.notify))]
    # SIGHUP: read the tenants file again at once (a round reloads a changed file anyway).
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, on_sighup, engine.tenants, engine.kick)
    await daemon.serve_until_signal(f"serving on {host}:{port}, epoch {epoch}")
    log.info("controller_stopping")
    hooks.shutdown()
    for t in tasks:
        t.cancel()
    if dashboard is not None:
        await dashboard.close()
    await rpc.stop_server(server, grace=2.0)
    await agents.close()
    if engine.estimator_feed is not None:
        await engine.estimator_feed.close()
    store.close()
    lock.release()


async def start_dashboard(args: argparse.Namespace, auth: Authenticator,
                          standby_reason: str = "") -> Dashboard | None:
    """The web dashboard on --dashboard-addr (None when off); its data once `attach`ed an engine."""
    if not args.dashboard_addr:
        return None
    dashboard = Dashboard(auth, args.tls, standby_reason)
    port = await dashboard.start(args.dashboard_addr)
    log.info("dashboard_started", listen=f"{args.dashboard_addr.rpartition(':')[0]}:{port}", port=port,
             scheme="http" if args.tls is None else "https")
    return dashboard


PAGE_KEY_FILE = "page-token.key"
RENDEZVOUS_KEY_FILE = "rendezvous.key"  # attempts' rendezvous keys derive from it (controller/launches.py)


def page_key(path: Path) -> bytes:
    """The key that signs ListJobs continue tokens: kept in the state dir so tokens outlive a
    restart; made (32 random bytes, mode 0600) at the first start."""
    return key_file(path)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        auth = authenticator(args.tokens)
    except (TesseraError, OSError) as exc:  # a missing or malformed tokens file: one line, exit 1
        print(f"tessera-controller: error: {exc}", file=sys.stderr)
        sys.exit(1)
    try:
        daemon.run("tessera-controller", args.log_level, lambda: serve(args, auth))
    except NotPassable as exc:  # a folder to fix before any job can keep a checkpoint: as a bad flag
        print(f"tessera-controller: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
