"""Validation of a submitted JobSpec: every problem as (field, reason), nothing stored until clean."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.common import envpolicy
from tessera.common.contract import CONTRACT_VARS
from tessera.common.gpus import UnknownGpuError, lookup
from tessera.controller.core import launchers
from tessera.estimator.convert import model_refinements
from tessera.estimator.models import REGISTERED, ModelDims, registered
from tessera.estimator.plans import PlanInputError
from tessera.v1 import common_pb2

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
ENV_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")
JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# argv[0] is a program, not a command line: these only make sense to a shell.
SHELL_META = set(";|&$`<>(){}*?!~\n\r\t\"' \\")

LIMITS = {
    "hidden_size": 65536, "num_layers": 1024, "num_heads": 1024,
    "vocab_size": 4_000_000, "seq_length": 1_048_576,
}
MAX_GLOBAL_BATCH = 1_048_576
MAX_ITERATIONS = 1_000_000_000
MAX_GPUS_HINT = 4096
MAX_ARGV = 256
MAX_ARG_LEN = 4096
MAX_ENV = 1024  # entries; a job file is also bounded by its size (4 MiB)
MAX_PROGRESS_TIMEOUT_S = 10**7  # the job file's bound


@dataclass(frozen=True)
class FieldError:
    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


def resolve_model(m: common_pb2.ModelSpec) -> ModelDims:
    """Dimensions of a validated ModelSpec: explicit dimensions win over the registered name."""
    if m.hidden_size:
        return ModelDims(m.hidden_size, m.num_layers, m.num_heads, m.vocab_size, m.seq_length, m.name,
                         **model_refinements(m))
    dims = registered(m.name)
    assert dims is not None, "resolve_model on an unvalidated spec"
    return dims


def _model_errors(m: common_pb2.ModelSpec) -> list[FieldError]:
    dims = ("hidden_size", "num_layers", "num_heads", "vocab_size", "seq_length")
    given = [d for d in dims if getattr(m, d)]
    if not given:
        if not m.name:
            return [FieldError("model", "give a registered name or hidden_size, num_layers, num_heads, "
                                        "vocab_size and seq_length")]
        named = registered(m.name)
        if named is None:
            return [FieldError("model.name", f"unknown model {m.name!r}; registered: {', '.join(sorted(REGISTERED))}")]
        return _family_errors(named)
    errs: list[FieldError] = []
    for d in dims:
        v = getattr(m, d)
        if v <= 0:
            errs.append(FieldError(f"model.{d}", "required, must be > 0" if v == 0 else "must be > 0"))
        elif v > LIMITS[d]:
            errs.append(FieldError(f"model.{d}", f"{v} is larger than the limit {LIMITS[d]}"))
    if not errs and m.hidden_size % m.num_heads:
        errs.append(FieldError("model.num_heads", f"hidden_size {m.hidden_size} is not divisible by {m.num_heads}"))
    if m.name and not NAME_RE.match(m.name.lower()):
        errs.append(FieldError("model.name", "must match [a-z0-9][a-z0-9-]{0,62}"))
    if not errs:  # the family fields (ModelSpec 7-16), checked as the estimator checks them
        try:
            errs += _family_errors(resolve_model(m).validate())
        except PlanInputError as e:
            errs.append(FieldError(e.field, e.reason))
    return errs


def _family_errors(dims: ModelDims) -> list[FieldError]:
    if dims.is_transformer:
        return []
    return [FieldError("model.family", f"a {dims.family} job cannot run on this control plane: its plans, memory "
                                       "checks and workers are for transformers (the estimator answers its "
                                       "Cells: tessctl estimate cells)")]


def validate_spec(spec: common_pb2.JobSpec, allowed_env: frozenset[str] = frozenset()) -> list[FieldError]:
    """All problems of a JobSpec; an empty list means it may be stored. `allowed_env`: names the
    operator allows although the environment policy refuses them (common/envpolicy.py)."""
    errs: list[FieldError] = []
    if not spec.name:
        errs.append(FieldError("name", "required"))
    elif not NAME_RE.match(spec.name):
        errs.append(FieldError("name", "must match [a-z0-9][a-z0-9-]{0,62} (no paths, spaces or shell characters)"))
    if spec.tenant and not NAME_RE.match(spec.tenant):
        errs.append(FieldError("tenant", "must match [a-z0-9][a-z0-9-]{0,62}"))
    if not spec.HasField("model"):
        errs.append(FieldError("model", "required"))
    else:
        errs += _model_errors(spec.model)
    if spec.global_batch_size <= 0:
        errs.append(FieldError("global_batch_size", "required, must be >= 1"))
    elif spec.global_batch_size > MAX_GLOBAL_BATCH:
        errs.append(FieldError("global_batch_size", f"larger than the limit {MAX_GLOBAL_BATCH}"))
    if spec.iterations <= 0:
        errs.append(FieldError("iterations", "required, must be >= 1"))
    elif spec.iterations > MAX_ITERATIONS:
        errs.append(FieldError("iterations", f"larger than the limit {MAX_ITERATIONS}"))
    if spec.hint.gpus < 0 or spec.hint.gpus > MAX_GPUS_HINT:
        errs.append(FieldError("hint.gpus", f"must be between 0 and {MAX_GPUS_HINT}"))
    for i, t in enumerate(spec.hint.gpu_types):
        try:
            lookup(t)
        except UnknownGpuError as e:
            errs.append(FieldError(f"hint.gpu_types[{i}]", str(e)))
    errs += _argv_errors("entrypoint", spec.entrypoint, (launchers.PYTHON,), "a program path")
    if len(spec.env) > MAX_ENV:
        errs.append(FieldError("env", f"more than {MAX_ENV} variables"))
    for k, v in spec.env.items():
        if not ENV_NAME_RE.match(k):
            errs.append(FieldError(f"env.{k}", "name must match [A-Z_][A-Z0-9_]*"))
        elif k in CONTRACT_VARS:
            errs.append(FieldError(f"env.{k}", "reserved for the worker contract"))
        elif (why := envpolicy.refusal(k, allowed_env)) is not None:
            errs.append(FieldError(f"env.{k}", why))
        if "\0" in v or len(v) > MAX_ARG_LEN:
            errs.append(FieldError(f"env.{k}", "value contains NUL or is too long"))
    errs += [FieldError(f, r) for f, r in launchers.check(spec.launcher)]
    for field, argv in (("launcher.argv", spec.launcher.argv), ("launcher.head_argv", spec.launcher.head_argv)):
        errs += _argv_errors(field, argv, (launchers.PYTHON, launchers.ENTRYPOINT),
                             "{python}, {entrypoint} or a program path")
    if not 0 <= spec.checkpoint_every <= MAX_ITERATIONS:
        errs.append(FieldError("checkpoint_every", f"must be between 0 and {MAX_ITERATIONS}"))
    if not -1 <= spec.progress_timeout_seconds <= MAX_PROGRESS_TIMEOUT_S:
        errs.append(FieldError("progress_timeout_seconds",
                               f"must be between -1 (off) and {MAX_PROGRESS_TIMEOUT_S} seconds (0: the controller's)"))
    if not 0 <= spec.max_retries <= 100:
        errs.append(FieldError("max_retries", "must be between 0 and 100"))
    return errs


def _argv_errors(field: str, argv: Sequence[str], placeholders: tuple[str, ...], allowed: str) -> list[FieldError]:
    """An argv is run without a shell: bounded, no NUL, and its program (argv[0]) one of the
    `placeholders` or a path, never a command line (`allowed` says which in the error)."""
    errs: list[FieldError] = []
    if len(argv) > MAX_ARGV:
        errs.append(FieldError(field, f"more than {MAX_ARGV} arguments"))
    for i, arg in enumerate(argv):
        if "\0" in arg or len(arg) > MAX_ARG_LEN:
            errs.append(FieldError(f"{field}[{i}]", "contains NUL or is too long"))
    if argv:
        prog = argv[0]
        if not prog or (prog not in placeholders and any(c in SHELL_META for c in prog)):
            errs.append(FieldError(f"{field}[0]", f"must be {allowed}, not a shell command line "
                                                  "(the argv is run without a shell)"))
    return errs


def canonical_gpu_types(spec: common_pb2.JobSpec) -> tuple[str, ...]:
    return tuple(lookup(t).name for t in spec.hint.gpu_types)
