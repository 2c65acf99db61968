"""`tessera-controller`: the asyncio controller daemon."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

import structlog

from tessera.common import daemon, metrics, rpc, tls
from tessera.controller.agents import AgentClients
from tessera.controller.core.frenzy import GIB, FrenzyConfig
from tessera.controller.core.policies import ALIASES, policy_names
from tessera.controller.engine import Engine, EngineConfig
from tessera.controller.registry import LivenessConfig
from tessera.controller.service import ControllerService, RegistryService, translate
from tessera.controller.store import SqliteStore
from tessera.v1 import agent_pb2_grpc, controller_pb2_grpc

log = structlog.get_logger("controller")

# The agents' port: AgentRegistry needs a client certificate, which gRPC can only require port-wide,
# while users connect without one (docs/security.md).
DEFAULT_AGENT_PORT = 50054


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tessera-controller", description=__doc__)
    p.add_argument("--listen", default="127.0.0.1:50051",
                   help="host:port of the client API (TLS; users need no certificate)")
    p.add_argument("--agent-listen", default=None, metavar="HOST:PORT",
                   help="host:port of the agents' API (mTLS: node certificates); default the --listen host, "
                        f"port {DEFAULT_AGENT_PORT} (port 0 when --listen has port 0)")
    p.add_argument("--state-dir", required=True, help="directory for the SQLite state (created if missing)")
    p.add_argument("--round-interval", type=float, default=300.0, help="seconds between scheduling rounds")
    p.add_argument("--inspect-interval", type=float, default=20.0, help="seconds between running-job inspections")
    p.add_argument("--debounce", type=float, default=1.0, help="seconds a round waits after an arrival/departure")
    p.add_argument("--lease", type=float, default=15.0, help="seconds without heartbeat before UNREACHABLE")
    p.add_argument("--heartbeat-interval", type=float, default=5.0, help="heartbeat period asked of agents")
    p.add_argument("--down-after", type=float, default=120.0, help="seconds without heartbeat before DOWN")
    p.add_argument("--stop-grace", type=float, default=30.0, help="seconds between SIGTERM and SIGKILL")
    p.add_argument("--policy", default="crius",
                   help=f"scheduling policy: {', '.join(policy_names())} (default crius)")
    p.add_argument("--policy-mode", default="paper", choices=("paper", "artifact"),
                   help="the policy as its paper describes it, or as the Crius artifact ran it")
    p.add_argument("--search-depth", type=int, default=3, help="Crius: scaling steps one choice may make")
    p.add_argument("--min-gain", type=float, default=0.2,
                   help="Crius: relative throughput gain a running job's scale-up or move must bring")
    p.add_argument("--round-budget", type=float, default=10.0, help="wall-clock seconds a round may search")
    p.add_argument("--start-timeout", type=float, default=300.0,
                   help="seconds for every rank of an attempt to be running, else the attempt failed")
    p.add_argument("--progress-timeout", type=float, default=900.0,
                   help="seconds without progress from rank 0 before an attempt counts as hung (jobs may "
                        "override; <= 0 = never)")
    p.add_argument("--checkpoint-root", default="", help="shared checkpoint storage (default STATE_DIR/checkpoints)")
    p.add_argument("--gpu-reserve-gb", type=float, default=1.0, help="GiB kept free on every GPU")
    p.add_argument("--metrics-listen", default="", help="host:port for Prometheus /metrics (off when empty)")
    p.add_argument("--estimator", default="",
                   help="host:port of a tessera-estimator that receives running jobs' step times (online refit)")
    p.add_argument("--learn-step-times", default="nvml", choices=("nvml", "all", "off"),
                   help="whose step times replace Cell estimates: nodes with NVML inventories (default), "
                        "all nodes (declared inventories too: demos and tests only), or none")
    p.add_argument("--log-level", default="info")
    tls.add_arguments(p)
    args = p.parse_args(argv)
    args.tls = tls.from_args(args, p.error)
    if args.tls is not None and (args.tls.identity is None or args.tls.identity.kind != "controller"):
        p.error(f"--tls-dir: {args.tls.source} holds a certificate of {args.tls.identity or 'no Tessera identity'}, "
                "not of the controller (tessctl admin pki issue --controller)")
    if args.agent_listen is None:
        host, _, port = args.listen.rpartition(":")
        args.agent_listen = f"{host}:{0 if port == '0' else DEFAULT_AGENT_PORT}"
    for name in ("round_interval", "inspect_interval", "lease", "heartbeat_interval", "down_after"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if args.policy.strip().lower() not in policy_names() and args.policy not in ALIASES:
        p.error(f"--policy: unknown policy {args.policy!r}; use one of {', '.join(policy_names())}")
    if args.search_depth < 0:
        p.error("--search-depth must be >= 0")
    if args.heartbeat_interval >= args.lease:
        p.error("--heartbeat-interval must be shorter than --lease")
    return args


async def serve(args: argparse.Namespace) -> None:
    state = Path(args.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    ckpt = Path(args.checkpoint_root or state / "checkpoints").resolve()
    ckpt.mkdir(parents=True, exist_ok=True)
    store = SqliteStore(state / "controller.db")
    epoch = store.next_epoch()
    structlog.contextvars.bind_contextvars(epoch=epoch)
    cfg = EngineConfig(
        round_interval_s=args.round_interval, inspect_interval_s=args.inspect_interval, debounce_s=args.debounce,
        stop_grace_s=args.stop_grace, checkpoint_root=str(ckpt), start_timeout_s=args.start_timeout,
        policy=args.policy, policy_mode=args.policy_mode, search_depth=args.search_depth,
        round_budget_s=args.round_budget, min_gain=args.min_gain,
        progress_timeout_s=args.progress_timeout, estimator=args.estimator,
        learn_step_times=args.learn_step_times,
        liveness=LivenessConfig(args.lease, args.heartbeat_interval, args.down_after),
        frenzy=FrenzyConfig(reserve_bytes=int(args.gpu_reserve_gb * GIB)), tls=args.tls)
    agents = AgentClients(args.tls)
    engine = Engine(store, agents, cfg, epoch)
    insecure = args.tls is None
    # One server, two ports: the same services on both; AgentRegistry finds a node identity only
    # on the agent port, whose TLS requires a client certificate.
    server, port = rpc.aio_server(args.listen, [
        (controller_pb2_grpc.add_ControllerServicer_to_server, ControllerService(engine)),
        (agent_pb2_grpc.add_AgentRegistryServicer_to_server, RegistryService(engine, authenticate=not insecure)),
    ], name="controller", translate=translate(), tls=args.tls, insecure=insecure, client_cert=False)
    agent_port = rpc.add_port(server, args.agent_listen, tls=args.tls, insecure=insecure, client_cert=True)
    await server.start()
    mport = metrics.serve(args.metrics_listen)
    tls.announce("tessera-controller", args.tls)
    host = args.listen.rpartition(":")[0]
    agent_host = args.agent_listen.rpartition(":")[0]
    log.info("controller_started", listen=f"{host}:{port}", agent_listen=f"{agent_host}:{agent_port}", epoch=epoch,
             state_dir=str(state), checkpoint_root=str(ckpt), metrics_port=mport, pid=os.getpid(),
             transport="insecure" if insecure else "tls")
    tasks = [asyncio.create_task(c) for c in (engine.round_loop(), engine.liveness_loop(), engine.inspect_loop())]
    await daemon.serve_until_signal(f"serving on {host}:{port}, epoch {epoch}")
    log.info("controller_stopping")
    for t in tasks:
        t.cancel()
    await rpc.stop_server(server, grace=2.0)
    await agents.close()
    if engine.estimator_feed is not None:
        await engine.estimator_feed.close()
    store.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    daemon.run("tessera-controller", args.log_level, lambda: serve(args))


if __name__ == "__main__":
    main()
