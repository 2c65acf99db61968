"""Job traces for the simulator: the Crius artifact's traces, Philly with a seeded generator, and the
Morphling workloads. Every loader reports a bad file as `TraceError: FILE line N: field F: why`.

- `load_arena(path)`: `job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,
  gpu_type` (data/arena/trace_*.csv), as the artifact replays them.
- `generate_philly(path, oracle models, seed, hours, start_hour, load, families)`:
  data/traces/philly.csv (timestamp, duration, num_gpus) with GPU count and type, model, size and
  batch drawn by a seeded generator as Crius Sec. 8.1 and the artifact's
  `traces/regenerate_sim_trace.py` do, over the artifact's families (Wide-ResNet, BERT, MoE) and
  ours (GPT-3 and LLaMA sizes, for oracles that estimate them); iterations from the duration at the
  requested resources (docs/simulator.md gives every rule).
- `load_morphling(path)`: data/morphling/workloads/workload-*.csv.
"""

from __future__ import annotations

import codecs
import csv
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from tessera.common.errors import InvalidInput
from tessera.estimator.models import ModelDims


class TraceError(InvalidInput, ValueError):
    """A trace file that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class TraceJob:
    id: str
    submit_time: float
    iterations: int
    # Estimate key: the oracle's model name, e.g. "bert_1.3B_128" (arena) or "gpt2" (Morphling).
    model_key: str
    model: ModelDims
    global_batch_size: int
    gpus: int  # the user's request (0 = none)
    gpu_type: str  # the user's request, in the trace's own spelling ("a40"); "" = none
    deadline: float = 0.0
    # Morphling: guaranteed (SLA) job; its initial execution plan; the CPUs it asked for.
    sla: bool = False
    exec_plan: str = ""
    cpus: int = 0
    # The job's tenant ("" = none). A job with a tenant and `sla` is guaranteed, its promise the
    # row's GPUs, CPUs and plan (docs/tenants.md); morphling-mt sets it (controller/sim/tenants.py).
    tenant: str = ""
    # The cost objective (docs/cost-objective.md): "cost", and the seconds its iterations must run within.
    objective: str = ""
    slo_s: float = 0.0


def _open_rows(path: Path, required: Sequence[str]) -> tuple[list[dict[str, str]], list[int]]:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror}") from None
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0  # utf-8-sig
    try:
        text = data[bom:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = bom + e.start
        line = data.count(b"\n", 0, at) + 1
        raise TraceError(f"{path} line {line}: not UTF-8 text (byte 0x{data[at]:02x} at offset {at}); "
                         f"a trace is a UTF-8 CSV file") from None
    lines = text.splitlines()
    if not lines:
        raise TraceError(f"{path} line 1: empty file, expected a header with {', '.join(required)}")
    reader = csv.DictReader(lines, restkey=_EXTRA)
    try:
        header = [h.strip() for h in (reader.fieldnames or [])]
        missing = [f for f in required if f not in header]
        if missing:
            raise TraceError(f"{path} line 1: header lacks field(s) {', '.join(missing)} "
                             f"(has {', '.join(header) or 'nothing'})")
        rows, nums = [], []
        for row in reader:
            # Fields past the header's: an error, but for empty ones (a trailing comma).
            extra = row.pop(_EXTRA, [])
            if any(v.strip() for v in extra):
                raise TraceError(f"{path} line {reader.line_num}: {len(header) + len(extra)} fields, the "
                                 f"header has {len(header)} (past field {header[-1]}: "
                                 f"{', '.join(repr(v) for v in extra)})")
            if not any((v or "").strip() for v in row.values()):
                continue
            rows.append({(k or "").strip(): (v or "").strip() for k, v in row.items()})
            nums.append(reader.line_num)
    except csv.Error as e:  # a NUL byte, a field over csv's size limit
        raise TraceError(f"{path} line {reader.reader.line_num}: not a CSV row: {e}") from None
    return rows, nums


# The key csv.DictReader gives a row's fields past the header's (a list).
_EXTRA = "\0extra"


def _num(path: Path, line: int, row: dict[str, str], field: str, kind: Callable[[str], float],
         positive: bool = False, allow_zero: bool = True) -> float:
    raw = row.get(field, "")
    try:
        v = kind(raw)
    except (TypeError, ValueError):
        raise TraceError(f"{path} line {line}: field {field}: not a number: {raw!r}") from None
    except OverflowError:  # an integer field of inf or 1e400
        raise TraceError(f"{path} line {line}: field {field}: not a finite number: {raw!r}") from None
    if math.isnan(v) or math.isinf(v):
        raise TraceError(f"{path} line {line}: field {field}: not a finite number: {raw!r}")
    if positive and (v < 0 or (v == 0 and not allow_zero)):
        raise TraceError(f"{path} line {line}: field {field}: must be {'> 0' if not allow_zero else '>= 0'}, got {raw}")
    return v


def _objective(path: Path, line: int, row: dict[str, str]) -> tuple[str, float]:
    """The optional columns `objective` ("" or "cost") and `slo_seconds` (> 0 with "cost": the
    seconds its iterations must run within; docs/cost-objective.md)."""
    objective = (row.get("objective") or "").strip().lower()
    if objective not in ("", "cost"):
        raise TraceError(f"{path} line {line}: field objective: must be empty or cost, got {objective!r}")
    if not objective:
        return "", 0.0
    slo = _num(path, line, row, "slo_seconds", float, positive=True, allow_zero=False)
    return objective, slo


def _int(raw: str) -> int:
    f = float(raw)
    if f != int(f):
        raise ValueError(raw)
    return int(f)


# ---------------------------------------------------------------------------------------- arena


ARENA_FIELDS = ("job_id", "submission_time", "num_iteration", "model_name", "deadline", "batch_size",
                "num_gpu", "gpu_type")


def arena_dims(family: str, size: str, models: dict[str, dict[str, dict[str, object]]]) -> ModelDims:
    """ModelDims for an arena model name; Wide-ResNet (not a transformer) gets stand-in dims."""
    spec = models.get(family, {}).get(size, {})

    def g(k: str, d: int) -> int:
        v = spec.get(k, d)
        return int(v) if isinstance(v, (int, float)) else d

    name = f"{family}_{size}"
    if family == "wide_resnet":
        return ModelDims(g("num_channels", 224), g("layer_num", 50), 1, g("num_classes", 1024), g("image_size", 224), name)
    return ModelDims(g("hidden_size", 1024), g("num_layers", 24), g("num_heads", 16), g("vocab_size", 32000),
                     g("seq_len", 1024), name)


def load_arena(path: Path, models: dict[str, dict[str, dict[str, object]]], known_types: Sequence[str] = (),
               known_models: Sequence[str] = (), estimator_dims: bool = False) -> list[TraceJob]:
    """The artifact's trace CSV. `estimator_dims`: each model in the estimator's own family (BERT an
    encoder, MoE GShard), as `philly_dims` builds them for an oracle other than the measured table."""
    rows, nums = _open_rows(path, ARENA_FIELDS)
    out: list[TraceJob] = []
    seen: set[str] = set()
    for row, ln in zip(rows, nums, strict=True):
        jid = row["job_id"]
        if not jid:
            raise TraceError(f"{path} line {ln}: field job_id: empty")
        if jid in seen:
            raise TraceError(f"{path} line {ln}: field job_id: duplicate {jid!r}")
        seen.add(jid)
        sub = _num(path, ln, row, "submission_time", float, positive=True)
        iters = int(_num(path, ln, row, "num_iteration", _int, positive=True, allow_zero=False))
        ddl = _num(path, ln, row, "deadline", float)
        batch = int(_num(path, ln, row, "batch_size", _int, positive=True, allow_zero=False))
        gpus = int(_num(path, ln, row, "num_gpu", _int, positive=True, allow_zero=False))
        if gpus & (gpus - 1):
            raise TraceError(f"{path} line {ln}: field num_gpu: must be a power of two, got {gpus}")
        mname = row["model_name"]
        if "__" not in mname:
            raise TraceError(f"{path} line {ln}: field model_name: expected <family>__<size>, got {mname!r}")
        family, size = mname.split("__", 1)
        key = f"{family}_{size}_{batch}"
        if known_models and f"{family}_{size}" not in known_models:
            raise TraceError(f"{path} line {ln}: field model_name: unknown model {mname!r}")
        gtype = row["gpu_type"].lower()
        if known_types and gtype not in known_types:
            raise TraceError(f"{path} line {ln}: field gpu_type: {gtype!r} is not in the cluster "
                             f"({', '.join(known_types)})")
        objective, slo = _objective(path, ln, row)
        out.append(TraceJob(jid, sub, iters, key, philly_dims(family, size, models, estimator=estimator_dims), batch,
                            gpus, gtype, ddl, objective=objective, slo_s=slo))
    out.sort(key=lambda j: j.submit_time)  # stable: file order among equal times
    return out


# ---------------------------------------------------------------------------------------- philly

PHILLY_FIELDS = ("timestamp", "duration", "num_gpus")

# The artifact's draw (traces/regenerate_sim_trace.py, Philly): cumulative weights out of the last.
# Its three families keep its draw exactly; GPT and LLaMA are ours, for oracles that can estimate
# them (the Cell estimator; the artifact's measured table has only its own three).
ARTIFACT_FAMILIES = ("wide_resnet", "bert", "moe")
FAMILIES = (*ARTIFACT_FAMILIES, "gpt", "llama")
# Families the live controller's Cells cover (controller/cell_estimates.py over ModelDims: decoder,
# encoder, moe). The Cell estimator also models Wide-ResNet (CellModel.wide_resnet), but a Cell is
# offered only with a plan a worker runs, and no worker here trains a convnet.
TRANSFORMER_FAMILIES = ("bert", "moe", "gpt", "llama")
# Family weights: the artifact's 15/25/60; GPT and LLaMA weigh as much as BERT. The draw is over
# the chosen families only, in FAMILIES order (the artifact's three: cumulative 15/40/100, as it).
_W_FAMILY = {"wide_resnet": 15, "bert": 25, "moe": 60, "gpt": 25, "llama": 25}
_SIZES = {"wide_resnet": ("500M", "1B", "2B", "4B", "6.8B", "13B"),
          "bert": ("760M", "1.3B", "2.6B", "6.7B", "15B", "39B"),
          "moe": ("690M", "1.3B", "2.4B", "10B", "27B", "70B"),
          # GPT-3 (Brown et al. 2020, Table 2.1) sizes from 350M to 13B.
          "gpt": ("350M", "760M", "1.3B", "2.7B", "6.7B", "13B"),
          # LLaMA (Touvron et al. 2023, Table 2); 65B is left out: 65.2B x 16 B/param of weights,
          # gradients and Adam states is over 16 x 48 GB, and a request stops at 16 GPUs.
          "llama": ("7B", "13B", "33B")}
_P_SIZE = (10, 25, 50, 70, 85, 95)
_P_SIZES = {"llama": (40, 75, 100)}  # else _P_SIZE
_BATCHES = {"wide_resnet": (256, 512, 1024), "bert": (128, 256, 512), "moe": (256, 512, 1024),
            # GPT-3 trained with 0.5M-1M tokens per batch (256-512 sequences of 2,048) at these sizes.
            "gpt": (128, 256, 512),
            # LLaMA fine-tuning recipes: 128 sequences (Stanford Alpaca, Vicuna), 64 to 256 here.
            "llama": (64, 128, 256)}
_P_BATCH = (50, 60, 65)
_COUNTS = (1, 2, 4, 8, 16)
_P_COUNT = (10, 25, 45, 65, 80)
# The largest GPU count a size may request: the artifact caps the count draw at the size's rank + 2
# (4, 8, then 16 GPUs); every LLaMA size may ask for up to 16.
_MAX_GPUS = {"llama": (16, 16, 16)}  # else (4, 8, 16, 16, 16, 16)
_P_TYPE = (15, 30, 60, 90)
# Iteration time over this is infeasible (the artifact's rule, controller/sim/oracles.py MAX_ITER_S).
MAX_ITER_S = 300.0

# Dimensions of GPT and LLaMA (ModelDims: hidden, layers, heads, vocabulary, sequence).
# GPT: GPT-3 Table 2.1 (d_model, n_layers, d_head; 2,048-token context; GPT-2's 50,257-token BPE,
# tied embeddings). Two rows of that table are inconsistent (1.3B: 24 heads x 128 != 2,048;
# 13B: d_model 5,140 is not a multiple of its 40 heads): we keep d_head 128, so 1.3B has 16 heads
# and 13B d_model 5,120 = 40 x 128 (as OPT-13B and Megatron's GPT-3 13B).
# LLaMA: Table 2 of the LLaMA paper (dimension, heads, layers; 2,048-token context), the SwiGLU
# width of the released params.json (2/3 x 4h rounded up to a multiple of 256: 11,008, 13,824,
# 17,920), 32,000-token vocabulary, untied embeddings, RMSNorm and rotary positions (gated=True).
_GPT = {"350M": (1024, 24, 16), "760M": (1536, 24, 16), "1.3B": (2048, 24, 16), "2.7B": (2560, 32, 32),
        "6.7B": (4096, 32, 32), "13B": (5120, 40, 40)}
_LLAMA = {"7B": (4096, 32, 32, 11008), "13B": (5120, 40, 40, 13824), "33B": (6656, 60, 52, 17920)}
PHILLY_DIMS: dict[str, dict[str, ModelDims]] = {
    "gpt": {s: ModelDims(h, l, a, 50257, 2048, f"gpt_{s}") for s, (h, l, a) in _GPT.items()},
    "llama": {s: ModelDims(h, l, a, 32000, 2048, f"llama_{s}", ffn_hidden=f, gated=True, tied_embeddings=False)
              for s, (h, l, a, f) in _LLAMA.items()},
}


def _pick(rng: random.Random, cum: Sequence[int]) -> int:
    x = rng.randint(0, cum[-1] - 1)
    for i, c in enumerate(cum):
        if x < c:
            return i
    return len(cum) - 1


def philly_dims(family: str, size: str, models: dict[str, dict[str, dict[str, object]]],
                estimator: bool = False) -> ModelDims:
    """ModelDims of a Philly job. GPT and LLaMA: PHILLY_DIMS. The artifact's families: `arena_dims`
    (every transformer a GPT-2-style decoder; what the arena oracle's runs have always used), or with
    `estimator` the estimator's own family: BERT an encoder, MoE GShard-style with the artifact's
    expert count, an 8h expert MLP and untied embeddings (as estimator/models.py registers them)."""
    if family in PHILLY_DIMS:
        return PHILLY_DIMS[family][size]
    d = arena_dims(family, size, models)
    if not estimator or family == "wide_resnet":
        return d
    if family == "bert":
        return replace(d, family="encoder")
    if family == "moe":
        e = models.get(family, {}).get(size, {}).get("num_experts", 16)
        return replace(d, family="moe", num_experts=int(e) if isinstance(e, (int, float)) else 16,
                       ffn_hidden=8 * d.hidden_size, tied_embeddings=False)
    return d


@dataclass(frozen=True)
class PhillyOptions:
    seed: int = 1
    hours: float = 24.0
    start_hour: float = 0.0
    # Load scaling: submission gaps divided by this factor (2.0 = twice the arrival rate).
    load: float = 1.0
    # Families drawn, any of FAMILIES (order does not matter; the draw follows FAMILIES' order).
    families: tuple[str, ...] = ARTIFACT_FAMILIES
    min_iterations: int = 100
    max_iterations: int = 1_000_000
    # Dimensions the estimator's families expect (philly_dims); False keeps the artifact's.
    estimator_dims: bool = False


def generate_philly(path: Path, feasible: Callable[[str, str, int], float], gpu_types: Sequence[str],
                    models: dict[str, dict[str, dict[str, object]]], opts: PhillyOptions) -> list[TraceJob]:
    """Philly arrivals and durations with the artifact's seeded draw of model, size, batch, GPU count
    and type. `feasible(model_key, gpu_type, gpus)` gives the iteration time (s) of the request at
    its best locality, 0 if it cannot run: infeasible draws are drawn again, as the artifact does.
    `gpu_types`: the four types in the artifact's order (a100, v100, a40, a10). The model key is
    `<family>_<size>_<batch>`; `philly_dims` gives the dimensions."""
    for name, value, low_ok in (("hours", opts.hours, False), ("start_hour", opts.start_hour, True),
                                ("load", opts.load, False)):
        if not (math.isfinite(value) and (value > 0 or (low_ok and value == 0))):
            raise TraceError(f"{name}: must be a finite number {'>=' if low_ok else '>'} 0, got {value!r}")
    unknown = [f for f in opts.families if f not in FAMILIES]
    if unknown:
        raise TraceError(f"families: unknown family {unknown[0]!r} (known: {', '.join(FAMILIES)})")
    fams = [f for f in FAMILIES if f in opts.families]
    if not fams:
        raise TraceError("families: none given (known: " + ", ".join(FAMILIES) + ")")
    p_family: list[int] = []
    for f in fams:
        p_family.append((p_family[-1] if p_family else 0) + _W_FAMILY[f])
    rows, nums = _open_rows(path, PHILLY_FIELDS)
    recs: list[tuple[float, float, int, int]] = []
    for row, ln in zip(rows, nums, strict=True):
        try:
            ts = datetime.strptime(row["timestamp"], "%Y-%m-%d %H:%M:%S").timestamp()
        except ValueError:
            raise TraceError(f"{path} line {ln}: field timestamp: expected YYYY-MM-DD HH:MM:SS, "
                             f"got {row['timestamp']!r}") from None
        dur = _num(path, ln, row, "duration", float, positive=True)
        n = int(_num(path, ln, row, "num_gpus", _int, positive=True, allow_zero=False))
        recs.append((ts, dur, n, ln))
    recs.sort()
    if not recs:
        return []
    # The trace's head is sparse (a few jobs a day for three weeks): start at the first day with
    # at least 100 submissions, as the artifact starts after its START_TIMESTAMP.
    per_day: dict[int, int] = {}
    for ts, _, _, _ in recs:
        per_day[int(ts // 86400)] = per_day.get(int(ts // 86400), 0) + 1
    dense = min((d for d, c in per_day.items() if c >= 100), default=int(recs[0][0] // 86400))
    t0 = max(recs[0][0], dense * 86400.0) + opts.start_hour * 3600
    t1 = t0 + opts.hours * 3600
    rng = random.Random(opts.seed)
    out: list[TraceJob] = []
    for ts, dur, _n, ln in recs:
        if ts < t0 or ts >= t1:
            continue
        sub = (ts - t0) / opts.load
        if not math.isfinite(sub):  # a load so small that the arrival's time overflows
            raise TraceError(f"load: {opts.load!r} puts the arrival of {path} line {ln} past any time "
                             f"({ts - t0:.0f} s / {opts.load!r})")
        for _attempt in range(10_000):
            fam = fams[_pick(rng, p_family)]
            batch = _BATCHES[fam][_pick(rng, _P_BATCH)]
            si = _pick(rng, _P_SIZES.get(fam, _P_SIZE))
            size = _SIZES[fam][si]
            top = _MAX_GPUS[fam][si] if fam in _MAX_GPUS else _COUNTS[min(len(_P_COUNT) - 1, si + 2)]
            x = rng.randint(0, _P_COUNT[_COUNTS.index(top)] - 1)
            gpus = next(_COUNTS[i] for i, c in enumerate(_P_COUNT) if x < c)
            gtype = gpu_types[min(_pick(rng, _P_TYPE), len(gpu_types) - 1)]
            key = f"{fam}_{size}_{batch}"
            it = feasible(key, gtype, gpus)
            if it > 0:
                break
        else:
            raise TraceError(f"{path} line {ln}: no feasible model drawn in 10,000 tries (seed {opts.seed}, "
                             f"families {', '.join(fams)})")
        iters = int(min(opts.max_iterations, max(opts.min_iterations, dur // it)))
        out.append(TraceJob(f"philly-{ln}", sub, iters, key, philly_dims(fam, size, models, opts.estimator_dims),
                            batch, gpus, gtype, sub + dur * 1.5))
    return out


def split_philly_key(key: str) -> tuple[str, str, int]:
    """`<family>_<size>_<batch>` -> (family, size, batch)."""
    fam, size, batch = key.rsplit("_", 2)
    return fam, size, int(batch)


# ---------------------------------------------------------------------------------------- morphling

MORPHLING_FIELDS = ("name", "submission_time", "duration", "application", "num_gpus", "exec_plan", "steps", "is_sla")

MORPHLING_MODELS = {
    "vit": ModelDims(768, 12, 12, 1000, 197, "vit"),
    "roberta": ModelDims(1024, 24, 16, 50265, 512, "roberta"),
    "bert": ModelDims(1024, 24, 16, 30522, 512, "bert"),
    "t5": ModelDims(1024, 48, 16, 32128, 512, "t5"),
    "gpt2": ModelDims(1600, 48, 25, 50257, 1024, "gpt2"),
    "llama7": ModelDims(4096, 32, 32, 32000, 4096, "llama7"),
    "llama30": ModelDims(6656, 60, 52, 32000, 2048, "llama30"),
}


def load_morphling(path: Path) -> list[TraceJob]:
    rows, nums = _open_rows(path, MORPHLING_FIELDS)
    out = []
    for row, ln in zip(rows, nums, strict=True):
        app = row["application"]
        if app not in MORPHLING_MODELS:
            raise TraceError(f"{path} line {ln}: field application: unknown {app!r} "
                             f"(known: {', '.join(MORPHLING_MODELS)})")
        sub = _num(path, ln, row, "submission_time", float, positive=True)
        gpus = int(_num(path, ln, row, "num_gpus", _int, positive=True, allow_zero=False))
        steps = int(_num(path, ln, row, "steps", _int, positive=True, allow_zero=False))
        sla = int(_num(path, ln, row, "is_sla", _int)) == 1
        cpus = int(_num(path, ln, row, "num_cpus", _int, positive=True)) if row.get("num_cpus", "") else 0
        out.append(TraceJob(row["name"], sub, steps, app, MORPHLING_MODELS[app], 1, gpus, "", 0.0, sla,
                            row["exec_plan"], cpus))
    out.sort(key=lambda j: j.submit_time)
    return out
