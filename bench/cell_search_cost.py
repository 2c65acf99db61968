"""The Cell search's cost and its answer on issue 14's example (estimator/cell_search.py).

1. Seconds to produce all Cells of one job (BERT 2.6B, MoE 10B of the Crius artifact) on the 4-type
   cluster of cluster_1280.json (GPU counts 1..64, stage counts up to min(GPUs, layers)), cold (fresh
   estimator, module memo cleared) and cached, with the artifact's fixed 16 micro-batches and with
   the micro-batch count chosen per Cell (CellConfig's default): CPU seconds, the least of
   `--repeats` runs (the machine may be shared; the least is the least disturbed).
2. The best Cell per stage count of a Llama-3-8B-like job (h 4096, 32 layers, 32 heads, 8 KV heads,
   SwiGLU 14336, vocab 128256, 8k tokens) at global batch 16 on one 8 x H100 node, and what the old
   search answered (pp2 x tp4, B = 8) under the same time model.

Prints JSON and writes bench/results/cell_search_cost.json.
Usage: .venv/bin/python bench/cell_search_cost.py [--data DIR] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from estimator_arena import arena_model, config_from, data_dir, pools, shipped_params

from tessera.estimator.cells import (
    CellConfig,
    CellEstimator,
    CellModel,
    ClusterSpec,
    GpuPool,
    best_plan,
    clear_caches,
)
from tessera.estimator.models import ModelDims

LLAMA8B = ModelDims(4096, 32, 32, 128256, 8192, name="llama3-8b-like", ffn_hidden=14336, gated=True,
                    num_kv_heads=8, tied_embeddings=False)


def cost(cfg: CellConfig, model: CellModel, cluster: ClusterSpec, repeats: int) -> dict[str, Any]:
    colds, warms, n, fit = [], [], 0, 0
    for _ in range(repeats):
        est = CellEstimator(cfg)
        clear_caches()
        t0 = time.process_time()
        cells = est.cells(model, cluster)
        colds.append(time.process_time() - t0)
        t0 = time.process_time()
        est.cells(model, cluster)
        warms.append(time.process_time() - t0)
        n, fit = len(cells), sum(c.fits for c in cells)
    return {"cells": n, "fitting": fit, "cold_cpu_s_min": round(min(colds), 4),
            "cached_cpu_s_min": round(min(warms), 6), "repeats": repeats}


def example() -> dict[str, Any]:
    model = CellModel.from_dims(LLAMA8B, 16)
    pool = GpuPool("H100-80GB", 8, 8)
    est = CellEstimator()
    out: dict[str, Any] = {}
    for s in (1, 2, 4, 8):
        c = est.cell(model, pool, 8, s)
        out[f"stages_{s}"] = {"plan": c.plan.describe() if c.plan else None,
                              "iter_time_s": round(c.iter_time.value, 4) if c.iter_time else None,
                              "memory_gb": round(c.memory_per_gpu.value / 1e9, 1) if c.memory_per_gpu else None}
    old = best_plan(est.stage_costs(model, pool, 8, 2, options=[[(1, 4)], [(1, 4)]], num_microbatches=8)[0], 8)
    out["old_answer"] = {"plan": "pp2[tp4,tp4]xmb8", "iter_time_s": round(old.iter_time, 4) if old else None}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="folder holding arena/ (default: <repo>/../shared/data)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    arena = data_dir(args.data) / "arena"
    dims = json.loads((arena / "models.json").read_text())
    cluster_json = json.loads((arena / "cluster_1280.json").read_text())
    spec = cluster_json[0] if isinstance(cluster_json, list) else cluster_json
    pool_map = pools(spec)
    cluster = ClusterSpec(tuple(pool_map.values()))
    fixed = config_from(shipped_params(), pool_map)[0]
    result: dict[str, Any] = {"cells_cost": {}}
    for key in ("bert_2.6B_256", "moe_10B_512"):
        model = arena_model(key, dims)
        assert model is not None
        result["cells_cost"][key] = {
            "fixed_16_microbatches": cost(fixed, model, cluster, args.repeats),
            "chosen_per_cell": cost(replace(fixed, num_microbatches=0), model, cluster, args.repeats)}
    result["llama3_8b_batch16_on_8xH100"] = example()
    out = REPO / "bench" / "results" / "cell_search_cost.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
