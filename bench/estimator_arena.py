"""Crius Cell estimator against the Crius artifact's measured optima (data/arena/: docs/reference/data.md).

For every (model, resources) pair of iter_time_optimal.json with a measured time (> 0) (BERT, GShard
MoE and Wide-ResNet: every family of the artifact), Tessera's estimate of the
Cell's best iteration time (best over pipeline stage counts, each Cell the best of its 2^Ns assembled
plans) is compared with the measured optimum of Alpa's full search: mean, median, max relative error,
per family and per GPU type, side by side with the authors' own single-device estimates
(iter_time_estimated.json: the best of their sampled plans).

Calibration, stated: ten constants (six global: matmul efficiency, memory-traffic multiplier,
per-micro-batch overhead, all-to-all, NVLink and PCIe efficiency; and one network efficiency per GPU
type, standing in for the per-pool communication tables) were fitted with `--refit`: seeded random
starts then Nelder-Mead, minimising mean |log(estimate/measured)| over the TRAINING half of the
BERT/MoE models (a seeded split of model keys within each family; seed 0); and the two constants
only the Wide-ResNet uses (FP32 efficiency: it trains in float32; convolution weight traffic per
micro-batch), by Nelder-Mead, on the training half of the Wide-ResNet models with the ten shipped
constants held. The shipped constants are that fit (the Nelder-Mead starts from the shipped point,
so a rerun may move the ten a little on a flat objective).
Errors are reported on the held-out half, on all pairs and on the pairs that also have the authors'
estimate, plus the same with nominal unfitted constants, and after Cell-guided tuning.

Also compares the Wide-ResNet data-parallel memory with dp_mem.json (`dp_memory`; the transformers'
are in bench/estimator_memory.py) and reports the cost of producing all Cells of one job for the
4-type cluster of cluster_1280.json, cold and cached. Prints JSON and writes
bench/results/estimator_arena.json.

Usage: .venv/bin/python bench/estimator_arena.py [--data DIR] [--seed 0] [--refit]
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
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tessera.estimator.cells import (
    Cell,
    CellConfig,
    CellEstimator,
    CellModel,
    ClusterSpec,
    GpuPool,
    LinkPrior,
    clear_caches,
    model_operators,
)
from tessera.estimator.compute import DEFAULT_PRIOR, EfficiencyPrior
from tessera.estimator.models import ModelDims
from tessera.estimator.tuning import tune_cell

# The artifact's GPU types (Crius Table 1; docs/reference/data.md): GPUs per node, intra-node link and
# the node's NIC (Mellanox CX5 = 100 Gb/s = 12.5 GB/s, CX6 = 200 Gb/s = 25 GB/s).
ARENA_GPUS: dict[str, dict[str, Any]] = {
    "a100": {"gpu": "A100-40GB", "gpus_per_node": 4, "intra_link": "nvlink", "nic_gbps": 12.5},
    "v100": {"gpu": "V100-32GB", "gpus_per_node": 16, "intra_link": "nvlink", "nic_gbps": 12.5},
    "a40": {"gpu": "A40-48GB", "gpus_per_node": 2, "intra_link": "pcie", "nic_gbps": 12.5},
    "a10": {"gpu": "A10-24GB", "gpus_per_node": 2, "intra_link": "pcie", "nic_gbps": 25.0},
}
# Achievable fraction of the NIC per GPU type of the artifact's cluster: fitted (see --refit and
# docs/estimator-cells.md), standing in for the per-pool communication tables we do not have.
ARENA_NETWORK: dict[str, float] = {"a100": 1.0, "v100": 0.4843, "a40": 0.0256, "a10": 0.0143}
# Every trainer of the artifact runs 16 micro-batches (sjtu-epcc/arena runtime/crius_worker/jax/run.sh:
# micro_batches_num=16 for wide_resnet, bert and moe), so the bench estimates its Cells with B = 16
# rather than the paper's 4 x Ns.
ARENA_MICROBATCHES = 16
FAMILIES = ("bert", "moe", "wide")  # the first "_"-part of the artifact's model keys
RECIPE = "mixed-adafactor"
# The fitted constants: (name, kind) with kind "unit" in (0, 1] or "pos" > 0. Per-GPU-type network
# efficiencies stand in for the per-pool communication tables the artifact profiled and we do not have.
PARAMS: tuple[tuple[str, str], ...] = (
    ("matmul_efficiency", "unit"), ("traffic_multiplier", "pos"), ("microbatch_overhead_ms", "pos"),
    ("all_to_all_efficiency", "unit"), ("nvlink_efficiency", "unit"), ("pcie_efficiency", "unit"),
    ("network_efficiency.a100", "unit"), ("network_efficiency.v100", "unit"),
    ("network_efficiency.a40", "unit"), ("network_efficiency.a10", "unit"),
)
# Box for the seeded random start of the fit.
_BOX = {"matmul_efficiency": (0.3, 0.9), "traffic_multiplier": (1.0, 12.0), "microbatch_overhead_ms": (1.0, 120.0),
        "all_to_all_efficiency": (0.02, 0.8), "nvlink_efficiency": (0.3, 0.99), "pcie_efficiency": (0.05, 0.95)}


def data_dir(arg: str | None) -> Path:
    d = Path(arg) if arg else REPO.parent / "shared" / "data"
    if not (d / "arena" / "iter_time_optimal.json").is_file():
        raise SystemExit(f"error: arena data not found: expected {d / 'arena' / 'iter_time_optimal.json'} "
                         "(pass --data DIR, the folder that holds arena/)")
    return d


def family_of(key: str) -> str:
    return key.split("_")[0]


def arena_model(key: str, dims: dict[str, Any]) -> CellModel | None:
    """The artifact's model as a CellModel: ModelDims from models.json, the artifact's training recipe
    (fp16, Adafactor with an fp32 master copy: memory.py's "mixed-adafactor"), Alpa's recomputation.
    MoE: FFN 8h, every other layer MoE, top-2, groups of expert_group_size tokens (Alpa's GShard MoE).
    Wide-ResNet: Alpa's model in float32 with SGD + momentum (CellModel.wide_resnet)."""
    if family_of(key) not in FAMILIES:
        return None
    fam_size, batch_s = key.rsplit("_", 1)
    fam, size = fam_size.rsplit("_", 1)
    batch = int(batch_s)
    c = dims[fam][size]
    if fam == "wide_resnet":
        return CellModel.wide_resnet(c["layer_num"], c["width_factor"], c["num_channels"], c["num_classes"],
                                     c["image_size"], batch, name=key)
    h = c["hidden_size"]
    if fam == "bert":
        md = ModelDims(h, c["num_layers"], c["num_heads"], c["vocab_size"], c["seq_len"], key, family="encoder")
        return CellModel.from_dims(md, batch, precision=RECIPE)
    md = ModelDims(h, c["num_layers"], c["num_heads"], c["vocab_size"], c["seq_len"], key, family="moe",
                   ffn_hidden=8 * h, num_experts=c["num_experts"], top_k=2, tied_embeddings=False)
    return CellModel.from_dims(md, batch, precision=RECIPE, expert_group_size=c["expert_group_size"])


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


def shipped_params() -> dict[str, float]:
    """The constants this checkout ships: compute.DEFAULT_PRIOR, cells.LinkPrior() and ARENA_NETWORK."""
    lp = LinkPrior()
    out = {"matmul_efficiency": DEFAULT_PRIOR.matmul_efficiency, "fp32_efficiency": DEFAULT_PRIOR.fp32_efficiency,
           "conv_weight_traffic": DEFAULT_PRIOR.conv_weight_traffic,
           "traffic_multiplier": DEFAULT_PRIOR.traffic_multiplier,
           "microbatch_overhead_ms": DEFAULT_PRIOR.microbatch_overhead_s * 1e3,
           "all_to_all_efficiency": lp.all_to_all_efficiency, "nvlink_efficiency": lp.nvlink_efficiency,
           "pcie_efficiency": lp.pcie_efficiency}
    for t in ARENA_GPUS:
        out[f"network_efficiency.{t}"] = ARENA_NETWORK.get(t, lp.network_efficiency)
    return out


def config_from(params: dict[str, float], pool_map: dict[str, GpuPool]) -> tuple[CellConfig, dict[str, GpuPool]]:
    """A CellConfig and the arena pools (with their network efficiency) from named constants."""
    mm, kappa, ovh = params["matmul_efficiency"], params["traffic_multiplier"], params["microbatch_overhead_ms"]
    f32, kw = params["fp32_efficiency"], params["conv_weight_traffic"]
    prior = EfficiencyPrior(mm, kappa, microbatch_overhead_s=ovh / 1e3, fp32_efficiency=f32, conv_weight_traffic=kw,
                            source=f"prior:roofline(eta_mm={mm:.3f},eta_fp32={f32:.3f},kappa={kappa:.2f},"
                                   f"mb={ovh:.1f}ms,kw={kw:.0f})")
    links = LinkPrior(nvlink_efficiency=params["nvlink_efficiency"], pcie_efficiency=params["pcie_efficiency"],
                      all_to_all_efficiency=params["all_to_all_efficiency"], source="prior:links(arena)")
    pm = {t: replace(p, network_efficiency=params.get(f"network_efficiency.{t}")) for t, p in pool_map.items()}
    return CellConfig(prior=prior, links=links, num_microbatches=ARENA_MICROBATCHES), pm


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


def _to_params(z: Sequence[float]) -> dict[str, float]:
    out = {}
    for (name, kind), v in zip(PARAMS, z):
        out[name] = 1.0 / (1.0 + math.exp(-v)) if kind == "unit" else math.exp(v)
    return out


def _from_params(p: dict[str, float]) -> list[float]:
    z = []
    for name, kind in PARAMS:
        v = p[name]
        if kind == "unit":
            v = min(max(v, 1e-6), 1 - 1e-6)
            z.append(math.log(v / (1 - v)))
        else:
            z.append(math.log(max(v, 1e-6)))
    return z


def mean_log_error(pairs: Sequence[Pair], est: dict[tuple[str, str], Cell | None]) -> float:
    tot = 0.0
    for m, r, t in pairs:
        c = est[(m, r)]
        tot += abs(math.log(c.iter_time.value / t)) if c and c.iter_time else 2.0
    return tot / len(pairs)


def fit(pairs: Sequence[Pair], models: dict[str, CellModel], pool_map: dict[str, GpuPool], seed: int,
        starts: int = 40, iters: int = 250) -> tuple[dict[str, float], float, int]:
    """The PARAMS: seeded random starts in _BOX, then two Nelder-Mead passes from the best; mean |log
    ratio| over `pairs` (the transformer training pairs; the convnet constants do not act on them)."""
    calls = 0
    fixed = shipped_params()

    def loss(z: list[float]) -> float:
        nonlocal calls
        calls += 1
        cfg, pm = config_from({**fixed, **_to_params(z)}, pool_map)
        est = estimate_pairs(cfg, pairs, models, pm)
        return mean_log_error(pairs, est)

    rng = random.Random(seed)
    best_z, best_v = _from_params(fixed), math.inf
    best_v = loss(best_z)
    for _ in range(starts):
        p = {name: (rng.uniform(*_BOX[name]) if name in _BOX else rng.uniform(0.02, 0.95)) for name, _ in PARAMS}
        z = _from_params(p)
        v = loss(z)
        if v < best_v:
            best_z, best_v = z, v
    for _ in range(2):
        best_z, best_v = nelder_mead(loss, best_z, [0.3] * len(PARAMS), iters)
    return {**fixed, **_to_params(best_z)}, best_v, calls


def fit_convnet(pairs: Sequence[Pair], models: dict[str, CellModel], pool_map: dict[str, GpuPool],
                params: dict[str, float], iters: int = 60) -> tuple[dict[str, float], float, int]:
    """The two constants only the Wide-ResNet uses (fp32_efficiency in (0, 1], conv_weight_traffic
    >= 0), on its training pairs, the other constants held: Nelder-Mead on (logit eta, log kw) from
    (0.5, 50); mean |log ratio|."""
    calls = 0

    def unpack(z: Sequence[float]) -> dict[str, float]:
        return {**params, "fp32_efficiency": 1.0 / (1.0 + math.exp(-z[0])), "conv_weight_traffic": math.exp(z[1])}

    def loss(z: list[float]) -> float:
        nonlocal calls
        calls += 1
        cfg, pm = config_from(unpack(z), pool_map)
        return mean_log_error(pairs, estimate_pairs(cfg, pairs, models, pm))

    best_z, best_v = nelder_mead(loss, [0.0, math.log(50.0)], [0.5, 0.5], iters)
    return unpack(best_z), best_v, calls


def split(keys: Sequence[str], seed: int) -> tuple[set[str], set[str]]:
    """Half of the model keys of each family for training, the other half held out."""
    rng = random.Random(seed)
    train: set[str] = set()
    for fam in FAMILIES:
        ks = sorted(k for k in keys if family_of(k) == fam)
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


def live_ratio(rows: Sequence[dict[str, Any]], pick: str) -> dict[str, Any]:
    """What a per-job calibration from live metrics would give: for each pair, the same model's other
    Cells on the same GPU type are taken as already run (their measured optimum reported live), and
    the estimate is scaled by the geometric mean of their measured/estimated ratios. `pick`:
    "smallest" (one other Cell: the fewest GPUs, as a job that ran small first) or "all" (every other
    Cell). Scored on the pair itself, which was not used; pairs with no other Cell are skipped."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        if row["estimate"]:
            by.setdefault((row["model"], row["gpu"]), []).append(row)
    errs: list[float | None] = []
    both: list[tuple[float, float, float]] = []
    for group in by.values():
        for row in group:
            others = [o for o in group if o is not row]
            if not others:
                continue
            if pick == "smallest":
                others = [min(others, key=lambda o: o["gpus"])]
            ratio = math.exp(statistics.fmean(math.log(o["measured"] / o["estimate"]) for o in others))
            err = abs(row["estimate"] * ratio - row["measured"]) / row["measured"]
            errs.append(err)
            if row["authors"] is not None:
                both.append((err, row["authors_rel_err"], row["rel_err"]))
    return {"all": summary(errs),
            "pairs_with_authors_estimate": {"tessera_live_ratio": summary([a for a, _, _ in both]),
                                            "authors": summary([b for _, b, _ in both]),
                                            "tessera": summary([c for _, _, c in both])}}


GIB = 1024**3


def dp_memory_bytes(model: CellModel, gpus: int, microbatches: int = ARENA_MICROBATCHES) -> float:
    """Per-GPU memory of the artifact's data-parallel run of a Wide-ResNet (its trainer's settings:
    16 micro-batches, Alpa's GPipe schedule on one stage, so every micro-batch's stored activations
    are in flight at the turn; coarse-grained remat; float32 weights, gradients and momentum, all
    replicated), from the same operators as the Cells: states + stored activations of the whole
    per-GPU batch + one operator's transient activations of one micro-batch.

    Replicated momentum is read from the data, not from the trainer: with it sharded over the DP
    ranks (ZeRO-1, as bench/estimator_memory.py maps BERT and MoE), the shortfall at 16 GPUs grows
    with the model at 4.4-4.6 bytes per parameter (500M, 1B, 2B), i.e. the momentum is all there."""
    ops = model_operators(model)
    params = sum(o.params for o in ops)
    per_gpu = model.global_batch / gpus
    states = params * model.state_bytes_per_param
    stored = sum(o.stored_bytes for o in ops) * per_gpu
    transient = max(o.traffic_bytes + o.traffic_sharded_bytes for o in ops) * per_gpu / microbatches
    return states + stored + transient


def dp_memory_rows(dp_mem: dict[str, list[float]], models: dict[str, CellModel]) -> dict[str, Any]:
    """Wide-ResNet rows of dp_mem.json (GiB at 1, 2, 4, 8, 16 GPUs; -1 = did not run) against
    dp_memory_bytes."""
    rows, unmeasured = [], []
    for key, values in sorted(dp_mem.items()):
        model = models.get(key)
        if model is None or model.family != "wresnet":
            continue
        for i, gib in enumerate(values):
            n = 2**i
            est = dp_memory_bytes(model, n) / GIB
            if gib <= 0:
                unmeasured.append({"model": key, "gpus": n, "estimate_gib": round(est, 2)})
                continue
            rows.append({"model": key, "gpus": n, "measured_gib": gib, "estimate_gib": round(est, 3),
                         "rel_err": round((est - gib) / gib, 4)})
    errs = [abs(r["rel_err"]) for r in rows]
    return {"wide_resnet": {"n": len(rows), "mean_abs_rel_err": round(statistics.fmean(errs), 4),
                            "median_abs_rel_err": round(statistics.median(errs), 4),
                            "max_abs_rel_err": round(max(errs), 4),
                            "mean_signed_rel_err": round(statistics.fmean(r["rel_err"] for r in rows), 4)}
            if rows else {"n": 0},
            "rows": rows,
            "unmeasured": {"count": len(unmeasured), "estimate_over_40gib": sum(u["estimate_gib"] > 40 for u in unmeasured),
                           "note": "-1 in dp_mem.json: did not run (the artifact's largest GPU has 40 GB; V100s 32)"}}


def cost_of_cells(cluster_json: Any, models: dict[str, CellModel], cfg: CellConfig,
                  repeats: int = 5) -> dict[str, Any]:
    """Seconds to produce all Cells of one job on the 4-type cluster: cold (fresh estimator, module
    memo cleared) and cached (the same call again); median of `repeats`."""
    spec = cluster_json[0] if isinstance(cluster_json, list) else cluster_json
    cluster = ClusterSpec(tuple(pools(spec).values()))
    out = {}
    for key in ("bert_2.6B_256", "moe_10B_512"):
        model = models[key]
        colds, warms = [], []
        for _ in range(repeats):
            est = CellEstimator(cfg)
            clear_caches()
            t0 = time.perf_counter()
            cells = est.cells(model, cluster)
            colds.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            again = est.cells(model, cluster)
            warms.append(time.perf_counter() - t0)
            assert again == cells
        out[key] = {"cells": len(cells), "fitting": sum(c.fits for c in cells),
                    "cold_s_median": round(statistics.median(colds), 4), "cold_s_min": round(min(colds), 4),
                    "cached_s_median": round(statistics.median(warms), 6), "repeats": repeats,
                    "gpu_types": len(cluster.pools), "gpu_counts": "1..64 (powers of two)",
                    "stage_counts": "1..min(GPUs, layers) (powers of two)"}
    return out


NOMINAL = {"matmul_efficiency": 0.5, "fp32_efficiency": 0.5, "conv_weight_traffic": 0.0, "traffic_multiplier": 4.0, "microbatch_overhead_ms": 1.0,
           "all_to_all_efficiency": 0.8, "nvlink_efficiency": 0.8, "pcie_efficiency": 0.8,
           "network_efficiency.a100": 0.8, "network_efficiency.v100": 0.8, "network_efficiency.a40": 0.8,
           "network_efficiency.a10": 0.8}


def tuned_pairs(cfg: CellConfig, pairs: Sequence[Pair], models: dict[str, CellModel],
                pool_map: dict[str, GpuPool]) -> dict[tuple[str, str], tuple[float, str] | None]:
    """Per pair, the best plan after Cell-guided tuning (Sec. 5.2) of every stage count's Cell."""
    est = CellEstimator(cfg)
    out: dict[tuple[str, str], tuple[float, str] | None] = {}
    for m, r, _ in pairs:
        g, nodes, per = parse_resources(r)
        n, best = nodes * per, None
        s = 1
        while s <= min(n, models[m].num_layers):
            t = tune_cell(est, models[m], pool_map[g], n, s, nodes, per)
            if t is not None and (best is None or t.iter_time < best[0]):
                best = (t.iter_time, t.plan.describe())
            s *= 2
        out[(m, r)] = best
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="folder holding arena/ (default: <repo>/../shared/data)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the train/held-out split and of the fit")
    ap.add_argument("--refit", action="store_true",
                    help="refit the constants on the training half (several minutes) and report them too")
    ap.add_argument("--iters", type=int, default=250, help="Nelder-Mead iterations per pass (with --refit)")
    ap.add_argument("--starts", type=int, default=40, help="random starts (with --refit)")
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
    authors_all: list[dict[str, Any]] = []
    for m, rs in sorted(optimal.items()):
        model = arena_model(m, dims)
        for r, t in sorted(rs.items()):
            if t <= 0:
                skipped["not_runnable_in_artifact"] = skipped.get("not_runnable_in_artifact", 0) + 1
                continue
            a = authors_best(estimated, m, r)
            if a is not None:
                authors_all.append({"family": family_of(m), "gpu": parse_resources(r)[0],
                                    "err": abs(a - t) / t})
            if model is None:
                k = f"family_not_covered:{family_of(m)}"
                skipped[k] = skipped.get(k, 0) + 1
                continue
            models[m] = model
            pairs.append((m, r, float(t)))
    train_keys, test_keys = split(sorted(models), args.seed)
    train = [p for p in pairs if p[0] in train_keys]
    test = [p for p in pairs if p[0] in test_keys]

    result: dict[str, Any] = {
        "data": str(arena), "pairs_evaluated": len(pairs), "pairs_skipped": skipped,
        "split": {"seed": args.seed, "train_models": len(train_keys), "test_models": len(test_keys),
                  "train_pairs": len(train), "test_pairs": len(test), "held_out_models": sorted(test_keys)},
        "authors_estimates_all_pairs": {
            "all": summary([x["err"] for x in authors_all]),
            "by_family": breakdown_by(authors_all, "family", "err"),
            "by_gpu": breakdown_by(authors_all, "gpu", "err"),
        },
    }
    configs: dict[str, dict[str, float]] = {"shipped": shipped_params(), "nominal_unfitted": NOMINAL}
    if args.refit:
        t0 = time.perf_counter()
        fp16_train = [p for p in train if models[p[0]].dtype_bytes < 4]
        fp32_train = [p for p in train if models[p[0]].dtype_bytes >= 4]
        params, loss, calls = fit(fp16_train, models, pool_map, args.seed, args.starts, args.iters)
        conv, loss32, calls32 = fit_convnet(fp32_train, models, pool_map, shipped_params())
        params.update({k: conv[k] for k in ("fp32_efficiency", "conv_weight_traffic")})
        result["refit"] = {"on": "training half (model keys); the PARAMS on the BERT/MoE pairs; "
                                 "fp32_efficiency and conv_weight_traffic on the Wide-ResNet pairs with "
                                 "the shipped PARAMS held",
                           "objective": "mean |log(estimate/measured)|",
                           "params": {k: round(v, 4) for k, v in params.items()},
                           "train_loss": {"bert_moe": round(loss, 4), "wide_resnet": round(loss32, 4)},
                           "evaluations": calls + calls32, "seconds": round(time.perf_counter() - t0, 1)}
        configs["refit_on_train"] = params

    rows_by_cfg: dict[str, list[dict[str, Any]]] = {}
    for name, params in configs.items():
        cfg, pm = config_from(params, pool_map)
        est = estimate_pairs(cfg, pairs, models, pm)
        tuned = tuned_pairs(cfg, pairs, models, pm) if name == "shipped" else {}
        rows = []
        for (m, r, t), e in rel_errors(pairs, est):
            c = est[(m, r)]
            a = authors_best(estimated, m, r)
            g, nodes, per = parse_resources(r)
            tu = tuned.get((m, r))
            rows.append({"model": m, "resources": r, "family": family_of(m), "gpu": g,
                         "gpus": nodes * per, "measured": round(t, 4),
                         "estimate": round(c.iter_time.value, 4) if c and c.iter_time else None,
                         "plan": c.plan.describe() if c and c.plan else None,
                         "rel_err": None if e is None else round(e, 4),
                         "tuned": round(tu[0], 4) if tu else None, "tuned_plan": tu[1] if tu else None,
                         "tuned_rel_err": round(abs(tu[0] - t) / t, 4) if tu else None,
                         "authors": None if a is None else round(a, 4),
                         "authors_rel_err": None if a is None else round(abs(a - t) / t, 4),
                         "split": "train" if m in train_keys else "test"})
        rows_by_cfg[name] = rows
        both = [row for row in rows if row["authors"] is not None]
        block: dict[str, Any] = {
            "params": {k: round(v, 4) for k, v in params.items()},
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
        if name == "shipped":
            block["live_ratio"] = {"smallest": live_ratio(rows, "smallest"), "all": live_ratio(rows, "all")}
        if tuned:
            block["after_cell_guided_tuning"] = {
                "all": summary([row["tuned_rel_err"] for row in rows]),
                "held_out": summary([row["tuned_rel_err"] for row in rows if row["split"] == "test"]),
                "pairs_with_authors_estimate": summary([row["tuned_rel_err"] for row in both]),
            }
        result[name] = block
    dp_mem = json.loads((arena / "dp_mem.json").read_text())
    dp_mem = dp_mem[0] if isinstance(dp_mem, list) else dp_mem
    dp_models = {k: m for k in dp_mem if (m := models.get(k) or arena_model(k, dims)) is not None}
    result["dp_memory"] = dp_memory_rows(dp_mem, dp_models)
    result["cells_cost"] = cost_of_cells(cluster, models, config_from(shipped_params(), pool_map)[0])
    out = REPO / "bench" / "results" / "estimator_arena.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result, "rows": rows_by_cfg}, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
