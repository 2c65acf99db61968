"""`tessera-estimator`: the estimator daemon (the tessera.v1.Estimator gRPC API).

Exit status: 0 after SIGTERM/SIGINT, 1 when the address cannot be bound, 2 for bad arguments.
stdout stays empty; logs go to stderr (structlog: JSON when stderr is not a terminal).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
from pathlib import Path

import structlog

from tessera.common import clihelp, daemon, logs, metrics, rpc, tls
from tessera.common.buildinfo import version_line
from tessera.common.errors import InvalidArgument, PermissionDenied, Unauthenticated
from tessera.common.hooks import Hooks
from tessera.common.identity import CONTROLLER, ESTIMATOR
from tessera.common.privatefile import make_dir
from tessera.estimator.service.handlers import Estimator, version
from tessera.estimator.service.server import EstimatorService
from tessera.estimator.service.state import EstimatorState
from tessera.estimator.service.traced_child import TRACED_BUDGET_S
from tessera.v1 import estimator_pb2_grpc

log = structlog.get_logger("estimator")

DEFAULT_LISTEN = "127.0.0.1:50053"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tessera-estimator", description=__doc__, **clihelp.PARSER)
    p.add_argument("--version", action="version", version=f"tessera-estimator {version_line()}")
    p.add_argument("--listen", default=DEFAULT_LISTEN,
                   help=f"host:port of the Estimator API (port 0 = pick one; default {DEFAULT_LISTEN})")
    p.add_argument("--metrics-listen", default="", help="host:port for Prometheus /metrics (off when empty); a host "
                   "other than loopback needs --metrics-token-file (docs/observability.md)")
    p.add_argument("--metrics-token-file", default="", metavar="FILE",
                   help="a bearer token every scrape of /metrics must carry (Authorization: Bearer ...; mode 600)")
    p.add_argument("--memory-cache", type=int, default=4096, help="memory answers kept (LRU)")
    p.add_argument("--cells-cache", type=int, default=256, help="GetCells answers kept (LRU)")
    p.add_argument("--state-dir", default="",
                   help="keep fitted performance models and measured Cell times in DIR/estimator.db across "
                        "restarts (default: in memory only)")
    p.add_argument("--traced-budget", type=float, default=TRACED_BUDGET_S, metavar="SECONDS",
                   help="wall-clock seconds one traced-mode memory estimate may take, torch's import included "
                        "(then RESOURCE_EXHAUSTED; a real 32-layer hidden-4,096 model took 10 s, the largest the "
                        f"request bounds admit 148 s; default {TRACED_BUDGET_S:g})")
    p.add_argument("--log-level", default="info", choices=logs.LEVELS)
    tls.add_arguments(p)
    args = p.parse_args(argv)
    args.tls = tls.from_args(args, p.error)
    if args.tls is not None and args.tls.identity != ESTIMATOR:
        p.error(f"--tls-dir: {args.tls.source} does not hold the estimator's certificate "
                "(tessctl admin pki issue --estimator)")
    try:
        args.listen = rpc.check_listen(args.listen, "--listen", 50053)
        if args.metrics_listen:
            args.metrics_listen = rpc.check_listen(args.metrics_listen, "--metrics-listen", 9453)
    except InvalidArgument as e:
        p.error(str(e))
    if args.memory_cache < 1 or args.cells_cache < 1:
        p.error("cache sizes must be >= 1")
    if not (math.isfinite(args.traced_budget) and args.traced_budget > 0):
        p.error(f"--traced-budget: must be a number of seconds > 0, got {args.traced_budget:g}")
    try:
        metrics.check(args.metrics_listen, args.metrics_token_file)
    except metrics.MetricsConfigError as e:
        p.error(str(e))
    return args


# Calls that change what later answers say: the fitted performance model every round trusts.
CONTROLLER_ONLY = frozenset({"FitPerformance", "ReportStepTimes"})


# Calls in progress at once, over every method (more are RESOURCE_EXHAUSTED): the heavy ones have
# bounded lanes of threads (estimator/service/server.py), this bounds what waiting calls hold.
MAX_CALLS = 256


def authorize(method: str, context: object) -> None:
    """mTLS: queries from any certificate of the CA (the controller; an operator's `tessctl estimate
    --estimator --tls-dir`), changes to the fitted models from the controller only (docs/security.md)."""
    who = tls.peer_identity(context)
    if who is None:
        raise Unauthenticated(f"{method}: the estimator needs a client certificate naming a Tessera identity")
    if method in CONTROLLER_ONLY and who != CONTROLLER:
        raise PermissionDenied(f"{method}: only the controller may call it, not {who}")


async def serve(args: argparse.Namespace) -> None:
    state = None
    if args.state_dir:
        make_dir(Path(args.state_dir))  # 0700 whatever the umask: what it learned is no other user's
        state = EstimatorState(Path(args.state_dir) / "estimator.db")
    estimator = Estimator(memory_cache_size=args.memory_cache, cells_cache_size=args.cells_cache, state=state,
                          traced_budget_s=args.traced_budget, traced_spare=True)
    service = EstimatorService(estimator)
    insecure = args.tls is None
    hooks = Hooks("tessera-estimator")  # the state is loaded: serving from the start
    server, port = rpc.aio_server(args.listen, [(estimator_pb2_grpc.add_EstimatorServicer_to_server, service)],
                                  [] if insecure else [rpc.Authorize(authorize)], name="estimator",
                                  tls=args.tls, insecure=insecure, hooks=hooks, max_concurrent_rpcs=MAX_CALLS,
                                  grow_windows=False)  # a refused caller's upload is not taken in (rpc.Authorize)
    await server.start()
    mport = metrics.serve(args.metrics_listen, args.metrics_token_file)
    tls.announce("tessera-estimator", args.tls)
    host = args.listen.rpartition(":")[0]
    log.info("estimator_started", listen=f"{host}:{port}", metrics_port=mport, version=version(), pid=os.getpid(),
             state=str(state.path) if state else "memory only", fitted_models=estimator.health().fitted_models,
             transport="insecure" if insecure else "tls")
    await daemon.serve_until_signal(f"serving on {host}:{port}")
    log.info("estimator_stopping")
    hooks.shutdown()
    await rpc.stop_server(server, grace=2.0)
    await asyncio.to_thread(estimator.close)  # waits for a traced estimate the stop is ending
    if state is not None:
        state.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    daemon.run("tessera-estimator", args.log_level, lambda: serve(args))


if __name__ == "__main__":
    main()
