"""The bounds of a JobSpec: one table that the job-file parser (tessera.clients.jobfile) and the
controller's SubmitJob validation (tessera.controller.core.validate) both apply, so a spec sent over
raw gRPC meets exactly the limits a job file does (docs/job-file.md, "Limits").

`spec_errors` checks everything that needs no estimator: sizes and counts of every field and of the
whole serialized spec, names, ranges, argv and launcher templates. What a model means (a registered
name, divisibility, the family's own rules) is the estimator library's check, which both callers run
on top. Errors are (field, reason) with proto field paths (`hint.gpus`, `env.NAME`); the job file
maps them to its own keys.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from tessera.common import envpolicy
from tessera.common.contract import CONTRACT_VARS
from tessera.common.gpus import UnknownGpuError, lookup
from tessera.common.objective import objective_errors
from tessera.v1 import common_pb2

# Names: lowercase DNS-label style, so they are safe in paths, labels and terminals.
NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
NAME_RULE = "1-63 lowercase letters, digits or '-', starting with a letter or digit"
MODEL_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MODEL_NAME_RULE = "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
ENV_NAME_RE = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")
ENV_NAME_RULE = "[A-Z_][A-Z0-9_]*, at most 128 characters"

# The whole spec, serialized: a job is listed, stored and sent to every agent of its placement, so
# its size bounds ListJobs pages and Launch calls (the gRPC limit is 16 MiB; 64 KiB leaves pages of
# hundreds of the largest jobs).
MAX_SPEC_BYTES = 64 * 1024
MAX_ENV = 1024  # variables
MAX_ENV_VALUE = 4096  # characters of one value
MAX_ARGV = 256  # arguments of the entrypoint and of each launcher template
MAX_ARG_LEN = 4096  # characters of one argument
MAX_GPU_TYPES = 32  # entries of hint.gpu_types (the catalog has fewer models)
MAX_LAUNCHER_NAME = 32

MODEL_DIMS: tuple[tuple[str, int], ...] = (
    ("hidden_size", 65_536),
    ("num_layers", 1_024),
    ("num_heads", 1_024),
    ("vocab_size", 4_000_000),
    ("seq_length", 1_048_576),
)
# ModelSpec's optional refinements (0 = absent) and their bounds: a layer count or a width bounded
# like the dimension it refines (the estimator's work grows with the layers: the decoder's count as
# num_layers), experts above the largest published MoE (Switch-C: 2,048), ffn_hidden 16 x hidden.
MODEL_REFINEMENTS: tuple[tuple[str, int], ...] = (
    ("ffn_hidden", 1_048_576),
    ("num_kv_heads", 1_024),
    ("num_experts", 4_096),
    ("top_k", 4_096),
    ("moe_every", 1_024),
    ("width_factor", 1_024),
    ("kv_channels", 65_536),
    ("num_decoder_layers", 1_024),
    ("decoder_seq_length", 1_048_576),
    ("sliding_window", 1_048_576),
)
MAX_CAPACITY_FACTOR = 1000.0
MAX_LOGIT_SOFTCAP = 1000.0

# The job's recipe (JobSpec.plan): the sizes are the scheduler's and must be unset; these bound the rest.
PLAN_SIZES = ("dp", "tp", "pp", "cp", "micro_batch", "grad_accum", "ep", "virtual_stages")
MAX_LORA_RANK = 65_536
MAX_CHECKPOINT_EVERY_LAYERS = 1_024

MAX_GLOBAL_BATCH = 1_048_576
MAX_ITERATIONS = 1_000_000_000
MAX_CHECKPOINT_EVERY = 1_000_000_000
MAX_GPUS_HINT = 4096
MAX_RETRIES = 100
MAX_PROGRESS_TIMEOUT_S = 10**7

# Launcher templates (docs/launchers.md): the placeholders the controller fills in, and the
# built-in names (tessera.controller.core.launchers holds their argv; a test keeps the two equal).
PYTHON = "{python}"
ENTRYPOINT = "{entrypoint}"
LAUNCHER_FIELDS = ("nnodes", "node_rank", "nproc_per_node", "master_addr", "master_port", "world_size", "dp",
                   "tp", "pp", "micro_batch", "grad_accum", "global_batch_size", "iterations", "checkpoint_dir",
                   "world_info")
BUILTIN_LAUNCHERS = ("deepspeed", "direct", "torchrun")
# A placeholder of a launcher template; every other brace of a template is literal.
PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
# argv[0] is a program, not a command line: these only make sense to a shell.
SHELL_META = frozenset(";|&$`<>(){}*?!~\n\r\t\"' \\")
# How much of an offending key an error repeats (a hostile key may be megabytes).
_KEY_SHOWN = 40

Errors = list[tuple[str, str]]


def shown_key(key: str) -> str:
    """A key as an error's field path may repeat it: printable and short."""
    if len(key) <= _KEY_SHOWN and key.isascii() and key.isprintable():
        return key
    return repr(key[:_KEY_SHOWN]) + ("..." if len(key) > _KEY_SHOWN else "")


def spec_errors(spec: common_pb2.JobSpec, allowed_env: frozenset[str] = frozenset()) -> Errors:
    """Every bound of docs/job-file.md that `spec` breaks, as (field, reason); [] = within bounds.
    An oversized spec is not walked: it gets the count it breaks (env, an argv), else `spec`."""
    size = spec.ByteSize()
    if size > MAX_SPEC_BYTES:
        counts = [(field, f"more than {hi:,} {what} ({n:,})") for field, n, hi, what in (
            ("env", len(spec.env), MAX_ENV, "variables"), ("entrypoint", len(spec.entrypoint), MAX_ARGV, "arguments"),
            ("launcher.argv", len(spec.launcher.argv), MAX_ARGV, "arguments"),
            ("launcher.head_argv", len(spec.launcher.head_argv), MAX_ARGV, "arguments")) if n > hi]
        why = f"{size:,} bytes serialized, over the limit of {MAX_SPEC_BYTES:,} (env and argv are for settings, not data)"
        return counts or [("spec", why)]
    errs: Errors = []
    if not spec.name:
        errs.append(("name", "required"))
    elif not NAME_RE.fullmatch(spec.name):
        errs.append(("name", f"must be {NAME_RULE} (no paths, spaces or shell characters)"))
    if spec.tenant and not NAME_RE.fullmatch(spec.tenant):
        errs.append(("tenant", f"must be {NAME_RULE}"))
    opaque = not spec.HasField("model")  # docs/opaque-jobs.md: resources and a program only
    if opaque:
        errs += opaque_errors(spec)
    else:
        errs += model_bound_errors(spec.model)
    if spec.HasField("plan"):
        errs += plan_bound_errors(spec.plan)
    errs += _range("global_batch_size", spec.global_batch_size, 0 if opaque else 1, MAX_GLOBAL_BATCH)
    errs += _range("iterations", spec.iterations, 0 if runs_own_program(spec) else 1, MAX_ITERATIONS)
    errs += run_limit_errors(spec)
    errs += _range("hint.gpus", spec.hint.gpus, 0, MAX_GPUS_HINT)
    if len(spec.hint.gpu_types) > MAX_GPU_TYPES:
        errs.append(("hint.gpu_types", f"more than {MAX_GPU_TYPES} entries"))
    else:
        for i, t in enumerate(spec.hint.gpu_types):
            try:
                lookup(t)
            except UnknownGpuError as e:
                errs.append((f"hint.gpu_types[{i}]", str(e)[:200]))
    errs += argv_errors("entrypoint", spec.entrypoint, (PYTHON,), "a program path")
    errs += entrypoint_launcher_errors(spec)
    errs += env_errors(spec.env, allowed_env)
    errs += launcher_errors(spec.launcher)
    errs += _range("checkpoint_every", spec.checkpoint_every, 0, MAX_CHECKPOINT_EVERY)
    if not -1 <= spec.progress_timeout_seconds <= MAX_PROGRESS_TIMEOUT_S:
        errs.append(("progress_timeout_seconds",
                     f"must be between -1 (never) and {MAX_PROGRESS_TIMEOUT_S:,} seconds (0: the controller's)"))
    errs += _range("max_retries", spec.max_retries, 0, MAX_RETRIES)
    errs += objective_errors(spec)
    errs += guarantee_errors(spec)
    return errs


# A guarantee's plan name: the estimator's vocabulary (ga, gc, zero-dp, zero-offload, "248"); its
# meaning is checked by the controller (controller/core/validate.py) against the estimator.
PLAN_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
MAX_GUARANTEE_CPUS = 65_536  # common/nodespec.py's bound of one node's CPUs


def guaranteed(spec: common_pb2.JobSpec) -> bool:
    return bool(spec.priority == common_pb2.PRIORITY_GUARANTEED)


def fill_guarantee(spec: common_pb2.JobSpec) -> None:
    """A guaranteed job without a promise is promised its hint: `hint.gpus` GPUs, of its one allowed
    type when it names exactly one. Changes nothing when the hint has no GPU count either (then
    `guarantee_errors` names the missing field)."""
    if not guaranteed(spec) or spec.guarantee.num_gpus or spec.hint.gpus <= 0:
        return
    spec.guarantee.num_gpus = spec.hint.gpus
    if not spec.guarantee.gpu_type and len(spec.hint.gpu_types) == 1:
        spec.guarantee.gpu_type = spec.hint.gpu_types[0]


def guarantee_errors(spec: common_pb2.JobSpec) -> Errors:
    """`priority` and `guarantee` (docs/tenants.md): a known priority; a guarantee only on a
    guaranteed job, which must have one (`fill_guarantee` first gives it the hint's); numbers in
    range; a catalog GPU type among the hint's; a plan name in the estimator's spelling."""
    if spec.priority not in common_pb2.Priority.values():
        return [("priority", f"unknown value {spec.priority}: guaranteed or best-effort")]
    if not spec.HasField("guarantee"):
        if guaranteed(spec):
            return [("guarantee", ("a guaranteed job needs its promise: guarantee.num_gpus (or a GPU count in "
                                  "hint.gpus, which becomes the promise)"))]
        return []
    g = spec.guarantee
    if not guaranteed(spec):
        return [("guarantee", "only a guaranteed job has a guarantee (priority: guaranteed)")]
    errs = _range("guarantee.num_gpus", g.num_gpus, 1, MAX_GPUS_HINT)
    errs += _range("guarantee.num_cpus", g.num_cpus, 0, MAX_GUARANTEE_CPUS)
    if g.gpu_type:
        try:
            name = lookup(g.gpu_type).name
        except UnknownGpuError as e:
            errs.append(("guarantee.gpu_type", str(e)[:200]))
        else:
            allowed = {lookup(t).name for t in spec.hint.gpu_types if _known(t)}
            if allowed and name not in allowed:
                errs.append(("guarantee.gpu_type", (f"{name} is not among the job's hint.gpu_types "
                                                   f"({', '.join(sorted(allowed))})")))
    if g.plan and not PLAN_NAME_RE.fullmatch(g.plan):
        errs.append(("guarantee.plan", ("must be a plan name: ga, gc, zero-dp, zero-offload or PP/TP/DP digits "
                                       "such as 248")))
    runs_on = spec.hint.gpus or 1  # an opaque job without hint.gpus runs on one GPU (controller/snapshots.py)
    if not spec.HasField("model") and g.num_gpus and g.num_gpus != runs_on:
        # Its tenant would be charged the promise while the job holds its hint's GPUs.
        errs.append(("guarantee.num_gpus", (f"an opaque job runs on exactly its hint.gpus ({runs_on}"
                                           f"{'' if spec.hint.gpus else ': none given is 1'}): its promise must "
                                           f"be that many GPUs, got {g.num_gpus}")))
    return errs


def _known(gpu_type: str) -> bool:
    try:
        lookup(gpu_type)
    except UnknownGpuError:
        return False
    return True


def _range(field: str, value: int, lo: int, hi: int) -> Errors:
    if value < lo:
        return [(field, "required, must be >= 1" if value == 0 and lo == 1 else f"must be >= {lo}, got {value}")]
    if value > hi:
        return [(field, f"must be <= {hi:,}, got {value:,}")]
    return []


def model_bound_errors(m: common_pb2.ModelSpec) -> Errors:
    """The model's name and the ranges of its numbers (their meaning is the estimator's check)."""
    errs: Errors = []
    if m.name and not MODEL_NAME_RE.fullmatch(m.name):
        errs.append(("model.name", f"must be {MODEL_NAME_RULE}"))
    dims = [d for d, _ in MODEL_DIMS if getattr(m, d)]
    if not dims and not m.name:
        errs.append(("model", ("give a registered name or hidden_size, num_layers, num_heads, vocab_size and "
                              "seq_length")))
    elif dims:
        for d, hi in MODEL_DIMS:
            errs += _range(f"model.{d}", getattr(m, d), 1, hi)
    for r, hi in MODEL_REFINEMENTS:
        errs += _range(f"model.{r}", getattr(m, r), 0, hi)
    cf = m.capacity_factor
    if cf and not (math.isfinite(cf) and 0 < cf <= MAX_CAPACITY_FACTOR):
        errs.append(("model.capacity_factor", f"must be a number in (0, {MAX_CAPACITY_FACTOR:g}]"))
    cap = m.logit_softcap
    if cap and not (math.isfinite(cap) and 0 < cap <= MAX_LOGIT_SOFTCAP):
        errs.append(("model.logit_softcap", f"must be a number in (0, {MAX_LOGIT_SOFTCAP:g}] (0 = none)"))
    return errs


def plan_bound_errors(p: common_pb2.ExecutionPlan) -> Errors:
    """The job's recipe: no parallel size (the scheduler's), enum values that exist, bounded numbers.
    Whether the combination exists is the estimator's check (ExecutionPlan), run on top."""
    why = "a parallel size is the scheduler's choice, not the job's (tessctl estimate --plan takes it)"
    errs: Errors = [(f"plan.{f}", why) for f in PLAN_SIZES if getattr(p, f)]
    for desc, value in p.ListFields():
        if desc.enum_type is not None and desc.enum_type.values_by_number.get(value) is None:
            errs.append((f"plan.{desc.name}", f"unknown value {value}"))
    errs += _range("plan.lora_rank", p.lora_rank, 0, MAX_LORA_RANK)
    errs += _range("plan.checkpoint_every", p.checkpoint_every, 0, MAX_CHECKPOINT_EVERY_LAYERS)
    return errs


def env_errors(env: Mapping[str, str], allowed: frozenset[str] = frozenset()) -> Errors:
    """Names, sizes, the worker contract's reserved names and the environment policy
    (common/envpolicy.py: loader and interpreter hooks, unless the operator `allowed` them)."""
    items = list(env.items())
    if len(items) > MAX_ENV:
        return [("env", f"more than {MAX_ENV:,} variables ({len(items):,})")]
    errs: Errors = []
    for name, value in items:
        field = f"env.{shown_key(name)}"
        if not ENV_NAME_RE.fullmatch(name):
            errs.append((field, f"invalid name: must match {ENV_NAME_RULE}"))
        elif name in CONTRACT_VARS:
            errs.append((field, "reserved: set by the agent for every worker (docs/worker-contract.md)"))
        elif (why := envpolicy.refusal(name, allowed)) is not None:
            errs.append((field, why))
        if "\0" in value:
            errs.append((field, "must not contain a NUL character"))
        elif len(value) > MAX_ENV_VALUE:
            errs.append((field, f"value longer than {MAX_ENV_VALUE:,} characters"))
    return errs


def argv_errors(field: str, argv: Sequence[str], placeholders: tuple[str, ...], allowed: str) -> Errors:
    """An argv is run without a shell: bounded, no NUL, and its program (argv[0]) one of the
    `placeholders` or a path, never a command line (`allowed` says which in the error)."""
    if len(argv) > MAX_ARGV:
        return [(field, f"more than {MAX_ARGV} arguments")]
    errs: Errors = []
    for i, arg in enumerate(argv):
        if "\0" in arg:
            errs.append((f"{field}[{i}]", "must not contain a NUL character"))
        elif len(arg) > MAX_ARG_LEN:
            errs.append((f"{field}[{i}]", f"longer than {MAX_ARG_LEN:,} characters"))
    if argv:
        prog = argv[0]
        if not prog or (prog not in placeholders and any(c in SHELL_META for c in prog)):
            errs.append((f"{field}[0]", (f"must be {allowed}, not a shell command line "
                                        "(the argv is run without a shell)")))
    return errs


# Built-in launchers that run the entrypoint as `<their python> -u <entrypoint>`: a {python} first
# became `python -u /path/to/python train.py`, which fails on every node (docs/launchers.md).
RUNS_ITS_OWN_PYTHON = ("deepspeed", "torchrun")


def entrypoint_launcher_errors(spec: common_pb2.JobSpec) -> Errors:
    """An entrypoint that its launcher cannot run: {python} first under torchrun or deepspeed, or
    any entrypoint under a template without {entrypoint}, which would run the template's program
    and never the entrypoint (a live audit saw one accepted, and `describe job` show the dropped
    entrypoint as the job's)."""
    if spec.entrypoint and template_runs_own_program(spec.launcher):
        return [("entrypoint", ("the launcher template has no {entrypoint}, so the entrypoint would never run; "
                                "drop it or put {entrypoint} in launcher.argv"))]
    if spec.launcher.name in RUNS_ITS_OWN_PYTHON and spec.entrypoint[:1] == [PYTHON]:
        return [("entrypoint[0]", (f"{spec.launcher.name} runs the entrypoint with its own Python: give the "
                                   "script (or -m module) without {python}, e.g. [train.py, --lr, '3e-4']"))]
    return []


def template_runs_own_program(launcher: common_pb2.Launcher) -> bool:
    """Whether a launcher template runs a program of its own: it has an argv (without one, the
    controller runs "direct", head_argv or not: controller/core/launchers.template_of) and names no
    {entrypoint}, in argv or head_argv, so no entrypoint, the job's or the reference trainer, runs."""
    return bool(launcher.argv) and ENTRYPOINT not in (*launcher.argv, *launcher.head_argv)


def launcher_errors(launcher: common_pb2.Launcher) -> Errors:
    """A launcher field: a built-in name or a template whose placeholders the controller knows."""
    errs: Errors = []
    if len(launcher.name) > MAX_LAUNCHER_NAME:
        errs.append(("launcher.name", f"longer than {MAX_LAUNCHER_NAME} characters"))
    elif launcher.name and launcher.argv:
        errs.append(("launcher", "give a built-in name or an argv template, not both"))
    elif launcher.name and launcher.name not in BUILTIN_LAUNCHERS:
        errs.append(("launcher.name", (f"unknown launcher {launcher.name[:_KEY_SHOWN]!r}; built-in: "
                                      f"{', '.join(BUILTIN_LAUNCHERS)}")))
    for field, argv in (("launcher.argv", launcher.argv), ("launcher.head_argv", launcher.head_argv)):
        bounded = argv_errors(field, argv, (PYTHON, ENTRYPOINT), "{python}, {entrypoint} or a program path")
        errs += bounded
        if bounded and bounded[0][0] == field:  # too many arguments: not walked
            continue
        for i, arg in enumerate(argv):
            for name in PLACEHOLDER.findall(arg):
                if name not in LAUNCHER_FIELDS and f"{{{name}}}" not in (PYTHON, ENTRYPOINT):
                    errs.append((f"{field}[{i}]", (f"unknown placeholder {{{name}}}; known: {{python}}, "
                                                  f"{{entrypoint}}, {', '.join('{' + f + '}' for f in LAUNCHER_FIELDS)}")))
            if ENTRYPOINT in arg and arg != ENTRYPOINT:
                errs.append((f"{field}[{i}]", "{entrypoint} must be an argument of its own"))
    if launcher.head_argv and not launcher.per_node:
        errs.append(("launcher.head_argv", "only for per-node launchers"))
    elif launcher.head_argv and not launcher.argv:
        # The controller runs "direct" for a template without argv: head_argv alone never ran.
        errs.append(("launcher.head_argv", "needs launcher.argv, the other nodes' command"))
    return errs


# The workers' working directory (JobSpec.workdir): an absolute path of the nodes.
MAX_WORKDIR = 4096
MAX_RUNTIME_S = 10**8


def runs_own_program(spec: common_pb2.JobSpec) -> bool:
    """Whether the job runs a program of its own rather than the reference trainer: an entrypoint,
    or a launcher template that names none ({entrypoint} absent). Whether it checkpoints is then up
    to that program, not Tessera's trainer."""
    return bool(spec.entrypoint) or template_runs_own_program(spec.launcher)


def opaque_errors(spec: common_pb2.JobSpec) -> Errors:
    """A job without model dims (docs/opaque-jobs.md) runs its own program on the GPUs it asks for."""
    errs: Errors = []
    if not runs_own_program(spec):
        errs.append(("model", ("required when the job runs the reference trainer (no entrypoint): give an "
                              "entrypoint to run your own program without model dims")))
    if spec.HasField("plan"):
        errs.append(("plan", "a training recipe needs the model's dims (model)"))
    return errs


def run_limit_errors(spec: common_pb2.JobSpec) -> Errors:
    """workdir and max_runtime_seconds (JobSpec 20, 21)."""
    errs: Errors = []
    wd = spec.workdir
    if wd:
        if "\0" in wd:
            errs.append(("workdir", "must not contain a NUL character"))
        elif len(wd) > MAX_WORKDIR:
            errs.append(("workdir", f"longer than {MAX_WORKDIR:,} characters"))
        elif not wd.startswith("/"):
            errs.append(("workdir", f"must be an absolute path on the nodes, got {shown_key(wd)}"))
    if not 0 <= spec.max_runtime_seconds <= MAX_RUNTIME_S:
        errs.append(("max_runtime_seconds", f"must be between 0 (no limit) and {MAX_RUNTIME_S:,} seconds"))
    return errs
