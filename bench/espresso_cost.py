"""Espresso's cost tree (estimator/cost_tree.py) against the exhaustive optimum and the paper's baselines.

Setting, from the Espresso paper ("Espresso: Cost-Efficient Large Model Training by Exploiting GPU
Heterogeneity in the Cloud", IEEE INFOCOM 2025; docs/reference/papers.md): the four GPU types of
its artifact's gpu_config.json (shared/data/espresso/: RTX A6000, A30, RTX 3090, RTX A4000, with
their prices in yuan per GPU-hour, the `cost` field, = Table I), Table I's quotas (8, 16, 16, 16),
2.5 Gb/s between instances (Sec. V-A), 4 GPUs per instance (not in the paper; as
examples/clusters/espresso-rental.yaml), 100 iterations per job (Sec. V-B). The models: Table II's
four, as the registered models closest to them (`--shapes registered`, the default):

    LLaMA-1.3B (26 x 2048)  -> llama3.2-1b (16 x 2048, 1.2B)
    LLaMA-3B   (45 x 2560)  -> llama3.2-3b (28 x 3072, 3.2B)
    LLaMA-7B   (61 x 3200)  -> llama2-7b   (32 x 4096, 6.7B)
    ViT 3.4B   (70 x 2048)  -> qwen2.5-3b  (36 x 2048, 3.1B; no ViT is registered)

or Table II's own layer counts and widths (`--shapes table2`: LLaMA vocabulary 32,000; the ViT an
encoder over 197 patch tokens with 1,000 classes). Sequence 4,096 for the language models (Sec.
II-B); global batch 128 (not in the paper; 32, Sec. II-B's, caps every plan at 8 GPUs).

For each model, the SLO sweep runs from just under the fastest plan's time (infeasible: the answer
is NoFeasiblePlan with the best time) to past the time of the cheapest plan without an SLO. Each
instance is solved by the tree (Alg. 1 with Alg. 2 at the leaves), Sia+, Whale+ and HPH+
(estimator/cost_baselines.py), and, where the allocations number at most --max-exhaustive, by the
exhaustive solver (every allocation placed once per model, then every SLO). Solve times are one
call each on one core (this process), wall and CPU.

    python bench/espresso_cost.py [--shapes registered|table2] [--max-stages 8] [--max-exhaustive 3000]

Prints one line per instance and writes bench/results/espresso_cost[_table2].json. Pure CPU; no torch.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchio import write_result

from tessera.estimator.cells import CellModel
from tessera.estimator.cost_baselines import hph_plus, sia_plus, whale_plus
from tessera.estimator.cost_tree import (
    CostPlan,
    GpuOffer,
    NoFeasiblePlan,
    cheapest_plan,
    count_allocations,
    exhaustive_sweep,
    fastest_plan,
)
from tessera.estimator.models import registered

# gpu_config.json's names -> the catalog's (common/gpus.py).
CATALOG_NAME = {"a6000-pcie4-48gb": "RTX-A6000-48GB", "a30-pcie-24gb": "A30-24GB",
                "3090-pcie4-24gb": "RTX-3090-24GB", "a4000-pcie4-16gb": "RTX-A4000-16GB"}
# Espresso Table I: "Max. Quota" per type.
QUOTA = {"RTX-A6000-48GB": 8, "A30-24GB": 16, "RTX-3090-24GB": 16, "RTX-A4000-16GB": 16}
NIC_GBPS = 2.5 / 8  # Sec. V-A: 2.5 Gb/s between instances, in GB/s per direction
GPUS_PER_NODE = 4
ITERATIONS = 100  # Sec. V-B: "for 100 iterations"
SEQ = 4096  # Sec. II-B
GLOBAL_BATCH = 128
REGISTERED = {"LLaMA-1.3B": "llama3.2-1b", "LLaMA-3B": "llama3.2-3b", "LLaMA-7B": "llama2-7b", "ViT": "qwen2.5-3b"}


def models(shapes: str) -> dict[str, CellModel]:
    if shapes == "table2":
        return {
            "LLaMA-1.3B": CellModel("gpt", hidden_size=2048, num_layers=26, num_heads=16, vocab_size=32000,
                                    seq_length=SEQ, global_batch=GLOBAL_BATCH, name="llama-1.3b-table2"),
            "LLaMA-3B": CellModel("gpt", hidden_size=2560, num_layers=45, num_heads=20, vocab_size=32000,
                                  seq_length=SEQ, global_batch=GLOBAL_BATCH, name="llama-3b-table2"),
            "LLaMA-7B": CellModel("gpt", hidden_size=3200, num_layers=61, num_heads=25, vocab_size=32000,
                                  seq_length=SEQ, global_batch=GLOBAL_BATCH, name="llama-7b-table2"),
            # ViT-style encoder: (224 / 16)^2 + 1 = 197 tokens, 1,000 ImageNet classes as the "vocabulary"
            "ViT": CellModel("bert", hidden_size=2048, num_layers=70, num_heads=16, vocab_size=1000, seq_length=197,
                             global_batch=GLOBAL_BATCH, name="vit-3.4b-table2"),
        }
    out = {}
    for label, name in REGISTERED.items():
        dims = registered(name)
        assert dims is not None, name
        out[label] = CellModel.from_dims(replace(dims, seq_length=SEQ), GLOBAL_BATCH, name=name)
    return out


def offers(data: Path) -> list[GpuOffer]:
    cfg = json.loads((data / "espresso" / "gpu_config.json").read_text())
    return [GpuOffer(CATALOG_NAME[k], float(v["cost"]), QUOTA[CATALOG_NAME[k]], GPUS_PER_NODE, NIC_GBPS)
            for k, v in sorted(cfg.items())]


def row(p: CostPlan | NoFeasiblePlan, wall: float, cpu: float) -> dict[str, Any]:
    if isinstance(p, NoFeasiblePlan):
        return {"feasible": False, "best_time_s": None if math.isinf(p.best_time_s) else round(p.best_time_s, 3),
                "solve_s": round(wall, 4), "solve_cpu_s": round(cpu, 4)}
    return {"feasible": True, "allocation": dict(p.gpus), "cost": round(p.cost, 6), "total_time_s": round(p.total_time_s, 3),
            "plan": p.describe(), "solve_s": round(wall, 4), "solve_cpu_s": round(cpu, 4), "placed": p.placed,
            "explored": p.explored, "pruned": p.pruned, "_cost": p.cost}


def timed(fn: Any, *a: Any, **kw: Any) -> tuple[CostPlan | NoFeasiblePlan, float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    try:
        got: CostPlan | NoFeasiblePlan = fn(*a, **kw)
    except NoFeasiblePlan as exc:
        got = exc
    return got, time.perf_counter() - w0, time.process_time() - c0


def gpu_label(catalog_name: str) -> str:
    """The short name of a catalog type: RTX-3090-24GB -> 3090, A30-24GB -> A30."""
    parts = catalog_name.split("-")
    return parts[1] if parts[0] == "RTX" and len(parts) > 1 else parts[0]


def short(r: dict[str, Any]) -> str:
    """`21.40 (16 x A30 + 4 x 3090, 163 s)`: the cost, the GPU mix, the time; the counts apart from
    the names (`16A30+43090` read as 43,090 GPUs)."""
    if not r["feasible"]:
        return "N/A"
    alloc = " + ".join(f"{n} x {gpu_label(t)}" for t, n in r["allocation"].items())
    return f"{r['cost']:.2f} ({alloc}, {r['total_time_s']:.0f} s)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", choices=("registered", "table2"), default="registered")
    ap.add_argument("--max-stages", type=int, default=8)
    ap.add_argument("--max-exhaustive", type=int, default=3000, help="largest allocation count to enumerate")
    ap.add_argument("--points", type=int, default=6, help="feasible SLOs per model (default 6)")
    ap.add_argument("--data", default=None, help="folder holding espresso/ (default: the shared data)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args(argv)
    data = Path(args.data) if args.data else next(
        (d for d in (REPO.parent / "shared" / "data", REPO.parent.parent / "shared" / "data")
         if (d / "espresso").is_dir()), REPO.parent / "shared" / "data")
    offs = offers(data)
    kw = {"max_stages": args.max_stages}
    instances: list[dict[str, Any]] = []
    per_model: dict[str, Any] = {}
    for label, model in models(args.shapes).items():
        fastest = fastest_plan(model, offs, ITERATIONS, **kw)
        cheapest = cheapest_plan(model, offs, ITERATIONS, math.inf, **kw)
        lo, hi = fastest.total_time_s, max(cheapest.total_time_s, fastest.total_time_s * 1.01)
        slos = [0.95 * lo] + [lo * (hi / lo) ** (i / (args.points - 1)) for i in range(args.points)] + [1.5 * hi]
        n_alloc = count_allocations(model, offs, **kw)
        exh: list[Any] = []
        exh_wall = exh_cpu = 0.0
        if n_alloc <= args.max_exhaustive:
            w0, c0 = time.perf_counter(), time.process_time()
            exh = exhaustive_sweep(model, offs, ITERATIONS, slos, **kw)
            exh_wall, exh_cpu = time.perf_counter() - w0, time.process_time() - c0
        per_model[label] = {"model": model.name, "signature": model.signature, "allocations": n_alloc,
                            "fastest_time_s": round(lo, 3), "cheapest_time_s": round(cheapest.total_time_s, 3),
                            "exhaustive_s": round(exh_wall, 2), "exhaustive_cpu_s": round(exh_cpu, 2)}
        print(f"{label} ({model.name}): {n_alloc} allocations, fastest {lo:.0f} s, cheapest without SLO "
              f"{cheapest.total_time_s:.0f} s; exhaustive {exh_wall:.1f} s for all {len(slos)} SLOs")
        for i, slo in enumerate(slos):
            inst: dict[str, Any] = {"model": label, "slo_s": slo}
            for name, fn, extra in (("espresso", cheapest_plan, {}), ("best", cheapest_plan, {"placement": "best"}),
                                    ("sia+", sia_plus, {}), ("whale+", whale_plus, {}), ("hph+", hph_plus, {})):
                got, wall, cpu = timed(fn, model, offs, ITERATIONS, slo, **kw, **extra)
                inst[name] = row(got, wall, cpu)
            if exh:
                inst["exhaustive"] = row(exh[i], 0.0, 0.0)
                t, o = inst["espresso"], inst["exhaustive"]
                inst["tree_equals_exhaustive"] = (t["feasible"] == o["feasible"]) and (
                    not t["feasible"] or math.isclose(t["_cost"], o["_cost"], rel_tol=1e-9))
            instances.append(inst)
            print(f"  SLO {slo:>9.1f} s  tree {short(inst['espresso'])} in {inst['espresso']['solve_s']:.2f} s"
                  f" [cpu {inst['espresso']['solve_cpu_s']:.2f}]  exhaustive "
                  f"{short(inst['exhaustive']) if exh else '-'}  best-placement {short(inst['best'])} in "
                  f"{inst['best']['solve_s']:.2f} s  Sia+ {short(inst['sia+'])}  Whale+ "
                  f"{short(inst['whale+'])}  HPH+ {short(inst['hph+'])}")
    for inst in instances:
        for k in ("espresso", "best", "sia+", "whale+", "hph+", "exhaustive"):
            if k in inst:
                inst[k].pop("_cost", None)
    compared = [i for i in instances if "tree_equals_exhaustive" in i]
    tree_s = [i["espresso"]["solve_s"] for i in instances]
    tree_cpu = [i["espresso"]["solve_cpu_s"] for i in instances]

    def saving(base: str, tree: str = "espresso") -> list[float]:
        return [1 - i[tree]["cost"] / i[base]["cost"] for i in instances
                if i[tree]["feasible"] and i[base]["feasible"]]

    def pct(s: list[float]) -> dict[str, Any]:
        return {"n": len(s), "mean_pct": round(100 * sum(s) / len(s), 2) if s else None,
                "max_pct": round(100 * max(s), 2) if s else None, "min_pct": round(100 * min(s), 2) if s else None}

    best_s = [i["best"]["solve_cpu_s"] for i in instances]

    summary = {
        "instances": len(instances),
        "compared_with_exhaustive": len(compared),
        "tree_equals_exhaustive": sum(1 for i in compared if i["tree_equals_exhaustive"]),
        "tree_solve_s": {"max": max(tree_s), "mean": round(sum(tree_s) / len(tree_s), 4)},
        "tree_solve_cpu_s": {"max": max(tree_cpu), "mean": round(sum(tree_cpu) / len(tree_cpu), 4)},
        "tree_feasible": sum(1 for i in instances if i["espresso"]["feasible"]),
        "baseline_feasible": {b: sum(1 for i in instances if i[b]["feasible"]) for b in ("sia+", "whale+", "hph+")},
        "tree_saving_vs": {b: pct(saving(b)) for b in ("sia+", "whale+", "hph+")},
        "best_placement_saving_vs": {b: pct(saving(b, "best")) for b in ("espresso", "sia+", "whale+", "hph+")},
        "best_placement_solve_cpu_s": {"max": max(best_s), "mean": round(sum(best_s) / len(best_s), 4)},
    }
    print(f"tree == exhaustive on {summary['tree_equals_exhaustive']} of {summary['compared_with_exhaustive']} "
          f"instances; tree solve time max {summary['tree_solve_s']['max']:.2f} s wall, "
          f"{summary['tree_solve_cpu_s']['max']:.2f} s CPU (mean {summary['tree_solve_s']['mean']:.2f} s)")
    for b, s in summary["tree_saving_vs"].items():
        print(f"  cost saved vs {b}: {s} (baseline feasible on {summary['baseline_feasible'][b]}, "
              f"tree on {summary['tree_feasible']} of {len(instances)})")
    print(f"  placement=best: saved vs {summary['best_placement_saving_vs']}; solve CPU "
          f"{summary['best_placement_solve_cpu_s']}")
    result = {"benchmark": "espresso_cost",
              "setting": {"shapes": args.shapes, "offers": [vars(o) for o in offs], "iterations": ITERATIONS,
                          "global_batch": GLOBAL_BATCH, "seq_length": SEQ, "max_stages": args.max_stages,
                          "max_exhaustive": args.max_exhaustive},
              "models": per_model, "summary": summary, "instances": instances}
    name = "espresso_cost.json" if args.shapes == "registered" else "espresso_cost_table2.json"
    path = write_result(args.out, name, result, indent=1, show=False)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
