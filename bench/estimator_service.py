"""Speed of the estimator: all Cells of one job on a 4-type cluster, cold and cached, in-process and
through the tessera-estimator service.

    python bench/estimator_service.py [--quick] [--trials N] [--cached N] [--out bench/results]

For each job (registered models: a dense decoder, LLaMA-style, an encoder, a GShard MoE) on the Crius
paper's 1,280-GPU cluster (controller/sim/clusters/crius-1280.json: A100-40GB, V100-32GB, A40-48GB,
A10-24GB; Cells of 1-64 GPUs, power-of-two stage counts):

- in-process cold: a fresh Python process builds the GetCells request and times the first
  `Estimator.get_cells` (no cache of any kind yet; imports are done before the clock starts);
- in-process cached: the same request again in that process (the answer cache), and the same job
  with `best_only` (the Cell estimator's own cache of every Cell, a new answer to build);
- service cold: a freshly started `tessera-estimator`, one Health call to open the channel, then the
  first GetCells, timed at the client (serialisation, loopback gRPC, the worker thread included);
- service cached: the same call again, repeated.

Prints one JSON object and writes it to OUT/estimator_service.json. Times are wall seconds: the
median, min and max over trials (cold) or calls (cached). The machine's CPU count and load average
are recorded, since the figures scale with them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CLUSTER = REPO / "controller" / "sim" / "clusters" / "crius-1280.json"
JOBS = {  # model, global batch
    "gpt2-xl": ("gpt2-xl", 512),
    "llama2-7b": ("llama2-7b", 256),
    "bert-large": ("bert-large", 1024),
    "moe-2.4b": ("moe-2.4b", 1024),
}


def _request(model: str, batch: int, best: bool = False) -> Any:
    from tessera.clients.estimate import load_cluster
    from tessera.v1 import common_pb2, estimator_pb2

    return estimator_pb2.GetCellsRequest(model=common_pb2.ModelSpec(name=model), global_batch_size=batch,
                                         cluster=load_cluster([str(CLUSTER)]), best_only=best)


def _stats(xs: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def child_in_process(model: str, batch: int, cached: int) -> dict[str, Any]:
    """Run in a fresh process: cold, then cached, in-process timings."""
    from tessera.estimator.service.handlers import Estimator

    req, best = _request(model, batch), _request(model, batch, best=True)
    est = Estimator()
    t = time.perf_counter()
    resp = est.get_cells(req)
    cold = time.perf_counter() - t
    hits = []
    for _ in range(cached):
        t = time.perf_counter()
        est.get_cells(req)
        hits.append(time.perf_counter() - t)
    t = time.perf_counter()
    best_resp = est.get_cells(best)
    best_s = time.perf_counter() - t
    return {"cold_s": cold, "cached_s": hits, "best_from_cell_cache_s": best_s, "cells": len(resp.cells),
            "fitting": sum(c.fits for c in resp.cells), "best_cells": len(best_resp.cells),
            "response_bytes": resp.ByteSize()}


def in_process(model: str, batch: int, trials: int, cached: int) -> dict[str, Any]:
    runs = []
    for _ in range(trials):
        out = subprocess.run([sys.executable, __file__, "--child", model, str(batch), str(cached)], check=True,
                             capture_output=True, text=True, cwd=REPO)
        runs.append(json.loads(out.stdout))
    return {
        "cold_s": _stats([r["cold_s"] for r in runs]),
        "cached_s": _stats([x for r in runs for x in r["cached_s"]]),
        "best_from_cell_cache_s": _stats([r["best_from_cell_cache_s"] for r in runs]),
        "cells": runs[0]["cells"], "fitting": runs[0]["fitting"], "best_cells": runs[0]["best_cells"],
        "response_bytes": runs[0]["response_bytes"],
    }


def through_service(model: str, batch: int, trials: int, cached: int, logs: Path) -> dict[str, Any]:
    from tessera.common import identity
    from tessera.common.localcluster import start_estimator, tls_config
    from tessera.common.rpc import sync_channel
    from tessera.v1 import estimator_pb2, estimator_pb2_grpc

    req = _request(model, batch)
    colds, hits = [], []
    for i in range(trials):
        d = start_estimator(logs / f"estimator-{model}-{i}.log")
        try:
            ch = sync_channel(d.address, tls=tls_config(identity.CONTROLLER), peer=identity.ESTIMATOR)
            stub = estimator_pb2_grpc.EstimatorStub(ch)
            stub.Health(estimator_pb2.HealthRequest(), timeout=30)
            t = time.perf_counter()
            stub.GetCells(req, timeout=300)
            colds.append(time.perf_counter() - t)
            for _ in range(cached):
                t = time.perf_counter()
                stub.GetCells(req, timeout=60)
                hits.append(time.perf_counter() - t)
            ch.close()
        finally:
            d.stop()
    return {"cold_s": _stats(colds), "cached_s": _stats(hits)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=5, help="cold runs (fresh processes) per job and path")
    p.add_argument("--cached", type=int, default=20, help="cached calls per trial")
    p.add_argument("--quick", action="store_true", help="one job, 2 trials, 5 cached calls")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child_in_process(args.child[0], int(args.child[1]), int(args.child[2]))))
        return 0
    jobs = dict(list(JOBS.items())[:1]) if args.quick else JOBS
    trials, cached = (2, 5) if args.quick else (args.trials, args.cached)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"estimator-bench-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    from tessera.clients.estimate import load_cluster

    pools = [{"gpu": x.gpu, "num_gpus": x.num_gpus, "gpus_per_node": x.gpus_per_node}
             for x in load_cluster([str(CLUSTER)]).pools]
    result: dict[str, Any] = {
        "benchmark": "estimator_service", "cluster": CLUSTER.name, "pools": pools,
        "trials": trials, "cached_calls_per_trial": cached,
        "machine": {"cpus": os.cpu_count(), "load_average_before": os.getloadavg(),
                    "python": platform.python_version(), "platform": platform.platform()},
        "jobs": {},
    }
    for name, (model, batch) in jobs.items():
        local = in_process(model, batch, trials, cached)
        remote = through_service(model, batch, trials, cached, logs)
        result["jobs"][name] = {"model": model, "global_batch": batch, "in_process": local, "service": remote}
    result["machine"]["load_average_after"] = os.getloadavg()
    text = json.dumps(result, indent=2)
    print(text)
    (out_dir / "estimator_service.json").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
