"""Control-plane throughput: one real controller process, N simulated agents, M submits.

The agents are in-process asyncio gRPC clients (no workers, no NodeAgent server): they register with
a declared inventory and heartbeat with their whole (empty) state, as real agents do, each over its
own mTLS channel with its own node certificate (issued from the local dev PKI, ~2 ms each). Jobs ask for a
GPU type that no simulated node has, so every round runs over the full cluster but launches nothing.

    python bench/control_plane.py --agents 1000 --heartbeats 10 --submits 2000 --out bench/results

Prints one JSON object and writes it to OUT/control_plane.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchio import write_result

from tessera.common import identity
from tessera.common.localcluster import ca_only, start_controller, tls_config
from tessera.common.rpc import aio_channel
from tessera.v1 import agent_pb2, agent_pb2_grpc, common_pb2, controller_pb2, controller_pb2_grpc

GB = 1000**3


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def summary(lat_s: list[float], wall: float) -> dict[str, float]:
    ms = [x * 1000 for x in lat_s]
    return {"count": len(ms), "wall_s": round(wall, 3), "per_s": round(len(ms) / wall, 1),
            "p50_ms": round(pct(ms, 50), 3), "p90_ms": round(pct(ms, 90), 3), "p99_ms": round(pct(ms, 99), 3),
            "max_ms": round(max(ms), 3), "mean_ms": round(statistics.fmean(ms), 3)}


def status(i: int) -> agent_pb2.NodeStatus:
    inv = common_pb2.NodeInventory(source=common_pb2.INVENTORY_SOURCE_DECLARED, hostname=f"sim{i}", gpus=[
        common_pb2.Gpu(index=k, uuid=f"SIM-{i}-{k}", model="A10-24GB", memory_bytes=24 * GB) for k in range(8)])
    return agent_pb2.NodeStatus(node_id=f"sim-{i:05d}", address=f"127.0.0.1:{20000 + i % 40000}", inventory=inv)


async def run(args: argparse.Namespace) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="tessera-bench-"))
    # Lease long enough that no simulated node lapses while the single client process is busy.
    ctl = start_controller(tmp / "state", "--lease", "600", "--heartbeat-interval", "5", "--down-after", "1200",
                           "--round-interval", "300",
                           "--debounce", "1", "--inspect-interval", "20", fast=False)
    try:
        sts = [status(i) for i in range(args.agents)]
        users = ca_only()
        channels = [aio_channel(ctl.address, tls=users) for _ in range(args.channels)]
        # A node certificate speaks for its own node only: one channel per simulated agent.
        agent_channels = [aio_channel(ctl.agent_address, tls=tls_config(identity.node(st.node_id)),
                                      peer=identity.CONTROLLER) for st in sts]
        regs = [agent_pb2_grpc.AgentRegistryStub(c) for c in agent_channels]
        sem = asyncio.Semaphore(args.concurrency)

        async def timed(coro_fn, lat: list[float]) -> object:  # type: ignore[no-untyped-def]
            async with sem:
                t0 = time.perf_counter()
                r = await coro_fn()
                lat.append(time.perf_counter() - t0)
                return r

        reg_lat: list[float] = []
        t0 = time.perf_counter()
        resps = await asyncio.gather(*[timed(lambda i=i: regs[i % len(regs)].Register(
            agent_pb2.RegisterRequest(request_id=str(uuid.uuid4()), status=sts[i]), timeout=60), reg_lat)
            for i in range(args.agents)])
        reg_wall = time.perf_counter() - t0
        epoch = resps[0].controller_epoch  # type: ignore[attr-defined]

        hb_lat: list[float] = []
        t0 = time.perf_counter()
        rereg = 0
        for _ in range(args.heartbeats):
            out = await asyncio.gather(*[timed(lambda i=i: regs[i % len(regs)].Heartbeat(
                agent_pb2.HeartbeatRequest(status=sts[i], controller_epoch=epoch), timeout=60), hb_lat)
                for i in range(args.agents)])
            rereg += sum(1 for r in out if r.reregister)  # type: ignore[attr-defined]
        hb_wall = time.perf_counter() - t0

        ctl_stubs = [controller_pb2_grpc.ControllerStub(c) for c in channels]
        auth = (("authorization", f"Bearer {ctl.token}"),)  # the Controller API's calls carry the admin token
        spec = common_pb2.JobSpec(name="bench", model=common_pb2.ModelSpec(name="gpt2-small"), global_batch_size=32,
                                  iterations=100, hint=common_pb2.ResourceHint(gpu_types=["H100"]))
        sub_lat: list[float] = []
        t0 = time.perf_counter()
        await asyncio.gather(*[timed(lambda i=i: ctl_stubs[i % len(ctl_stubs)].SubmitJob(
            controller_pb2.SubmitJobRequest(request_id=f"bench-{i}", spec=spec), timeout=60, metadata=auth), sub_lat)
            for i in range(args.submits)])
        sub_wall = time.perf_counter() - t0

        # One more heartbeat sweep while rounds run over the pending jobs and all nodes.
        hb2_lat: list[float] = []
        t0 = time.perf_counter()
        await asyncio.gather(*[timed(lambda i=i: regs[i % len(regs)].Heartbeat(
            agent_pb2.HeartbeatRequest(status=sts[i], controller_epoch=epoch), timeout=60), hb2_lat)
            for i in range(args.agents)])
        hb2_wall = time.perf_counter() - t0
        nodes = await ctl_stubs[0].ListNodes(controller_pb2.ListNodesRequest(), timeout=60, metadata=auth)
        ready = sum(1 for n in nodes.nodes if n.state == common_pb2.NODE_STATE_READY)
        for c in channels + agent_channels:
            await c.close()
        rounds = [e for e in ctl.events() if e.get("event") == "round" and e.get("pending")]
        return {
            "agents": args.agents, "gpus": args.agents * 8, "concurrency": args.concurrency,
            "register": summary(reg_lat, reg_wall),
            "heartbeat": summary(hb_lat, hb_wall), "heartbeat_reregister_answers": rereg,
            "submit": summary(sub_lat, sub_wall),
            "heartbeat_after_submits": summary(hb2_lat, hb2_wall),
            "nodes_ready": ready,
            "round_seconds_with_pending": [r["seconds"] for r in rounds][-5:],
            "round_pending_jobs": [r["pending"] for r in rounds][-5:],
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
            "note": "one client process drives all agents; client and controller share the machine",
        }
    finally:
        ctl.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", type=int, default=1000)
    p.add_argument("--heartbeats", type=int, default=10, help="heartbeat sweeps over all agents")
    p.add_argument("--submits", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=64, help="calls in flight at once")
    p.add_argument("--channels", type=int, default=4)
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    result = asyncio.run(run(args))
    write_result(args.out, "control_plane.json", result)


if __name__ == "__main__":
    main()
