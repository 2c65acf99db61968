"""Readers for the Morphling artifact's measurements (shared/data/morphling/: docs/reference/data.md).

* ``profile/<model>/config.csv`` + ``data.csv``: the sampled runs the paper fits on (UTF-8 BOM).
* ``profile/history.csv``: the paper's fitted parameters per model.
* ``placements/<model>/placements.csv``: measured iteration times per (plan, placement).

The readers return plain records; :func:`profile_samples` and :func:`placement_config` turn them into
the performance model's :class:`~tessera.estimator.perf_model.Sample` / :class:`RunConfig`.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera.estimator.perf_model import (
    Params,
    PerfModelInputError,
    Placement,
    Plan,
    RunConfig,
    Sample,
    Workload,
    Zero,
)

MIB = 1024 * 1024
PLAN_KINDS = ("ga", "gc", "zero-dp", "zero-offload")


@dataclass(frozen=True)
class ProfileRow:
    """One sampled run: config.csv joined with data.csv (times in milliseconds as in the files)."""

    nodes: int
    gpus: int
    param_mib: float  # parameter count / 2**20 (the artifact's "parameter_size")
    batch_size: int
    seq_hid: int
    cpu_threads: int
    zero_type: int  # 0 none, 1 offload, 2 zero-dp
    is_tp: int
    is_pp: int
    forward_ms: float
    tcc_ms: float
    topt_ms: float
    iter_ms: float
    strategy: tuple[int, int, int, int]  # (alpha_f, alpha_b, alpha_c, plan flag)


@dataclass(frozen=True)
class PlacementRow:
    exec_plan: str
    placement: str
    iter_time: float  # seconds
    extra: tuple[tuple[str, str], ...] = ()  # the other columns, as read


@dataclass(frozen=True)
class PlanSpec:
    """A decoded ``exec_plan``: kind is ga/gc/zero-dp/zero-offload/3d; sizes only for 3d."""

    kind: str
    pp: int = 1
    tp: int = 1
    dp: int = 1


def _read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    with path.open(encoding="utf-8-sig", newline="") as f:  # utf-8-sig drops the BOM
        return [
            {k.strip(): (v or "").strip() for k, v in row.items() if k is not None}
            for row in csv.DictReader(f)
        ]


def _num(row: dict[str, str], key: str, where: str, as_int: bool = False) -> float:
    if key not in row:
        raise PerfModelInputError(key, f"column missing in {where}")
    try:
        value = float(row[key])
    except ValueError:
        raise PerfModelInputError(key, f"not a number in {where}: {row[key]!r}") from None
    if not math.isfinite(value):
        raise PerfModelInputError(key, f"not finite in {where}: {row[key]!r}")
    if as_int and value != int(value):
        raise PerfModelInputError(key, f"not an integer in {where}: {row[key]!r}")
    return value


def decode_strategy(text: str) -> tuple[int, int, int, int]:
    """``"1111"`` -> (alpha_f, alpha_b, alpha_c, plan flag)."""
    s = text.strip()
    if len(s) != 4 or not s.isdigit():
        raise PerfModelInputError("strategy", f"expects four digits, got {text!r}")
    return (int(s[0]), int(s[1]), int(s[2]), int(s[3]))


def read_profile(model_dir: Path | str) -> list[ProfileRow]:
    """Read ``config.csv`` and ``data.csv`` of one model (row i of one goes with row i of the other)."""
    d = Path(model_dir)
    config = _read_csv(d / "config.csv")
    data = _read_csv(d / "data.csv")
    if len(config) != len(data):
        raise PerfModelInputError("data.csv", f"{len(data)} rows but config.csv has {len(config)} in {d}")
    rows = []
    for i, (c, x) in enumerate(zip(config, data, strict=True)):
        where = f"{d} row {i + 1}"
        rows.append(
            ProfileRow(
                nodes=int(_num(c, "nodes", where, True)),
                gpus=int(_num(c, "gpus", where, True)),
                param_mib=_num(c, "parameter_size", where),
                batch_size=int(_num(c, "batch_size", where, True)),
                seq_hid=int(_num(c, "seq_hid", where, True)),
                cpu_threads=int(_num(c, "num_cpu_threads", where, True)),
                zero_type=int(_num(c, "zero_type", where, True)),
                is_tp=int(_num(c, "is_tp", where, True)),
                is_pp=int(_num(c, "is_pp", where, True)),
                forward_ms=_num(x, "forward_time", where),
                tcc_ms=_num(x, "Tcc", where),
                topt_ms=_num(x, "Topt", where),
                iter_ms=_num(x, "iter_time", where),
                strategy=decode_strategy(x.get("strategy", "")),
            )
        )
    return rows


def read_history(path: Path | str) -> dict[str, Params]:
    """The paper's fitted parameters, keyed by lower-case model name (``llama7b``, ``gpt2``...)."""
    out: dict[str, Params] = {}
    for i, row in enumerate(_read_csv(Path(path))):
        where = f"{path} row {i + 1}"
        name = row.get("model", "").strip().lower()
        if not name:
            raise PerfModelInputError("model", f"empty in {where}")
        out[name] = Params(
            k_bwd=_num(row, "k_bwd", where),
            k_sync=_num(row, "k_sync", where),
            k_opt=_num(row, "k_opt", where),
            k_os_offload=_num(row, "k_os_offload", where),
            k_const=_num(row, "k_const", where),
            k_off=_num(row, "k_off", where),
            k_swap=_num(row, "k_swap", where),
        )
    return out


def read_placements(path: Path | str) -> list[PlacementRow]:
    """Rows of a ``placements.csv`` (any columns beyond exec_plan, placement, iter_time kept as text)."""
    out = []
    for i, row in enumerate(_read_csv(Path(path))):
        where = f"{path} row {i + 1}"
        for key in ("exec_plan", "placement"):
            if not row.get(key):
                raise PerfModelInputError(key, f"missing in {where}")
        extra = tuple((k, v) for k, v in row.items() if k not in ("exec_plan", "placement", "iter_time"))
        out.append(PlacementRow(row["exec_plan"], row["placement"], _num(row, "iter_time", where), extra))
    return out


def parse_exec_plan(text: str, gpus: int | None = None) -> PlanSpec:
    """``ga``/``gc``/``zero-dp``/``zero-offload``, or three digits PP, TP, DP (``248`` = PP2 TP4 DP8).

    With ``gpus`` the 3D sizes must multiply to it.
    """
    s = text.strip().lower()
    if s in PLAN_KINDS:
        return PlanSpec(s, dp=gpus or 1)
    if len(s) == 3 and s.isdigit() and "0" not in s:
        pp, tp, dp = (int(c) for c in s)
        if gpus is not None and pp * tp * dp != gpus:
            raise PerfModelInputError(
                "exec_plan", f"{text!r} is PP{pp} TP{tp} DP{dp} = {pp * tp * dp} GPUs, placement has {gpus}"
            )
        return PlanSpec("3d", pp=pp, tp=tp, dp=dp)
    raise PerfModelInputError(
        "exec_plan", f"expects ga, gc, zero-dp, zero-offload or PP/TP/DP digits, got {text!r}"
    )


def launcher_pods(placement: str) -> tuple[int, int]:
    """(GPUs per pod, most pods on one server) when the artifact's launcher starts ``placement``.

    The Morphling controller (``sched/controller.py``, ``_create_pytorch_job``) gives every pod
    gcd(GPUs per server) GPUs (``nproc_per_node``) and starts as many pods as that takes, so "35"
    runs as 8 pods of 1 GPU (3 on one server, 5 on the other) and "26" as 4 pods of 2 GPUs. Used by
    the benchmark to group rows; the performance model itself does not use it (see
    docs/estimator-perf-model.md, "Not under 10%").
    """
    counts = Placement.parse(placement).gpus_per_node
    per_pod = math.gcd(*counts)
    return per_pod, max(counts) // per_pod


# Applications whose ZeRO-Offload pods the artifact's launcher gives OMP_NUM_THREADS (CPUs per server).
OMP_SET_FOR_OFFLOAD = frozenset({"vit", "roberta", "swin"})


def launcher_omp_unset(application: str, exec_plan: str, placement: str) -> int:
    """How many processes with OMP_NUM_THREADS unset the artifact's launcher puts on one server.

    ``torch.distributed.launch`` sets OMP_NUM_THREADS=1 only when it starts more than one process
    (``nproc_per_node`` > 1), and the launcher itself sets it only for the ZeRO-Offload pods of
    ViT, RoBERTa and Swin; every other pod of one GPU runs torch with a thread pool of every core of
    its server. 0 when every process has it set; else the most such processes on one server. Used
    by the benchmark to group rows (docs/estimator-perf-model.md); the model does not use it.
    """
    per_pod, most = launcher_pods(placement)
    if per_pod > 1 or (exec_plan == "zero-offload" and application in OMP_SET_FOR_OFFLOAD):
        return 0
    return most


def plan_from_spec(spec: PlanSpec, micro_batches: int = 1) -> Plan:
    if spec.kind == "3d":
        return Plan(dp=spec.dp, tp=spec.tp, pp=spec.pp, micro_batches=micro_batches)
    zero: Zero = {"zero-dp": "zero-dp", "zero-offload": "offload"}.get(spec.kind, "none")  # type: ignore[assignment]
    return Plan(dp=spec.dp, zero=zero, checkpointing=spec.kind == "gc")


def placement_config(
    row: PlacementRow, workload: Workload, *, offload_cpus: int = 4, micro_batches: int = 1
) -> RunConfig:
    """The RunConfig of one placements.csv row (no measured forward: the model predicts it)."""
    placement = Placement.parse(row.placement)
    spec = parse_exec_plan(row.exec_plan, placement.gpus)
    plan = plan_from_spec(spec, micro_batches)
    cpus = offload_cpus if plan.zero == "offload" else 1
    return RunConfig(workload, plan, placement, cpus=cpus)


def profile_config(row: ProfileRow, workload: Workload, *, use_measured_forward: bool) -> RunConfig:
    """The RunConfig of one profiled run: DP on ``gpus`` GPUs over ``nodes`` servers."""
    if row.is_tp or row.is_pp:
        raise PerfModelInputError("is_tp", "profiled TP/PP runs carry no sizes in config.csv; not supported")
    if row.nodes < 1 or row.gpus < row.nodes or row.gpus % row.nodes:
        raise PerfModelInputError("gpus", f"{row.gpus} GPUs cannot spread evenly over {row.nodes} nodes")
    zero: Zero = {0: "none", 1: "offload", 2: "zero-dp"}.get(row.zero_type, "none")  # type: ignore[assignment]
    if row.zero_type not in (0, 1, 2):
        raise PerfModelInputError("zero_type", f"expects 0, 1 or 2, got {row.zero_type}")
    plan = Plan(dp=row.gpus, zero=zero, checkpointing=row.strategy[0] == 2)
    placement = Placement((row.gpus // row.nodes,) * row.nodes)
    fwd = row.forward_ms / 1000.0 if use_measured_forward and row.forward_ms > 0 else None
    return RunConfig(workload, plan, placement, cpus=row.cpu_threads, fwd_time=fwd)


def profile_samples(
    rows: Sequence[ProfileRow], workload: Workload, *, use_measured_forward: bool = False
) -> list[Sample]:
    """Samples to fit on: each profiled run of ``workload`` (the model that was profiled) with its
    measured iteration time and parts. With ``use_measured_forward`` the run's measured forward time
    replaces the workload's forward model (the paper's T_fwd "from profilers")."""
    out = []
    for row in rows:
        cfg = profile_config(row, workload, use_measured_forward=use_measured_forward)
        out.append(
            Sample(
                cfg,
                iter_time=row.iter_ms / 1000.0,
                t_cc=row.tcc_ms / 1000.0 if row.tcc_ms > 0 else None,
                t_oo=row.topt_ms / 1000.0 if row.topt_ms > 0 else None,
            )
        )
    return out


def forward_points(rows: Sequence[ProfileRow], global_batch: int) -> list[tuple[float, float]]:
    """(per-GPU batch, forward seconds) of the profiled runs, for :func:`perf_model.forward_profile`."""
    return [(global_batch / r.gpus, r.forward_ms / 1000.0) for r in rows if r.forward_ms > 0]
