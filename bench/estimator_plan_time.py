"""The time of one plan (estimator/plan_time.py) against measured runs, and the fit of its constants.

1. torchtitan's published throughput (TORCHTITAN below: A100, H100 and H200 rows). The constants of
   estimator/time_constants.py are fitted here (`--refit`) on a seeded half of these rows, split by
   configuration; the report gives every row's half and the error per half, GPU type and recipe kind,
   with the fitted constants and with the Crius prior (CellConfig's, fitted on Alpa's runs).
2. The Morphling artifact's measured placements on 8 x 8 A800-80GB (data/morphling/placements,
   docs/reference/data.md): GPT-2 1.5B, LLaMA-2-7B and LLaMA-30B, Megatron 3D plans (PP, TP, DP digits)
   and, for GPT-2, DeepSpeed data-parallel plans (ga: plain DP; gc: + full activation checkpointing;
   zero-dp: ZeRO-2); never fitted. Rows whose placement puts different GPU counts on its servers are
   left out (an ExecutionPlan fills whole nodes), and so are ZeRO-Offload rows (plan_time refuses them).
   What the artifact does not say is stated and varied instead of chosen:
   - the batch: the bench's global batch per iteration (estimator_morphling.MODELS: GPT-2 16, LLaMA-7B
     8, LLaMA-30B 4), one micro-batch per replica (the artifact's Megatron runs set no accumulation);
   - flash attention off and on (Megatron/DeepSpeed of 2023 ran GPT-2 without it by default);
   - the inter-server link: 12.5 GB/s (100 Gb/s) and the data README's 100 GB/s per server.

    .venv/bin/python bench/estimator_plan_time.py [--data DIR]      # about 2 s
    .venv/bin/python bench/estimator_plan_time.py --refit          # about 2 min; prints, writes nothing

Prints JSON and writes bench/results/estimator_plan_time.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tessera.common.gpus import GpuType, lookup
from tessera.estimator.cells import CellConfig, GpuPool, with_prior
from tessera.estimator.models import ModelDims, registered
from tessera.estimator.plan_time import estimate_plan_time
from tessera.estimator.plans import ExecutionPlan, PlanInputError
from tessera.estimator.time_constants import (
    PLAN_TIME_CONSTANTS,
    GenerationConstants,
    PlanTimeConstants,
    plan_prior,
)

GPT2 = registered("gpt2-xl")
LLAMA7 = registered("llama2-7b")
assert GPT2 is not None and LLAMA7 is not None
# LLaMA-30B (Touvron et al. 2023, Table 2): 60 layers of 6656, 52 heads, 2048 tokens, SwiGLU 17920.
LLAMA30 = ModelDims(6656, 60, 52, 32000, 2048, "llama-30b", ffn_hidden=17920, gated=True, tied_embeddings=False)
MODELS: dict[str, tuple[ModelDims, int]] = {"gpt2": (GPT2, 16), "llama7": (LLAMA7, 8), "llama30": (LLAMA30, 4)}
DP_KINDS = {"ga": {}, "gc": {"checkpointing": "full"}, "zero-dp": {"sharding": "zero2"}}


def rows(root: Path) -> list[dict[str, Any]]:
    out = []
    for name in MODELS:
        with (root / "morphling" / "placements" / name / "placements.csv").open(encoding="utf-8-sig") as f:
            for r in csv.DictReader(f):
                out.append({"model": name, "exec_plan": r["exec_plan"], "placement": r["placement"],
                            "measured_s": float(r["iter_time"])})
    return out


def plan_of(row: dict[str, Any], flash: bool) -> tuple[ExecutionPlan, int, int] | None:
    """(plan, GPUs, GPUs per node) of a row, or None when the row is not timed (see the docstring)."""
    batch = MODELS[row["model"]][1]
    placement, ep = row["placement"], row["exec_plan"]
    if len(set(placement)) != 1:
        return None
    per_node = int(placement[0])
    gpus = per_node * len(placement)
    extra: dict[str, Any] = {}
    if ep.isdigit() and len(ep) == 3:
        pp, tp, dp = (int(c) for c in ep)
    elif ep in DP_KINDS:
        pp, tp, dp = 1, 1, gpus
        extra = dict(DP_KINDS[ep])
    else:
        return None
    if batch % dp or pp * tp * dp != gpus:
        return None
    if extra.get("sharding") == "zero2" and dp == 1:
        extra.pop("sharding")
    try:
        plan = ExecutionPlan(dp=dp, tp=tp, pp=pp, micro_batch=batch // dp, grad_accum=1, precision="mixed",
                             flash_attention=flash, **extra)
    except PlanInputError:
        return None
    return plan, gpus, per_node


def summary(errs: list[float]) -> dict[str, Any]:
    return {"n": len(errs), "mean_abs_pct": round(100 * statistics.fmean(abs(e) for e in errs), 1),
            "median_signed_pct": round(100 * statistics.median(errs), 1)} if errs else {"n": 0}


def run(root: Path) -> dict[str, Any]:
    data = rows(root)
    variants: dict[str, Any] = {}
    for flash in (False, True):
        for nic in (12.5, 100.0):
            groups: dict[str, list[float]] = {}
            preds = []
            for row in data:
                got = plan_of(row, flash)
                if got is None:
                    continue
                plan, gpus, per_node = got
                dims = MODELS[row["model"]][0]
                pool = GpuPool("A800-80GB", gpus, per_node, "nvlink", nic_gbps=nic)
                try:
                    t = estimate_plan_time(dims, plan, "A800-80GB", gpus_per_node=per_node, pool=pool)
                except PlanInputError as exc:
                    preds.append({**row, "refused": str(exc)})
                    continue
                err = (t.iter_time - row["measured_s"]) / row["measured_s"]
                kind = "3d" if row["exec_plan"].isdigit() else row["exec_plan"]
                for g in ("all", row["model"], f"{row['model']}/{kind}"):
                    groups.setdefault(g, []).append(err)
                preds.append({**row, "estimate_s": round(t.iter_time, 4), "err_pct": round(100 * err, 1)})
            variants[f"flash={int(flash)},nic={nic:g}GB/s"] = {
                "error": {g: summary(v) for g, v in sorted(groups.items())}, "rows": preds}
    return {"benchmark": "estimator_plan_time", "data": str(root / "morphling"), "gpu": "A800-80GB",
            "fitted_here": False, "variants": variants}


# ---------------------------------------------------------------------------------------------------
# torchtitan's published throughput (pytorch/torchtitan docs/performance.md): tokens per second per GPU.
# H100 rows: the version of 2024-12 (commit eaea6f6a; torch 1963fc8, torchao eab345c, torchtitan 9dec370):
# Grand Teton hosts, 8 H100 (96 GB HBM2e, 2.4 TB/s, 500 W) on NVLink, 400 Gb/s RDMA per GPU. Their peak
# is "between SXM and NVL" (the doc): we time them as H100-80GB (SXM: 989 TFLOP/s, 3.35 TB/s) and say so.
# A100 rows: the earlier version (commit 04133643): 64 A100-80GB, FSDP2, no interconnect given (taken as
# 8 x 200 Gb/s HDR per node, DGX A100's). Sequence 8192 (Llama 3) or 4096 (Llama 2) unless a row says.
# "Selective" AC in torchtitan's configs of that time is the per-op policy ('op'); "selective layer"
# is full AC of every second block (checkpoint_every=2). Pipelines: micro-batches of 1 sample (torchtitan's
# default micro-batch size), so local batch 32 = 32 micro-batches; "Interleaved 1F1B" taken as 2 virtual
# stages per rank (not stated in the table).

LLAMA31_8B = ModelDims(4096, 32, 32, 128256, 8192, "llama3.1-8b", ffn_hidden=14336, gated=True, num_kv_heads=8,
                       tied_embeddings=False)
LLAMA31_70B = ModelDims(8192, 80, 64, 128256, 8192, "llama3.1-70b", ffn_hidden=28672, gated=True,
                        num_kv_heads=8, tied_embeddings=False)
LLAMA31_405B = ModelDims(16384, 126, 128, 128256, 8192, "llama3.1-405b", ffn_hidden=53248, gated=True,
                         num_kv_heads=8, tied_embeddings=False)
LLAMA2_13B = ModelDims(5120, 40, 40, 32000, 4096, "llama2-13b", ffn_hidden=13824, gated=True,
                       tied_embeddings=False)
LLAMA2_70B = ModelDims(8192, 80, 64, 32000, 4096, "llama2-70b", ffn_hidden=28672, gated=True, num_kv_heads=8,
                       tied_embeddings=False)
TT = {"sharding": "fsdp", "precision": "amp", "loss": "fp32", "flash_attention": True}
CF = {**TT, "compile": True, "float8": "linear"}
# (table, model, gpu, nic GB/s per node, plan fields, seq override, measured tokens/s/GPU)
TORCHTITAN: list[tuple[str, ModelDims, str, float, dict[str, Any], int, float]] = [
    ("H100 T1 FSDP", LLAMA31_8B, "H100-80GB", 400.0, {**TT, "dp": 8, "micro_batch": 2, "checkpointing": "op"}, 0, 5762),
    ("H100 T1 +compile", LLAMA31_8B, "H100-80GB", 400.0,
     {**TT, "dp": 8, "micro_batch": 2, "checkpointing": "op", "compile": True}, 0, 6667),
    ("H100 T1 +compile+float8", LLAMA31_8B, "H100-80GB", 400.0,
     {**CF, "dp": 8, "micro_batch": 2, "checkpointing": "op"}, 0, 8532),
    ("H100 T2 cp1 32k", LLAMA31_8B, "H100-80GB", 400.0, {**CF, "dp": 8, "checkpointing": "full"}, 32768, 3890),
    ("H100 T2 cp2 64k", LLAMA31_8B, "H100-80GB", 400.0, {**CF, "dp": 4, "cp": 2, "checkpointing": "full"}, 65536, 2540),
    ("H100 T2 cp4 128k", LLAMA31_8B, "H100-80GB", 400.0, {**CF, "dp": 2, "cp": 4, "checkpointing": "full"}, 131072,
     1071),
    ("H100 T2 cp8 256k", LLAMA31_8B, "H100-80GB", 400.0, {**CF, "dp": 1, "cp": 8, "checkpointing": "full"}, 262144,
     548),
    ("H100 T3 FSDP 128", LLAMA31_8B, "H100-80GB", 400.0, {**TT, "dp": 128, "micro_batch": 2, "checkpointing": "op"}, 0,
     5605),
    ("H100 T3 +compile", LLAMA31_8B, "H100-80GB", 400.0,
     {**TT, "dp": 128, "micro_batch": 2, "checkpointing": "op", "compile": True}, 0, 6514),
    ("H100 T3 +compile+float8", LLAMA31_8B, "H100-80GB", 400.0,
     {**CF, "dp": 128, "micro_batch": 2, "checkpointing": "op"}, 0, 8380),
    ("H100 T4 2D", LLAMA31_70B, "H100-80GB", 400.0,
     {**CF, "dp": 32, "tp": 8, "micro_batch": 16, "checkpointing": "full", "sequence_parallel": True}, 0, 829),
    ("H100 T4 2D+asyncTP", LLAMA31_70B, "H100-80GB", 400.0,
     {**CF, "dp": 32, "tp": 8, "micro_batch": 16, "checkpointing": "full", "sequence_parallel": True,
      "async_tp": True}, 0, 876),
    ("H100 T5 1F1B", LLAMA31_405B, "H100-80GB", 400.0,
     {**CF, "dp": 8, "tp": 8, "pp": 8, "micro_batch": 1, "grad_accum": 32, "checkpointing": "full",
      "sequence_parallel": True, "async_tp": True}, 0, 100),
    ("H100 T5 interleaved", LLAMA31_405B, "H100-80GB", 400.0,
     {**CF, "dp": 8, "tp": 8, "pp": 8, "micro_batch": 1, "grad_accum": 32, "virtual_stages": 2,
      "checkpointing": "full", "sequence_parallel": True, "async_tp": True}, 0, 128),
    *((f"H100 T6 cp{cp}", LLAMA31_405B, "H100-80GB", 400.0,
       {**CF, "dp": 8 // cp, "cp": cp, "tp": 8, "pp": 8, "micro_batch": 1, "grad_accum": 8, "checkpointing": "full",
        "sequence_parallel": True, "async_tp": True}, 32768 * cp, tps)
      for cp, tps in ((1, 76), (2, 47), (4, 31), (8, 16))),
    # async TP, June 2025 (benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md, table version of
    # commit 2887250b): same Grand Teton H100s; 70B FSDP 32 x TP 8, full AC, local batch 16; 8B FSDP 8 x
    # TP 8, per-op SAC, local batch 12; torch.compile throughout, TP with sequence parallel
    *((f"H100 aTP {name}{' float8' if f8 else ''}{' async' if a else ''}", dims, "H100-80GB", 400.0,
       {**TT, "compile": True, "float8": "linear" if f8 else "none", "dp": dp, "tp": 8, "micro_batch": mb,
        "checkpointing": ac, "sequence_parallel": True, "async_tp": a}, 0, tps)
      for name, dims, dp, mb, ac, f8, a, tps in (
          ("70B", LLAMA31_70B, 32, 16, "full", False, False, 597.3),
          ("70B", LLAMA31_70B, 32, 16, "full", False, True, 652.4),
          ("70B", LLAMA31_70B, 32, 16, "full", True, False, 809.8),
          ("70B", LLAMA31_70B, 32, 16, "full", True, True, 942.4),
          ("8B", LLAMA31_8B, 8, 12, "op", False, False, 4378.0),
          ("8B", LLAMA31_8B, 8, 12, "op", False, True, 4809.4),
          ("8B", LLAMA31_8B, 8, 12, "op", True, False, 5078.1),
          ("8B", LLAMA31_8B, 8, 12, "op", True, True, 5570.1))),
    # H200, June 2025 (benchmarks/llama3_8b_h200_2025-06_torchtitan.md, Trainy): 8 H200 per host, 400 Gb/s
    # per GPU; llama3_8b.toml (per-op SAC), local batch 2, compile, Float8 with FSDP Float8 all-gather
    *((f"H200 L3-8B {n} GPUs", LLAMA31_8B, "H200-141GB", 400.0,
       {**CF, "float8": "linear+allgather", "dp": n, "micro_batch": 2, "checkpointing": "op"}, 0, tps)
      for n, tps in ((32, 10938.0), (64, 10753.0))),
    ("A100 L3-8B sel.layer", LLAMA31_8B, "A100-80GB", 200.0,
     {**TT, "dp": 64, "checkpointing": "full", "checkpoint_every": 2}, 0, 2904),
    ("A100 L3-8B sel.op", LLAMA31_8B, "A100-80GB", 200.0, {**TT, "dp": 64, "checkpointing": "op"}, 0, 2973),
    ("A100 L3-70B full", LLAMA31_70B, "A100-80GB", 200.0, {**TT, "dp": 64, "checkpointing": "full"}, 0, 331),
    ("A100 L2-13B no AC", LLAMA2_13B, "A100-80GB", 200.0, {**TT, "dp": 64, "micro_batch": 2}, 0, 2162),
    ("A100 L2-13B sel.layer", LLAMA2_13B, "A100-80GB", 200.0,
     {**TT, "dp": 64, "micro_batch": 2, "checkpointing": "full", "checkpoint_every": 2}, 0, 1914),
    ("A100 L2-13B sel.op", LLAMA2_13B, "A100-80GB", 200.0,
     {**TT, "dp": 64, "micro_batch": 2, "checkpointing": "op"}, 0, 1904),
    ("A100 L2-70B sel.op", LLAMA2_70B, "A100-80GB", 200.0, {**TT, "dp": 64, "checkpointing": "op"}, 0, 355),
    ("A100 L2-70B full", LLAMA2_70B, "A100-80GB", 200.0,
     {**TT, "dp": 64, "micro_batch": 2, "checkpointing": "full"}, 0, 353),
]


# Meta's Grand Teton H100 (torchtitan docs/performance.md): 96 GB HBM2e at 2.4 TB/s, 500 W. Not in the
# catalog (plumbing's "H100-96GB" is the GH200's HBM3 part, 4 TB/s): the H100-80GB's NVLink with the
# published bandwidth and memory, and a BF16 peak at the middle of the range torchtitan gives ("The
# actual peak TFLOPs should be between SXM and NVL, and we don't know the exact value": TorchTitan,
# arXiv:2410.06511): (989 + 835) / 2 = 912. The fitted Hopper constants are fractions of the peak
# of a full-power part; what the 500 W limit costs beyond that reading is in them too.
GRAND_TETON_H100 = replace(lookup("H100-80GB"), memory_gb=96, bandwidth_gbps=2400, tflops_fp16=912)
SEED = 0
KINDS = ("1D FSDP", "op SAC", "full AC", "compile", "float8", "CP", "TP", "async TP", "PP")


def _kinds(fields: dict[str, Any]) -> list[str]:
    out = []
    if fields.get("tp", 1) == fields.get("pp", 1) == fields.get("cp", 1) == 1:
        out.append("1D FSDP")
    out += [k for k, on in (("op SAC", fields.get("checkpointing") == "op"),
                            ("full AC", fields.get("checkpointing") == "full"),
                            ("compile", fields.get("compile")), ("float8", fields.get("float8", "none") != "none"),
                            ("CP", fields.get("cp", 1) > 1), ("TP", fields.get("tp", 1) > 1),
                            ("async TP", fields.get("async_tp")), ("PP", fields.get("pp", 1) > 1)) if on]
    return out


def _group(dims: ModelDims, gpu: str, fields: dict[str, Any], seq: int) -> str:
    """A configuration: the model, sequence, GPU and recipe; the data-parallel degree (and so the
    GPU count) is not part of it, so one recipe measured at 8 and 128 GPUs, or published twice, is
    one group (never split between the fit and the held-out half)."""
    plan = asdict(ExecutionPlan(**fields))  # defaults filled in: a field left out equals one set to its default
    return json.dumps([dims.name, seq or dims.seq_length, gpu, {k: v for k, v in sorted(plan.items()) if k != "dp"}])


def split(seed: int = SEED) -> dict[str, str]:
    """group -> 'train' | 'test': per GPU type, the groups shuffled with `seed`, the first half
    (rounded down) to train."""
    import random

    by_gpu: dict[str, list[str]] = {}
    for _, dims, gpu, _, fields, seq, _ in TORCHTITAN:
        gs = by_gpu.setdefault(gpu, [])
        g = _group(dims, gpu, fields, seq)
        if g not in gs:
            gs.append(g)
    out = {}
    rng = random.Random(seed)
    for gpu in sorted(by_gpu):
        gs = sorted(by_gpu[gpu])
        rng.shuffle(gs)
        for i, g in enumerate(gs):
            out[g] = "train" if i < len(gs) // 2 else "test"
    return out


def _config(gpu: GpuType, constants: PlanTimeConstants | None) -> CellConfig:
    base = CellConfig()
    return base if constants is None else with_prior(base, plan_prior(gpu, base.prior, constants))


def torchtitan_rows(constants: PlanTimeConstants | None = PLAN_TIME_CONSTANTS, only: str | None = None,
                    seed: int = SEED) -> list[dict[str, Any]]:
    """Every row (or only the 'train' / 'test' half) timed with `constants` (None: the Crius prior)."""
    halves = split(seed)
    out = []
    for name, dims, gpu, nic, fields, seq, tps in TORCHTITAN:
        half = halves[_group(dims, gpu, fields, seq)]
        if only is not None and half != only:
            continue
        m = replace(dims, seq_length=seq) if seq else dims
        plan = ExecutionPlan(**fields)
        part = GRAND_TETON_H100 if gpu == "H100-80GB" else lookup(gpu)
        pool = GpuPool(gpu, plan.num_gpus, min(8, plan.num_gpus), "nvlink", nic_gbps=nic)
        t = estimate_plan_time(m, plan, part, gpus_per_node=min(8, plan.num_gpus), pool=pool,
                               config=_config(part, constants))
        est = t.tokens_per_second / plan.num_gpus
        out.append({"row": name, "gpu": gpu, "half": half, "kinds": _kinds(fields), "measured_tps_gpu": tps,
                    "estimated_tps_gpu": round(est, 1), "time_err_pct": round(100 * (tps / est - 1), 1),
                    "breakdown_s": {k: round(v, 4) for k, v in t.breakdown.items()}})
    return out


def report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Error of the iteration time (measured / estimated - 1) per half, GPU type and recipe kind."""
    out: dict[str, Any] = {}
    for half in ("train", "test", "all"):
        sel = [r for r in rows if half in ("all", r["half"])]
        e = {"all": summary([r["time_err_pct"] / 100 for r in sel])}
        for gpu in sorted({r["gpu"] for r in sel}):
            e[gpu] = summary([r["time_err_pct"] / 100 for r in sel if r["gpu"] == gpu])
        for k in KINDS:
            v = [r["time_err_pct"] / 100 for r in sel if k in r["kinds"]]
            if v:
                e[f"kind:{k}"] = summary(v)
        out[half] = e
    return out


def _loss(rows: list[dict[str, Any]]) -> float:
    return statistics.fmean(abs(math.log(1 + r["time_err_pct"] / 100)) for r in rows) if rows else 0.0


def _grid(lo: float, hi: float, step: float) -> list[float]:
    return [round(lo + i * step, 4) for i in range(round((hi - lo) / step) + 1)]


def refit(seed: int = SEED, free: tuple[str, ...] = ("eta", "flash", "compile", "fp8")) -> PlanTimeConstants:
    """The constants of time_constants.py fitted on the training half (see its docstring): Ampere's
    efficiency on the A100 rows, Hopper's efficiency, flash utilisation and the compile factor on
    the H100 rows, by coordinate search (3 rounds) over grids."""
    def rows_of(c: PlanTimeConstants, gpu: str) -> list[dict[str, Any]]:
        return [r for r in torchtitan_rows(c, "train", seed) if r["gpu"] == gpu]

    c = PLAN_TIME_CONSTANTS
    gens = dict(c.generations)
    grids = {"eta": _grid(0.30, 0.80, 0.005), "flash": _grid(0.10, 0.60, 0.005), "compile": _grid(0.02, 1.0, 0.02),
             "fp8": _grid(1.0, 2.0, 0.02)}

    def make(amp: float, hop: float, flash: float, comp: float, fp8: float) -> PlanTimeConstants:
        return replace(c, generations=(("ampere", replace(gens["ampere"], matmul_efficiency=amp)),
                                       ("hopper", GenerationConstants(hop, flash, fp8))), compile_traffic_factor=comp)

    x = [gens["ampere"].matmul_efficiency, gens["hopper"].matmul_efficiency,
         gens["hopper"].flash_utilization or 0.35, c.compile_traffic_factor, gens["hopper"].fp8_speedup or 2.0]
    x[0] = min(grids["eta"], key=lambda v: _loss(rows_of(make(v, *x[1:]), "A100-80GB")))
    for _ in range(3):
        for i, g in ((1, "eta"), (2, "flash"), (3, "compile"), (4, "fp8")):
            if g not in free:
                continue
            x[i] = min(grids[g], key=lambda v: _loss(rows_of(make(*[v if j == i else x[j] for j in range(5)]),
                                                             "H100-80GB")))
    return make(*x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="shared data folder (default: <repo>/../shared/data)")
    ap.add_argument("--refit", action="store_true", help="fit time_constants.py's constants on the training half "
                                                         "of torchtitan's rows and print them (not written)")
    args = ap.parse_args(argv)
    if args.refit:
        c = refit()
        rows = torchtitan_rows(c)
        print(json.dumps({"refit": {"generations": {g: vars(v) for g, v in c.generations},
                                    "compile_traffic_factor": c.compile_traffic_factor, "seed": SEED},
                          "error": report(rows)}, indent=1))
        return 0
    root = Path(args.data) if args.data else REPO.parent / "shared" / "data"
    if not (root / "morphling" / "placements").is_dir():
        raise SystemExit(f"error: Morphling data not found under {root / 'morphling'}; pass --data DIR")
    result = run(root)
    fitted, crius = torchtitan_rows(), torchtitan_rows(None)
    result["torchtitan"] = {
        "source": "pytorch/torchtitan docs/performance.md (H100: 2024-12; A100: earlier version), async-TP and "
                  "H200 benchmark pages; H100 rows timed as Meta's Grand Teton part (2.4 TB/s)",
        "split": f"by configuration, seed {SEED}, half of each GPU type's groups fitted (time_constants.py)",
        "constants": PLAN_TIME_CONSTANTS.source,
        "error_fitted_constants": report(fitted), "error_crius_prior": report(crius), "rows": fitted}
    out = REPO / "bench" / "results" / "estimator_plan_time.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    shown = {**result, "variants": {k: v["error"] for k, v in result["variants"].items()}}
    shown["torchtitan"] = {**result["torchtitan"], "rows": [
        {k: r[k] for k in ("row", "half", "measured_tps_gpu", "estimated_tps_gpu", "time_err_pct")}
        for r in fitted]}
    print(json.dumps(shown, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
