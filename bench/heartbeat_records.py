"""A node's heartbeat carrying many worker records: one real controller process, one simulated agent
whose Register and Heartbeats report N exited workers of N jobs, and a user's WhoAmI calls timed
beside them.

    python bench/heartbeat_records.py --records 1024,2048,4096 --out bench/results

The agent keeps up to 2,000 exited records for an hour, and a status may carry 4,096. The controller
used to scan every record of the node for each job it touched: the time grew with the square of the
count, and a live audit's 4,096 records (one node certificate) held the event loop 4 to 6 s per
heartbeat, long enough for every other node's agents to fence (controller/registry.by_job now looks
them up per job). Printed, and written as JSON (OUT/heartbeat_records.json): per N, the Register and
Heartbeat round trips, and the WhoAmI round trips that overlapped them (p50 and max).
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


def with_records(i: int, n: int) -> agent_pb2.NodeStatus:
    """Node i's status reporting n exited single-rank workers of n jobs the controller never saw."""
    st = status(i)
    for k in range(n):
        st.workers.add(job_id=f"j-{i:04d}{k:08x}", attempt=1, rank=0, state=common_pb2.WORKER_STATE_EXITED,
                       exit_code=0)
    return st


async def measure(ctl, i: int, n: int, beats: int) -> dict[str, object]:  # type: ignore[no-untyped-def]
    st = with_records(i, n)
    channel = aio_channel(ctl.agent_address, tls=tls_config(identity.node(st.node_id)), peer=identity.CONTROLLER)
    users = aio_channel(ctl.address, tls=ca_only())
    reg = agent_pb2_grpc.AgentRegistryStub(channel)
    stub = controller_pb2_grpc.ControllerStub(users)
    auth = (("authorization", f"Bearer {ctl.token}"),)
    busy = asyncio.Event()
    whoami: list[float] = []

    async def probe() -> None:  # a user's call while the node's messages are handled
        while not busy.is_set():
            t0 = time.perf_counter()
            await stub.WhoAmI(controller_pb2.WhoAmIRequest(), timeout=120, metadata=auth)
            whoami.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(0.01)

    await stub.WhoAmI(controller_pb2.WhoAmIRequest(), timeout=120, metadata=auth)  # the channel is up
    prober = asyncio.create_task(probe())
    t0 = time.perf_counter()
    r = await reg.Register(agent_pb2.RegisterRequest(request_id=str(uuid.uuid4()), status=st), timeout=300)
    register_ms = (time.perf_counter() - t0) * 1000
    heartbeat_ms = []
    for _ in range(beats):
        t0 = time.perf_counter()
        await reg.Heartbeat(agent_pb2.HeartbeatRequest(status=st, controller_epoch=r.controller_epoch), timeout=300)
        heartbeat_ms.append((time.perf_counter() - t0) * 1000)
    busy.set()
    await prober
    await channel.close()
    await users.close()
    return {"records": n, "register_ms": round(register_ms, 1), "heartbeat_ms_p50": round(pct(heartbeat_ms, 50), 1),
            "heartbeat_ms_max": round(max(heartbeat_ms), 1), "whoami_ms_p50": round(pct(whoami, 50), 1),
            "whoami_ms_max": round(max(whoami), 1), "whoami_calls": len(whoami)}


async def run(args: argparse.Namespace) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="tessera-bench-"))
    ctl = start_controller(tmp / "state", "--lease", "600", "--down-after", "1200", "--round-interval", "300", fast=False)
    try:
        rows = []
        for i, n in enumerate(int(x) for x in args.records.split(",")):
            row = await measure(ctl, i, n, args.beats)
            print(row, flush=True)
            rows.append(row)
        return {"rows": rows, "beats": args.beats,
                "machine": {"cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2),
                            "python": sys.version.split()[0]}}
    finally:
        ctl.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", default="1024,2048,4096", help="exited worker records per status, comma-separated")
    p.add_argument("--beats", type=int, default=5, help="heartbeats per count")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    write_result(args.out, "heartbeat_records.json", asyncio.run(run(args)))


if __name__ == "__main__":
    main()
