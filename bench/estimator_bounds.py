"""How long the estimator takes on the largest models a job spec may name (common/jobspec.py's
bounds), which is how long one new job can hold a controller round or an estimator call.

Each case asks the estimator library for a model's Cells on an 80-GPU cluster (64 x A100-80GB on 8
nodes, 16 x A40-48GB on 4), as GetCells does: the best Cell per type and count, then every Cell,
on fresh caches. With the stage partition's O(k n^2) programme (before 2026-11-26,
estimator/partition.py), a 1,024-layer model took minutes here, and the controller, which computed
Cells in its round on the event loop, stood still for as long.

    .venv/bin/python bench/estimator_bounds.py [--out bench/results]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchio import write_result

from tessera.common import jobspec
from tessera.estimator import cells
from tessera.estimator.service.handlers import Estimator
from tessera.v1 import common_pb2 as P
from tessera.v1 import estimator_pb2 as E

LAYERS = dict(jobspec.MODEL_DIMS)["num_layers"]
REFINE = dict(jobspec.MODEL_REFINEMENTS)
SMALL = {"hidden_size": 64, "num_heads": 4, "vocab_size": 256, "seq_length": 64}

CASES: dict[str, dict[str, Any]] = {
    "decoder, max layers": {**SMALL, "num_layers": LAYERS},
    "decoder, max layers, max vocab (the head dominates)": {**SMALL, "num_layers": LAYERS,
                                                            "vocab_size": dict(jobspec.MODEL_DIMS)["vocab_size"]},
    "encoder-decoder, max layers each": {**SMALL, "num_layers": LAYERS, "family": P.MODEL_FAMILY_ENCODER_DECODER,
                                         "num_decoder_layers": REFINE["num_decoder_layers"]},
    "encoder-decoder, max layers each, max vocab": {**SMALL, "num_layers": LAYERS, "vocab_size": dict(jobspec.MODEL_DIMS)["vocab_size"],
                                                    "family": P.MODEL_FAMILY_ENCODER_DECODER,
                                                    "num_decoder_layers": REFINE["num_decoder_layers"]},
    "moe, max layers, max experts and top_k, every layer": {
        **SMALL, "num_layers": LAYERS, "family": P.MODEL_FAMILY_MOE, "num_experts": REFINE["num_experts"],
        "top_k": REFINE["top_k"], "moe_every": 1},
}


def cluster() -> E.ClusterSpec:
    return E.ClusterSpec(pools=[E.GpuPool(gpu="A100-80GB", num_gpus=64, gpus_per_node=8),
                                E.GpuPool(gpu="A40-48GB", num_gpus=16, gpus_per_node=4)])


def run_case(model: dict[str, Any], best_only: bool) -> dict[str, Any]:
    cells.clear_caches()
    req = E.GetCellsRequest(model=P.ModelSpec(**model), global_batch_size=16, cluster=cluster(), best_only=best_only)
    t = time.perf_counter()
    resp = Estimator().get_cells(req)
    return {"seconds": round(time.perf_counter() - t, 3), "cells": len(resp.cells)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    rows = []
    for name, model in CASES.items():
        for best_only in (True, False):
            r = {"case": name, "best_only": best_only, **run_case(model, best_only)}
            print(f"{name:55s} {'best' if best_only else 'all ':4s} {r['seconds']:7.3f} s  {r['cells']} Cells", flush=True)
            rows.append(r)
    write_result(args.out, "estimator_bounds.json", {"cluster": "64 x A100-80GB + 16 x A40-48GB", "rows": rows},
                 show=False)
    print(f"worst: {max(r['seconds'] for r in rows):.3f} s; wrote {args.out}/estimator_bounds.json")


if __name__ == "__main__":
    main()
