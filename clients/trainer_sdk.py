"""The trainer SDK: what a training process imports to speak the worker contract.

A training script calls `TrainerContext.from_env()` to read what the node agent gave it (see
docs/worker-contract.md), `ctx.install_signal_handlers()` so that SIGTERM becomes "checkpoint at the
next step boundary and exit 0", `ctx.report(...)` after each step to send progress to the agent, and the
checkpoint helpers (`checkpoint_writer`, `latest_checkpoint`) to write and find atomic checkpoints.

Outside Tessera (no TESSERA_* variables) the same script runs by hand: one process, no agent, a small
default model and plan, checkpoints under ./checkpoints.

This module must stay free of torch: the controller and the agent import it without the trainer extra.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, MappingProxyType
from typing import Any, Self

from tessera.common.errors import InvalidInput

log = logging.getLogger(__name__)

# Defaults used when a variable is absent (a run by hand, outside Tessera).
DEFAULT_JOB_ID = "local"
DEFAULT_ITERATIONS = 100
DEFAULT_MICRO_BATCH = 8
DEFAULT_CHECKPOINT_DIR = "checkpoints"
DEFAULT_CHECKPOINT_EVERY = 10
DEFAULT_REPORT_INTERVAL_S = 0.5
DEFAULT_REPORT_DEADLINE_S = 1.0
# A worker that cannot reach its agent for this long stops itself (env TESSERA_AGENT_LOSS_TIMEOUT).
DEFAULT_AGENT_LOSS_TIMEOUT_S = 60.0
# After a failed report, unforced reports wait this long (doubling per failure, capped at 10 s).
_FAILURE_BACKOFF_S = 1.0
_FAILURE_BACKOFF_MAX_S = 10.0

CHECKPOINT_META = "meta.json"
LATEST_FILE = "latest"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def _env_float(e: Mapping[str, str], name: str, default: float) -> float:
    raw = e.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ContractError(f"{name} must be a number, got {raw!r}") from None


class ContractError(InvalidInput, ValueError):
    """A contract variable is present but malformed (bad JSON, not an integer, ...)."""


# --------------------------------------------------------------------------------------------------
# Plan and model


def _int_field(d: Mapping[str, Any], names: tuple[str, ...], what: str) -> int | None:
    """The first of `names` present in d as an int (proto JSON writes int64 as strings), else None."""
    for name in names:
        if name in d and d[name] is not None:
            value = d[name]
            if isinstance(value, bool):
                raise ContractError(f"{what}.{name} must be an integer, got {value!r}")
            try:
                as_int = int(value)
            except (TypeError, ValueError):
                raise ContractError(f"{what}.{name} must be an integer, got {value!r}") from None
            if isinstance(value, float) and value != as_int:
                raise ContractError(f"{what}.{name} must be an integer, got {value!r}")
            return as_int
    return None


def _str_field(d: Mapping[str, Any], names: tuple[str, ...]) -> str:
    for name in names:
        if name in d and d[name] is not None:
            return str(d[name])
    return ""


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _parse_json_object(raw: str, var: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ContractError(f"{var} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ContractError(f"{var} must be a JSON object, got {type(value).__name__}")
    return value


PP_SCHEDULES = ("gpipe", "1f1b")
OFFLOADS = ("none", "optimizer", "optimizer+params")
CHECKPOINTINGS = ("none", "selective", "full")
# The estimator's sharding names (estimator/plans.py) and the ZeRO stage each means.
SHARDINGS = {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


def _enum_word(value: str, prefix: str) -> str:
    """A plan option's value in lower case, from its own spelling or protobuf's enum name in the JSON
    mapping of common.proto's ExecutionPlan (`SHARDING_ZERO3`, `OFFLOAD_OPTIMIZER_AND_PARAMS`,
    `PIPELINE_SCHEDULE_GPIPE`; `..._UNSPECIFIED` = "")."""
    v = value.strip().lower()
    if prefix and v.startswith(prefix):
        v = v[len(prefix):]
        v = "" if v == "unspecified" else v.replace("_and_", "+")
    return v


def _choice_field(d: Mapping[str, Any], names: tuple[str, ...], what: str, choices: tuple[str, ...],
                  true: str, prefix: str = "") -> str | None:
    """The first of `names` present in d as one of `choices` (any case, or its protobuf enum name
    with `prefix`); JSON true/false (or 1/0, "true"/"false") mean `true` / "none". None when absent."""
    for name in names:
        if name in d and d[name] is not None:
            value = d[name]
            if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
                return true if value else "none"
            if isinstance(value, str):
                v = _enum_word(value, prefix) or "none"
                if v in choices:
                    return v
                if v in _TRUE | _FALSE:
                    return true if v in _TRUE else "none"
            raise ContractError(f"{what}.{name} must be one of {', '.join(choices)} (or true/false), got {value!r}")
    return None


@dataclass(frozen=True)
class Plan:
    """The execution plan (common.proto Plan). Global batch = micro_batch * grad_accum * dp.

    `extra` holds keys this SDK does not know (future plan kinds), so a trainer can refuse what it
    cannot run instead of silently ignoring it.

    Optional keys beyond 3D parallelism (docs/worker-contract.md, "Execution plan options"), with
    defaults that mean plain 3D parallelism: `zero_stage` 0-3 (0 = replicated data parallelism; also
    read from the estimator's `sharding`: none/zero1/zero2/zero3/fsdp), `offload` (none/optimizer/
    optimizer+params: model state in CPU memory, ZeRO-Offload), `activation_checkpointing`
    (none/selective/full; also read from `checkpointing`), `pp_schedule` ("gpipe" or "1f1b"; "" = the
    trainer's default). With pp > 1, `grad_accum` is the pipeline's micro-batch count per step.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batch: int = 1
    grad_accum: int = 1
    gpu_model: str = ""
    memory_per_gpu_bytes: int = 0
    memory_source: str = ""
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), compare=False)
    zero_stage: int = 0
    offload: str = "none"
    activation_checkpointing: str = "none"
    pp_schedule: str = ""

    _KNOWN = ("dp", "tp", "pp", "micro_batch", "grad_accum", "gpu_model", "memory_per_gpu_bytes",
              "memory_source", "zero_stage", "offload", "activation_checkpointing", "pp_schedule")

    @property
    def world_size(self) -> int:
        """GPUs (processes) this plan uses: dp * tp * pp."""
        return self.dp * self.tp * self.pp

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.dp

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, default_dp: int = 1, default_micro_batch: int = 1) -> Plan:
        """Parse a plan from its JSON form.

        Accepts snake_case or camelCase keys and int64 values as strings (protobuf's JSON mapping).
        A missing or zero dp, tp, pp, micro_batch or grad_accum takes its default (proto JSON omits
        zero fields): tp = pp = grad_accum = 1, dp = `default_dp`, micro_batch = `default_micro_batch`.
        Negative values raise ContractError. `zero_stage` (alias `zero`) must be 0-3, or come from
        `sharding` (SHARDINGS); `offload` one of OFFLOADS, `activation_checkpointing` (aliases
        `checkpointing`, `gradient_checkpointing`) one of CHECKPOINTINGS, either also as a boolean
        (true = "optimizer" / "full"); `pp_schedule` (alias `schedule`) one of PP_SCHEDULES or
        empty. Any case; protobuf's enum names (common.proto ExecutionPlan: `SHARDING_ZERO3`,
        `OFFLOAD_OPTIMIZER_AND_PARAMS`, `CHECKPOINTING_FULL`, `PIPELINE_SCHEDULE_GPIPE`, `*_UNSPECIFIED`)
        are read too.
        """
        def names(*keys: str) -> tuple[str, ...]:
            return tuple(n for k in keys for n in (k, _camel(k)))

        def get_int(name: str, default: int, *aliases: str) -> int:
            v = _int_field(d, names(name, *aliases), "plan")
            if v is not None and v < 0:
                raise ContractError(f"plan.{name} must be >= 0, got {v}")
            return default if not v else v

        zero_stage = get_int("zero_stage", 0, "zero")
        if zero_stage > 3:
            raise ContractError(f"plan.zero_stage must be 0, 1, 2 or 3, got {zero_stage}")
        sharding = _enum_word(_str_field(d, ("sharding",)), "sharding_")
        if sharding:
            if sharding not in SHARDINGS:
                raise ContractError(f"plan.sharding must be one of {', '.join(SHARDINGS)}, got {sharding!r}")
            zero_stage = max(zero_stage, SHARDINGS[sharding])
        pp_schedule = _enum_word(_str_field(d, names("pp_schedule", "schedule")), "pipeline_schedule_")
        if pp_schedule not in ("", *PP_SCHEDULES):
            raise ContractError(f"plan.pp_schedule must be one of {', '.join(PP_SCHEDULES)}, got {pp_schedule!r}")
        offload = _choice_field(d, names("offload"), "plan", OFFLOADS, "optimizer", "offload_") or "none"
        ac = _choice_field(d, names("activation_checkpointing", "checkpointing", "gradient_checkpointing"), "plan",
                           CHECKPOINTINGS, "full", "checkpointing_") or "none"
        known = set(names(*cls._KNOWN, "zero", "sharding", "checkpointing", "gradient_checkpointing", "schedule"))
        return cls(
            dp=get_int("dp", default_dp),
            tp=get_int("tp", 1),
            pp=get_int("pp", 1),
            micro_batch=get_int("micro_batch", default_micro_batch),
            grad_accum=get_int("grad_accum", 1),
            gpu_model=_str_field(d, ("gpu_model", "gpuModel")),
            memory_per_gpu_bytes=get_int("memory_per_gpu_bytes", 0),
            memory_source=_str_field(d, ("memory_source", "memorySource")),
            extra=MappingProxyType({k: v for k, v in d.items() if k not in known}),
            zero_stage=zero_stage,
            offload=offload,
            activation_checkpointing=ac,
            pp_schedule=pp_schedule,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in self._KNOWN}
        out.update(self.extra)
        return out


@dataclass(frozen=True)
class ModelDims:
    """The model (common.proto ModelSpec). A zero dimension means "not given": a registered `name`
    is expected to supply it (the trainer resolves names it knows)."""

    name: str = ""
    hidden_size: int = 0
    num_layers: int = 0
    num_heads: int = 0
    vocab_size: int = 0
    seq_length: int = 0

    _DIMS = ("hidden_size", "num_layers", "num_heads", "vocab_size", "seq_length")

    @property
    def complete(self) -> bool:
        """True when every dimension is given (> 0)."""
        return all(getattr(self, k) > 0 for k in self._DIMS)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelDims:
        """Parse from JSON form (snake_case or camelCase keys, ints possibly as strings)."""
        dims: dict[str, int] = {}
        for k in cls._DIMS:
            v = _int_field(d, (k, _camel(k)), "model")
            if v is not None and v < 0:
                raise ContractError(f"model.{k} must be >= 0, got {v}")
            dims[k] = v or 0
        return cls(name=_str_field(d, ("name",)), **dims)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **{k: getattr(self, k) for k in self._DIMS}}


# A small model for runs by hand, when TESSERA_MODEL is absent.
DEFAULT_MODEL = ModelDims(name="tiny-gpt", hidden_size=64, num_layers=2, num_heads=4, vocab_size=128,
                          seq_length=64)


# --------------------------------------------------------------------------------------------------
# Checkpoint layout: <dir>/step-<N>/ (complete when it holds meta.json), <dir>/latest = "step-<N>"


@dataclass(frozen=True)
class CheckpointRef:
    """A complete checkpoint on disk."""

    iteration: int
    path: Path

    def meta(self) -> dict[str, Any]:
        """The checkpoint's meta.json."""
        meta: dict[str, Any] = json.loads((self.path / CHECKPOINT_META).read_text())
        return meta


def checkpoint_path(checkpoint_dir: str | os.PathLike[str], iteration: int) -> Path:
    """Where the checkpoint of `iteration` lives (complete or not)."""
    return Path(checkpoint_dir) / f"step-{iteration}"


def list_checkpoints(checkpoint_dir: str | os.PathLike[str]) -> list[CheckpointRef]:
    """The complete checkpoints in the directory, oldest first. Missing directory = []."""
    root = Path(checkpoint_dir)
    try:
        entries = list(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    found: list[CheckpointRef] = []
    for entry in entries:
        m = _STEP_DIR.match(entry.name)
        if m and (entry / CHECKPOINT_META).is_file():
            found.append(CheckpointRef(int(m.group(1)), entry))
    return sorted(found, key=lambda c: c.iteration)


def latest_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> CheckpointRef | None:
    """The newest complete checkpoint, or None.

    A checkpoint directory only gets its final name `step-<N>` (by an atomic rename) once it is
    complete, so the highest complete `step-<N>` wins. The `latest` file is a pointer for people and
    other tools; it is not trusted here, so a stale or dangling `latest` (a crash between the rename
    and its update) changes nothing.
    """
    all_ckpts = list_checkpoints(checkpoint_dir)
    return all_ckpts[-1] if all_ckpts else None


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(Path(dirpath))


def write_text_atomic(path: Path, text: str) -> None:
    """Write a small file atomically: temp file in the same directory, fsync, os.replace."""
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def prune_checkpoints(checkpoint_dir: str | os.PathLike[str], keep: int = 2) -> list[Path]:
    """Delete all but the `keep` newest complete checkpoints, and leftover `step-<N>.tmp` directories
    older than the newest one. Returns what was deleted."""
    root = Path(checkpoint_dir)
    ckpts = list_checkpoints(root)
    removed: list[Path] = []
    doomed = [c.path for c in ckpts[: max(0, len(ckpts) - keep)]]
    if ckpts:
        newest = ckpts[-1].iteration
        for entry in root.iterdir():
            m = re.match(r"^step-(\d+)\.tmp(\.\d+)?$", entry.name)
            if m and int(m.group(1)) < newest:
                doomed.append(entry)
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


@contextlib.contextmanager
def checkpoint_writer(
    checkpoint_dir: str | os.PathLike[str],
    iteration: int,
    meta: Mapping[str, Any] | None = None,
    keep: int = 2,
) -> Iterator[Path]:
    """Write the checkpoint of `iteration` atomically; only one process (rank 0) should call this.

    Yields an empty directory `<dir>/step-<N>.tmp/` to fill. On a clean exit from the block it writes
    meta.json (`iteration`, `time` and `meta`), fsyncs, renames the directory to `step-<N>/`, points
    `latest` at it and keeps the `keep` newest checkpoints. If the block raises, the temporary
    directory is removed and nothing else changes.
    """
    root = Path(checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(root, iteration)
    # Per-process temporary name: a stale attempt still running on a lost node may write the same
    # step into the same directory; neither may clobber the other's half-written files.
    tmp = final.with_name(f"{final.name}.tmp.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        record = {"iteration": iteration, "time": time.time(), **(meta or {})}
        (tmp / CHECKPOINT_META).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        _fsync_tree(tmp)
        if final.exists():  # e.g. a previous attempt wrote the same step: the new one replaces it
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / CHECKPOINT_META).exists():
                raise
            # Another writer completed the same step first: training is deterministic in
            # (seed, step), so its checkpoint stands for ours.
            shutil.rmtree(tmp, ignore_errors=True)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_text_atomic(root / LATEST_FILE, final.name + "\n")
    if keep > 0:
        prune_checkpoints(root, keep)


# --------------------------------------------------------------------------------------------------
# The context


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ContractError(f"{name} must be an integer, got {raw!r}") from None


class TrainerContext:
    """What the agent gave this process, and its line back to the agent.

    Attributes mirror the contract variables. `stop_requested` and `checkpoint_requested` are set by
    signals (SIGTERM/SIGINT, once `install_signal_handlers()` ran) and by the agent's answers to
    `report()`; the training loop reads them at step boundaries and clears `checkpoint_requested`
    after checkpointing.
    """

    def __init__(
        self,
        *,
        job_id: str = DEFAULT_JOB_ID,
        attempt: int = 1,
        rank: int = 0,
        local_rank: int = 0,
        world_size: int = 1,
        local_world_size: int = 1,
        master_addr: str = "127.0.0.1",
        master_port: int = 29500,
        plan: Plan | None = None,
        model: ModelDims = DEFAULT_MODEL,
        iterations: int = DEFAULT_ITERATIONS,
        global_batch_size: int = 0,
        checkpoint_dir: str | os.PathLike[str] = DEFAULT_CHECKPOINT_DIR,
        checkpoint_every: int = 0,
        agent_addr: str = "",
        inventory_source: str = "",
        cuda_visible_devices: str | None = None,
        in_tessera: bool = False,
        report_interval_s: float = DEFAULT_REPORT_INTERVAL_S,
        report_deadline_s: float = DEFAULT_REPORT_DEADLINE_S,
        agent_loss_timeout_s: float = DEFAULT_AGENT_LOSS_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.local_world_size = local_world_size
        self.master_addr = master_addr
        self.master_port = master_port
        self.plan = plan if plan is not None else Plan(dp=world_size, micro_batch=DEFAULT_MICRO_BATCH)
        self.model = model
        self.iterations = iterations
        self.global_batch_size = global_batch_size or self.plan.global_batch
        self.checkpoint_dir = Path(checkpoint_dir)
        self.checkpoint_every = checkpoint_every
        self.agent_addr = agent_addr
        self.inventory_source = inventory_source
        self.cuda_visible_devices = cuda_visible_devices
        self.in_tessera = in_tessera
        self.report_interval_s = report_interval_s
        self.report_deadline_s = report_deadline_s
        self.agent_loss_timeout_s = agent_loss_timeout_s

        self.stop_requested = False
        self.checkpoint_requested = False
        self.stop_reason = ""

        self._clock = clock
        self._next_report_at = float("-inf")
        self._failures = 0
        self._failing_since = 0.0
        self._channel: Any = None
        self._stub: Any = None
        self._signals_received = 0

    # ---- construction

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> TrainerContext:
        """Read the worker contract from `env` (default os.environ).

        Absent variables take the defaults of a run by hand: rank 0 of 1, no agent, the plan
        dp=WORLD_SIZE with micro_batch 8, a tiny model, 100 iterations, ./checkpoints. Present but
        malformed variables raise ContractError. Keyword `overrides` replace any constructor argument.
        """
        e = os.environ if env is None else env
        world_size = _env_int(e, "WORLD_SIZE", 1)
        if world_size < 1:
            raise ContractError(f"WORLD_SIZE must be >= 1, got {world_size}")
        rank = _env_int(e, "RANK", 0)
        if not 0 <= rank < world_size:
            raise ContractError(f"RANK={rank} is outside WORLD_SIZE={world_size}")
        global_batch = _env_int(e, "TESSERA_GLOBAL_BATCH_SIZE", 0)
        plan_raw = e.get("TESSERA_PLAN", "").strip()
        if plan_raw:
            plan = Plan.from_dict(_parse_json_object(plan_raw, "TESSERA_PLAN"), default_dp=world_size,
                                  default_micro_batch=DEFAULT_MICRO_BATCH)
        else:
            plan = Plan(dp=world_size, micro_batch=DEFAULT_MICRO_BATCH)
        model_raw = e.get("TESSERA_MODEL", "").strip()
        model = ModelDims.from_dict(_parse_json_object(model_raw, "TESSERA_MODEL")) if model_raw \
            else DEFAULT_MODEL

        master_addr = e.get("MASTER_ADDR", "")
        master_port = _env_int(e, "MASTER_PORT", 0)
        rendezvous = e.get("TESSERA_RENDEZVOUS", "").strip()
        if rendezvous and (not master_addr or not master_port):
            host, _, port = rendezvous.rpartition(":")
            master_addr = master_addr or host.strip("[]")
            if not master_port:
                try:
                    master_port = int(port)
                except ValueError:
                    raise ContractError(f"TESSERA_RENDEZVOUS must be host:port, got {rendezvous!r}") \
                        from None

        kwargs: dict[str, Any] = {
            "job_id": e.get("TESSERA_JOB_ID", "") or DEFAULT_JOB_ID,
            "attempt": _env_int(e, "TESSERA_ATTEMPT", 1),
            "rank": rank,
            "local_rank": _env_int(e, "LOCAL_RANK", rank),
            "world_size": world_size,
            "local_world_size": _env_int(e, "LOCAL_WORLD_SIZE", world_size),
            "master_addr": master_addr or "127.0.0.1",
            "master_port": master_port or 29500,
            "plan": plan,
            "model": model,
            "iterations": _env_int(e, "TESSERA_ITERATIONS", DEFAULT_ITERATIONS),
            "global_batch_size": global_batch or plan.global_batch,
            "checkpoint_dir": e.get("TESSERA_CHECKPOINT_DIR", "") or DEFAULT_CHECKPOINT_DIR,
            "checkpoint_every": _env_int(e, "TESSERA_CHECKPOINT_EVERY", 0),
            "agent_addr": e.get("TESSERA_AGENT_ADDR", "").strip(),
            "inventory_source": e.get("TESSERA_INVENTORY_SOURCE", "").strip().lower(),
            "cuda_visible_devices": e.get("CUDA_VISIBLE_DEVICES"),
            "in_tessera": bool(e.get("TESSERA_JOB_ID")),
            "agent_loss_timeout_s": _env_float(e, "TESSERA_AGENT_LOSS_TIMEOUT", DEFAULT_AGENT_LOSS_TIMEOUT_S),
        }
        kwargs.update(overrides)
        return cls(**kwargs)

    # ---- derived

    @property
    def rendezvous(self) -> str:
        return f"{self.master_addr}:{self.master_port}"

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    @property
    def gpu_allowed(self) -> bool:
        """False when the agent gave this rank no GPU (empty CUDA_VISIBLE_DEVICES, or a declared
        inventory): the worker must run on CPU. True does not mean a GPU exists."""
        if self.inventory_source == "declared":
            return False
        return self.cuda_visible_devices is None or self.cuda_visible_devices.strip() != ""

    def checkpoint_interval(self, default: int = DEFAULT_CHECKPOINT_EVERY) -> int:
        """TESSERA_CHECKPOINT_EVERY, or `default` when it is 0 (the trainer's choice)."""
        return self.checkpoint_every if self.checkpoint_every > 0 else default

    def latest_checkpoint(self) -> CheckpointRef | None:
        return latest_checkpoint(self.checkpoint_dir)

    def checkpoint_writer(self, iteration: int, meta: Mapping[str, Any] | None = None,
                          keep: int = 2) -> contextlib.AbstractContextManager[Path]:
        """`checkpoint_writer` in this job's checkpoint directory (call on rank 0 only)."""
        return checkpoint_writer(self.checkpoint_dir, iteration, meta, keep)

    # ---- signals

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT set `stop_requested` (checkpoint at the next step boundary, exit 0).

        A second SIGINT raises KeyboardInterrupt, so Ctrl-C twice still interrupts a run by hand.
        Must be called from the main thread.
        """
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.stop_requested and self.stop_reason == "SIGINT":
            raise KeyboardInterrupt
        self.stop_requested = True
        self.stop_reason = self.stop_reason or signal.Signals(signum).name

    def should_stop(self) -> bool:
        return self.stop_requested

    def request_stop(self, reason: str = "requested") -> None:
        self.stop_requested = True
        self.stop_reason = self.stop_reason or reason

    # ---- progress

    def report(
        self,
        iteration: int,
        loss: float,
        samples_per_second: float,
        step_time_seconds: float,
        peak_memory_bytes: int = 0,
        checkpoint_iteration: int = -1,
        *,
        force: bool = False,
    ) -> bool:
        """Send progress to the agent (NodeAgent.ReportProgress). True if it was delivered.

        Throttled: skipped (False) when the last attempt was less than `report_interval_s` ago, unless
        `force` (use it at the end and right after a checkpoint). After a transport failure the next
        unforced attempt waits longer (doubling up to 10 s). Never raises on transport errors: they
        are logged and training goes on. Without an agent address this is a no-op returning False.
        The answer's stop_requested / checkpoint_requested set the attributes of the same name
        (they are never cleared by an answer).
        """
        if not self.agent_addr:
            return False
        now = self._clock()
        if not force and now < self._next_report_at:
            return False
        self._next_report_at = now + self.report_interval_s
        try:
            import grpc

            from tessera.v1 import agent_pb2, common_pb2

            stub = self._ensure_stub()
            request = agent_pb2.ReportProgressRequest(
                job_id=self.job_id,
                attempt=self.attempt,
                rank=self.rank,
                progress=common_pb2.Progress(
                    iteration=int(iteration),
                    loss=float(loss),
                    samples_per_second=float(samples_per_second),
                    step_time_seconds=float(step_time_seconds),
                    peak_memory_bytes=int(peak_memory_bytes),
                    time=time.time(),
                    checkpoint_iteration=int(checkpoint_iteration),
                ),
            )
            response = stub.ReportProgress(request, timeout=self.report_deadline_s)
        except grpc.RpcError as e:
            self._on_report_failure(now, f"{e.code().name}: {e.details()}")
            return False
        except Exception as e:  # noqa: BLE001 - reporting must never take the training down
            self._on_report_failure(now, f"{type(e).__name__}: {e}")
            return False
        if self._failures:
            log.warning("tessera: progress reports reach the agent at %s again", self.agent_addr)
        self._failures = 0
        if response.stop_requested and not self.stop_requested:
            self.stop_requested = True
            self.stop_reason = self.stop_reason or "agent"
        if response.checkpoint_requested:
            self.checkpoint_requested = True
        return True

    def _on_report_failure(self, now: float, why: str) -> None:
        if self._failures == 0:
            self._failing_since = now
        self._failures += 1
        # Self-fencing: a worker whose agent is gone (killed, node partitioned) has likely been
        # requeued elsewhere by now; it checkpoints and stops instead of training on as a duplicate.
        if (self.in_tessera and self.agent_loss_timeout_s > 0 and not self.stop_requested
                and now - self._failing_since >= self.agent_loss_timeout_s):
            log.warning("tessera: agent %s unreachable for %.0fs: stopping (checkpoint, then exit)",
                        self.agent_addr, now - self._failing_since)
            self.stop_requested = True
            self.stop_reason = self.stop_reason or "agent unreachable"
        backoff = min(_FAILURE_BACKOFF_MAX_S, _FAILURE_BACKOFF_S * 2 ** (self._failures - 1))
        self._next_report_at = max(self._next_report_at, now + backoff)
        if self._failures == 1 or self._failures % 20 == 0:
            log.warning("tessera: progress report to agent %s failed (%d in a row), training goes on: %s",
                        self.agent_addr, self._failures, why)

    def _ensure_stub(self) -> Any:
        if self._stub is None:
            from tessera.common.rpc import sync_channel
            from tessera.v1 import agent_pb2_grpc

            self._channel = sync_channel(self.agent_addr)
            self._stub = agent_pb2_grpc.NodeAgentStub(self._channel)
        return self._stub

    def close(self) -> None:
        """Close the channel to the agent (report() reopens it if called again)."""
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"TrainerContext(job_id={self.job_id!r}, attempt={self.attempt}, rank={self.rank}/"
                f"{self.world_size}, plan={self.plan}, model={self.model}, iterations={self.iterations}, "
                f"global_batch_size={self.global_batch_size}, checkpoint_dir={str(self.checkpoint_dir)!r})")
