"""Espresso's stage placer (estimator/stage_placer.py) against the exhaustive optimum and two baselines.

Every plan is scored by the same estimate (the Cell estimator's stage costs and pipeline time), so
this measures the placement algorithms, not the estimate: how far Alg. 2 of the Espresso paper
lands from the best order-and-split of the layers, and from Whale+ (stages on GPUs in decreasing
memory, layers in proportion to the compute rate) and HPH+ (stages on GPUs in increasing compute
rate, the best split for that order, as its integer program finds), as in the paper's Sec. V.

Setting, from the Espresso paper ("Espresso: Cost-Efficient Large Model Training by Exploiting GPU
Heterogeneity in the Cloud", IEEE INFOCOM 2025; docs/reference/papers.md): the four rented GPU types
of Table I (RTX A6000, A30, RTX 3090, RTX A4000), 2.5 Gb/s between instances, the models of Table II
with the LLaMA shapes (LLaMA-1.3B 26 layers x 2048, LLaMA-3B 45 x 2560), sequence 4,096 and global
batch 32 (Sec. II-B), DP 2 inside each stage (Fig. 9). Allocations: every multiset of 3 or 4 stage types
drawn from the four (20 + 35 = 55), on each of the two models, where the exhaustive search stays
within --max-plans plans (about 3.5 minutes on one core at the default).

    python bench/stage_placer.py [--max-plans 200000] [--overlap-sync] [--out bench/results]

Prints a summary and writes bench/results/stage_placer.json. Pure CPU; no torch.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tessera.estimator.cells import CellInputError, CellModel, GpuPool
from tessera.estimator.cost_placements import whale_placement
from tessera.estimator.stage_placer import HeteroPlan, StagePlacer

NIC_GBPS = 2.5 / 8  # Espresso Sec. V-A: 2.5 Gbps between instances
TYPES = {
    "A": GpuPool("RTX-A6000-48GB", 8, 4, intra_link="pcie", nic_gbps=NIC_GBPS),
    "B": GpuPool("A30-24GB", 16, 4, intra_link="pcie", nic_gbps=NIC_GBPS),
    "C": GpuPool("RTX-3090-24GB", 16, 4, intra_link="pcie", nic_gbps=NIC_GBPS),
    "D": GpuPool("RTX-A4000-16GB", 16, 4, nic_gbps=NIC_GBPS),
}
MODELS = {
    "llama-1.3b": CellModel("gpt", hidden_size=2048, num_layers=26, num_heads=16, vocab_size=32000,
                            seq_length=4096, global_batch=32, name="llama-1.3b"),
    "llama-3b": CellModel("gpt", hidden_size=2560, num_layers=45, num_heads=20, vocab_size=32000,
                          seq_length=4096, global_batch=32, name="llama-3b"),
}
DP = 2


def hph(sp: StagePlacer, pools: list[GpuPool], max_plans: int) -> HeteroPlan:
    """HPH+: increasing compute rate, the best split of the layers for that order."""
    return sp.best_split(sorted(pools, key=lambda p: (p.gpu_type.tflops_fp16, p.gpu)), max_plans)


def gap(plan: HeteroPlan, best: HeteroPlan) -> float | None:
    """Relative iteration-time gap to the optimum; None when either does not fit."""
    if not (plan.fits and best.fits):
        return None
    return plan.iter_time / best.iter_time - 1


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {"n": len(values), "mean_pct": round(100 * statistics.fmean(values), 2),
            "median_pct": round(100 * statistics.median(values), 2), "max_pct": round(100 * max(values), 2),
            "at_optimum": sum(v <= 1e-9 for v in values)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-plans", type=int, default=200_000, help="skip allocations whose exhaustive search is "
                                                                     "larger (default 200000)")
    ap.add_argument("--overlap-sync", action="store_true",
                    help="score with Espresso's Eq. 9 (sync overlapped with earlier backward passes); writes "
                         "stage_placer_overlap.json")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"), help="folder for the JSON result")
    args = ap.parse_args(argv)
    rows: list[dict[str, Any]] = []
    t_alg = t_opt = t_hph = 0.0
    for name, model in MODELS.items():
        for k in (3, 4):
            for combo in itertools.combinations_with_replacement("ABCD", k):
                pools = [TYPES[c] for c in combo]
                orders = len(set(itertools.permutations(combo)))
                if orders * math.comb(model.num_layers - 1, k - 1) > args.max_plans:
                    continue
                try:
                    sp = StagePlacer(model, pools, DP, overlap_sync=args.overlap_sync)
                except CellInputError as exc:
                    rows.append({"model": name, "allocation": "".join(combo), "error": str(exc)})
                    continue
                t0 = time.perf_counter()
                alg = sp.place()
                t1 = time.perf_counter()
                opt = sp.exhaustive(args.max_plans)
                t2 = time.perf_counter()
                t_alg += t1 - t0
                t_opt += t2 - t1
                wh = whale_placement(sp)  # Whale+ as the cost baselines place it
                t3 = time.perf_counter()
                hp = hph(sp, pools, args.max_plans)
                t_hph += time.perf_counter() - t3
                rows.append({
                    "model": name, "allocation": "".join(combo), "optimum_fits": opt.fits,
                    "optimum": {"plan": opt.describe(), "iter_time_s": round(opt.iter_time, 4)},
                    "espresso": {"plan": alg.describe(), "iter_time_s": round(alg.iter_time, 4), "fits": alg.fits},
                    "whale": {"plan": wh.describe(), "iter_time_s": round(wh.iter_time, 4), "fits": wh.fits},
                    "hph": {"plan": hp.describe(), "iter_time_s": round(hp.iter_time, 4), "fits": hp.fits},
                    "espresso_s": round(t1 - t0, 4), "exhaustive_s": round(t2 - t1, 3),
                    "gap": {k2: gap(p, opt) for k2, p in (("espresso", alg), ("whale", wh), ("hph", hp))},
                })
    scored = [r for r in rows if r.get("optimum_fits")]
    refused = [r for r in rows if "error" in r]
    result = {
        "benchmark": "stage_placer",
        "setting": {"types": {k: v.gpu for k, v in TYPES.items()}, "nic_gbps": NIC_GBPS, "dp": DP,
                    "estimate": "espresso-eq9-overlap" if args.overlap_sync else "cells",
                    "models": {k: m.signature for k, m in MODELS.items()}, "max_plans": args.max_plans},
        "allocations": len(rows),
        "allocations_refused": len(refused),
        "allocations_where_the_optimum_fits": len(scored),
        "gap_to_optimum": {
            alg: summary([r["gap"][alg] for r in scored if r["gap"][alg] is not None])
            for alg in ("espresso", "whale", "hph")
        },
        "no_fitting_plan": {alg: sum(1 for r in scored if r["gap"][alg] is None) for alg in ("espresso", "whale", "hph")},
        "seconds": {"espresso_total": round(t_alg, 2), "hph_total": round(t_hph, 2),
                    "exhaustive_total": round(t_opt, 2)},
        "rows": rows,
    }
    print(f"{len(rows)} allocations ({len(scored)} where some plan fits, {len(refused)} refused); "
          "iteration time over the exhaustive optimum:")
    for alg, s in result["gap_to_optimum"].items():
        print(f"  {alg:<9} {s}  no fitting plan: {result['no_fitting_plan'][alg]}")
    print(f"  time in all: Espresso Alg. 2 {t_alg:.2f} s, HPH+ (every split of one order) {t_hph:.1f} s, "
          f"exhaustive {t_opt:.1f} s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "stage_placer_overlap.json" if args.overlap_sync else "stage_placer.json"
    (out / name).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
