"""Heartbeats while rounds plan over many pending jobs: one real controller process, a few simulated
agents heartbeating without pause, N jobs submitted that fit nowhere (they ask for a GPU type no
node has), so every round plans over all of them.

    python bench/round_heartbeats.py --pending 10000 --out bench/results

A round over 10,000 pending jobs took seconds, and it ran on the controller's event loop: the
heartbeats waited it out, and with the default liveness (15 s lease, 10 s fence) a live audit saw
the workers of another tenant fenced four times in three minutes. The controller now plans and
writes the pending reasons in a thread (controller/rounds.py). Printed: the rounds' seconds with
their pending counts, and the heartbeats' round trips (all of them, and those that overlapped a
round) as percentiles and maximum, as JSON (also OUT/round_heartbeats.json).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchio import write_result
from control_plane import pct, status

from tessera.common import identity
from tessera.common.localcluster import ca_only, start_controller, tls_config
from tessera.common.rpc import aio_channel
from tessera.v1 import agent_pb2, agent_pb2_grpc, common_pb2, controller_pb2, controller_pb2_grpc


def stats(ms: list[float]) -> dict[str, float]:
    return {"count": len(ms), "p50_ms": round(pct(ms, 50), 1), "p99_ms": round(pct(ms, 99), 1),
            "max_ms": round(max(ms), 1) if ms else float("nan")}


async def run(args: argparse.Namespace) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="tessera-bench-"))
    ctl = start_controller(tmp / "state", "--round-interval", "300", "--debounce", "1",
                           "--max-unended-jobs", str(args.pending + 10), fast=False)
    try:
        sts = [status(i) for i in range(args.agents)]
        agent_channels = [aio_channel(ctl.agent_address, tls=tls_config(identity.node(st.node_id)),
                                      peer=identity.CONTROLLER) for st in sts]
        regs = [agent_pb2_grpc.AgentRegistryStub(c) for c in agent_channels]
        epoch = 0
        for reg, st in zip(regs, sts):
            r = await reg.Register(agent_pb2.RegisterRequest(request_id=str(uuid.uuid4()), status=st), timeout=60)
            epoch = r.controller_epoch
        beats: list[tuple[float, float]] = []  # (start, end) on this process's monotonic clock
        done = asyncio.Event()

        async def beat(reg: agent_pb2_grpc.AgentRegistryStub, st: agent_pb2.NodeStatus) -> None:
            while not done.is_set():
                t0 = time.monotonic()
                await reg.Heartbeat(agent_pb2.HeartbeatRequest(status=st, controller_epoch=epoch), timeout=120)
                beats.append((t0, time.monotonic()))
                await asyncio.sleep(args.interval)

        beaters = [asyncio.create_task(beat(r, s)) for r, s in zip(regs, sts)]
        channel = aio_channel(ctl.address, tls=ca_only())
        stub = controller_pb2_grpc.ControllerStub(channel)
        auth = (("authorization", f"Bearer {ctl.token}"),)
        spec = common_pb2.JobSpec(name="bench", model=common_pb2.ModelSpec(name="gpt2-small"), global_batch_size=32,
                                  iterations=100, hint=common_pb2.ResourceHint(gpu_types=["H100"]))
        sem = asyncio.Semaphore(args.concurrency)

        async def submit(i: int) -> None:
            async with sem:
                await stub.SubmitJob(controller_pb2.SubmitJobRequest(request_id=f"b-{i}", spec=spec),
                                     timeout=120, metadata=auth)

        t_sub = time.monotonic()
        await asyncio.gather(*[submit(i) for i in range(args.pending)])
        sub_s = time.monotonic() - t_sub

        def full_rounds() -> list[dict[str, object]]:
            return [e for e in ctl.events() if e.get("event") == "round" and int(e.get("pending", 0)) >= args.pending]

        # Rounds over every job: the last submit's debounced round, then the ones a job written asks for.
        deadline = time.monotonic() + args.wait
        while len(full_rounds()) < args.rounds and time.monotonic() < deadline:
            await stub.SubmitJob(controller_pb2.SubmitJobRequest(request_id=str(uuid.uuid4()), spec=spec),
                                 timeout=120, metadata=auth)  # an arrival asks for a round
            await asyncio.sleep(2.0)  # (a poll of the controller's log, not synchronisation)
        done.set()
        await asyncio.gather(*beaters)
        rounds = full_rounds()
        await channel.close()
        for c in agent_channels:
            await c.close()
        all_ms = [(b - a) * 1000 for a, b in beats]
        after = [(b - a) * 1000 for a, b in beats if a >= t_sub + sub_s]
        return {
            "pending": args.pending, "agents": args.agents, "heartbeat_interval_s": args.interval,
            "submit_seconds": round(sub_s, 1),
            "rounds_over_all_jobs": [{"pending": r["pending"], "seconds": r["seconds"]} for r in rounds],
            "heartbeat_ms_whole_run": stats(all_ms),
            "heartbeat_ms_after_submits": stats(after),
            "machine": {"cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2),
                        "python": sys.version.split()[0]},
        }
    finally:
        ctl.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pending", type=int, default=10000, help="jobs submitted that fit nowhere")
    p.add_argument("--agents", type=int, default=2)
    p.add_argument("--interval", type=float, default=0.2, help="seconds between one agent's heartbeats")
    p.add_argument("--concurrency", type=int, default=32, help="submits in flight at once")
    p.add_argument("--rounds", type=int, default=3, help="rounds over all the jobs to wait for")
    p.add_argument("--wait", type=float, default=300.0, help="seconds to wait for them")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    write_result(args.out, "round_heartbeats.json", asyncio.run(run(args)))


if __name__ == "__main__":
    main()
