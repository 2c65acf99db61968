"""Memory per GPU: the analytical formula against traced mode, against the Crius artifact's measured
data-parallel memory, and traced mode against real CPU steps.

    python bench/estimator_memory.py [--quick] [--out bench/results]

1. Grid (>= 50 configurations, 125M..13B, DP/TP/PP, ZeRO 0-2, recomputation, precision recipes,
   batch and sequence lengths): relative error of the formula's tensor bytes (parameters +
   gradients + optimizer + activations; the `other` reserve is the same constant in both and is
   left out) against traced mode (FakeTensorMode + MemTracker), mean and max, and traced wall time.
   ZeRO-3/FSDP and interleaved plans are formula-only (traced mode does not simulate them): listed.
2. ../shared/data/arena/dp_mem.json (the Crius artifact's measured per-GPU memory of data-parallel
   BERT and GShard-MoE training under Alpa; Wide-ResNet is not a transformer and is skipped): the
   formula for the same run (Alpa's settings read from the artifact's trainer: 16 micro-batches,
   GPipe schedule, coarse-grained rematerialisation, fp16 params with fp32 gradient accumulation and
   fp32 master + Adam (BERT) or Adafactor (MoE), optimizer state sharded over DP ranks by
   prefer_reduce_scatter, i.e. ZeRO-1) against the measured GiB: mean, median and max relative error.
3. Traced against real on this CPU: the same small model's step on real tensors, measured by
   MemTracker (to the byte) and by the OS (peak RSS in a child process).

Prints one JSON object and writes it to OUT/estimator_memory.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tessera.estimator.memory import estimate_memory, num_params
from tessera.estimator.memory_terms import GIB
from tessera.estimator.models import REGISTERED, ModelDims
from tessera.estimator.plans import ExecutionPlan


def shared_data() -> Path:
    d = REPO.parent / "shared" / "data"
    if not (d / "arena" / "dp_mem.json").is_file():
        sys.exit(f"shared data not found: expected {d}/arena/dp_mem.json (the checkout's ../shared/data)")
    return d


def arena_models(data: Path) -> dict[str, ModelDims]:
    dims = json.loads((data / "arena" / "models.json").read_text())
    out: dict[str, ModelDims] = {}
    for size, d in dims["bert"].items():
        out[f"bert_{size}"] = ModelDims(d["hidden_size"], d["num_layers"], d["num_heads"], d["vocab_size"],
                                        d["seq_len"], f"bert-{size}", family="encoder", tied_embeddings=False)
    for size, d in dims["moe"].items():
        out[f"moe_{size}"] = ModelDims(d["hidden_size"], d["num_layers"], d["num_heads"], d["vocab_size"],
                                       d["seq_len"], f"moe-{size}", family="moe", num_experts=d["num_experts"],
                                       ffn_hidden=8 * d["hidden_size"], tied_embeddings=False)
    return out


def m(name: str, seq: int | None = None) -> ModelDims:
    base = REGISTERED[name]
    return base if seq is None else dataclasses.replace(base, seq_length=seq, name=f"{name}-s{seq}")


def P(**kw: Any) -> ExecutionPlan:
    return ExecutionPlan(**kw)


def grid(arena: dict[str, ModelDims]) -> list[tuple[ModelDims, ExecutionPlan]]:
    g, g2, gl, gx = "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"
    l7, l13, bl = "llama2-7b", "llama2-13b", "bert-large"
    return [
        (m(g), P(micro_batch=8)),
        (m(g), P(dp=8, sharding="zero1", micro_batch=8)),
        (m(g), P(dp=8, sharding="zero2", micro_batch=4, precision="mixed")),
        (m(g), P(tp=2, micro_batch=8, flash_attention=False)),
        (m(g), P(tp=2, sequence_parallel=True, micro_batch=8)),
        (m(g), P(micro_batch=16, checkpointing="full")),
        (m(g), P(micro_batch=4, precision="fp32")),
        (m(g), P(micro_batch=4, precision="amp")),
        (m(g), P(pp=2, grad_accum=8, micro_batch=4)),
        (m(g, 2048), P(micro_batch=4)),
        (m(g, 512), P(micro_batch=32, dp=4, sharding="zero2")),
        (m(g2), P(dp=4, sharding="zero2", micro_batch=8)),
        (m(g2), P(tp=4, sequence_parallel=True, micro_batch=4, checkpointing="selective", flash_attention=False)),
        (m(g2), P(pp=4, grad_accum=16, micro_batch=2)),
        (m(g2), P(micro_batch=8, precision="bf16")),
        (m(g2), P(dp=2, sharding="zero1", micro_batch=4, precision="megatron-fp16")),
        (m(g2), P(micro_batch=32, checkpointing="full")),
        (m(g2, 256), P(micro_batch=64, flash_attention=False)),
        (m(gl), P(dp=8, sharding="zero1", micro_batch=4)),
        (m(gl), P(tp=4, micro_batch=4)),
        (m(gl), P(tp=2, pp=2, grad_accum=8, micro_batch=2)),
        (m(gl), P(micro_batch=16, checkpointing="full")),
        (m(gl), P(dp=8, sharding="zero2", offload="optimizer", micro_batch=8)),
        (m(gx), P(pp=2, grad_accum=4, micro_batch=4, checkpointing="full")),
        (m(gx), P(pp=4, grad_accum=8, micro_batch=2)),
        (m(gx), P(dp=8, sharding="zero2", micro_batch=2, checkpointing="full")),
        (m(gx), P(pp=8, grad_accum=16, micro_batch=1)),
        (m(gx), P(dp=4, sharding="zero1", micro_batch=2, precision="amp")),
        (m(gx, 2048), P(pp=4, grad_accum=4, micro_batch=2)),
        (m(l7), P(tp=8, micro_batch=1)),
        (m(l7), P(tp=8, sequence_parallel=True, micro_batch=1)),
        (m(l7), P(tp=4, pp=2, grad_accum=8, micro_batch=1, sequence_parallel=True)),
        (m(l7), P(tp=2, pp=4, grad_accum=16, micro_batch=1, checkpointing="full")),
        (m(l7), P(dp=8, sharding="zero1", micro_batch=1, checkpointing="full")),
        (m(l7, 2048), P(tp=8, micro_batch=2, checkpointing="selective", flash_attention=False)),
        (m(l7), P(pp=8, grad_accum=32, micro_batch=1)),
        (m(l7), P(tp=4, sequence_parallel=True, micro_batch=1, precision="bf16")),
        (m(l7, 1024), P(tp=8, sequence_parallel=True, micro_batch=8, checkpointing="full")),
        (m(l7, 8192), P(tp=8, sequence_parallel=True, micro_batch=1)),
        (m(l7), P(tp=8, micro_batch=1, precision="amp")),
        (m(l7), P(tp=4, pp=2, grad_accum=4, micro_batch=1, precision="megatron-fp16")),
        (m(l13), P(tp=8, sequence_parallel=True, micro_batch=1)),
        (m(l13), P(tp=8, pp=2, grad_accum=8, micro_batch=1, sequence_parallel=True)),
        (m(l13), P(tp=4, pp=4, grad_accum=16, micro_batch=1, sequence_parallel=True, checkpointing="full")),
        (m(l13), P(dp=16, tp=8, sharding="zero2", micro_batch=1, sequence_parallel=True)),
        (m(l13), P(tp=8, pp=4, grad_accum=32, micro_batch=1)),
        (m(l13, 2048), P(tp=8, pp=2, grad_accum=4, micro_batch=2)),
        (m(bl), P(micro_batch=16)),
        (m(bl), P(dp=8, sharding="zero1", micro_batch=32, checkpointing="full")),
        (m(bl), P(tp=2, micro_batch=16, flash_attention=False)),
        (m(bl), P(micro_batch=16, precision="amp")),
        (m(bl), P(pp=2, grad_accum=8, micro_batch=8)),
        (arena["bert_1.3B"], P(dp=4, sharding="zero1", micro_batch=2, grad_accum=16, schedule="gpipe",
                               checkpointing="full", flash_attention=False)),
        (arena["bert_1.3B"], P(tp=2, micro_batch=4)),
        (m("moe-1.3b"), P(dp=8, ep=8, sharding="zero1", micro_batch=2, precision="mixed-adafactor")),
        (m("moe-1.3b"), P(dp=4, ep=4, micro_batch=4)),
        (m("moe-1.3b"), P(dp=2, ep=2, tp=2, micro_batch=2)),
        (m("moe-1.3b"), P(pp=2, grad_accum=4, micro_batch=2, checkpointing="full")),
        (m("moe-2.4b"), P(dp=16, ep=16, sharding="zero2", micro_batch=1)),
        (m("moe-2.4b"), P(dp=8, sharding="zero1", micro_batch=2, grad_accum=8, schedule="gpipe",
                          checkpointing="full", precision="mixed-adafactor", flash_attention=False)),
        (m("moe-690m"), P(dp=4, ep=4, micro_batch=4)),
    ]


FORMULA_ONLY = [
    ("gpt2-xl", P(dp=8, sharding="zero3", micro_batch=2)),
    ("llama2-7b", P(dp=8, sharding="fsdp", micro_batch=1, precision="amp", checkpointing="full")),
    ("llama2-13b", P(dp=64, sharding="zero3", offload="optimizer+params", micro_batch=1)),
    ("llama2-13b", P(tp=8, pp=4, virtual_stages=2, grad_accum=32, micro_batch=1, sequence_parallel=True)),
]


def rel(a: float, b: float) -> float:
    return (a - b) / b


def run_grid(cfgs: list[tuple[ModelDims, ExecutionPlan]]) -> dict[str, Any]:
    from tessera.estimator.torch.traced import traced_memory

    rows = []
    for model, plan in cfgs:
        t0 = time.perf_counter()
        tr = traced_memory(model, plan)
        wall = time.perf_counter() - t0
        f = estimate_memory(model, plan)
        rows.append({
            "model": model.name, "params": num_params(model), "plan": plan.key,
            "formula_gib": round(f.tensor_bytes / GIB, 3), "traced_gib": round(tr.tensor_bytes / GIB, 3),
            "rel_err": round(rel(f.tensor_bytes, tr.tensor_bytes), 5),
            "activations_rel_err": round(rel(f.activations, tr.activations), 5) if tr.activations else None,
            "stage": tr.stage, "traced_s": round(wall, 2),
        })
        print(f"  {model.name:18s} {plan.key:80s} formula {f.tensor_bytes / GIB:8.2f} traced "
              f"{tr.tensor_bytes / GIB:8.2f} GiB  err {rows[-1]['rel_err']:+.4f}  {wall:5.1f}s", file=sys.stderr)
    errs = [abs(r["rel_err"]) for r in rows]
    big = [r["traced_s"] for r in rows if r["params"] > 5e9]
    return {
        "n": len(rows), "mean_abs_rel_err": round(statistics.mean(errs), 5), "max_abs_rel_err": round(max(errs), 5),
        "median_abs_rel_err": round(statistics.median(errs), 5),
        "within_1pct": sum(e <= 0.01 for e in errs), "within_3pct": sum(e <= 0.03 for e in errs),
        "traced_seconds_max_7b_13b": max(big) if big else None,
        "traced_seconds_mean_7b_13b": round(statistics.mean(big), 2) if big else None,
        "rows": rows,
    }


def run_formula_only() -> list[dict[str, Any]]:
    out = []
    for name, plan in FORMULA_ONLY:
        f = estimate_memory(REGISTERED[name], plan)
        out.append({"model": name, "plan": plan.key, "formula_gib": round(f.tensor_bytes / GIB, 3),
                    "cpu_gib": round(f.cpu_bytes / GIB, 3), "why": "traced mode does not simulate this plan"})
    return out


def run_arena(data: Path, arena: dict[str, ModelDims]) -> dict[str, Any]:
    measured = json.loads((data / "arena" / "dp_mem.json").read_text())[0]
    rows, skipped, oom = [], 0, []
    for key, values in measured.items():
        fam_size, batch = key.rsplit("_", 1)
        if fam_size.startswith("wide_resnet"):
            skipped += len(values)
            continue
        model = arena[fam_size]
        for i, gib in enumerate(values):
            n, b = 2**i, int(batch)
            if b % (16 * n):
                continue  # Alpa's 16 micro-batches do not split the batch over n GPUs
            plan = ExecutionPlan(dp=n, sharding="zero1" if n > 1 else "none", micro_batch=b // 16 // n, grad_accum=16,
                                 schedule="gpipe", checkpointing="full", flash_attention=False,
                                 precision="megatron-bf16" if model.family == "encoder" else "mixed-adafactor")
            est = estimate_memory(model, plan, other_bytes=0).total / GIB
            if gib < 0:
                oom.append({"model": key, "gpus": n, "formula_gib": round(est, 2)})
                continue
            rows.append({"model": key, "gpus": n, "measured_gib": gib, "formula_gib": round(est, 3),
                         "rel_err": round(rel(est, gib), 4)})
    def stats(rs: list[dict[str, Any]]) -> dict[str, Any]:
        e = [abs(r["rel_err"]) for r in rs]
        return {"n": len(e), "mean_abs_rel_err": round(statistics.mean(e), 4),
                "median_abs_rel_err": round(statistics.median(e), 4), "max_abs_rel_err": round(max(e), 4),
                "mean_signed_rel_err": round(statistics.mean(r["rel_err"] for r in rs), 4)} if e else {"n": 0}
    return {
        "all": stats(rows),
        "bert": stats([r for r in rows if r["model"].startswith("bert")]),
        "moe": stats([r for r in rows if r["model"].startswith("moe")]),
        "bert_gpus_ge_2": stats([r for r in rows if r["model"].startswith("bert") and r["gpus"] >= 2]),
        "rows": rows,
        "unmeasured_rows": {"count": len(oom), "formula_over_40gib": sum(r["formula_gib"] > 40 for r in oom),
                            "note": "-1 in dp_mem.json (did not run / OOM); A100-40GB is the artifact's largest GPU"},
        "wide_resnet_values_skipped": skipped,
        "mapping": "dp=n, 16 micro-batches of b/16/n, GPipe, full remat, ZeRO-1, megatron-bf16 (BERT) / "
                   "mixed-adafactor (MoE), plain attention, other=0 (Alpa reports max allocated)",
    }


def run_real(quick: bool) -> dict[str, Any]:
    from tessera.estimator.torch.traced import real_cpu_peak, run_step

    model = ModelDims(512, 4, 8, 8000, 512, "small-cpu")
    out: dict[str, Any] = {"model": dataclasses.asdict(model)}
    plans = [("fp32", P(micro_batch=4, precision="fp32"))]
    if not quick:
        plans += [("fp32-plain-attention", P(micro_batch=4, precision="fp32", flash_attention=False)),
                  ("megatron-bf16", P(micro_batch=4))]
    for name, plan in plans:
        traced = run_step(model, plan, 0, fake=True)
        t0 = time.perf_counter()
        real_mt = run_step(model, plan, 0, fake=False)
        real_s = time.perf_counter() - t0
        rss = real_cpu_peak(model, plan)
        out[name] = {
            "plan": plan.key, "traced_peak": traced.peak, "traced_s": round(traced.seconds, 2),
            "real_memtracker_peak": real_mt.peak, "real_s": round(real_s, 2),
            "memtracker_rel_err": rel(traced.peak, real_mt.peak),
            "real_rss_peak": rss["peak"], "rss_rel_err": round(rel(traced.peak, rss["peak"]), 4),
        }
    out["note"] = ("rss_rel_err = (traced - OS peak) / OS peak; OS peak = resident state + (VmHWM - VmRSS) "
                   "of a second real step in a child process (high-water mark reset by clear_refs, glibc "
                   "mmap threshold 64 KiB, one thread)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--quick", action="store_true", help="every 4th grid configuration, one real run")
    args = ap.parse_args()
    data = shared_data()
    arena = arena_models(data)
    cfgs = grid(arena)
    if args.quick:
        cfgs = cfgs[::4]
    t0 = time.perf_counter()
    result = {
        "grid_formula_vs_traced": run_grid(cfgs),
        "formula_only": run_formula_only(),
        "arena_dp_mem": run_arena(data, arena),
        "traced_vs_real_cpu": run_real(args.quick),
    }
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "estimator_memory.json").write_text(json.dumps(result, indent=1))
    summary = {k: ({kk: vv for kk, vv in v.items() if kk != "rows"} if isinstance(v, dict) else v)
               for k, v in result.items()}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
