"""Host-side step time of k concurrent torch workers: torch's default thread pool against the agent's.

Why: on the Morphling artifact's cluster, ViT and T5 jobs ran much slower than any model predicts
whenever several single-GPU pods shared a server (docs/estimator-perf-model.md). torchrun sets
OMP_NUM_THREADS=1 only when it starts more than one process itself, so each single-GPU pod ran with
an OpenMP pool of every core of the server. This program reproduces that on any machine: k worker
processes run the same CPU-side step (a ViT-style input pipeline: 8 images of 224x224x3 to
normalised float tensors, then 200 small in-place updates, the shape of an optimizer step's host
work), all at once, first with OMP_NUM_THREADS unset (torch's default: every usable CPU), then with
what the Tessera agent gives a worker (tessera.nodeagent.contract.cpu_threads_per_gpu: usable CPUs / GPUs,
here with k GPUs on the node).

    python bench/worker_threads.py [--workers 1,2,3,4] [--steps 400] [--out bench/results]

Prints a table and writes bench/results/worker_threads.json. Needs torch.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tessera.nodeagent.contract import cpu_threads_per_gpu
from tessera.nodeagent.process import usable_cpus

WARMUP_STEPS = 5


def worker(steps: int) -> None:
    """One worker: warm up, say ready, wait for the go line, time `steps` steps, print seconds/step."""
    import torch

    gen = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (224, 224, 3), dtype=torch.uint8, generator=gen) for _ in range(8)]
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    params = [torch.zeros(64) for _ in range(200)]

    def step() -> float:
        batch = torch.stack([(im.permute(2, 0, 1).float() / 255.0 - mean) / std for im in images])
        for p in params:
            p.mul_(0.99).add_(0.01)
        return float(batch.sum())

    for _ in range(WARMUP_STEPS):
        step()
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    print(json.dumps({"step_s": (time.perf_counter() - t0) / steps, "threads": torch.get_num_threads()}), flush=True)


def run_group(k: int, omp: int | None, steps: int) -> dict[str, Any]:
    """Start k workers, release them together, collect their seconds per step."""
    env = {key: v for key, v in os.environ.items() if key != "OMP_NUM_THREADS"}
    if omp is not None:
        env["OMP_NUM_THREADS"] = str(omp)
    argv = [sys.executable, __file__, "--worker", "--steps", str(steps)]
    procs = [
        subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(k)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a worker did not start; is torch installed?")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=600)
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    times = [r["step_s"] for r in results]
    return {
        "workers": k,
        "omp_num_threads": "unset" if omp is None else omp,
        "torch_threads": results[0]["threads"],
        "step_ms_median": round(statistics.median(times) * 1e3, 3),
        "step_ms_max": round(max(times) * 1e3, 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="1,2,3,4", help="comma-separated worker counts (default 1,2,3,4)")
    ap.add_argument("--steps", type=int, default=400, help="timed steps per worker (default 400)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"), help="folder for the JSON result")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.steps)
        return 0
    try:
        counts = [int(x) for x in args.workers.split(",")]
    except ValueError:
        ap.error(f"--workers: {args.workers!r} is not a comma-separated list of integers")
    if args.steps < 1 or any(k < 1 for k in counts):
        ap.error("--steps and every --workers count must be >= 1")
    cpus = usable_cpus()
    rows = []
    print(f"{cpus} usable CPUs; ms per step, median over the workers (max)")
    print(f"{'workers':>7}  {'torch default':>22}  {'agent share':>22}  slowdown")
    for k in counts:
        share = cpu_threads_per_gpu(cpus, k)
        default = run_group(k, None, args.steps)
        agent = run_group(k, share, args.steps)
        ratio = default["step_ms_median"] / agent["step_ms_median"]
        rows.append({"workers": k, "torch_default": default, "agent_share": agent, "slowdown": round(ratio, 2)})
        d = f"{default['step_ms_median']:.1f} ({default['step_ms_max']:.1f}), {default['torch_threads']} thr"
        a = f"{agent['step_ms_median']:.1f} ({agent['step_ms_max']:.1f}), {agent['torch_threads']} thr"
        print(f"{k:>7}  {d:>22}  {a:>22}  {ratio:.2f}x")
    result = {
        "benchmark": "worker_threads",
        "machine": {"usable_cpus": cpus, "platform": platform.platform(), "python": platform.python_version()},
        "steps": args.steps,
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "worker_threads.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out / 'worker_threads.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
