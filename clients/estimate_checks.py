"""What `tessctl estimate memory|time` say before and beside the estimator's answer (docs/cli.md):
the plan fields that `--mode marp` leaves out, the model families the two commands cover, and the
figure their fits verdict judges."""

from __future__ import annotations

from tessera.estimator.convert import execution_plan, model_dims
from tessera.estimator.errors import PlanInputError
from tessera.estimator.plans import ExecutionPlan
from tessera.v1 import common_pb2, estimator_pb2

# Frenzy's MARP is static bytes over tp plus Korthikanti's activations of one micro-batch over tp:
# the plan's dp (which does not change it) and grad_accum (which does not either at pp = 1; a pp
# above 1 is named itself) are taken too. Every other field the plan sets, it leaves out: its answer
# for `sharding=fsdp,checkpointing=op` is the plain DP one (558 GB against the formula's 52).
MARP_TAKES = ("dp", "tp", "micro_batch", "grad_accum")

GB = 1e9


def marp_ignored(plan: common_pb2.ExecutionPlan) -> list[str]:
    """`field=value` of every field of `plan` that MARP leaves out and that is not the default."""
    d = execution_plan(plan).to_dict()
    defaults = ExecutionPlan().to_dict()
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in d.items()
            if k not in MARP_TAKES and v != defaults[k]]


def marp_warning(plan: common_pb2.ExecutionPlan) -> str:
    """The stderr line for a MARP estimate of `plan`; "" when MARP takes all that the plan sets."""
    ignored = marp_ignored(plan)
    if not ignored:
        return ""
    return (f"--mode marp ignores the plan's {', '.join(ignored)}: Frenzy's MARP counts dp, tp and the "
            "micro-batch only, so its figures are those of a plan without them (--mode formula counts them)")


def require_transformer(model: common_pb2.ModelSpec, command: str) -> None:
    """A PlanInputError naming model.family (exit 1) for a model `estimate COMMAND` cannot answer,
    in the job file's words; the estimator's own reason named the memory estimate and `wresnet`."""
    dims = model_dims(model)
    if dims.is_transformer:
        return
    what = ("`estimate time` covers transformers (the iteration time and the memory of the plan)"
            if command == "time" else f"`estimate {command}` covers transformers")
    raise PlanInputError("model.family", f"{what}; a {dims.family_word} model has Cells only: `tessctl estimate cells "
                                         "-f FILE --cluster FILE` gives its iteration times")


def fits_figure(m: estimator_pb2.MemoryEstimate) -> str:
    """The figure `fits` judges, in GB: what the allocator reserves plus `other` (the CUDA context),
    or the tensors' total where no reserve is predicted."""
    return f"{(m.reserved + m.other if m.reserved else m.total) / GB:.2f}"


def fits_term(m: estimator_pb2.MemoryEstimate) -> str:
    """What fits_figure is, as the tables name it."""
    return "reserved + other" if m.reserved else "total"
