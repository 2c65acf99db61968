"""Accuracy of the performance model on the Morphling artifact's measurements.

For each model: fit the seven parameters on its ``profile/`` samples only, predict every row of its
``placements/`` table (512 rows over 7 models: single-node, multi-node and 3D plans) and compare
with the measured iteration time. Three columns:

* ``morphling``: the paper's model (Appendix A), fitted here;
* ``tessera``: the placement-aware extension, fitted here;
* ``history``: the paper's model with the parameters the authors published (profile/history.csv).

    python bench/estimator_morphling.py [--data DIR] [--out bench/results]

Prints one JSON object and writes it to OUT/estimator_morphling.json. The data are looked up at
<repo>/../shared/data unless --data says otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from estimator import perf_data
from estimator.perf_model import (
    DEFAULT_ENV,
    MODES,
    Environment,
    Mode,
    Params,
    Workload,
    fit,
    forward_profile,
    predict,
    rmsle,
)

MIB = 1024 * 1024


@dataclass(frozen=True)
class ModelSpec:
    """Shape of one model of the artifact: layers/hidden/seq split the profile's ``seq_hid`` (= s*h*l)
    with the published architecture; the global batch is the artifact's job config
    (sched/models/*.py ``local_bsz``). ``params``/``seq`` None = the profiled model's; a model whose
    profile is a sibling's (llama30 <- llama7b) names its own, and its forward time is scaled by
    the FLOPs per sample (params x seq)."""

    profile: str
    history: str
    layers: int
    hidden: int
    seq: int
    global_batch: int
    params: float | None = None
    profile_seq: int | None = None


MODELS: dict[str, ModelSpec] = {
    "vit": ModelSpec("vit", "vit", 12, 768, 512, 64),
    "roberta": ModelSpec("roberta", "roberta", 24, 1024, 512, 64),
    "bert": ModelSpec("bert", "bert", 24, 1024, 512, 32),
    "t5": ModelSpec("t5", "t5", 32, 1024, 512, 16),
    "gpt2": ModelSpec("gpt2", "gpt2", 48, 1600, 1024, 16),
    "llama7": ModelSpec("llama7b", "llama7b", 32, 4096, 4096, 8),
    # The artifact's llama30b profile is a copy of llama7b's (data README): 6.74 B parameters at
    # 4096 tokens. LLaMA-30B: 32.5 B parameters, 60 layers of 6656, a 2048-token context.
    "llama30": ModelSpec("llama30b", "llama30b", 60, 6656, 2048, 4, params=32.5e9, profile_seq=4096),
}

# Artifact's profiled offload runs use 4 CPU threads per GPU; the placements rows are taken as the same.
OFFLOAD_CPUS = 4


def data_root(arg: str | None) -> Path:
    root = Path(arg) if arg else REPO.parent / "shared" / "data"
    morph = root / "morphling"
    if not (morph / "profile").is_dir() or not (morph / "placements").is_dir():
        raise SystemExit(
            f"error: Morphling data not found under {morph} (expected profile/ and placements/); "
            "put the shared data beside the repository (<repo>/../shared/data) or pass --data DIR"
        )
    return root


def history_in_si(p: Params) -> Params:
    """history.csv is in the artifact's units (ms; parameter sizes in MiB of parameters)."""
    return Params(
        k_bwd=p.k_bwd,
        k_sync=p.k_sync,
        k_opt=p.k_opt * 1e-3 / MIB,
        k_os_offload=p.k_os_offload * 1e-3 / MIB,
        k_const=p.k_const * 1e-3,
        k_off=p.k_off,
        k_swap=p.k_swap,
    )


def build_workloads(
    name: str, spec: ModelSpec, rows: list[perf_data.ProfileRow]
) -> tuple[Workload, Workload]:
    """(the profiled model, the model whose placements are predicted); the same unless the profile
    is a sibling's."""
    profiled_params = rows[0].param_mib * MIB
    ref_t, ref_b, beta = forward_profile(perf_data.forward_points(rows, spec.global_batch))
    profiled = Workload(
        name=f"{name}-profile",
        params=profiled_params,
        layers=spec.layers,
        hidden=spec.hidden,
        seq=spec.profile_seq or spec.seq,
        global_batch=spec.global_batch,
        fwd_ref_time=ref_t,
        fwd_ref_batch=ref_b,
        fwd_exponent=beta,
    )
    if spec.params is None and spec.profile_seq is None:
        return profiled, replace(profiled, name=name)
    params = spec.params or profiled_params
    flops = params * spec.seq / (profiled_params * profiled.seq)
    return profiled, replace(profiled, name=name, params=params, seq=spec.seq, fwd_ref_time=ref_t * flops)


def kinds(row: perf_data.PlacementRow, nodes: int) -> list[str]:
    spec = perf_data.parse_exec_plan(row.exec_plan)
    return ["single-node" if nodes == 1 else "multi-node", spec.kind]


def stats(errs: list[float]) -> dict[str, float]:
    return {
        "n": len(errs),
        "mean_pct": round(100 * statistics.fmean(errs), 2),
        "median_pct": round(100 * statistics.median(errs), 2),
        "max_pct": round(100 * max(errs), 2),
    }


def run(root: Path, env: Environment) -> dict[str, Any]:
    morph = root / "morphling"
    history = perf_data.read_history(morph / "profile" / "history.csv")
    columns = [*MODES, "history"]
    errs: dict[str, dict[str, dict[str, list[float]]]] = {c: {} for c in columns}
    fitted: dict[str, dict[str, Any]] = {}
    rows_out: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for name, spec in MODELS.items():
        prof = perf_data.read_profile(morph / "profile" / spec.profile)
        profiled, workload = build_workloads(name, spec, prof)
        samples = perf_data.profile_samples(prof, profiled)
        params: dict[str, Params] = {}
        fitted[name] = {"workload": asdict(workload), "profile_samples": len(samples)}
        for mode in MODES:
            params[mode] = fit(samples, mode, env)
            fitted[name][mode] = {
                "params": asdict(params[mode]),
                "profile_rmsle": round(rmsle(params[mode], samples, mode, env), 4),
            }
        params["history"] = history_in_si(history[spec.history])
        fitted[name]["history"] = {"params": asdict(params["history"])}
        for row in perf_data.read_placements(morph / "placements" / name / "placements.csv"):
            cfg = perf_data.placement_config(row, workload, offload_cpus=OFFLOAD_CPUS)
            groups = ["all", name, *kinds(row, cfg.placement.nodes)]
            rec: dict[str, Any] = {
                "model": name,
                "exec_plan": row.exec_plan,
                "placement": row.placement,
                "measured_s": row.iter_time,
            }
            for col in columns:
                mode: Mode = "morphling" if col == "history" else col  # type: ignore[assignment]
                pred = predict(params[col], cfg, mode, env)
                err = abs(pred - row.iter_time) / row.iter_time if math.isfinite(pred) else math.inf
                rec[col] = round(pred, 5)
                for g in groups:
                    errs[col].setdefault(g, []).append(err)
            rows_out.append(rec)
    elapsed = time.perf_counter() - t0

    def table(col: str) -> dict[str, dict[str, float]]:
        return {g: stats(v) for g, v in errs[col].items()}

    return {
        "benchmark": "estimator_morphling",
        "data": str(morph),
        "rows": len(rows_out),
        "environment": asdict(env),
        "seconds": round(elapsed, 2),
        "error": {col: table(col) for col in columns},
        "fitted": fitted,
        "predictions": rows_out,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="shared data folder (default: <repo>/../shared/data)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"), help="folder for the JSON result")
    ap.add_argument("--rows", action="store_true", help="print every row's prediction too")
    args = ap.parse_args(argv)
    root = data_root(args.data)
    result = run(root, DEFAULT_ENV)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "estimator_morphling.json").write_text(json.dumps(result, indent=1) + "\n")
    shown = dict(result)
    if not args.rows:
        shown.pop("predictions")
    print(json.dumps(shown, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
