"""The real-code trace at the sizes people train: Llama 3.1 8B, 70B and a per-rank shard of 405B on
torchtitan, a 7B transformers model with LoRA, each as one `trace_real` call on fake tensors.

    python bench/realtrace_sizes.py [--quick] [--out bench/results]

For each configuration: the wall time of the call (import time excluded: a warm-up trace of a tiny
model runs first) and the per-category peak GiB of the traced rank. No figure here is an accuracy
claim (that is bench/estimator_recipes.py's comparison with the formula); it shows what the trace
costs and what it reports. Prints one JSON object and writes OUT/realtrace_sizes.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tessera.estimator.memory_terms import GIB
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError
from tessera.estimator.torch.realtrace import trace_real

# Meta's Llama 3.1 configs (config.json of meta-llama/Llama-3.1-{8B,70B,405B}; torchtitan's llama3
# registry has the same dims), trained at 8192 tokens.
LLAMA3 = {"vocab_size": 128256, "seq_length": 8192, "gated": True, "num_kv_heads": 8, "tied_embeddings": False}
L8B = ModelDims(4096, 32, 32, name="llama3.1-8b", ffn_hidden=14336, **LLAMA3)  # type: ignore[arg-type]
L70B = ModelDims(8192, 80, 64, name="llama3.1-70b", ffn_hidden=28672, **LLAMA3)  # type: ignore[arg-type]
L405B = ModelDims(16384, 126, 128, name="llama3.1-405b", ffn_hidden=53248, **LLAMA3)  # type: ignore[arg-type]
FT = ExecutionPlan(sharding="fsdp", loss="fp32", checkpointing="op")

CONFIGS: list[tuple[ModelDims, ExecutionPlan, str]] = [
    (L8B, FT.with_(dp=8), "torchtitan"),
    (L8B, FT.with_(dp=8, checkpointing="full"), "torchtitan"),
    (L8B, FT.with_(dp=4, tp=2, sequence_parallel=True), "torchtitan"),
    (L8B.__class__(**{**L8B.__dict__, "seq_length": 32768, "name": "llama3.1-8b-32k"}),
     FT.with_(dp=2, cp=4), "torchtitan"),
    (L70B, FT.with_(dp=64), "torchtitan"),
    (L70B, FT.with_(dp=8, tp=8, sequence_parallel=True), "torchtitan"),
    # 405B on 512 GPUs as torchtitan's recipe lays it out (TP 8, PP 8, FSDP 8): the first stage's rank
    (L405B, FT.with_(dp=8, tp=8, pp=8, grad_accum=16, sequence_parallel=True, checkpointing="full"),
     "torchtitan"),
    (ModelDims(4096, 32, 32, 32000, 4096, name="llama2-7b", ffn_hidden=11008, gated=True, tied_embeddings=False),
     ExecutionPlan(loss="fp32", lora_rank=16, lora_targets="attention", checkpointing="full"), "transformers"),
]
QUICK = [CONFIGS[0], CONFIGS[-1]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args()
    trace_real(ModelDims(64, 2, 4, 256, 64, gated=True, tied_embeddings=False), ExecutionPlan(loss="fp32"))
    rows: list[dict[str, Any]] = []
    for model, plan, stack in (QUICK if args.quick else CONFIGS):
        t0 = time.perf_counter()
        try:
            tr = trace_real(model, plan, stack=stack)
        except PlanInputError as e:  # a refusal is a result too: printed with its field
            rows.append({"model": model.name, "plan": plan.key, "stack": stack, "error": str(e)})
            print(json.dumps(rows[-1]), flush=True)
            continue
        row = {"model": model.name, "plan": plan.key, "stack": tr.stack, "seconds": round(time.perf_counter() - t0, 1),
               **{k: round(getattr(tr, k) / GIB, 3) for k in ("parameters", "gradients", "optimizer", "activations",
                                                             "other", "peak")}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "realtrace_sizes.json").write_text(json.dumps({"rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
