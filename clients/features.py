"""What a job gets from Tessera, and why (`tessctl describe job`, docs/opaque-jobs.md).

A job that names only resources and a program is opaque: it runs, and it succeeds when every rank
exits 0. Model dims, iterations and the trainer SDK's progress reports are opt-in; each unlocks
features, and `describe` names what is on and what is missing for the rest.
"""

from __future__ import annotations

from tessera.common import jobspec
from tessera.common.durations import format_duration
from tessera.v1 import controller_pb2


def features(job: controller_pb2.Job) -> list[tuple[str, str]]:
    """(feature, "yes/no: why") lines for the job's spec and what it has reported."""
    spec = job.spec
    model = spec.HasField("model")
    own = jobspec.runs_own_program(spec)
    iters = spec.iterations
    reports = job.HasField("progress")
    gpus = spec.hint.gpus or (1 if not model else 0)
    types = "/".join(spec.hint.gpu_types) or "any type"
    out = [("Kind", f"model-aware ({'your program' if own else 'the reference trainer'})" if model else
            f"opaque: no model dims: runs its program on exactly {gpus} x {types}")]
    no_dims = "no: no model dims (add model: to the job file)"
    out.append(("Memory-aware placement", "yes: Cells and plans from the estimator" if model else no_dims))
    out.append(("Learned step times", _learned(job, own) if model else no_dims))
    if not model:
        # TESSERA_CHECKPOINT_DIR is the job's, the same on every attempt: a script that saves there resumes.
        out.append(("Migration", ("stop and restart (no model dims: never moved to scale); resumes only if "
                                  "the script saves to and loads from $TESSERA_CHECKPOINT_DIR")))
    elif own:
        out.append(("Migration", ("stop and restart; resumes only if your program checkpoints to "
                                 "$TESSERA_CHECKPOINT_DIR")))
    else:
        out.append(("Migration", "yes: from the reference trainer's last checkpoint"))
    out.append(("Forecasts", "yes" if model and iters else
                "no: needs model dims and iterations" if not model else "no: needs iterations"))
    if iters:
        out.append(("Success", f"rank 0 reports {iters} iterations and every rank exits 0"))
        out.append(("Progress", "reported" if reports else "expected (trainer SDK): none yet"))
    else:
        out.append(("Success", "every rank exits 0"))
        out.append(("Progress", "reported: shown, no ETA (no iterations)" if reports else
                    "none (opt-in: the trainer SDK's reports give iteration, loss, rate)"))
    pt = spec.progress_timeout_seconds
    out.append(("Hang detection", f"after {format_duration(pt)} without a report" if pt > 0 else "off" if pt < 0 else
                "the controller's timeout" if iters else "off until it reports progress, then the controller's"))
    out.append(("Working directory", spec.workdir or "the attempt's folder on each node"))
    out.append(("Time limit", f"max_runtime {format_duration(spec.max_runtime_seconds)} per attempt"
                if spec.max_runtime_seconds else "none"))
    return out


def _learned(job: controller_pb2.Job, own: bool) -> str:
    """What the controller learns from a model-aware job's step times (controller/learning.py
    `learnable`). Its --learn-step-times and the nodes' inventory sources are not in the Job: the
    rule is said, not assumed met, unless a MEASURED event shows it was."""
    if any(e.kind == "MEASURED" for e in job.events):
        return "yes: learned from rank 0's step times (see the MEASURED event)"
    if job.plan.stages:
        return "no: a staged pipeline's uneven split is no Cell of the estimates"
    reports = "rank 0's step-time reports (trainer SDK)" if own else "rank 0's step-time reports"
    return (f"from {reports} on nodes whose GPUs NVML probed (the controller's default, --learn-step-times "
            "nvml; declared inventories only with all, never with off)")
