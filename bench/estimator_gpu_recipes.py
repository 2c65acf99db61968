"""The training recipes of issue 14 run for real on one GPU, against the estimator's predictions.

Each case is a few real training steps (random tokens, AdamW) at world size 1 of
- torchtitan's Llama 3 (its own model classes, `parallelize_llama` with FSDP2 over a one-rank
  process group, its per-op selective (`op`) or full activation checkpointing, per-block
  torch.compile, Float8 linears through its Float8LinearConverter, its fp32 or chunked loss), or
- a Hugging Face transformers model built from a config (random init, SDPA attention), trained in
  full (fp32 weights, bf16 autocast) or with PEFT LoRA on a bf16 base.
For each case it records torch.cuda.max_memory_allocated and max_memory_reserved (one fresh
process per case, so every peak is the case's own), the median step time after warm-up and tokens/s,
and puts them beside tessera.estimator.memory.estimate_memory (formula) and, when the library has
it, tessera.estimator.plan_time.estimate_plan_time for the same ModelDims and ExecutionPlan.

    python bench/estimator_gpu_recipes.py [--out FILE] [--only SUBSTR ...] [--budget-s 420]
    python bench/estimator_gpu_recipes.py --device cpu --tiny   # the same code paths, tiny models,
                                                                # no memory figures (no CUDA)
    python bench/estimator_gpu_recipes.py --list                # the cases and their plans
    python bench/estimator_gpu_recipes.py --rescore FILE        # no GPU: a recorded run's measurements
                                                                # against this checkout's predictions

Prints a table and writes bench/results/estimator_gpu_recipes.json (or FILE) after every case, so a
run stopped at its time limit keeps what it measured. Exits 2 with --device cuda and no GPU.
scripts/device_recipes.sh runs it on the device machine; docs/estimator-gpu.md says how.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from cuda_stats import device_info, supports_float8
from recipe_cases import Case, cases

from tessera.estimator.memory import estimate_memory, num_params

GIB = 2**30
DEFAULT_OUT = str(REPO / "bench" / "results" / "estimator_gpu_recipes.json")
RESULT_TAG = "RECIPE-RESULT "


# ------------------------------------------------------------------------------------------------
# Predictions (no torch)

def predict(case: Case, gpu: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"params_dims": num_params(case.dims)}
    try:
        out["memory"] = estimate_memory(case.dims, case.plan, num_gpus=1).to_dict()
    except Exception as exc:  # noqa: BLE001 - a plan the formula refuses is a finding, not a crash
        out["memory"] = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        from tessera.estimator.plan_time import estimate_plan_time  # type: ignore[import-not-found]
    except ImportError as exc:
        out["time"] = {"unavailable": f"tessera.estimator.plan_time: {exc}"}
        return out
    if gpu is None:
        out["time"] = {"unavailable": "no catalog GPU to time for"}
        return out
    try:
        pt = estimate_plan_time(case.dims, case.plan, gpu)
        out["time"] = {"gpu": gpu, "iter_time": pt.iter_time, "tokens_per_second": pt.tokens_per_second,
                       "source": pt.source, "breakdown": dict(pt.breakdown)}
    except Exception as exc:  # noqa: BLE001
        out["time"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def compare(row: dict[str, Any]) -> dict[str, Any]:
    """Errors of the predictions against what was measured (None where either side is missing)."""
    meas, pred = row.get("measured") or {}, row.get("predicted") or {}
    mem, pmem, ptime = meas.get("memory") or {}, pred.get("memory") or {}, pred.get("time") or {}
    alloc, reserved = mem.get("max_allocated"), mem.get("max_reserved")
    out: dict[str, Any] = {}
    if alloc and "total" in pmem:
        tensors = pmem["total"] - pmem["other"]
        out["pred_tensor_bytes"] = tensors
        out["alloc_err"] = round((tensors - alloc) / alloc, 4)
        # MemoryBreakdown.reserved (the allocator's slack over the tensors) where the library has it;
        # else the total with its stated `other` reserve is the nearest figure.
        pred_res = pmem.get("reserved", pmem["total"])
        out["pred_reserved_bytes"] = pred_res
        out["pred_reserved_from"] = "reserved" if "reserved" in pmem else "total"
        out["reserved_err"] = round((pred_res - reserved) / reserved, 4)
        out["reserved_over_allocated"] = round(reserved / alloc, 4)
    if meas.get("step_median_s") and "iter_time" in ptime:
        out["time_err"] = round((ptime["iter_time"] - meas["step_median_s"]) / meas["step_median_s"], 4)
    if meas.get("params_real"):
        out["params_err"] = round((pred["params_dims"] - meas["params_real"]) / meas["params_real"], 6)
    return out


# ------------------------------------------------------------------------------------------------
# Driver

def _worker(args: argparse.Namespace) -> int:
    by_name = {c.name: c for c in cases(args.tiny)}
    case = by_name[args.worker]
    try:
        from recipe_steps import run_case

        res = {"status": "ok", **run_case(case, args.device, args.tiny, args.warmup, args.steps)}
    except Exception as exc:  # noqa: BLE001 - reported to the parent as the case's result
        res = {"status": "error", "error": f"{type(exc).__name__}: {exc}",
               "traceback": traceback.format_exc(limit=8)[-3000:]}
    print(RESULT_TAG + json.dumps(res), flush=True)
    return 0


def _run_isolated(case: Case, args: argparse.Namespace, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", case.name, "--device", args.device,
           "--warmup", str(args.warmup), "--steps", str(args.steps)] + (["--tiny"] if args.tiny else [])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"status": "error", "error": f"timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    return {"status": "error", "error": f"worker exited {proc.returncode} without a result",
            "stderr_tail": proc.stderr[-3000:]}


def _skip_reason(case: Case, args: argparse.Namespace, fp8: bool) -> str | None:
    if case.needs_float8 and args.device == "cuda" and not fp8:
        return "float8 needs a CUDA GPU of compute capability >= 8.9"
    if case.needs_float8 and args.device != "cuda" and case.plan.compile:
        return "float8 without an fp8 GPU is emulated, and torchtitan's emulation is eager only"
    return None


def _fmt_gib(x: Any) -> str:
    return f"{x / GIB:8.2f}" if isinstance(x, (int, float)) else f"{'-':>8}"


def _fmt_pct(x: Any) -> str:
    return f"{100 * x:+7.1f}%" if isinstance(x, (int, float)) else f"{'-':>8}"


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'case':<36} {'alloc':>8} {'reserv':>8} {'pred':>8} {'err':>8} {'pr.res':>8} {'err/res':>8} "
          f"{'res/all':>7} {'step s':>8} {'pred s':>8} {'err':>8} {'tok/s':>9}  status")
    for r in rows:
        m = (r.get("measured") or {})
        mem = m.get("memory") or {}
        pm = (r.get("predicted") or {}).get("memory") or {}
        pt = (r.get("predicted") or {}).get("time") or {}
        c = r.get("compare") or {}
        slack = c.get("reserved_over_allocated")
        step = m.get("step_median_s")
        why = r.get("error", r.get("reason", ""))
        status = f"{r['status']}: {why[:70]}" if why else r["status"]
        pred_tensors = c.get("pred_tensor_bytes", pm["total"] - pm["other"] if "total" in pm else None)
        slack_s = f"{slack:7.3f}" if slack else "-"
        step_s = f"{step:8.4f}" if step else "-"
        pred_s = f"{pt['iter_time']:8.4f}" if "iter_time" in pt else "-"
        tps = f"{m['tokens_per_s']:9.0f}" if m.get("tokens_per_s") else "-"
        print(f"{r['case']:<36} {_fmt_gib(mem.get('max_allocated'))} {_fmt_gib(mem.get('max_reserved'))} "
              f"{_fmt_gib(pred_tensors)} {_fmt_pct(c.get('alloc_err'))} "
              f"{_fmt_gib(c.get('pred_reserved_bytes', pm.get('reserved', pm.get('total'))))} "
              f"{_fmt_pct(c.get('reserved_err'))} "
              f"{slack_s:>7} {step_s:>8} {pred_s:>8} {_fmt_pct(c.get('time_err'))} {tps:>9}  {status}")
    for key, what in (("alloc_err", "memory (formula tensors vs max_allocated)"),
                      ("reserved_err", "reserved (formula reserved vs max_reserved)"),
                      ("time_err", "step time (plan_time vs median step)")):
        errs = [abs(r["compare"][key]) for r in rows if key in (r.get("compare") or {})]
        if errs:
            print(f"{what}: mean |error| {100 * sum(errs) / len(errs):.1f}%, max {100 * max(errs):.1f}% "
                  f"over {len(errs)} cases")
    if any(r.get("measured") for r in rows) and \
            not any(r["measured"].get("memory", {}).get("max_allocated") for r in rows if r.get("measured")):
        print("memory: cpu: no cuda memory stats")


def rescore(recorded: Path, out: Path | None) -> int:
    """The measurements of a recorded run beside this checkout's predictions for the same model, plan and
    GPU (each row's model and plan as recorded, so cases since renamed or removed still count)."""
    from tessera.estimator.models import ModelDims
    from tessera.estimator.plans import ExecutionPlan

    run = json.loads(recorded.read_text())
    rows = []
    for r in run["rows"]:
        case = Case(r["case"], r["stack"], r["arch"], ModelDims(**r["model"]), ExecutionPlan.from_dict(r["plan"]),
                    r.get("recipe", ""))
        row = {**r, "predicted": predict(case, run.get("predict_gpu"))}
        if row.get("measured"):
            row["compare"] = compare(row)
        rows.append(row)
    print(f"{recorded}: {run.get('device')}, torch {run.get('torch')}; predictions of this checkout")
    print_table(rows)
    if out is not None:
        out.write_text(json.dumps({**run, "rescored": True, "rows": rows}, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny models (the CPU dry run)")
    ap.add_argument("--out", help=f"where the JSON goes (default {DEFAULT_OUT}; with --rescore, nowhere)")
    ap.add_argument("--only", action="append", default=[], help="run the cases whose name contains this")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="start no case after this many seconds (0: no limit); the rest are 'skipped'")
    ap.add_argument("--case-timeout-s", type=float, default=240.0)
    ap.add_argument("--isolate", choices=("auto", "yes", "no"), default="auto",
                    help="one process per case (auto: on cuda yes, on cpu no)")
    ap.add_argument("--gpu", help="catalog GPU to predict time for (default: this device's entry)")
    ap.add_argument("--torchtitan", choices=("auto", "only", "native"), default="auto",
                    help="auto: torchtitan, or where its build fails the same recipe on torch's own APIs "
                         "(bench/recipe_native.py); only: no stand-in; native: the stand-in alone")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--predict-only", action="store_true", help="the predictions alone: no torch, no steps")
    ap.add_argument("--rescore", metavar="FILE", help="a recorded run (its JSON): predict its cases again with "
                                                      "this checkout and compare; runs nothing, writes only "
                                                      "to an --out given")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ["TESSERA_RECIPES_TORCHTITAN"] = args.torchtitan  # read by the workers (recipe_steps)
    if args.worker:
        return _worker(args)
    if args.rescore:
        return rescore(Path(args.rescore), Path(args.out) if args.out else None)
    todo = [c for c in cases(args.tiny) if not args.only or any(s in c.name for s in args.only)]
    if args.list:
        for c in todo:
            print(f"{c.name:<40} {c.stack:<12} {c.dims.signature:<48} {c.plan.key}")
        return 0
    info = {"device": "none (--predict-only)"} if args.predict_only else device_info()
    if args.device == "cuda" and info["device"] == "cpu":
        print("estimator_gpu_recipes: no CUDA device here (try --device cpu --tiny)", file=sys.stderr)
        return 2
    fp8 = args.device == "cuda" and not args.predict_only and supports_float8()
    gpu = args.gpu or info.get("catalog") or (None if args.device == "cuda" else "H100-80GB")
    isolate = args.isolate == "yes" or (args.isolate == "auto" and args.device == "cuda")
    result: dict[str, Any] = {"benchmark": "estimator_gpu_recipes", **info, "run_device": args.device,
                              "tiny": args.tiny, "float8_supported": fp8, "predict_gpu": gpu,
                              "warmup": args.warmup, "steps": args.steps, "rows": []}
    out = Path(args.out or DEFAULT_OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    broken: dict[str, str] = {}  # stack -> why it cannot run here (an import that failed)
    for case in todo:
        row: dict[str, Any] = {"case": case.name, "stack": case.stack, "arch": case.arch,
                               "model": asdict(case.dims), "plan": case.plan.to_dict(), "plan_key": case.plan.key,
                               "recipe": case.recipe, "predicted": predict(case, gpu)}
        reason = _skip_reason(case, args, fp8)
        if reason is None and case.stack in broken:
            reason = f"{case.stack} did not import here: {broken[case.stack]}"
        if reason is None and args.budget_s and time.perf_counter() - start > args.budget_s:
            reason = f"time budget of {args.budget_s:.0f} s spent"
        if args.predict_only:
            row.update(status="predicted")
        elif reason:
            row.update(status="skipped", reason=reason)
        else:
            t0 = time.perf_counter()
            if isolate:
                res = _run_isolated(case, args, args.case_timeout_s)
            else:
                from recipe_steps import reset_between_cases, run_case

                try:
                    res = {"status": "ok", **run_case(case, args.device, args.tiny, args.warmup, args.steps)}
                except Exception as exc:  # noqa: BLE001 - one failed case must not stop the others
                    res = {"status": "error", "error": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc(limit=8)[-3000:]}
                reset_between_cases()
            row["status"] = res.pop("status")
            if "error" in res:
                row["error"] = res.pop("error")
                if row["error"].startswith(("ImportError", "ModuleNotFoundError")):
                    # The same import fails in every later case of the stack: save their minutes.
                    broken[case.stack] = row["error"]
            row["measured"] = res
            row["case_s"] = round(time.perf_counter() - t0, 1)
            row["compare"] = compare(row)
        result["rows"].append(row)
        print(f"[{time.perf_counter() - start:6.1f} s] {case.name}: {row['status']} "
              f"{row.get('error', row.get('reason', ''))}", flush=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    result["seconds"] = round(time.perf_counter() - start, 1)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print_table(result["rows"])
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
