"""Job files: a YAML document that maps onto a `tessera.v1.JobSpec`.

The schema is documented in docs/job-file.md. This module checks what can be checked from the file
alone (types, ranges, names, the GPU catalog) and builds the proto; the controller validates the
spec again on submit (registered model names, cluster-dependent limits).

Every error is a `JobFileError` (the shared tessera.common.yamlfile.InputFileError) naming the field;
read from a file its message is `FILE line N: field F: why`, built from a dict in code `F: why`. The
YAML itself is read by tessera.common.yamlfile (duplicate keys, aliases, nesting, NaN refused).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tessera.clients import jobfile_opaque as opaque
from tessera.clients.argtypes import MAX_INT
from tessera.clients.jobfile_objective import objective_fields
from tessera.common import gpus as catalog
from tessera.common import jobspec
from tessera.common.errors import InvalidArgument
from tessera.common.yamlfile import MAX_BYTES, InputFileError, load_yaml, parse_with_lines
from tessera.estimator.convert import (
    PLAN_BOOL_FIELDS,
    PLAN_ENUM_VALUES,
    PLAN_INT_FIELDS,
    PLAN_KEYS,
    execution_plan,
    model_dims,
    model_spec,
    plan_fields,
)
from tessera.estimator.hfconfig import load_hf_config
from tessera.estimator.models import REGISTERED, registered
from tessera.estimator.perf_data import parse_exec_plan
from tessera.estimator.perf_model import PerfModelInputError
from tessera.estimator.plans import PlanInputError
from tessera.v1 import common_pb2

NAME_RE = jobspec.NAME_RE
MODEL_NAME_RE = jobspec.MODEL_NAME_RE
ENV_NAME_RE = jobspec.ENV_NAME_RE

# A job file without `tenant:` leaves it to the controller: the caller's own (docs/auth.md), "default"
# without a tokens file. Filling "default" here made a user's file refused (another tenant's).
DEFAULT_TENANT = ""
DEFAULT_MAX_RETRIES = 2


# (field, upper bound) of the model dimensions; each must also be > 0.
MODEL_DIMS = jobspec.MODEL_DIMS
# Proto field paths of tessera.common.jobspec's errors whose key in a job file is another.
_FILE_KEYS = (("hint.gpu_types", "gpu_types"), ("hint.gpus", "gpus"), ("progress_timeout_seconds", "progress_timeout"),
              ("spec", "job"), ("slo.iterations_within_seconds", "slo.iterations_within"),
              ("max_runtime_seconds", "max_runtime"), ("guarantee.num_gpus", "guarantee.gpus"),
              ("guarantee.num_cpus", "guarantee.cpus"))
# Proto field names that those errors' reasons name, under the field they come with (tessera.common.objective
# says "needs exactly one of iterations_within_seconds and deadline" of `slo`, tessera.common.jobspec
# "not among the job's hint.gpu_types" of `guarantee.gpu_type`).
_FILE_WORDS = {"slo": (("iterations_within_seconds", "iterations_within"),),
               "guarantee": (("hint.gpu_types", "gpu_types"), ("hint.gpus", "gpus"),
                             ("guarantee.num_gpus", "guarantee.gpus"))}
# `priority:` in a job file (docs/tenants.md); absent = best-effort.
PRIORITIES = {"guaranteed": common_pb2.PRIORITY_GUARANTEED, "best-effort": common_pb2.PRIORITY_BEST_EFFORT}
GUARANTEE_KEYS = ("gpus", "cpus", "gpu_type", "plan")

# Optional refinements of explicit dimensions (ModelSpec fields 7-16; docs/job-file.md): the model
# family and its shape. Absent = a GPT-2-style decoder, as before they existed.
MODEL_FAMILY_KEYS = (
    "family", "ffn_hidden", "gated", "num_kv_heads", "num_experts", "top_k", "moe_every", "capacity_factor",
    "tied_embeddings", "width_factor", "kv_channels", "qkv_bias", "num_decoder_layers", "decoder_seq_length",
    "sliding_window", "logit_softcap", "sandwich_norm", "dropless",
)
# Integer refinements (>= 1 when given) and flags of a model mapping.
MODEL_INT_KEYS = ("ffn_hidden", "num_kv_heads", "num_experts", "top_k", "moe_every", "width_factor", "kv_channels",
                  "num_decoder_layers", "decoder_seq_length", "sliding_window")
REFINEMENT_MAX = dict(jobspec.MODEL_REFINEMENTS)
MODEL_FLAG_KEYS = ("gated", "tied_embeddings", "qkv_bias", "sandwich_norm", "dropless")
FAMILIES = {"decoder": common_pb2.MODEL_FAMILY_DECODER, "encoder": common_pb2.MODEL_FAMILY_ENCODER,
            "moe": common_pb2.MODEL_FAMILY_MOE, "wide_resnet": common_pb2.MODEL_FAMILY_WIDE_RESNET,
            "encoder_decoder": common_pb2.MODEL_FAMILY_ENCODER_DECODER}
# `model: {hf_config: PATH}`: the dimensions come from the config; these keys may go with it.
HF_CONFIG_KEYS = ("hf_config", "name", "seq_length", "decoder_seq_length")

TOP_LEVEL_KEYS = (
    "name", "tenant", "model", "global_batch_size", "iterations", "gpus", "gpu_types",
    "entrypoint", "env", "checkpoint_every", "max_retries", "launcher", "progress_timeout", "plan",
    "objective", "slo", "cell", "workdir", "max_runtime", "priority", "guarantee",
)
LAUNCHER_KEYS = ("name", "argv", "per_node", "head_argv")


class JobFileError(InputFileError):
    """A job file that cannot become a JobSpec: `field` names the offending key (dotted path), ""
    for a file that is not one safe YAML document; `file` and `line` where it was read from one."""


def load_job_file(path: str | Path, allowed_env: Iterable[str] = ()) -> common_pb2.JobSpec:
    """Read and parse the job file at `path`. OSError if unreadable; JobFileError if invalid.
    `allowed_env`: names the environment policy refuses that the caller knows its controller allows
    (`tessctl submit --allow-env`); the controller checks them again."""
    with open(path, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    return parse_job_yaml(raw, str(path), allowed_env)


def parse_job_yaml(text: str | bytes, file: str = "<string>", allowed_env: Iterable[str] = ()) -> common_pb2.JobSpec:
    """Parse one YAML document into a JobSpec; JobFileError (`file line N: field F: why`) on bad YAML
    or a bad field."""
    allow = frozenset(allowed_env)
    base = Path(file).parent if file not in ("<string>", "<stdin>") else None
    return parse_with_lines(load_yaml(text, file, JobFileError), file,
                            lambda d: job_spec_from_dict(d, allow, base_dir=base))


def job_spec_from_dict(data: Any, allowed_env: Iterable[str] = (), *, base_dir: Path | None = None
                       ) -> common_pb2.JobSpec:
    """Build a JobSpec from a parsed mapping (the YAML document), checking every field. A relative
    `model.hf_config` is read from `base_dir` (the job file's directory), else the working directory."""
    if not isinstance(data, Mapping):
        raise JobFileError("job", "the file must be a mapping of fields (name, model, ...)")
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            raise JobFileError(str(key), _unknown(str(key), TOP_LEVEL_KEYS))
    spec = common_pb2.JobSpec()
    spec.name = _name(data, "name", required=True)
    spec.tenant = _name(data, "tenant", required=False) or DEFAULT_TENANT
    has_model = data.get("model") is not None  # without: an opaque job (docs/opaque-jobs.md)
    if has_model:
        spec.model.CopyFrom(_model(data["model"], base_dir))
    spec.global_batch_size = _int(data, "global_batch_size", 1, 1_048_576, required=has_model)
    if "cell" in data:
        spec.hint.CopyFrom(opaque.cell_hint(data, JobFileError))
    elif "gpus" in data or "gpu_types" in data:
        spec.hint.gpus = _int(data, "gpus", 0, 4096, required=False, default=0)
        spec.hint.gpu_types.extend(_gpu_types(data.get("gpu_types")))
    spec.entrypoint.extend(_entrypoint(data.get("entrypoint")))
    for key, value in _env(data.get("env")).items():
        spec.env[key] = value
    spec.checkpoint_every = _int(data, "checkpoint_every", 0, 10**9, required=False, default=0)
    spec.max_retries = _int(data, "max_retries", 0, 100, required=False, default=DEFAULT_MAX_RETRIES)
    if "launcher" in data:
        spec.launcher.CopyFrom(_launcher(data["launcher"]))
    spec.progress_timeout_seconds = _int(data, "progress_timeout", -1, jobspec.MAX_PROGRESS_TIMEOUT_S,
                                         required=False, default=0)
    opaque.run_fields(data, spec, JobFileError)
    own = jobspec.runs_own_program(spec)
    spec.iterations = _int(data, "iterations", 0 if own else 1, 10**9, required=not own)
    if data.get("plan") is not None:
        spec.plan.CopyFrom(_plan(data["plan"]))
    try:
        objective_fields(data, spec)
    except InvalidArgument as exc:
        raise JobFileError(exc.field, exc.reason) from None
    set_priority(spec, data.get("priority"), data.get("guarantee"))
    revalidate(spec, isinstance(data.get("model"), str), frozenset(allowed_env))
    return spec


def revalidate(spec: common_pb2.JobSpec, model_by_name: bool = False, allowed_env: frozenset[str] = frozenset()) -> None:
    """The checks of a whole spec, as the controller makes them on submit: its bounds, the recipe's
    combination, the promise's plan name; the first problem as a JobFileError under the file's key."""
    _check_bounds(spec, model_by_name, allowed_env)
    if spec.HasField("plan"):
        try:  # the combination, as the estimator and the controller check it (sizes are the scheduler's: 1)
            execution_plan(spec.plan).check(model=model_dims(spec.model))
        except PlanInputError as exc:
            raise JobFileError(exc.field, exc.reason) from None
    check_guarantee_plan(spec.guarantee)


def check_guarantee_plan(g: common_pb2.Guarantee) -> None:
    """The promise's plan in the estimator's Morphling vocabulary, as the controller checks it."""
    if not g.plan:
        return
    try:
        plan = parse_exec_plan(g.plan)
    except PerfModelInputError as exc:
        raise JobFileError("guarantee.plan", exc.reason) from None
    if plan.kind == "3d" and plan.pp * plan.tp * plan.dp != g.num_gpus:
        raise JobFileError("guarantee.plan", f"{g.plan} is PP{plan.pp} TP{plan.tp} DP{plan.dp} = "
                                             f"{plan.pp * plan.tp * plan.dp} GPUs, the guarantee has {g.num_gpus}")


def set_priority(spec: common_pb2.JobSpec, priority: Any, guarantee: Any) -> None:
    """`priority: guaranteed | best-effort` and `guarantee: {gpus, cpus, gpu_type, plan}` onto `spec`
    (tessctl submit's --priority and --guarantee too). A guaranteed job without a guarantee is promised
    its `gpus:` hint (jobspec.fill_guarantee); the bounds are checked with the rest of the spec."""
    if priority is not None:
        if not isinstance(priority, str) or priority not in PRIORITIES:
            raise JobFileError("priority", f"must be one of {', '.join(PRIORITIES)}, got {priority!r}")
        spec.priority = PRIORITIES[priority]
    if guarantee is not None:
        if not isinstance(guarantee, Mapping):
            raise JobFileError("guarantee", "must be a mapping, e.g. {gpus: 8, cpus: 64, gpu_type: A100-80GB, "
                                            "plan: zero-dp}")
        for key in guarantee:
            if key not in GUARANTEE_KEYS:
                raise JobFileError(f"guarantee.{key}", _unknown(str(key), GUARANTEE_KEYS))
        g = spec.guarantee
        g.SetInParent()
        g.num_gpus = _int(guarantee, "gpus", 1, jobspec.MAX_GPUS_HINT, required=True, prefix="guarantee.")
        g.num_cpus = _int(guarantee, "cpus", 0, jobspec.MAX_GUARANTEE_CPUS, required=False, prefix="guarantee.")
        for key in ("gpu_type", "plan"):
            v = guarantee.get(key)
            if v is None:
                continue
            if not isinstance(v, str | int) or isinstance(v, bool):
                raise JobFileError(f"guarantee.{key}", f"must be a name, got {v!r}")
            setattr(g, key, str(v).strip().lower() if key == "plan" else str(v))
        if g.gpu_type:
            try:
                g.gpu_type = catalog.lookup(g.gpu_type).name
            except catalog.UnknownGpuError as exc:
                raise JobFileError("guarantee.gpu_type", str(exc)) from None
    jobspec.fill_guarantee(spec)


def _plan(value: Any) -> common_pb2.ExecutionPlan:
    """`plan:` the job's recipe in the library's spelling (docs/job-file.md): typed as YAML gives it
    (integers, true/false, names), then read by the one --plan parser (estimator.convert.plan_fields)."""
    if not isinstance(value, Mapping):
        raise JobFileError("plan", "must be a mapping of recipe fields, e.g. {checkpointing: op, loss: fp32}")
    texts: dict[str, str] = {}
    for key, v in value.items():
        field = f"plan.{key}"
        if key not in PLAN_KEYS:
            raise JobFileError(field, _unknown(str(key), PLAN_KEYS))
        if key in PLAN_BOOL_FIELDS:
            if not isinstance(v, bool):
                raise JobFileError(field, f"must be true or false, got {v!r}")
        elif key in PLAN_ENUM_VALUES:
            if not isinstance(v, str):
                raise JobFileError(field, f"must be one of {', '.join(PLAN_ENUM_VALUES[key])}, got {v!r}")
        elif isinstance(v, bool) or not isinstance(v, int):
            raise JobFileError(field, f"must be an integer, got {v!r}")
        texts[key] = str(v).lower() if isinstance(v, bool) else str(v)
    try:
        return checked_plan_fields(texts)
    except PlanInputError as exc:
        raise JobFileError(exc.field, exc.reason) from None


def checked_plan_fields(texts: dict[str, str]) -> common_pb2.ExecutionPlan:
    """estimator.convert.plan_fields, a size too large for its field (int32) refused as PlanInputError
    naming it, where protobuf would raise a bare "Value out of range" (the job file's plan:, --plan)."""
    for key, value in texts.items():
        if key in PLAN_INT_FIELDS or key == "lora_rank":
            try:
                n = int(value.strip())
            except ValueError:
                continue  # plan_fields says what is wrong
            if n > MAX_INT:
                lo = 0 if key == "lora_rank" else 1
                raise PlanInputError(f"plan.{key}", f"must be an integer from {lo} to {MAX_INT:,}, got {n}")
    return plan_fields(texts)


def _check_bounds(spec: common_pb2.JobSpec, model_by_name: bool, allowed_env: frozenset[str]) -> None:
    """The bounds the controller applies on submit (tessera.common.jobspec), so a file is refused
    here exactly when SubmitJob would refuse its spec; the first problem, under the file's key."""
    for field, reason in jobspec.spec_errors(spec, allowed_env):
        for proto, key in _FILE_WORDS.get(field.partition(".")[0], ()):
            reason = reason.replace(proto, key)
        for proto, key in _FILE_KEYS:
            if field == proto or field.startswith((proto + ".", proto + "[")):
                field = key + field[len(proto):]
                break
        if model_by_name and field == "model.name":
            field = "model"
        raise JobFileError(field, reason)


def _launcher(value: Any) -> common_pb2.Launcher:
    """`launcher: torchrun` (a built-in) or a mapping {argv: [...], per_node: bool, head_argv: [...]}.
    Placeholders are checked by the controller (docs/launchers.md)."""
    if isinstance(value, str):
        return common_pb2.Launcher(name=value)
    if not isinstance(value, Mapping):
        raise JobFileError("launcher", "must be a built-in name or a mapping with argv")
    for key in value:
        if key not in LAUNCHER_KEYS:
            raise JobFileError(f"launcher.{key}", _unknown(str(key), LAUNCHER_KEYS))
    out = common_pb2.Launcher(name=str(value.get("name", "")))
    for key in ("argv", "head_argv"):
        if key in value:
            argv = value[key]
            if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
                raise JobFileError(f"launcher.{key}", "must be a list of strings (argv, run without a shell)")
            getattr(out, key).extend(argv)
    per_node = value.get("per_node", False)
    if not isinstance(per_node, bool):
        raise JobFileError("launcher.per_node", "must be true or false")
    out.per_node = per_node
    return out


def _unknown(key: str, known: tuple[str, ...], suggest_first: tuple[str, ...] = ()) -> str:
    close = difflib.get_close_matches(key, suggest_first, n=1) or difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown field ({hint}known: {', '.join(known)})"


def _name(data: Mapping[str, Any], key: str, *, required: bool) -> str:
    if key not in data or data[key] is None:
        if required:
            raise JobFileError(key, "required")
        return ""
    value = data[key]
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise JobFileError(key, f"must be {jobspec.NAME_RULE}")
    return value


def _int(
    data: Mapping[str, Any], key: str, lo: int, hi: int, *, required: bool, default: int = 0,
    prefix: str = "",
) -> int:
    field = prefix + key
    if key not in data or data[key] is None:
        if required:
            raise JobFileError(field, "required")
        return default
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobFileError(field, f"must be an integer, got {value!r}")
    if value < lo:
        raise JobFileError(field, f"must be >= {lo}, got {value}")
    if value > hi:
        raise JobFileError(field, f"must be <= {hi:,}, got {value:,}")
    return value


def _hf_model(value: Mapping[str, Any], base_dir: Path | None) -> common_pb2.ModelSpec:
    """`model: {hf_config: PATH, seq_length: N, ...}`: a local Hugging Face config.json read into explicit
    dimensions (estimator/hfconfig.py), so the spec carries no path the controller cannot read."""
    for key in value:
        if key not in HF_CONFIG_KEYS:
            raise JobFileError(f"model.{key}", f"comes from model.hf_config; with it give only "
                                               f"{', '.join(HF_CONFIG_KEYS)}")
    path = value["hf_config"]
    if not isinstance(path, str) or not path or "\0" in path:
        raise JobFileError("model.hf_config", "must be the path of a local config.json (or its directory)")
    name = value.get("name") or ""
    if not isinstance(name, str) or (name and not MODEL_NAME_RE.fullmatch(name)):
        raise JobFileError("model.name", f"invalid model name {jobspec.shown_key(str(name))}")
    seq = _int(value, "seq_length", 1, dict(MODEL_DIMS)["seq_length"], required=False, prefix="model.")
    dec = _int(value, "decoder_seq_length", 1, REFINEMENT_MAX["decoder_seq_length"], required=False, prefix="model.")
    full = Path(path) if base_dir is None or Path(path).is_absolute() else base_dir / path
    try:
        dims = load_hf_config(full, seq_length=seq, decoder_seq_length=dec, name=name)
    except PlanInputError as exc:
        raise JobFileError(exc.field, exc.reason) from None
    return model_spec(dims)


def _model(value: Any, base_dir: Path | None = None) -> common_pb2.ModelSpec:
    model = common_pb2.ModelSpec()
    if isinstance(value, str):
        if not MODEL_NAME_RE.fullmatch(value):
            raise JobFileError("model", f"invalid registered model name {jobspec.shown_key(value)}")
        if registered(value) is None:
            raise JobFileError("model", f"unknown model {value!r}; registered: {', '.join(sorted(REGISTERED))}")
        model.name = value
        return model
    if not isinstance(value, Mapping):
        raise JobFileError(
            "model", "must be a registered model name or a mapping of hidden_size, num_layers, "
            "num_heads, vocab_size, seq_length"
        )
    if "hf_config" in value:
        return _hf_model(value, base_dir)
    primary = ("name",) + tuple(k for k, _ in MODEL_DIMS)
    known = primary + MODEL_FAMILY_KEYS + ("hf_config",)
    for key in value:
        if key not in known:
            raise JobFileError(f"model.{key}", _unknown(str(key), known, primary))
    name = value.get("name")
    if name is not None:
        if not isinstance(name, str) or not MODEL_NAME_RE.fullmatch(name):
            raise JobFileError("model.name", f"invalid model name {jobspec.shown_key(str(name))}")
        model.name = name
    for key, hi in MODEL_DIMS:
        setattr(model, key, _int(value, key, 1, hi, required=True, prefix="model."))
    if model.hidden_size % model.num_heads:
        raise JobFileError(
            "model.hidden_size",
            f"must be divisible by num_heads ({model.hidden_size} % {model.num_heads} != 0)",
        )
    _model_family(value, model)
    return model


def _model_family(value: Mapping[str, Any], model: common_pb2.ModelSpec) -> None:
    """The optional family keys, then the estimator's own check of the whole model."""
    if "family" in value:
        family = value["family"]
        if not isinstance(family, str) or family not in FAMILIES:
            raise JobFileError("model.family", f"must be one of {', '.join(FAMILIES)}, got {family!r}")
        model.family = FAMILIES[family]
    for key in MODEL_INT_KEYS:
        setattr(model, key, _int(value, key, 1, REFINEMENT_MAX[key], required=False, default=0, prefix="model."))
    for key in MODEL_FLAG_KEYS:
        flag = value.get(key)
        if flag is not None and not isinstance(flag, bool):
            raise JobFileError(f"model.{key}", f"must be true or false, got {flag!r}")
    model.gated = bool(value.get("gated", False))
    model.untied_embeddings = value.get("tied_embeddings", True) is False
    model.qkv_bias = bool(value.get("qkv_bias", False))
    model.sandwich_norm = bool(value.get("sandwich_norm", False))
    model.dropless = bool(value.get("dropless", False))
    for key in ("capacity_factor", "logit_softcap"):
        if key in value:
            v = value[key]
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 1000:
                raise JobFileError(f"model.{key}", f"must be a number in (0, 1000], got {v!r}")
            setattr(model, key, float(v))
    if model.dropless and "capacity_factor" in value:
        raise JobFileError("model.dropless", "dropless routing has no capacity factor: give one or the other")
    try:
        model_dims(model)
    except PlanInputError as exc:
        raise JobFileError(exc.field, exc.reason) from None


def _gpu_types(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, list):
        raise JobFileError("gpu_types", "must be a list of GPU model names, e.g. [A100-80GB, A40-48GB]")
    out: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise JobFileError(f"gpu_types[{i}]", f"must be a GPU model name, got {item!r}")
        try:
            canonical = catalog.lookup(item).name
        except catalog.UnknownGpuError as exc:
            raise JobFileError(f"gpu_types[{i}]", str(exc)) from None
        if canonical not in out:
            out.append(canonical)
    return out


def _entrypoint(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        raise JobFileError("entrypoint", "must be a list of arguments (argv), not a shell string")
    if not isinstance(value, list):
        raise JobFileError("entrypoint", "must be a list of arguments (argv)")
    for i, arg in enumerate(value):
        if isinstance(arg, Mapping) and len(arg) == 1 and next(iter(arg.values())) is None:
            # YAML reads an unquoted {checkpoint_dir} as a mapping: the placeholder was meant.
            raise JobFileError(f"entrypoint[{i}]", f"must be a string: quote placeholders, "
                                                   f"'{{{next(iter(arg))}}}' (YAML read a mapping)")
        if not isinstance(arg, str):
            raise JobFileError(f"entrypoint[{i}]", f"must be a string (quote numbers), got {arg!r}")
        if "\0" in arg:
            raise JobFileError(f"entrypoint[{i}]", "must not contain a NUL character")
    if value and not value[0]:
        raise JobFileError("entrypoint[0]", "the program must not be empty")
    return list(value)


def _env(value: Any) -> dict[str, str]:
    """The env mapping's shape; names, sizes and the environment policy are jobspec's (_check_bounds)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise JobFileError("env", "must be a mapping of NAME: value")
    out: dict[str, str] = {}
    for name, val in value.items():
        field = f"env.{name}"
        if not isinstance(name, str) or not ENV_NAME_RE.fullmatch(name):
            raise JobFileError(f"env.{jobspec.shown_key(str(name))}", f"invalid name: must match {jobspec.ENV_NAME_RULE}")
        if isinstance(val, bool) or val is None or not isinstance(val, str | int | float):
            raise JobFileError(field, f"must be a string (quote it), got {val!r}")
        text = str(val)
        if "\0" in text:
            raise JobFileError(field, "must not contain a NUL character")
        out[name] = text
    return out
