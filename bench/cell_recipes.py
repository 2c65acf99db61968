"""What a job's recipe changes in its Cells (estimator/cell_recipe.py): for registered 7-8B models at
a fine-tuning batch, per GPU type, the fewest GPUs of one node on which some Cell fits, that Cell's
estimated iteration time and memory per GPU, under the Cells' own recipe (mixed precision, full
recomputation, flash attention: what the live controller assumes for a job without `plan:`) and
under the recipes a job may set (LoRA, QLoRA, no / per-op checkpointing, FSDP, bf16 Adam).

These are the estimator's own figures (no measurement): they show that the recipe reaches the
scheduler's fit, not how accurate the fit is (docs/estimator-memory.md and docs/estimator-cells.md
give the errors of the terms).

Prints a table and JSON; writes bench/results/cell_recipes.json.
Usage: .venv/bin/python bench/cell_recipes.py [--models llama3.1-8b,qwen2.5-7b] [--batch 8]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tessera.estimator.cell_recipe import JobRecipe, recipe_cell_model
from tessera.estimator.cells import CellEstimator, GpuPool
from tessera.estimator.models import registered
from tessera.estimator.plans import ExecutionPlan

GPUS = ("L4-24GB", "A10-24GB", "A100-40GB", "L40S-48GB", "A100-80GB", "H100-80GB")
RECIPES: dict[str, dict[str, Any]] = {
    "cells' own": {},
    "checkpointing none": {"checkpointing": "none"},
    "checkpointing op": {"checkpointing": "op"},
    "sharding fsdp": {"sharding": "fsdp"},
    "precision bf16": {"precision": "bf16"},
    "lora r16": {"lora_rank": 16},
    "qlora r16 nf4": {"lora_rank": 16, "base_quant": "nf4"},
}


def smallest_fit(est: CellEstimator, model_name: str, batch: int, gpu: str, given: dict[str, Any]) -> dict[str, Any]:
    dims = registered(model_name)
    assert dims is not None, model_name
    recipe = JobRecipe(ExecutionPlan(**given), frozenset(given)) if given else None
    got = recipe_cell_model(dims, batch, recipe, flash_attention=True)
    pool = GpuPool(gpu, 8, 8)
    n = 1
    while n <= 8:
        s, best = 1, None
        while s <= n:
            c = est.cell(got.model, pool, n, s)
            if c.fits and c.iter_time is not None and (best is None or c.iter_time.value < best.iter_time.value):
                best = c
            s *= 2
        if best is not None and best.iter_time is not None and best.memory_per_gpu is not None and best.plan:
            return {"gpus": n, "stages": best.num_stages, "plan": best.plan.describe(),
                    "iter_time_s": round(best.iter_time.value, 4), "memory_gb": round(best.memory_per_gpu.value / 1e9, 2),
                    "warnings": list(got.warnings)}
        n *= 2
    return {"gpus": None, "warnings": list(got.warnings)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="llama3.1-8b,qwen2.5-7b")
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args(argv)
    est = CellEstimator()
    rows = []
    for model in args.models.split(","):
        for gpu in GPUS:
            for label, given in RECIPES.items():
                r = smallest_fit(est, model, args.batch, gpu, given)
                rows.append({"model": model, "gpu": gpu, "recipe": label, **r})
    print(f"{'model':<12} {'gpu':<10} {'recipe':<20} {'gpus':>4} {'plan':<22} {'s/iter':>8} {'GB/GPU':>7}")
    for r in rows:
        if r["gpus"] is None:
            print(f"{r['model']:<12} {r['gpu']:<10} {r['recipe']:<20} {'-':>4} {'fits on no 8-GPU node'}")
        else:
            print(f"{r['model']:<12} {r['gpu']:<10} {r['recipe']:<20} {r['gpus']:>4} {r['plan']:<22} "
                  f"{r['iter_time_s']:>8.3f} {r['memory_gb']:>7.2f}")
    out = REPO / "bench" / "results" / "cell_recipes.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"batch": args.batch, "rows": rows}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({"written": str(out.relative_to(REPO)), "rows": len(rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
