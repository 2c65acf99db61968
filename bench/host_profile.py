"""Where a host-bound training step's time goes, at two token counts: torch.profiler over a few steps
of one recipe case of bench/recipe_cases.py, built as the recipe benches build it.

Run 5 of docs/estimator-gpu.md found eager per-op SAC's step flat over the micro-batch (host-bound)
yet about 1.4x the host cost bench/host_overhead.py measures at 64 tokens. This prints, per token
count: the step's wall time (unprofiled), how many kernels the host launched and its time in the
CUDA runtime's calls, the calls that wait for the GPU (synchronizations, device-to-host copies) and
the allocator's cudaMalloc/cudaFree, the GPU's kernel time, and the operators with the most host
time of their own. Nothing here feeds the estimator; it says where the gap lies.

    python bench/host_profile.py [--case "sac-sweep tt 1B fsdp op-sac mb1"] [--seqs 64,2048]
                                 [--steps 3] [--warmup 3] [--out FILE] [--device cuda]

Writes bench/results/host_profile.json (or FILE).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import recipe_steps
from recipe_cases import Case, cases

DEFAULT_OUT = REPO / "bench" / "results" / "host_profile.json"
# CUDA runtime/driver calls that block the host until the GPU catches up.
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy ",
         "cudaMemcpyAsync", "cuStreamSynchronize")
ALLOC = ("cudaMalloc", "cudaFree")
LAUNCH = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


def _ms(us: float, steps: int) -> float:
    return round(us / 1e3 / steps, 3)


def summarize(prof: Any, steps: int) -> dict[str, Any]:
    """Per step: the runtime calls by kind and the operators with the most host time of their own."""
    rows = prof.key_averages()
    calls = {r.key: (r.count, r.self_cpu_time_total) for r in rows}

    def group(names: tuple[str, ...]) -> dict[str, Any]:
        hit = {k: v for k, v in calls.items() if any(k.startswith(n.strip()) for n in names)}
        return {"calls": round(sum(c for c, _ in hit.values()) / steps, 1),
                "host_ms": _ms(sum(t for _, t in hit.values()), steps),
                "by_name": {k: [round(c / steps, 1), _ms(t, steps)] for k, (c, t) in sorted(hit.items())}}

    def device_us(r: Any) -> float:
        return float(getattr(r, "self_device_time_total", 0.0) or getattr(r, "self_cuda_time_total", 0.0) or 0.0)

    kernels = sum(device_us(r) for r in rows if not r.key.startswith("aten::") and device_us(r) > 0
                  and not r.key.startswith(("cuda", "cu")))
    ops = sorted((r for r in rows if r.key.startswith(("aten::", "c10d::", "_c10d", "autograd", "torch::"))
                  or "Checkpoint" in r.key or "Backward" in r.key),
                 key=lambda r: -r.self_cpu_time_total)[:15]
    host_total = sum(r.self_cpu_time_total for r in rows)
    return {"host_self_ms_all": _ms(host_total, steps), "gpu_kernel_ms": _ms(kernels, steps),
            "launches": group(LAUNCH), "waits": group(WAITS), "allocator": group(ALLOC),
            "top_ops": [[r.key, round(r.count / steps, 1), _ms(r.self_cpu_time_total, steps)] for r in ops]}


def measure(case: Case, device: str, warmup: int, steps: int) -> dict[str, Any]:
    """The case's median unprofiled step, then `steps` steps under the profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    out: dict[str, Any] = {}
    real = recipe_steps._timed

    def timed(step: Any, dev: str, w: int, n: int) -> recipe_steps.StepRun:
        run = real(step, dev, w, n)
        out["step_s"] = [round(s, 5) for s in run.step_s]
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
        with profile(activities=acts) as prof:
            for _ in range(steps):
                step()
            if dev == "cuda":
                torch.cuda.synchronize()
        out["profile"] = summarize(prof, steps)
        return run

    train = recipe_steps.train_torchtitan if case.stack == "torchtitan" else recipe_steps.train_transformers
    recipe_steps._timed = timed  # the trainers' own build and step, profiled after their timed steps
    try:
        torch.manual_seed(0)
        train(case, device, False, warmup, max(3, steps))
    finally:
        recipe_steps._timed = real
    out["step_median_s"] = round(statistics.median(out["step_s"]), 5)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default="sac-sweep tt 1B fsdp op-sac mb1")
    ap.add_argument("--seqs", default="64,2048", help="token counts per sample, comma-separated")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--layers", type=int, default=0, help="decoder layers (default: the case's)")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args()
    found = {c.name: c for c in cases(tiny=args.device == "cpu")} | {c.name: c for c in cases()}
    if args.case not in found:
        ap.error(f"--case: unknown {args.case!r}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TESSERA_RECIPES_TORCHTITAN", "native")  # as the recorded runs
    import torch

    recipe_steps._init_dist(args.device)
    base = found[args.case]
    result: dict[str, Any] = {"benchmark": "host_profile", "case": base.name, "torch": torch.__version__,
                              "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                              "cpus": os.cpu_count(), "steps": args.steps, "runs": {}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for seq in sorted({int(s) for s in args.seqs.split(",")}):
        dims = dataclasses.replace(base.dims, seq_length=seq, **({"num_layers": args.layers} if args.layers else {}))
        case = dataclasses.replace(base, name=f"{base.name} seq{seq}", dims=dims)
        t0 = time.perf_counter()
        try:
            row = measure(case, args.device, args.warmup, args.steps)
        except Exception as exc:  # noqa: BLE001 - one failed size must not lose the other
            row = {"error": f"{type(exc).__name__}: {exc}"[:600]}
        row["seconds"] = round(time.perf_counter() - t0, 1)
        result["runs"][str(seq)] = row
        recipe_steps.reset_between_cases()
        out.write_text(json.dumps(result, indent=1) + "\n")
        p = row.get("profile", {})
        print(f"seq {seq:>5}: step {row.get('step_median_s', '-')} s; launches {p.get('launches', {}).get('calls')} "
              f"({p.get('launches', {}).get('host_ms')} ms); waits {p.get('waits', {}).get('calls')} "
              f"({p.get('waits', {}).get('host_ms')} ms); allocator {p.get('allocator', {}).get('calls')} "
              f"({p.get('allocator', {}).get('host_ms')} ms); gpu kernels {p.get('gpu_kernel_ms')} ms "
              f"{row.get('error', '')}", flush=True)
        for name, count, ms in p.get("top_ops", [])[:8]:
            print(f"    {ms:9.3f} ms  {count:8.1f}x  {name}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
