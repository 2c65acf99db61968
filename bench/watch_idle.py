"""What idle WatchJobs streams cost the controller while nothing changes.

One controller in this process: a real Engine over SQLite with its three loops (rounds, liveness
once a second, inspection), ControllerService behind the token interceptor, gRPC on loopback
(plaintext). User alice (tenant team-a, the local tokens file) submits N jobs over gRPC; there are
no nodes, so they stay PENDING and nothing changes once the round after the last submit has run.
Then two idle windows of the same process:

- `without_streams`: no stream open (what the controller's loops cost by themselves);
- `with_streams`: S WatchJobs streams of alice open (16, the most one caller may hold:
  controller/streams.py), each past its first batch (the whole list).

For each window: the process's CPU seconds (time.process_time: user + system of every thread of
this process, the controller's and the in-process clients', which receive nothing while idle),
how many times the streams scanned the tenant's jobs (calls of the view's `jobs` for team-a), and
how many updates the clients received (0 expected: nothing changed). `streams_cpu_s_per_window`:
the streams' share, the second window's CPU less the first's scaled to the same length.

    python bench/watch_idle.py --jobs 3000 --streams 16 --window 20 --out bench/results

Prints one JSON object and writes it to OUT/NAME (watch_idle.json).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import structlog
from benchio import write_result

from tessera.common import rpc
from tessera.common.localcluster import local_tokens
from tessera.controller.agents import AgentClients
from tessera.controller.auth import AuthInterceptor, TokenAuthenticator
from tessera.controller.engine import Engine, EngineConfig
from tessera.controller.loops import loops
from tessera.controller.service import ControllerService, translate
from tessera.controller.store import SqliteStore
from tessera.v1 import common_pb2, controller_pb2, controller_pb2_grpc

TENANT = "team-a"  # alice's (common/localcluster.py CREDENTIALS)


class Counted:
    """The view's `jobs`, counting the calls that list TENANT's jobs (a WatchJobs scan)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, 0

    def __call__(self, states: Any = (), tenant: str = "") -> Any:
        if tenant == TENANT:
            self.calls += 1
        return self.inner(states, tenant)


async def window(seconds: float, counted: Counted, received: list[int]) -> dict[str, float]:
    cpu0, wall0, calls0, got0 = time.process_time(), time.perf_counter(), counted.calls, sum(received)
    await asyncio.sleep(seconds)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"seconds": round(wall, 2), "cpu_s": round(cpu, 3), "cpu_share": round(cpu / wall, 4),
            "scans": counted.calls - calls0, "updates_received": sum(received) - got0}


def say(what: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


async def run(args: argparse.Namespace) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="tessera-watch-idle-"))
    tokens_file, tokens = local_tokens(tmp / "state")
    store = SqliteStore(tmp / "controller.db")
    engine = Engine(store, AgentClients(None), EngineConfig(checkpoint_root=str(tmp / "ckpt"),
                                                            max_unended_jobs=max(10_000, args.jobs)),
                    store.next_epoch())
    counted = Counted(engine.view.jobs)
    engine.view.jobs = counted  # type: ignore[method-assign]
    server, port = rpc.aio_server("127.0.0.1:0", [(controller_pb2_grpc.add_ControllerServicer_to_server,
                                                   ControllerService(engine))],
                                  interceptors=[AuthInterceptor(TokenAuthenticator(tokens_file))],
                                  name="controller", translate=translate(), insecure=True, client_cert=False)
    await server.start()
    tasks = [asyncio.create_task(c) for c in loops(engine)]
    channel = rpc.aio_channel(f"127.0.0.1:{port}", insecure=True)
    stub = controller_pb2_grpc.ControllerStub(channel)
    auth = (("authorization", f"Bearer {tokens['alice']}"),)
    streams: list[Any] = []
    consumers: list[asyncio.Task[None]] = []
    try:
        spec = common_pb2.JobSpec(name="idle", entrypoint=["/bin/true"], hint=common_pb2.ResourceHint(gpus=1))
        sem = asyncio.Semaphore(32)

        async def submit(i: int) -> None:
            async with sem:
                await stub.SubmitJob(controller_pb2.SubmitJobRequest(request_id=f"idle-{i}", spec=spec),
                                     timeout=120, metadata=auth)

        t0 = time.perf_counter()
        await asyncio.gather(*[submit(i) for i in range(args.jobs)])
        submit_s = time.perf_counter() - t0
        say(f"{args.jobs} jobs submitted in {submit_s:.1f}s")
        rounds = engine.rounds
        while engine.round_requested or engine.rounds == rounds:  # the round after the last submit
            await asyncio.sleep(0.2)
        await asyncio.sleep(2.0)
        say("the round after the last submit has run")
        received = [0] * args.streams
        without = await window(args.baseline_window, counted, received)

        t0 = time.perf_counter()
        for _ in range(args.streams):
            call = stub.WatchJobs(controller_pb2.WatchJobsRequest(tenant=TENANT), metadata=auth)
            listed = 0
            while not (await call.read()).batch_end:
                listed += 1
            assert listed == args.jobs, listed
            streams.append(call)
        open_s = time.perf_counter() - t0
        say(f"{args.streams} streams open in {open_s:.1f}s")

        async def consume(k: int, call: Any) -> None:
            async for _ in call:
                received[k] += 1

        consumers = [asyncio.create_task(consume(k, c)) for k, c in enumerate(streams)]
        await asyncio.sleep(2.0)  # the streams settle
        with_streams = await window(args.window, counted, received)
        return {
            "jobs": args.jobs, "streams": args.streams, "tenant": TENANT,
            "submit_s": round(submit_s, 2), "open_streams_s": round(open_s, 2),
            "without_streams": without, "with_streams": with_streams,
            "streams_cpu_s_per_window": round(with_streams["cpu_s"] - without["cpu_s"] * args.window
                                              / args.baseline_window, 3),
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                        "loadavg_1m": round(os.getloadavg()[0], 2)},
            "measured": "time.process_time() of this process (controller + in-process clients) over each idle "
                        "window; scans = view.jobs calls for the tenant",
        }
    finally:
        for c in streams:
            c.cancel()
        for t in consumers + tasks:
            t.cancel()
        await asyncio.gather(*consumers, *tasks, return_exceptions=True)
        await channel.close()
        await server.stop(None)
        await asyncio.sleep(0.5)  # the handlers' cancellations run out (else the loop's close may hang)
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=3000)
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--window", type=float, default=20.0, help="idle seconds measured with the streams open")
    p.add_argument("--baseline-window", type=float, default=10.0, help="idle seconds measured without streams")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--name", default="watch_idle.json")
    args = p.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    write_result(args.out, args.name, asyncio.run(run(args)))


if __name__ == "__main__":
    main()
