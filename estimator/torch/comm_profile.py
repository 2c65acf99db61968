"""Offline communication profiler: collectives and p2p with torch.distributed, written as a CommTable.

Crius profiles communication operators offline, per interconnect, and interpolates by traffic at
estimation time (Crius Sec. 5.1: "A Codesign of Scheduling and Parallelization for Large Model
Training in Heterogeneous Clusters", arXiv 2024). This tool measures all-reduce, all-gather,
reduce-scatter, all-to-all and point-to-point for a range of message sizes across N local processes
and writes the JSON that `tessera.estimator.comm.CommTable.from_json` reads:

    python -m tessera.estimator.torch.comm_profile --backend gloo --out table.json            # CPU, 2 processes
    python -m tessera.estimator.torch.comm_profile --backend nccl --world 8 --link nvlink --out nvlink.json
    torchrun --nnodes 2 --nproc-per-node 1 ... -m tessera.estimator.torch.comm_profile --backend nccl --link ib --out ib.json

Without RANK/WORLD_SIZE in the environment it spawns `--world` local processes itself; under torchrun
it runs as one of the ranks (rank 0 writes the file). Timing: `--warmup` untimed calls, then `--iters`
timed calls, each the slowest rank's time (all-reduce MAX), the median kept. p2p is a ping-pong between
ranks 0 and 1 (one-way = round trip / 2). An op the backend does not support is skipped and listed in
the table's "unsupported". Sizes follow nccl-tests (see estimator/comm.py).

torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from tessera.estimator.comm import COLLECTIVES, LINK_KINDS

DEFAULT_SIZES = tuple(1 << k for k in range(10, 25, 2))  # 1 KiB .. 16 MiB


def _parse_size(text: str) -> int:
    t = text.strip().lower()
    for suffix, mult in (("gib", 1 << 30), ("mib", 1 << 20), ("kib", 1 << 10), ("g", 1 << 30),
                         ("m", 1 << 20), ("k", 1 << 10), ("b", 1)):
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * mult)
    return int(t)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_op(dist: Any, torch: Any, op: str, nbytes: int, world: int, rank: int, device: Any) -> None:
    elems = max(world, nbytes // 4)
    elems -= elems % world
    if op == "all_reduce":
        dist.all_reduce(torch.ones(elems, device=device))
    elif op == "all_gather":
        out = torch.empty(elems, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, torch.ones(elems // world, device=device))
    elif op == "reduce_scatter":
        out = torch.empty(elems // world, device=device)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        scatter(out, torch.ones(elems, device=device))
    elif op == "all_to_all":
        out = torch.empty(elems, device=device)
        dist.all_to_all_single(out, torch.ones(elems, device=device))
    elif op == "p2p":
        buf = torch.ones(elems, device=device)
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)
    else:
        raise ValueError(f"op: unknown collective {op!r}")


def measure(ops: Sequence[str], sizes: Sequence[int], iters: int, warmup: int, link: str,
            device_kind: str) -> dict[str, Any]:
    """Measure every (op, size) in an initialised process group; returns the table as a dict."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if device_kind == "cuda" else torch.device("cpu")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    entries: list[dict[str, Any]] = []
    unsupported: list[str] = []
    for op in ops:
        if op == "p2p" and world < 2:
            continue
        try:
            _run_op(dist, torch, op, 1024, world, rank, device)
            sync()
        except (RuntimeError, NotImplementedError, ValueError) as exc:
            unsupported.append(f"{op}: {str(exc).splitlines()[0][:120]}")
            dist.barrier()
            continue
        for nbytes in sizes:
            for _ in range(warmup):
                _run_op(dist, torch, op, nbytes, world, rank, device)
            sync()
            samples = []
            for _ in range(iters):
                dist.barrier()
                t0 = time.perf_counter()
                _run_op(dist, torch, op, nbytes, world, rank, device)
                sync()
                dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                samples.append(float(dt.item()))
            secs = statistics.median(samples)
            if op == "p2p":
                secs /= 2.0  # ping-pong round trip
            entries.append({"op": op, "link": link, "world": 2 if op == "p2p" else world,
                            "bytes": nbytes, "seconds": secs})
    return {"version": 1, "name": f"{link}-{dist.get_backend()}-w{world}", "backend": dist.get_backend(),
            "device": device.type, "link": link, "world": world, "host": socket.gethostname(),
            "iters": iters, "warmup": warmup, "unsupported": unsupported, "entries": entries}


def _worker(rank: int, world: int, port: int, backend: str, args: dict[str, Any], out: str) -> None:
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(rank % max(1, torch.cuda.device_count()))
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    try:
        table = measure(args["ops"], args["sizes"], args["iters"], args["warmup"], args["link"],
                        "cuda" if backend == "nccl" else "cpu")
        if rank == 0:
            Path(out).write_text(json.dumps(table, indent=1))
    finally:
        dist.destroy_process_group()


def profile_local(world: int, backend: str, ops: Sequence[str], sizes: Sequence[int], iters: int = 5,
                  warmup: int = 2, link: str = "loopback") -> dict[str, Any]:
    """Spawn `world` local processes, measure, and return the table (a dict for CommTable.from_json)."""
    from torch.multiprocessing.spawn import start_processes

    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "table.json")
        args = {"ops": list(ops), "sizes": list(sizes), "iters": iters, "warmup": warmup, "link": link}
        start_processes(  # type: ignore[no-untyped-call]
            _worker, args=(world, port, backend, args, out), nprocs=world, join=True, start_method="spawn")
        result: dict[str, Any] = json.loads(Path(out).read_text())
        return result


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tessera.estimator.torch.comm_profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    ap.add_argument("--out", required=True, help="JSON file to write (tessera.estimator.comm.CommTable format)")
    ap.add_argument("--world", type=int, default=2, help="local processes to spawn (ignored under torchrun)")
    ap.add_argument("--ops", default=",".join(COLLECTIVES), help="comma-separated subset of " + ",".join(COLLECTIVES))
    ap.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES),
                    help="comma-separated message sizes (bytes, or 4KiB, 16MiB)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--link", default="", help=f"link kind to record ({', '.join(LINK_KINDS)}); "
                    "default loopback for gloo, nvlink for nccl")
    a = ap.parse_args(argv)
    ops = [o.strip() for o in a.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in COLLECTIVES]
    if bad:
        ap.error(f"--ops: unknown {', '.join(bad)}; known: {', '.join(COLLECTIVES)}")
    try:
        sizes = sorted({_parse_size(s) for s in a.sizes.split(",") if s.strip()})
    except ValueError:
        ap.error(f"--sizes: cannot parse {a.sizes!r}")
    if not sizes or sizes[0] <= 0:
        ap.error("--sizes: sizes must be > 0")
    link = a.link or ("loopback" if a.backend == "gloo" else "nvlink")
    if link not in LINK_KINDS:
        ap.error(f"--link: unknown {link!r}; known: {', '.join(LINK_KINDS)}")
    if a.iters < 1 or a.warmup < 0:
        ap.error("--iters must be >= 1 and --warmup >= 0")

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun: one rank of many
        import torch
        import torch.distributed as dist

        if a.backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(a.backend, timeout=timedelta(seconds=120))
        try:
            table = measure(ops, sizes, a.iters, a.warmup, link, "cuda" if a.backend == "nccl" else "cpu")
            if dist.get_rank() == 0:
                Path(a.out).write_text(json.dumps(table, indent=1))
        finally:
            dist.destroy_process_group()
    else:
        if a.world < 1:
            ap.error("--world must be >= 1")
        table = profile_local(a.world, a.backend, ops, sizes, a.iters, a.warmup, link)
        Path(a.out).write_text(json.dumps(table, indent=1))
    if os.environ.get("RANK", "0") == "0":
        t = json.loads(Path(a.out).read_text())
        print(f"wrote {a.out}: {len(t['entries'])} points, backend {t['backend']}, world {t['world']}, "
              f"link {t['link']}" + (f"; unsupported: {t['unsupported']}" if t["unsupported"] else ""),
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
