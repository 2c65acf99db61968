"""The GPU isolation check on a real GPU (nodeagent/gpuguard.py, docs/agent.md "GPU isolation").

A worker-like process (its own session, as the agent's keepers start them) allocates memory on
GPU 0; the agent's NVML probe (inventory.probe_nvml) must list its session on GPU 0, and the guard
must evict a job whose attempt was given another GPU there and leave one given GPU 0 alone. Prints
what NVML saw and writes bench/results/gpu_guard.json (or --out). Exits 2 without NVML or a GPU.

    python bench/gpu_guard.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

HOLD = ("import torch, sys, time; x = torch.ones(256 * 2**20, device='cuda'); torch.cuda.synchronize(); "
        "print('ready', flush=True); time.sleep(120)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "gpu_guard.json"))
    args = ap.parse_args()
    from tessera.nodeagent.gpuguard import trespasses
    from tessera.nodeagent.inventory import NvmlUnavailable, probe_nvml
    from tessera.v1 import agent_pb2, common_pb2

    try:
        probe_nvml()
    except NvmlUnavailable as exc:
        print(f"gpu_guard: {exc}", file=sys.stderr)
        return 2
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0")
    proc = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            print("gpu_guard: the worker did not start", file=sys.stderr)
            return 1
        seen: dict[int, set[int]] = {}
        t0 = time.perf_counter()
        inv = probe_nvml(own_pids={proc.pid}, sessions=seen)
        probe_s = time.perf_counter() - t0
        running = common_pb2.WORKER_STATE_RUNNING
        own = [agent_pb2.WorkerStatus(job_id="given-0", attempt=1, pid=proc.pid, gpu_indices=[0], state=running)]
        other = [agent_pb2.WorkerStatus(job_id="given-1", attempt=1, pid=proc.pid, gpu_indices=[1], state=running)]
        result = {
            "benchmark": "gpu_guard", "gpus": [g.model for g in inv.gpus], "worker_pid": proc.pid,
            "sessions_seen": {str(k): sorted(v) for k, v in seen.items()},
            "foreign_used_bytes": [g.foreign_used_bytes for g in inv.gpus], "probe_s": round(probe_s, 4),
            "given_gpu0": trespasses(own, seen), "given_gpu1": trespasses(other, seen),
        }
    finally:
        proc.kill()
        proc.wait()
    ok = result["given_gpu0"] == {} and "given-1" in result["given_gpu1"]
    result["ok"] = ok
    print(json.dumps(result, indent=1))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'OK' if ok else 'NOT SEEN'}: wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
