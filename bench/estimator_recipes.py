"""The memory formula's PyTorch-native recipes against the trace of the real model code.

For each configuration: the formula (tessera.estimator.memory_recipes.native_estimate, the terms
`estimate_memory` uses for these plans) and `trace_real` (estimator/torch/realtrace: torchtitan's
Llama 3 or a transformers model built from its config, FSDP2 over a fake process group, torchtitan's
checkpoint policies, PEFT LoRA, one training step under FakeTensorMode with torch's FSDP2 memory
tracker) for the same rank; prints the relative error of the peak and of each category, their mean
and max |error|, and writes bench/results/estimator_recipes.json.

    .venv/bin/python bench/estimator_recipes.py            # all configurations (~9 min on 2 cores)
    .venv/bin/python bench/estimator_recipes.py --quick    # every 4th

The formula is evaluated for the program the trace runs on its CPU (device="cpu"): torch's composite
rms_norm (the fp32 copies it keeps; CUDA runs the fused kernel, which keeps the bf16 input and the
rstd), and transformers' explicit SDPA mask with repeated K/V and the copied attention output (on a
GPU it passes is_causal and enable_gqa). The trace's step does what each stack's trainer does (e.g.
torchtitan's `del pred` before backward), so nothing is added on either side and nothing is fitted
per configuration.

Model dimensions are written here from each model's public config.json (Hugging Face hub), since
the registered models land in another branch: hidden_size, num_hidden_layers, num_attention_heads,
num_key_value_heads, intermediate_size, vocab_size, head_dim, tie_word_embeddings, and for T5
d_model, d_kv, d_ff, num_layers, num_decoder_layers, num_heads, feed_forward_proj.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tessera.estimator.memory_layers import Stack
from tessera.estimator.memory_recipes import native_estimate
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError

P = ExecutionPlan

# -- models (config.json of each, cited) ------------------------------------------------------------
# meta-llama/Llama-3.2-1B, Llama-3.2-3B (tied), Llama-3.1-8B, Llama-3.1-70B (untied): rope_theta 500000
L1B = ModelDims(2048, 16, 32, 128256, 4096, "llama3.2-1b", ffn_hidden=8192, gated=True, num_kv_heads=8)
L3B = ModelDims(3072, 28, 24, 128256, 4096, "llama3.2-3b", ffn_hidden=8192, gated=True, num_kv_heads=8)
L8B = ModelDims(4096, 32, 32, 128256, 8192, "llama3.1-8b", ffn_hidden=14336, gated=True, num_kv_heads=8,
                tied_embeddings=False)
L70B = ModelDims(8192, 80, 64, 128256, 8192, "llama3.1-70b", ffn_hidden=28672, gated=True, num_kv_heads=8,
                 tied_embeddings=False)
# Qwen/Qwen2.5-0.5B, -1.5B (tied), -7B (untied): attention biases on q, k, v
Q05 = ModelDims(896, 24, 14, 151936, 4096, "qwen2.5-0.5b", ffn_hidden=4864, gated=True, num_kv_heads=2,
                qkv_bias=True)
Q15 = ModelDims(1536, 28, 12, 151936, 4096, "qwen2.5-1.5b", ffn_hidden=8960, gated=True, num_kv_heads=2,
                qkv_bias=True)
Q7 = ModelDims(3584, 28, 28, 152064, 4096, "qwen2.5-7b", ffn_hidden=18944, gated=True, num_kv_heads=4,
               qkv_bias=True, tied_embeddings=False)
# mistralai/Mistral-7B-v0.1: sliding_window 4096
M7 = ModelDims(4096, 32, 32, 32000, 4096, "mistral-7b", ffn_hidden=14336, gated=True, num_kv_heads=8,
               tied_embeddings=False, sliding_window=4096)
# google/gemma-2-2b, gemma-2-9b: head_dim 256, final_logit_softcapping 30, pre+post norms, tied
G2 = ModelDims(2304, 26, 8, 256000, 4096, "gemma2-2b", ffn_hidden=9216, gated=True, num_kv_heads=4,
               kv_channels=256, logit_softcap=30.0, sandwich_norm=True, sliding_window=4096)
G9 = ModelDims(3584, 42, 16, 256000, 4096, "gemma2-9b", ffn_hidden=14336, gated=True, num_kv_heads=8,
               kv_channels=256, logit_softcap=30.0, sandwich_norm=True, sliding_window=4096)
# mistralai/Mixtral-8x7B-v0.1: 8 experts, top-2, dropless
MX = ModelDims(4096, 32, 32, 32000, 4096, "mixtral-8x7b", family="moe", ffn_hidden=14336, gated=True,
               num_kv_heads=8, num_experts=8, top_k=2, moe_every=1, capacity_factor=0, tied_embeddings=False)
# google-t5/t5-base (ReLU, tied), google/t5-v1_1-large and -xl (gated-gelu, untied), google/mt5-base
T5B = ModelDims(768, 12, 12, 32128, 512, "t5-base", family="encoder-decoder", ffn_hidden=3072, kv_channels=64,
                decoder_seq_length=128)
T5L = ModelDims(1024, 24, 16, 32128, 512, "t5-v1_1-large", family="encoder-decoder", ffn_hidden=2816,
                kv_channels=64, gated=True, tied_embeddings=False, decoder_seq_length=128)
T5XL = ModelDims(2048, 24, 32, 32128, 1024, "t5-v1_1-xl", family="encoder-decoder", ffn_hidden=5120,
                 kv_channels=64, gated=True, tied_embeddings=False, decoder_seq_length=256)
MT5 = ModelDims(768, 12, 12, 250112, 1024, "mt5-base", family="encoder-decoder", ffn_hidden=2048,
                kv_channels=64, gated=True, tied_embeddings=False, decoder_seq_length=256)


def seq(m: ModelDims, s: int) -> ModelDims:
    return replace(m, seq_length=s)


A = "amp"  # FSDP2's MixedPrecisionPolicy(bf16, fp32) over fp32 params: torchtitan's default
F = dict(sharding="fsdp", loss="fp32", precision=A)  # noqa: C408


def configs() -> list[tuple[ModelDims, ExecutionPlan, Stack]]:
    tt: Stack = "torchtitan"
    hf: Stack = "transformers"
    c: list[tuple[ModelDims, ExecutionPlan, Stack]] = [
        # Llama 3 on torchtitan: FSDP2 (reshard), op/full/every-n checkpointing, fp32/chunked loss, CP, PP
        (L1B, P(dp=8, **F), tt),
        (L1B, P(dp=8, checkpointing="op", **F), tt),
        (L1B, P(dp=8, checkpointing="full", **F), tt),
        (L1B, P(dp=8, micro_batch=2, checkpointing="op", sharding="fsdp", loss="chunked", precision=A), tt),
        (L1B, P(dp=4, cp=2, checkpointing="op", **F), tt),
        (L1B, P(dp=8, reshard_after_forward="never", **F), tt),
        (L1B, P(dp=8, precision="bf16", sharding="fsdp", loss="fp32"), tt),
        (L1B, P(dp=8, precision="fp32", sharding="fsdp", loss="fp32", checkpointing="full"), tt),
        (L3B, P(dp=8, checkpointing="op", **F), tt),
        (L3B, P(dp=8, checkpointing="full", checkpoint_every=2, **F), tt),
        (L3B, P(dp=8, checkpointing="op", checkpoint_every=2, **F), tt),
        (L3B, P(dp=2, cp=4, **F), tt),
        (L3B, P(dp=16, micro_batch=2, checkpointing="full", sharding="fsdp", loss="chunked", precision=A), tt),
        (L8B, P(dp=8, checkpointing="op", **F), tt),
        (L8B, P(dp=8, checkpointing="full", **F), tt),
        (L8B, P(dp=8, checkpointing="op", sharding="fsdp", loss="chunked", precision=A), tt),
        (L8B, P(dp=8, **F), tt),
        (L8B, P(dp=8, checkpointing="full", checkpoint_every=4, **F), tt),
        (L8B, P(dp=4, cp=2, checkpointing="op", **F), tt),
        (seq(L8B, 32768), P(dp=1, cp=8, checkpointing="full", **F), tt),
        (seq(L8B, 32768), P(dp=2, cp=4, checkpointing="op", sharding="fsdp", loss="chunked", precision=A), tt),
        (L8B, P(dp=8, reshard_after_forward="never", checkpointing="op", **F), tt),
        (L8B, P(dp=4, pp=2, grad_accum=4, checkpointing="full", **F), tt),
        (L8B, P(dp=2, pp=4, grad_accum=8, checkpointing="op", **F), tt),
        (L8B, P(dp=2, pp=4, grad_accum=8, checkpointing="full", reshard_after_forward="always", **F), tt),
        (L8B, P(dp=8, precision="bf16", checkpointing="op", sharding="fsdp", loss="fp32"), tt),
        (seq(L70B, 4096), P(dp=64, checkpointing="full", **F), tt),
        (L70B, P(dp=32, cp=2, checkpointing="full", **F), tt),
        (L70B, P(dp=16, pp=4, grad_accum=8, checkpointing="full", **F), tt),
        (L70B, P(dp=8, pp=8, grad_accum=16, checkpointing="op", **F), tt),
        (seq(L70B, 4096), P(dp=64, checkpointing="op", sharding="fsdp", loss="chunked", precision=A), tt),
        (L70B, P(dp=8, pp=8, grad_accum=8, checkpointing="full", sharding="fsdp", loss="chunked", precision=A), tt),
        # torchtitan's tensor parallelism (its Llama 3 TP plan, sequence parallel, loss parallel) under FSDP2
        # on the dp axis: per-rank shards of 8B and 70B, op/full SAC, and a TP x PP stage
        (L8B, P(dp=4, tp=2, sequence_parallel=True, checkpointing="op", **F), tt),
        (L8B, P(dp=2, tp=4, sequence_parallel=True, checkpointing="full", **F), tt),
        (L8B, P(dp=4, tp=2, sequence_parallel=True, **F), tt),
        (L8B, P(dp=2, tp=4, sequence_parallel=True, checkpointing="op", sharding="fsdp", loss="chunked",
                precision=A), tt),
        (L70B, P(dp=8, tp=8, sequence_parallel=True, checkpointing="op", **F), tt),
        (L70B, P(dp=8, tp=8, sequence_parallel=True, checkpointing="full", **F), tt),
        (L70B, P(dp=4, tp=8, pp=2, grad_accum=4, sequence_parallel=True, checkpointing="full", **F), tt),
        (L70B, P(dp=2, tp=8, pp=4, grad_accum=8, sequence_parallel=True, checkpointing="op", **F), tt),
        # Llama-style on transformers: FSDP2 per decoder layer, the model's fp32 loss
        (L1B, P(dp=8, **F), hf),
        (L1B, P(dp=8, checkpointing="full", **F), hf),
        (L8B, P(dp=8, checkpointing="op", **F), hf),
        (L8B, P(dp=8, checkpointing="full", **F), hf),
        # Qwen2.5 (q/k/v biases), Mistral (sliding window), Gemma 2 (soft-capping, sandwich norms, head 256)
        (Q05, P(dp=4, **F), hf),
        (Q05, P(dp=4, checkpointing="op", **F), hf),
        (Q15, P(dp=8, checkpointing="full", **F), hf),
        (Q7, P(dp=8, checkpointing="full", **F), hf),
        (Q7, P(dp=8, checkpointing="op", checkpoint_every=2, **F), hf),
        (Q7, P(dp=4, cp=2, checkpointing="full", **F), hf),
        (M7, P(dp=8, checkpointing="full", **F), hf),
        (M7, P(dp=8, checkpointing="op", **F), hf),
        (G2, P(dp=4, **F), hf),
        (G2, P(dp=8, checkpointing="full", **F), hf),
        (G9, P(dp=8, checkpointing="op", **F), hf),
        # LoRA (PEFT): frozen base, fp32 adapters; qv / attention / all-linear; with and without FSDP2
        (L8B, P(lora_rank=16, lora_targets="qv", loss="fp32", precision="bf16", checkpointing="full"), hf),
        (L8B, P(dp=8, lora_rank=64, loss="fp32", precision="bf16", checkpointing="op", sharding="fsdp"), hf),
        (seq(L8B, 2048), P(lora_rank=16, lora_targets="qv", loss="fp32", precision="bf16"), hf),
        (seq(L8B, 2048), P(lora_rank=16, lora_targets="attention", loss="fp32", precision="bf16"), hf),
        (seq(L8B, 2048), P(lora_rank=16, loss="fp32", precision="bf16"), hf),
        (L8B, P(dp=8, lora_rank=64, loss="fp32", precision="bf16", sharding="fsdp"), hf),
        (L3B, P(lora_rank=8, lora_targets="qv", loss="fp32", precision="bf16"), hf),
        (L1B, P(lora_rank=16, loss="fp32", precision="amp"), hf),
        (Q7, P(lora_rank=16, lora_targets="attention", loss="fp32", precision="bf16"), hf),
        (Q05, P(dp=2, lora_rank=32, loss="fp32", precision="bf16", sharding="fsdp"), hf),
        (seq(L70B, 2048), P(dp=16, lora_rank=16, loss="fp32", precision="bf16", sharding="fsdp"), hf),
        (M7, P(dp=4, lora_rank=32, lora_targets="qv", loss="fp32", precision="bf16", sharding="fsdp"), hf),
        # T5 / mT5 (encoder-decoder) on transformers
        (T5B, P(dp=4, **F), hf),
        (T5B, P(dp=4, checkpointing="full", **F), hf),
        (T5L, P(dp=8, **F), hf),
        (T5L, P(dp=8, checkpointing="op", **F), hf),
        (T5XL, P(dp=8, checkpointing="full", **F), hf),
        (MT5, P(dp=4, checkpointing="full", **F), hf),
        (T5L, P(lora_rank=16, lora_targets="qv", loss="fp32", precision="bf16"), hf),
        (T5XL, P(dp=8, lora_rank=16, loss="fp32", precision="bf16", sharding="fsdp"), hf),
        (T5B, P(dp=8, micro_batch=4, checkpointing="op", **F), hf),
        (MT5, P(dp=8, micro_batch=2, **F), hf),
        (T5XL, P(dp=16, checkpointing="op", **F), hf),
        (Q15, P(dp=8, micro_batch=2, **F), hf),
        (M7, P(dp=4, cp=2, checkpointing="full", **F), hf),
    ]
    return c


# -- the comparison ----------------------------------------------------------------------------------
CATS = ("parameters", "gradients", "optimizer", "activations")


@dataclass
class Row:
    name: str
    stack: str
    plan: str
    stage: int
    formula: dict[str, int]
    traced: dict[str, int]
    err: float
    cat_err: dict[str, float]
    moment: str  # the formula's peak moment
    trace_s: float


def rel(a: float, b: float) -> float:
    return (a - b) / b if b else (0.0 if a == 0 else float("inf"))


def compare(m: ModelDims, plan: ExecutionPlan, stack: Stack, reuse: dict[str, Any] | None = None) -> Row:
    """One configuration; `reuse` (a row of an earlier run) skips the trace and re-evaluates the formula."""
    t0 = time.perf_counter()
    if reuse is not None:
        stage, secs = reuse["stage"], reuse["trace_s"]
        t = reuse["traced"]
        traced = {k: t[k] for k in (*CATS, "tracker") if k in t}
        ttot = t["peak"]
    else:
        from tessera.estimator.torch.realtrace import trace_real

        best = None
        for st in sorted({0, plan.pp - 1}):
            tr = trace_real(m, plan, stack=stack, stage=st)
            if best is None or tr.peak > best[1].peak:
                best = (st, tr)
        assert best is not None
        stage, tr = best
        secs = time.perf_counter() - t0
        traced = {"parameters": tr.parameters, "gradients": tr.gradients, "optimizer": tr.optimizer,
                  "activations": tr.activations + tr.other, "tracker": dict(tr.detail.get("tracker_peak", {}))}
        ttot = tr.peak
    # The trace runs the micro-batches a stage holds in flight (all forwards, then all backwards), not
    # the steady state of 1F1B after earlier backwards: the formula is evaluated for that many.
    traced_plan = replace(plan, grad_accum=min(plan.grad_accum, plan.pp - stage)) if plan.pp > 1 else plan
    n = native_estimate(m, traced_plan, stage, stack, device="cpu")
    formula = {"parameters": n.parameters, "gradients": n.gradients, "optimizer": n.optimizer,
               "activations": n.activations + n.comm}
    ftot = sum(formula.values())
    return Row(m.name, stack, plan.key, stage, {**formula, "peak": ftot}, {**traced, "peak": ttot}, rel(ftot, ttot),
               {k: rel(formula[k], traced[k]) for k in CATS}, n.moment, round(secs, 2))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="every 4th configuration")
    ap.add_argument("--only", default="", help="configurations whose model name contains this")
    ap.add_argument("--out", default="bench/results/estimator_recipes.json")
    ap.add_argument("--reuse", default="", help="a JSON of an earlier run: re-evaluate the formula, no tracing")
    args = ap.parse_args(argv)
    old: dict[tuple[str, str, str], Any] = {}
    if args.reuse:
        for r in json.loads(Path(args.reuse).read_text())["rows"]:
            old[(r["name"], r["stack"], r["plan"])] = r
    from tessera.estimator.torch.realtrace import session

    session.quiet()
    cs = configs()
    if args.quick:
        cs = cs[::4]
    if args.only:
        cs = [c for c in cs if args.only in c[0].name]
    rows: list[Row] = []
    failed: list[dict[str, str]] = []
    t0 = time.perf_counter()
    gib = 1024**3
    print(f"{'model':15s} {'stack':12s} {'plan':70s} {'traced GiB':>10s} {'formula':>9s} {'err':>7s}  "
          f"{'params':>7s} {'grads':>7s} {'optim':>7s} {'acts':>7s}")
    for m, plan, stack in cs:
        if args.reuse and (m.name, stack, plan.key) not in old:
            continue
        try:
            r = compare(m, plan, stack, old.get((m.name, stack, plan.key)))
        except (PlanInputError, RuntimeError, ValueError, KeyError, TypeError, NotImplementedError) as e:
            # a configuration the trace refuses or fails on is reported, not hidden
            failed.append({"model": m.name, "plan": plan.key, "stack": stack, "error": f"{type(e).__name__}: {e}"})
            print(f"{m.name:15s} {stack:12s} {plan.key[:70]:70s} FAILED {type(e).__name__}: {str(e)[:120]}")
            continue
        rows.append(r)
        ce = r.cat_err
        print(f"{r.name:15s} {r.stack:12s} {r.plan[:70]:70s} {r.traced['peak'] / gib:10.2f} "
              f"{r.formula['peak'] / gib:9.2f} {r.err:+7.2%}  " + " ".join(f"{ce[k]:+7.1%}" for k in CATS), flush=True)
    errs = [abs(r.err) for r in rows]
    summary: dict[str, Any] = {"configurations": len(rows), "failed": len(failed),
                               "mean_abs_err": sum(errs) / len(errs) if errs else None,
                               "max_abs_err": max(errs) if errs else None,
                               "seconds": round(time.perf_counter() - t0, 1)}
    per_cat: dict[str, Any] = {}
    for k in CATS:
        # category errors relative to the traced peak (a category near zero has no meaningful relative error)
        ce = [abs(r.formula[k] - r.traced[k]) / r.traced["peak"] for r in rows]
        per_cat[k] = {"mean_abs_of_peak": sum(ce) / len(ce) if ce else None, "max_abs_of_peak": max(ce) if ce else None}
    summary["per_category"] = per_cat
    by_stack: dict[str, Any] = {}
    for s in sorted({r.stack for r in rows}):
        e = [abs(r.err) for r in rows if r.stack == s]
        by_stack[s] = {"n": len(e), "mean_abs_err": sum(e) / len(e), "max_abs_err": max(e)}
    summary["by_stack"] = by_stack
    print(json.dumps(summary, indent=1))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "estimator_recipes", "summary": summary,
                               "rows": [r.__dict__ for r in rows], "failed": failed}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
