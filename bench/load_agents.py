"""Sustained load on one real controller: N simulated agents heartbeating every 10 s plus M job
submits per second, for D seconds (issue 13's load figure: 1,000 agents, 100 submits/s, 10 minutes).

The agents are asyncio tasks spread over a few client processes (real gRPC, one channel per process
per 250 agents): each registers with a realistic NodeStatus (8 GPUs with UUIDs, hostname, agent
version), then heartbeats every --heartbeat-interval seconds at its own phase, registering again
when told to. Submits go out at a fixed rate, each on schedule whether or not earlier ones have been
answered (no coordinated omission). Jobs ask for a GPU type no simulated node has, so every round
plans over the whole cluster and the pending queue but launches nothing (the simulated agents serve
no NodeAgent API); each job is cancelled --job-lifetime seconds after it was accepted, so the queue
stays at about rate x lifetime jobs instead of growing for the whole run.

Prints and writes (OUT/load_agents.json): p50/p99/max latency of heartbeats, registrations and
submits; errors by status code; missed leases (nodes the controller moved to UNREACHABLE, from its
log, and heartbeat gaps longer than the lease seen by the agents); the controller's CPU (mean and
the highest 5-s sample, in cores) and its resident memory.

    python bench/load_agents.py                                  # 1000 agents, 100/s, 600 s
    python bench/load_agents.py --agents 200 --rate 20 --duration 60

The controller runs with --lease 30 --heartbeat-interval 10 (three heartbeats per lease) and the
default round interval, over mTLS as deployed (--insecure for a plaintext comparison): every
simulated agent has its own node certificate from a dev PKI and its own TLS connection to the
controller's agent port, as real agents do (the controller checks that the certificate names the
node it speaks for); submits go to the users' port over TLS with the admin's bearer token.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import multiprocessing as mp
import os
import queue
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc
from benchio import write_result

from tessera.common import identity, tls
from tessera.common.localcluster import Daemon, pki, start_controller, use_pki
from tessera.common.pki import identity_dir_name
from tessera.common.rpc import aio_channel
from tessera.v1 import agent_pb2, agent_pb2_grpc, common_pb2, controller_pb2, controller_pb2_grpc

GB = 1 << 30


def agent_channel(args: argparse.Namespace, node_id: str) -> grpc.aio.Channel:
    """A simulated agent's own connection to the agent port, with its node certificate."""
    if args.insecure:
        return aio_channel(args.agent_target, insecure=True)
    node_tls = tls.load_dir(Path(args.pki_dir) / identity_dir_name(identity.node(node_id)))
    return aio_channel(args.agent_target, tls=node_tls, peer=identity.CONTROLLER)


def user_channel(args: argparse.Namespace) -> grpc.aio.Channel:
    """The submitters' connection to the users' port: TLS checked against the dev CA."""
    if args.insecure:
        return aio_channel(args.target, insecure=True)
    return aio_channel(args.target, tls=tls.TlsConfig(ca=(Path(args.pki_dir) / "ca.pem").read_bytes()))


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def summary(lat_s: list[float]) -> dict[str, float]:
    ms = [x * 1000 for x in lat_s]
    if not ms:
        return {"count": 0}
    return {"count": len(ms), "p50_ms": round(pct(ms, 50), 2), "p99_ms": round(pct(ms, 99), 2),
            "max_ms": round(max(ms), 2)}


def node_status(i: int) -> agent_pb2.NodeStatus:
    inv = common_pb2.NodeInventory(source=common_pb2.INVENTORY_SOURCE_DECLARED, hostname=f"load-{i:05d}", gpus=[
        common_pb2.Gpu(index=k, uuid=f"GPU-{uuid.UUID(int=i * 8 + k)}", model="A100-80GB", memory_bytes=80 * GB)
        for k in range(8)])
    return agent_pb2.NodeStatus(node_id=f"load-{i:05d}", address=f"127.0.0.1:{20000 + i % 40000}", inventory=inv,
                                agent_version="load-bench")


def job_spec() -> common_pb2.JobSpec:
    # A GPU type no simulated node has: planned every round, never launched.
    return common_pb2.JobSpec(name="load", model=common_pb2.ModelSpec(name="gpt2-small"), global_batch_size=32,
                              iterations=100, hint=common_pb2.ResourceHint(gpu_types=["H100"]))


class Client:
    """One client process's share: agents i = k, k + procs, ... and rate / procs submits per second."""

    def __init__(self, args: argparse.Namespace, k: int, start_at: float) -> None:
        self.args, self.k, self.start_at = args, k, start_at
        self.stop_at = start_at + args.duration
        self.lat: dict[str, list[float]] = {"heartbeat": [], "register": [], "submit": [], "cancel": []}
        self.errors: Counter[str] = Counter()
        self.reregistered = 0
        self.lease_gaps: list[str] = []

    async def call(self, kind: str, fn: Any, request: Any, metadata: Any = None) -> Any:
        t0 = time.perf_counter()
        try:
            resp = await fn(request, timeout=self.args.deadline, metadata=metadata)
        except grpc.aio.AioRpcError as e:
            self.errors[f"{kind}:{e.code().name}"] += 1
            return None
        self.lat[kind].append(time.perf_counter() - t0)
        return resp

    async def agent(self, stub: agent_pb2_grpc.AgentRegistryStub, i: int) -> None:
        status = node_status(i)
        epoch = 0
        interval = self.args.heartbeat_interval
        await asyncio.sleep(max(0.0, self.start_at - time.time()) + random.uniform(0, interval))
        last_ok = time.time()
        while time.time() < self.stop_at:
            if not epoch:
                r = await self.call("register", stub.Register,
                                    agent_pb2.RegisterRequest(request_id=str(uuid.uuid4()), status=status))
                epoch = r.controller_epoch if r is not None else 0
            else:
                r = await self.call("heartbeat", stub.Heartbeat,
                                    agent_pb2.HeartbeatRequest(status=status, controller_epoch=epoch))
                if r is not None and r.reregister:
                    self.reregistered += 1
                    epoch = 0
                    continue
            now = time.time()
            if r is not None:
                if now - last_ok > self.args.lease:
                    self.lease_gaps.append(f"{status.node_id}: {now - last_ok:.1f}s")
                last_ok = now
            await asyncio.sleep(interval)

    async def job(self, stub: controller_pb2_grpc.ControllerStub, n: int) -> None:
        token = (("authorization", f"Bearer {self.args.token}"),) if self.args.token else None
        r = await self.call("submit", stub.SubmitJob, controller_pb2.SubmitJobRequest(
            request_id=f"load-{self.k}-{n}-{uuid.uuid4().hex[:8]}", spec=job_spec()), token)
        if r is None:
            return
        await asyncio.sleep(self.args.job_lifetime)
        await self.call("cancel", stub.CancelJob, controller_pb2.CancelJobRequest(
            job_id=r.job.id, request_id=str(uuid.uuid4())), token)

    async def submitter(self, stub: controller_pb2_grpc.ControllerStub) -> None:
        rate = self.args.rate / self.args.procs
        if rate <= 0:
            return
        tasks: set[asyncio.Task[None]] = set()
        n = 0
        while True:
            due = self.start_at + n / rate
            if due >= self.stop_at:
                break
            await asyncio.sleep(max(0.0, due - time.time()))
            t = asyncio.create_task(self.job(stub, n))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            n += 1
        if tasks:
            await asyncio.wait(tasks)

    async def run(self) -> dict[str, Any]:
        mine = list(range(self.k, self.args.agents, self.args.procs))
        chans = [agent_channel(self.args, node_status(i).node_id) for i in mine]
        users = user_channel(self.args)
        chans.append(users)
        await asyncio.gather(*[self.agent(agent_pb2_grpc.AgentRegistryStub(c), i) for c, i in zip(chans, mine)],
                             self.submitter(controller_pb2_grpc.ControllerStub(users)))
        for c in chans:
            await c.close()
        return {"lat": self.lat, "errors": dict(self.errors), "reregistered": self.reregistered,
                "lease_gaps": self.lease_gaps}


def client_main(args: argparse.Namespace, k: int, start_at: float, out: Any) -> None:
    out.put(asyncio.run(Client(args, k, start_at).run()))


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _when(event: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(str(event.get("timestamp", ""))).timestamp()


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="tessera-load-"))
    use_pki(tmp / "pki")
    t_pki = time.monotonic()
    if not args.insecure:
        for i in range(args.agents):
            pki().tls_dir(identity.node(node_status(i).node_id))
    t_pki = time.monotonic() - t_pki
    args.pki_dir = str(tmp / "pki")
    ctl: Daemon = start_controller(tmp / "state", "--lease", str(args.lease), "--heartbeat-interval",
                                   str(args.heartbeat_interval), "--debounce", "1", "--inspect-interval", "20",
                                   fast=False, insecure=args.insecure)
    args.target, args.agent_target, args.token = ctl.address, ctl.agent_address, ctl.token
    pid = ctl.proc.pid
    try:
        start_at = time.time() + 2.0  # every client process up before the clock starts
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        procs = [ctx.Process(target=client_main, args=(args, k, start_at, q)) for k in range(args.procs)]
        for p in procs:
            p.start()
        time.sleep(max(0.0, start_at - time.time()))
        cpu0, t0 = proc_cpu_seconds(pid), time.monotonic()
        client_cpu0 = sum(proc_cpu_seconds(p.pid) for p in procs if p.pid is not None)
        load0 = os.getloadavg()[0]
        samples, last_cpu, last_t, rss_max = [], cpu0, t0, 0.0
        client_cpu, client_wall = 0.0, 1.0
        results: list[dict[str, Any]] = []
        while len(results) < len(procs):
            with contextlib.suppress(queue.Empty):
                results.append(q.get(timeout=5))
                continue
            if ctl.proc.poll() is not None:
                raise RuntimeError(f"the controller exited {ctl.proc.returncode}")
            cpu, now = proc_cpu_seconds(pid), time.monotonic()
            samples.append((cpu - last_cpu) / (now - last_t))
            last_cpu, last_t = cpu, now
            rss_max = max(rss_max, proc_rss_mb(pid))
            # The clients' CPU while they all run (a finished one has no /proc entry left to read).
            if all(p.is_alive() for p in procs):
                client_cpu = sum(proc_cpu_seconds(p.pid) for p in procs if p.pid is not None) - client_cpu0
                client_wall = now - t0
        cpu_total = proc_cpu_seconds(pid) - cpu0
        wall = time.monotonic() - t0
        for p in procs:
            p.join(30)
        events = ctl.events()
    finally:
        ctl.stop()
    lat: dict[str, list[float]] = {k: [] for k in ("heartbeat", "register", "submit", "cancel")}
    errors: Counter[str] = Counter()
    gaps: list[str] = []
    rereg = 0
    for r in results:
        for k, v in r["lat"].items():
            lat[k].extend(v)
        errors.update(r["errors"])
        gaps += r["lease_gaps"]
        rereg += r["reregistered"]
    # Lapses during the run; once the clients stop, every node lapses by design.
    end = start_at + args.duration
    unreachable = sorted({e["node_id"] for e in events
                          if e.get("event") == "node_liveness" and e.get("new") == "NODE_STATE_UNREACHABLE"
                          and e.get("old") == "NODE_STATE_READY" and _when(e) <= end})
    rounds = [e for e in events if e.get("event") == "round"]
    return {
        "agents": args.agents, "heartbeat_interval_s": args.heartbeat_interval, "lease_s": args.lease,
        "submit_rate_per_s": args.rate, "duration_s": args.duration, "client_processes": args.procs,
        "heartbeat": summary(lat["heartbeat"]), "register": summary(lat["register"]),
        "submit": summary(lat["submit"]), "cancel": summary(lat["cancel"]),
        "submits_per_s_achieved": round(len(lat["submit"]) / args.duration, 1),
        "errors": dict(errors), "reregister_answers": rereg,
        "missed_leases": {"nodes_unreachable": len(unreachable), "examples": unreachable[:10],
                          "heartbeat_gaps_over_lease": len(gaps), "gap_examples": gaps[:10]},
        "controller": {"cpu_cores_mean": round(cpu_total / wall, 3),
                       "cpu_cores_max_5s": round(max(samples), 3) if samples else None,
                       "rss_mb_max": round(rss_max, 1), "rounds": len(rounds),
                       "round_seconds_max": max((r["seconds"] for r in rounds), default=None)},
        "clients_cpu_cores_mean": round(client_cpu / client_wall, 3),
        "machine_load_1min_at_start": round(load0, 2),
        "transport": "plaintext (--insecure)" if args.insecure else
                     "mTLS: one node certificate and connection per agent; users' port TLS + bearer token",
        "node_certificates_issued_s": round(t_pki, 1),
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "note": "clients and controller share the machine's CPUs",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", type=int, default=1000)
    p.add_argument("--rate", type=float, default=100.0, help="SubmitJob calls per second")
    p.add_argument("--duration", type=float, default=600.0, help="seconds")
    p.add_argument("--heartbeat-interval", type=float, default=10.0)
    p.add_argument("--lease", type=float, default=30.0)
    p.add_argument("--job-lifetime", type=float, default=5.0, help="seconds before each job is cancelled")
    p.add_argument("--procs", type=int, default=2, help="client processes")
    p.add_argument("--deadline", type=float, default=10.0, help="per-call deadline, seconds")
    p.add_argument("--insecure", action="store_true", help="plaintext, for comparison (default: mTLS)")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    result = run(args)
    write_result(args.out, "load_agents.json", result)


if __name__ == "__main__":
    main()
