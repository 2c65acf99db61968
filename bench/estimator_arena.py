"""Crius Cell estimator against the Crius artifact's measured optima (data/arena/).

For every (model, resources) pair of iter_time_optimal.json with a measured time (> 0) and a model
family the estimator covers (BERT, GShard MoE; Wide-ResNet is not covered), Tessera's estimate of the
Cell's best iteration time (best over pipeline stage counts, each Cell the best of its 2^Ns assembled
plans) is compared with the measured optimum of Alpa's full search: mean, median, max relative error,
per family and per GPU type, side by side with the authors' own single-device estimates
(iter_time_estimated.json: the best of their sampled plans).

Calibration, stated: five global constants (matmul efficiency, memory-traffic multiplier, NVLink,
PCIe and network efficiency; none per GPU type) are fitted by Nelder-Mead on the log of the ratio
estimate/measured, minimising mean |log ratio|, over the TRAINING half of the models (a seeded split
of model keys within each family). Errors are reported on the held-out half, on all pairs and on the
53 pairs that also have the authors' estimate. The uncalibrated prior is reported too.

Also reports the cost of producing all Cells of one job for the 4-type cluster of cluster_1280.json,
cold and cached. Prints JSON and writes bench/results/estimator_arena.json.

Usage: .venv/bin/python bench/estimator_arena.py [--data DIR] [--seed 0] [--no-fit]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from estimator.cells import (
    Cell,
    CellConfig,
    CellEstimator,
    CellModel,
    ClusterSpec,
    GpuPool,
    LinkPrior,
)
from estimator.compute import DEFAULT_PRIOR, EfficiencyPrior

# The artifact's GPU types (crius.txt Table 1; data/README.md): GPUs per node, intra-node link and
# the node's NIC (Mellanox CX5 = 100 Gb/s = 12.5 GB/s, CX6 = 200 Gb/s = 25 GB/s).
ARENA_GPUS: dict[str, dict[str, Any]] = {
    "a100": {"gpu": "A100-40GB", "gpus_per_node": 4, "intra_link": "nvlink", "nic_gbps": 12.5},
    "v100": {"gpu": "V100-32GB", "gpus_per_node": 16, "intra_link": "nvlink", "nic_gbps": 12.5},
    "a40": {"gpu": "A40-48GB", "gpus_per_node": 2, "intra_link": "pcie", "nic_gbps": 12.5},
    "a10": {"gpu": "A10-24GB", "gpus_per_node": 2, "intra_link": "pcie", "nic_gbps": 25.0},
}
FAMILIES = ("bert", "moe")
PARAM_NAMES = ("matmul_efficiency", "traffic_multiplier", "nvlink_efficiency", "pcie_efficiency",
               "network_efficiency")


def data_dir(arg: str | None) -> Path:
    d = Path(arg) if arg else REPO.parent / "shared" / "data"
    if not (d / "arena" / "iter_time_optimal.json").is_file():
        raise SystemExit(f"error: arena data not found: expected {d / 'arena' / 'iter_time_optimal.json'} "
                         "(pass --data DIR, the folder that holds arena/)")
    return d


def arena_model(key: str, dims: dict[str, Any]) -> CellModel | None:
    parts = key.split("_")
    if parts[0] not in FAMILIES:
        return None
    fam, size, batch = parts[0], parts[1], int(parts[2])
    c = dims[fam][size]
    dtype = 2 if c.get("dtype", "float16") in ("float16", "bfloat16") else 4
    if fam == "bert":
        return CellModel("bert", c["hidden_size"], c["num_layers"], c["num_heads"], c["vocab_size"],
                         c["seq_len"], batch, dtype_bytes=dtype, name=key)
    # the artifact's MoE: FFN width 8h, every other layer MoE, top-2 routing (Alpa's GShard MoE)
    return CellModel("moe", c["hidden_size"], c["num_layers"], c["num_heads"], c["vocab_size"], c["seq_len"],
                     batch, ffn_mult=8, num_experts=c["num_experts"], top_k=2,
                     expert_group_size=c["expert_group_size"], dtype_bytes=dtype, name=key)


def parse_resources(r: str) -> tuple[str, int, int]:
    """'2_a40_2_n_2_d' -> ('a40', nodes=2, gpus_per_node=2)."""
    p = r.split("_")
    return p[1], int(p[2]), int(p[4])


def pools(cluster: dict[str, Any] | None = None) -> dict[str, GpuPool]:
    out = {}
    for t, spec in ARENA_GPUS.items():
        nodes = int(cluster[t]["node_num"]) if cluster and t in cluster else 64
        out[t] = GpuPool(spec["gpu"], nodes * spec["gpus_per_node"], spec["gpus_per_node"], spec["intra_link"],
                         spec["nic_gbps"])
    return out


Pair = tuple[str, str, float]  # (model key, resources, measured seconds)


def best_cell(est: CellEstimator, model: CellModel, pool: GpuPool, nodes: int, per_node: int) -> Cell | None:
    n = nodes * per_node
    best = None
    s = 1
    while s <= min(n, model.num_layers):
        c = est.cell(model, pool, n, s, nodes=nodes, gpus_per_node=per_node)
        if c.fits and c.iter_time is not None and (best is None or c.iter_time.value < best.iter_time.value):  # type: ignore[union-attr]
            best = c
        s *= 2
    return best


def config_from(params: Sequence[float]) -> CellConfig:
    mm, kappa, nv, pc, net = params
    prior = EfficiencyPrior(mm, kappa, source=f"prior:roofline(eta_mm={mm:.3f},kappa={kappa:.2f})")
    links = LinkPrior(nvlink_efficiency=nv, pcie_efficiency=pc, network_efficiency=net,
                      source=f"prior:links(nvlink={nv:.3f},pcie={pc:.3f},net={net:.3f})")
    return CellConfig(prior=prior, links=links)


def estimate_pairs(cfg: CellConfig, pairs: Sequence[Pair], models: dict[str, CellModel],
                   pool_map: dict[str, GpuPool]) -> dict[tuple[str, str], Cell | None]:
    est = CellEstimator(cfg)
    out = {}
    for m, r, _ in pairs:
        g, nodes, per = parse_resources(r)
        out[(m, r)] = best_cell(est, models[m], pool_map[g], nodes, per)
    return out


def rel_errors(pairs: Sequence[Pair], est: dict[tuple[str, str], Cell | None]) -> list[tuple[Pair, float | None]]:
    out: list[tuple[Pair, float | None]] = []
    for p in pairs:
        c = est[(p[0], p[1])]
        if c is None or c.iter_time is None:
            out.append((p, None))
        else:
            out.append((p, abs(c.iter_time.value - p[2]) / p[2]))
    return out


def summary(errs: Sequence[float | None]) -> dict[str, Any]:
    vals = [e for e in errs if e is not None]
    if not vals:
        return {"pairs": len(errs), "estimated": 0}
    return {"pairs": len(errs), "estimated": len(vals), "no_fit": len(errs) - len(vals),
            "mean": round(statistics.fmean(vals), 4), "median": round(statistics.median(vals), 4),
            "max": round(max(vals), 4)}


def nelder_mead(f: Callable[[list[float]], float], x0: list[float], steps: list[float], iters: int) -> tuple[list[float], float]:
    """Plain Nelder-Mead (no scipy here); deterministic."""
    pts = [list(x0)] + [[x0[j] + (steps[i] if j == i else 0.0) for j in range(len(x0))] for i in range(len(x0))]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = sorted(range(len(pts)), key=lambda i: vals[i])
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        cen = [sum(p[j] for p in pts[:-1]) / (len(pts) - 1) for j in range(len(x0))]
        refl = [cen[j] + (cen[j] - pts[-1][j]) for j in range(len(x0))]
        fr = f(refl)
        if fr < vals[0]:
            exp = [cen[j] + 2 * (cen[j] - pts[-1][j]) for j in range(len(x0))]
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = [cen[j] + 0.5 * (pts[-1][j] - cen[j]) for j in range(len(x0))]
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:
                for i in range(1, len(pts)):
                    pts[i] = [pts[0][j] + 0.5 * (pts[i][j] - pts[0][j]) for j in range(len(x0))]
                    vals[i] = f(pts[i])
    i = min(range(len(pts)), key=lambda k: vals[k])
    return pts[i], vals[i]


def _to_params(z: Sequence[float]) -> list[float]:
    """Unconstrained -> (eta_mm in (0,1], kappa > 0, three efficiencies in (0,1])."""
    def sig(v: float) -> float:
        return 1.0 / (1.0 + math.exp(-v))
    return [sig(z[0]), math.exp(z[1]), sig(z[2]), sig(z[3]), sig(z[4])]


def _from_params(p: Sequence[float]) -> list[float]:
    def logit(v: float) -> float:
        v = min(max(v, 1e-6), 1 - 1e-6)
        return math.log(v / (1 - v))
    return [logit(p[0]), math.log(p[1]), logit(p[2]), logit(p[3]), logit(p[4])]


def fit(pairs: Sequence[Pair], models: dict[str, CellModel], pool_map: dict[str, GpuPool],
        x0: Sequence[float], iters: int = 120) -> tuple[list[float], float, int]:
    calls = 0

    def loss(z: list[float]) -> float:
        nonlocal calls
        calls += 1
        est = estimate_pairs(config_from(_to_params(z)), pairs, models, pool_map)
        tot = 0.0
        for m, r, t in pairs:
            c = est[(m, r)]
            tot += abs(math.log(c.iter_time.value / t)) if c and c.iter_time else 2.0
        return tot / len(pairs)

    z, val = nelder_mead(loss, _from_params(x0), [0.4] * 5, iters)
    return _to_params(z), val, calls


def split(keys: Sequence[str], seed: int) -> tuple[set[str], set[str]]:
    """Half of the model keys of each family for training, the other half held out."""
    rng = random.Random(seed)
    train: set[str] = set()
    for fam in FAMILIES:
        ks = sorted(k for k in keys if k.split("_")[0] == fam)
        rng.shuffle(ks)
        train.update(ks[: len(ks) // 2])
    return train, set(keys) - train


def authors_best(estimated: dict[str, Any], m: str, r: str) -> float | None:
    plans = estimated.get(m, {}).get(r) or []
    vals = [p["values"][3] for p in plans if p["values"][3] > 0]
    return min(vals) if vals else None


def breakdown_by(rows: list[dict[str, Any]], field: str, value_key: str) -> dict[str, Any]:
    groups: dict[str, list[float | None]] = {}
    for row in rows:
        groups.setdefault(row[field], []).append(row[value_key])
    return {k: summary(v) for k, v in sorted(groups.items())}


def cost_of_cells(cluster_json: Any, models: dict[str, CellModel], cfg: CellConfig) -> dict[str, Any]:
    spec = cluster_json[0] if isinstance(cluster_json, list) else cluster_json
    cluster = ClusterSpec(tuple(pools(spec).values()))
    out = {}
    for key in ("bert_2.6B_256", "moe_10B_512"):
        model = models[key]
        est = CellEstimator(cfg)
        t0 = time.perf_counter()
        cells = est.cells(model, cluster)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = est.cells(model, cluster)
        warm = time.perf_counter() - t0
        assert again == cells
        out[key] = {"cells": len(cells), "fitting": sum(c.fits for c in cells), "cold_s": round(cold, 4),
                    "cached_s": round(warm, 6), "gpu_types": len(cluster.pools),
                    "max_gpus": cfg.max_gpus}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="folder holding arena/ (default: <repo>/../shared/data)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--iters", type=int, default=120, help="Nelder-Mead iterations")
    ap.add_argument("--no-fit", action="store_true", help="skip the refit; evaluate the shipped prior only")
    args = ap.parse_args(argv)

    arena = data_dir(args.data) / "arena"
    optimal = json.loads((arena / "iter_time_optimal.json").read_text())
    estimated = json.loads((arena / "iter_time_estimated.json").read_text())
    dims = json.loads((arena / "models.json").read_text())
    cluster = json.loads((arena / "cluster_1280.json").read_text())
    pool_map = pools(cluster[0] if isinstance(cluster, list) else cluster)

    models: dict[str, CellModel] = {}
    pairs: list[Pair] = []
    skipped: dict[str, int] = {}
    for m, rs in sorted(optimal.items()):
        model = arena_model(m, dims)
        for r, t in sorted(rs.items()):
            if t <= 0:
                skipped["not_runnable_in_artifact"] = skipped.get("not_runnable_in_artifact", 0) + 1
                continue
            if model is None:
                skipped[f"family_not_covered:{m.split('_')[0]}"] = skipped.get(f"family_not_covered:{m.split('_')[0]}", 0) + 1
                continue
            models[m] = model
            pairs.append((m, r, float(t)))
    train_keys, test_keys = split(sorted(models), args.seed)
    train = [p for p in pairs if p[0] in train_keys]
    test = [p for p in pairs if p[0] in test_keys]

    shipped = [DEFAULT_PRIOR.matmul_efficiency, DEFAULT_PRIOR.traffic_multiplier,
               LinkPrior().nvlink_efficiency, LinkPrior().pcie_efficiency, LinkPrior().network_efficiency]
    result: dict[str, Any] = {"data": str(arena), "pairs_evaluated": len(pairs), "pairs_skipped": skipped,
                              "split": {"seed": args.seed, "train_models": len(train_keys),
                                        "test_models": len(test_keys), "train_pairs": len(train),
                                        "test_pairs": len(test)}}
    configs = {"shipped_prior": shipped}
    if not args.no_fit:
        t0 = time.perf_counter()
        params, loss, calls = fit(train, models, pool_map, shipped, args.iters)
        result["fit"] = {"on": "train half (model keys)", "objective": "mean |log(estimate/measured)|",
                         "params": dict(zip(PARAM_NAMES, [round(p, 4) for p in params])),
                         "train_loss": round(loss, 4), "evaluations": calls,
                         "seconds": round(time.perf_counter() - t0, 1)}
        configs["fitted_on_train"] = params

    rows_by_cfg: dict[str, list[dict[str, Any]]] = {}
    for name, params in configs.items():
        cfg = config_from(params)
        est = estimate_pairs(cfg, pairs, models, pool_map)
        rows = []
        for (m, r, t), e in rel_errors(pairs, est):
            c = est[(m, r)]
            a = authors_best(estimated, m, r)
            g, nodes, per = parse_resources(r)
            rows.append({"model": m, "resources": r, "family": m.split("_")[0], "gpu": g,
                         "gpus": nodes * per, "measured": round(t, 4),
                         "estimate": round(c.iter_time.value, 4) if c and c.iter_time else None,
                         "plan": c.plan.describe() if c and c.plan else None,
                         "rel_err": None if e is None else round(e, 4),
                         "authors": None if a is None else round(a, 4),
                         "authors_rel_err": None if a is None else round(abs(a - t) / t, 4),
                         "split": "train" if m in train_keys else "test"})
        rows_by_cfg[name] = rows
        both = [row for row in rows if row["authors"] is not None]
        result[name] = {
            "params": dict(zip(PARAM_NAMES, [round(p, 4) for p in params])),
            "all": summary([row["rel_err"] for row in rows]),
            "held_out": summary([row["rel_err"] for row in rows if row["split"] == "test"]),
            "train": summary([row["rel_err"] for row in rows if row["split"] == "train"]),
            "by_family": breakdown_by(rows, "family", "rel_err"),
            "by_gpu": breakdown_by(rows, "gpu", "rel_err"),
            "pairs_with_authors_estimate": {
                "tessera": summary([row["rel_err"] for row in both]),
                "authors": summary([row["authors_rel_err"] for row in both]),
                "tessera_held_out": summary([row["rel_err"] for row in both if row["split"] == "test"]),
                "authors_held_out": summary([row["authors_rel_err"] for row in both if row["split"] == "test"]),
            },
        }
    authors_rows = [row for row in rows_by_cfg["shipped_prior"] if row["authors"] is not None]
    result["authors_all_their_pairs"] = {
        "all": summary([row["authors_rel_err"] for row in authors_rows]),
        "by_family": breakdown_by(authors_rows, "family", "authors_rel_err"),
        "by_gpu": breakdown_by(authors_rows, "gpu", "authors_rel_err"),
    }
    result["cells_cost"] = cost_of_cells(cluster, models, config_from(configs.get("fitted_on_train", shipped)))
    out = REPO / "bench" / "results" / "estimator_arena.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result, "rows": rows_by_cfg}, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
