"""How long the host takes to issue one training step's work, per recipe: eager PyTorch launches
every kernel from Python, and a step whose kernels are short waits on the launching, not on the GPU.

Each variant is a recipe of bench/recipe_cases.py (the native FSDP2 stand-in of torchtitan's recipes,
transformers full fine-tuning, PEFT LoRA; checkpointing, Float8, torch.compile) built at a width so
small (hidden 128, 64 tokens, micro-batch 1) that no kernel runs longer than the host takes to
launch it, at two depths. The median step at each depth gives the host's seconds per decoder layer
(the slope) and per step outside the layers (the intercept: embedding, head, loss, optimizer step,
the Python loop). Nothing is fitted to a full-size run: the estimator's host floor
(tessera.estimator.host_time) is read from these numbers, and docs/estimator-gpu.md compares its
predictions with full-size runs measured apart.

    python bench/host_overhead.py [--out FILE] [--layers 2,10] [--width 128] [--budget-s 240] [--device cuda]

All variants run in this one process (the host's cost does not depend on what ran before; the
compile variants last, as they take longest). Writes bench/results/host_overhead.json (or FILE)
after every variant.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from recipe_cases import HF_FULL, HF_LORA, TT_RECIPE, Case

from tessera.estimator.host_time import VARIANTS
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan

DEFAULT_OUT = REPO / "bench" / "results" / "host_overhead.json"


# Layer shapes by hidden width: (heads, KV heads, FFN width). 128: the default probe, narrow enough
# that every kernel is shorter than its launch (Float8's rowwise GEMMs need multiples of 16);
# 2048 and 3072: Llama 3.2 1B's and 3B's layers (bench/recipe_cases.py). With 64 tokens their
# kernels are still a few microseconds, so the step stays the host's, at the full-size layer's
# tensor sizes, op for op.
WIDTHS = {128: (4, 2, 256), 2048: (32, 8, 8192), 3072: (24, 8, 8192)}


def probe_dims(layers: int, width: int = 128) -> ModelDims:
    heads, kv, ffn = WIDTHS[width]
    return ModelDims(width, layers, heads, 512, 64, f"host-probe-{layers}" + (f"-h{width}" if width != 128 else ""),
                     ffn_hidden=ffn, gated=True, num_kv_heads=kv)


def probe_case(variant: str, layers: int, width: int = 128) -> Case:
    """The bench case of one host-time variant at `layers` decoder layers."""
    plan = ExecutionPlan(micro_batch=1, **VARIANTS[variant])
    dims = probe_dims(layers, width)
    if plan.sharding == "fsdp":
        return Case(f"{variant} L{layers}", "torchtitan", "native", dims, plan, TT_RECIPE)
    return Case(f"{variant} L{layers}", "transformers", "llama", dims, plan, HF_LORA if plan.lora_rank else HF_FULL)


def slope(depths: list[int], medians: list[float]) -> tuple[float, float]:
    """Least squares (seconds per layer, seconds outside the layers) through (depth, median step)."""
    fit = statistics.linear_regression(depths, medians)
    return fit.slope, fit.intercept


def pool(paths: list[Path]) -> dict[str, tuple[float, float, int]]:
    """Per variant, the slope and intercept through every recorded run's (depth, median) points, and
    how many runs measured it: what estimator/host_time.py's HOST_TABLE holds."""
    points: dict[str, list[tuple[int, float]]] = {}
    runs: dict[str, int] = {}
    for path in paths:
        for name, row in json.loads(path.read_text())["variants"].items():
            if row.get("status") == "ok":
                points.setdefault(name, []).extend((int(d), r["median_s"]) for d, r in row["runs"].items())
                runs[name] = runs.get(name, 0) + 1
    return {n: (*slope([d for d, _ in p], [m for _, m in p]), runs[n]) for n, p in points.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--width", type=int, choices=sorted(WIDTHS), default=128,
                    help="the layers' hidden width (default 128; 2048, 3072: Llama 3.2 1B's, 3B's layers)")
    ap.add_argument("--layers", default="2,10", help="the depths measured, comma-separated (at least two)")
    ap.add_argument("--only", action="append", default=[], help="variants whose name contains this")
    ap.add_argument("--variants", help="exactly these variants, comma-separated (instead of --only)")
    ap.add_argument("--no-compile", action="store_true", help="leave out the torch.compile variants")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--budget-s", type=float, default=240.0, help="start no variant after this many seconds")
    ap.add_argument("--pool", nargs="+", metavar="FILE", help="no run: the HOST_TABLE entries pooled from recorded runs")
    args = ap.parse_args()
    if args.pool:
        for name, (per_layer, fixed, n) in pool([Path(p) for p in args.pool]).items():
            print(f'    "{name}": HostCost({per_layer:.5f}, {max(0.0, fixed):.5f}),  # {n} run{"s" if n > 1 else ""}')
        return 0
    depths = sorted({int(x) for x in args.layers.split(",")})
    if len(depths) < 2 or depths[0] < 1:
        ap.error("--layers: give at least two depths >= 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["TESSERA_RECIPES_TORCHTITAN"] = "native"  # the recorded full-size runs used the stand-in
    import torch
    from recipe_steps import _init_dist, reset_between_cases, train_torchtitan, train_transformers

    if args.device == "cuda" and not torch.cuda.is_available():
        print("host_overhead: no CUDA device here (try --device cpu)", file=sys.stderr)
        return 2
    _init_dist(args.device)
    fp8 = args.device == "cuda" and torch.cuda.get_device_capability() >= (8, 9)
    result: dict[str, Any] = {
        "benchmark": "host_overhead", "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "torch": torch.__version__,
        "python": platform.python_version(), "width": args.width, "depths": depths, "warmup": args.warmup, "steps": args.steps,
        "variants": {}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    exact = args.variants.split(",") if args.variants else []
    if unknown := [v for v in exact if v not in VARIANTS]:
        ap.error(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    names = [v for v in VARIANTS if (v in exact if exact else not args.only or any(s in v for s in args.only))
             and not (args.no_compile and VARIANTS[v].get("compile"))]
    names.sort(key=lambda v: VARIANTS[v].get("compile", False))
    for name in names:
        row: dict[str, Any] = {"plan": VARIANTS[name]}
        if VARIANTS[name].get("float8", "none") != "none" and not fp8:
            row["status"] = "skipped: float8 needs a GPU of compute capability >= 8.9"
        elif time.perf_counter() - start > args.budget_s:
            row["status"] = f"skipped: budget of {args.budget_s:.0f} s spent"
        else:
            t0 = time.perf_counter()
            try:
                medians, runs = [], {}
                for depth in depths:
                    case = probe_case(name, depth, args.width)
                    train = train_torchtitan if case.stack == "torchtitan" else train_transformers
                    torch.manual_seed(0)
                    run, _, info = train(case, args.device, False, args.warmup, args.steps)
                    med = sorted(run.step_s)[len(run.step_s) // 2]
                    medians.append(med)
                    runs[str(depth)] = {"step_s": [round(s, 5) for s in run.step_s], "median_s": round(med, 5),
                                        "built_with": info.get("built_with", case.stack)}
                    reset_between_cases()
                per_layer, fixed = slope(depths, medians)
                row.update(status="ok", runs=runs, per_layer_s=round(per_layer, 6), fixed_s=round(fixed, 6),
                           seconds=round(time.perf_counter() - t0, 1))
            except Exception as exc:  # noqa: BLE001 - one failed variant must not stop the others
                row.update(status=f"error: {type(exc).__name__}: {exc}"[:600],
                           traceback=traceback.format_exc(limit=6)[-2000:])
        result["variants"][name] = row
        if row["status"] == "ok":
            at = ", ".join(f"L{d}: {r['median_s'] * 1e3:.1f} ms" for d, r in row["runs"].items())
            shown = f"{row['per_layer_s'] * 1e3:7.3f} ms/layer {row['fixed_s'] * 1e3:7.2f} ms fixed ({at})"
        else:
            shown = row["status"]
        print(f"[{time.perf_counter() - start:6.1f} s] {name:<22} {shown}", flush=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    result["seconds"] = round(time.perf_counter() - start, 1)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

