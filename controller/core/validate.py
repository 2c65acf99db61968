"""Validation of a submitted JobSpec: every problem as (field, reason), nothing stored until clean."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tessera.common import jobspec
from tessera.common.gpus import lookup
from tessera.estimator.convert import execution_plan, model_refinements
from tessera.estimator.models import REGISTERED, ModelDims, registered
from tessera.estimator.perf_data import parse_exec_plan
from tessera.estimator.perf_model import PerfModelInputError
from tessera.estimator.plans import PlanInputError
from tessera.v1 import common_pb2

JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# At most this many problems, and this many characters, in one answer: a hostile spec could have
# thousands, and gRPC refuses status details over its metadata limit (8 KiB by default).
MAX_REPORTED = 20
MAX_MESSAGE = 2000


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
    """What the model means, once its name and numbers are within bounds (jobspec.model_bound_errors):
    a registered name that exists, or dimensions the estimator accepts."""
    if not m.hidden_size:
        named = registered(m.name)
        if named is None:
            return [FieldError("model.name", f"unknown model {jobspec.shown_key(m.name)}; registered: "
                                             f"{', '.join(sorted(REGISTERED))}")]
        return _family_errors(named)
    if m.hidden_size % m.num_heads:
        return [FieldError("model.hidden_size", f"must be divisible by num_heads ({m.hidden_size} % {m.num_heads} "
                                                "!= 0)")]
    try:  # the family fields (ModelSpec 7-16), checked as the estimator checks them
        return _family_errors(resolve_model(m).validate())
    except PlanInputError as e:
        return [FieldError(e.field, e.reason)]


def _family_errors(dims: ModelDims) -> list[FieldError]:
    if dims.is_transformer:
        return []
    return [FieldError("model.family", f"a {dims.family_word} job cannot run on this control plane: its plans, memory "
                                       "checks and workers are for transformers (the estimator answers its "
                                       "Cells: tessctl estimate cells)")]


def validate_spec(spec: common_pb2.JobSpec, allowed_env: frozenset[str] = frozenset()) -> list[FieldError]:
    """All problems of a JobSpec (at most MAX_REPORTED); an empty list means it may be stored.

    The bounds are tessera.common.jobspec's, the same the job-file parser applies; the model's
    meaning is checked only once its fields are within them. `allowed_env`: names the operator
    allows although the environment policy refuses them (common/envpolicy.py)."""
    bounds = jobspec.spec_errors(spec, allowed_env)
    errs = [FieldError(f, r) for f, r in bounds]
    if spec.HasField("model") and not any(f == "spec" or f.startswith("model") for f, _ in bounds):
        errs += _model_errors(spec.model)
        if spec.HasField("plan") and not errs:
            errs += _recipe_errors(spec.plan, resolve_model(spec.model))
    if spec.guarantee.plan and not any(f.startswith("guarantee") for f, _ in bounds):
        errs += promise_plan_errors(spec.guarantee.plan, spec.guarantee.num_gpus)
    return errs[:MAX_REPORTED]


def promise_plan_errors(plan: str, gpus: int) -> list[FieldError]:
    """A guarantee's plan as the estimator's Morphling vocabulary reads it (estimator/perf_data.py):
    a kind it knows, or PP/TP/DP digits whose product is the promised GPUs."""
    try:
        spec = parse_exec_plan(plan)
    except PerfModelInputError as e:
        return [FieldError("guarantee.plan", e.reason)]
    if spec.kind == "3d" and spec.pp * spec.tp * spec.dp != gpus:
        return [FieldError("guarantee.plan", f"{plan} is PP{spec.pp} TP{spec.tp} DP{spec.dp} = "
                                             f"{spec.pp * spec.tp * spec.dp} GPUs, the guarantee has {gpus}")]
    return []


def _recipe_errors(p: common_pb2.ExecutionPlan, dims: ModelDims) -> list[FieldError]:
    """The job's recipe as the estimator reads it (a combination that does not exist, a field that
    would change nothing, a recipe the model cannot take), with the scheduler's sizes at 1."""
    try:
        execution_plan(p).check(model=dims)
    except PlanInputError as e:
        return [FieldError(e.field, e.reason)]
    return []


def summary(errors: list[FieldError]) -> str:
    """The problems as one status message: `field: reason; ...`, cut to MAX_MESSAGE characters."""
    text = "; ".join(map(str, errors))
    if len(text) <= MAX_MESSAGE:
        return text
    cut = text.rfind("; ", 0, MAX_MESSAGE - 20)
    return text[:cut if cut > 0 else MAX_MESSAGE - 20] + "; ... (more problems)"


def canonical_gpu_types(spec: common_pb2.JobSpec) -> tuple[str, ...]:
    return tuple(lookup(t).name for t in spec.hint.gpu_types)
