"""The controller validates exactly what job files validate (issue 13): every example job file and a
table of bad specs go through both the job-file parser and SubmitJob's validation, which must
accept and refuse the same ones, naming the same field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tessera.clients.jobfile import JobFileError, load_job_file, parse_job_yaml
from tessera.common import jobspec
from tessera.controller.core import launchers
from tessera.controller.core.validate import MAX_MESSAGE, summary, validate_spec
from tessera.v1 import common_pb2 as P

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# Files meant for `tessctl estimate` only: a convnet the estimator answers and the controller refuses
# to run (docs/job-file.md, wide_resnet): the one documented difference, checked as such below.
ESTIMATE_ONLY = {"wide-resnet-500m.yaml": "model.family"}
# jobspec/proto field path -> the job file's key.
FILE_KEYS = {"hint.gpus": "gpus", "hint.gpu_types": "gpu_types", "progress_timeout_seconds": "progress_timeout",
             "max_runtime_seconds": "max_runtime", "spec": "job"}


def job_files() -> list[Path]:
    return sorted((EXAMPLES / "jobs").glob("*.yaml")) + sorted((EXAMPLES / "estimate").glob("*.yaml"))


@pytest.mark.parametrize("path", job_files(), ids=lambda p: p.name)
def test_every_example_is_accepted_by_both(path: Path) -> None:
    spec = load_job_file(path)
    fields = [e.field for e in validate_spec(spec)]
    assert fields == ([ESTIMATE_ONLY[path.name]] if path.name in ESTIMATE_ONLY else [])
    # and the spec, written back as a job file, parses to itself
    assert parse_job_yaml(to_yaml(spec)) == spec


def to_yaml(spec: P.JobSpec) -> str:
    """A job file (JSON is YAML) saying what `spec` says, with the file's keys."""
    doc: dict[str, Any] = {"name": spec.name}
    if spec.tenant:
        doc["tenant"] = spec.tenant
    m = spec.model
    if spec.HasField("model"):
        if m.name and not m.hidden_size:
            doc["model"] = m.name
        else:
            model: dict[str, Any] = {"name": m.name} if m.name else {}
            model.update({d: getattr(m, d) for d, _ in jobspec.MODEL_DIMS})
            model.update({r: getattr(m, r) for r, _ in jobspec.MODEL_REFINEMENTS if getattr(m, r)})
            if m.family:
                model["family"] = {P.MODEL_FAMILY_DECODER: "decoder", P.MODEL_FAMILY_ENCODER: "encoder",
                                   P.MODEL_FAMILY_MOE: "moe", P.MODEL_FAMILY_WIDE_RESNET: "wide_resnet",
                                   P.MODEL_FAMILY_ENCODER_DECODER: "encoder_decoder"}[m.family]
            for flag in ("gated", "qkv_bias", "sandwich_norm", "dropless"):
                if getattr(m, flag):
                    model[flag] = True
            if m.untied_embeddings:
                model["tied_embeddings"] = False
            for number in ("capacity_factor", "logit_softcap"):
                if getattr(m, number):
                    model[number] = getattr(m, number)
            doc["model"] = model
    if spec.HasField("plan"):  # the library's spelling, as a file writes it
        from tessera.estimator.convert import PLAN_ENUMS, PRECISION

        plan: dict[str, Any] = {}
        for desc, value in spec.plan.ListFields():
            table = PRECISION if desc.name == "precision" else PLAN_ENUMS.get(desc.name)
            plan[desc.name] = table.get(value, value) if table is not None else value
        doc["plan"] = plan
    if spec.global_batch_size or spec.HasField("model"):  # an opaque job has neither (docs/opaque-jobs.md)
        doc["global_batch_size"] = spec.global_batch_size
    doc["iterations"] = spec.iterations
    if spec.HasField("hint"):
        doc["gpus"] = spec.hint.gpus
        if spec.hint.gpu_types:
            doc["gpu_types"] = list(spec.hint.gpu_types)
    if spec.entrypoint:
        doc["entrypoint"] = list(spec.entrypoint)
    if spec.env:
        doc["env"] = dict(spec.env)
    doc["checkpoint_every"] = spec.checkpoint_every
    doc["max_retries"] = spec.max_retries
    if spec.HasField("launcher"):
        la = spec.launcher
        if la.name and not (la.argv or la.head_argv or la.per_node):
            doc["launcher"] = la.name
        else:
            doc["launcher"] = {k: v for k, v in (("name", la.name), ("argv", list(la.argv)),
                                                 ("per_node", la.per_node), ("head_argv", list(la.head_argv))) if v}
    if spec.progress_timeout_seconds:
        doc["progress_timeout"] = spec.progress_timeout_seconds
    if spec.workdir:
        doc["workdir"] = spec.workdir
    if spec.max_runtime_seconds:
        doc["max_runtime"] = spec.max_runtime_seconds
    return json.dumps(doc)


def good(**kw: Any) -> P.JobSpec:
    s = P.JobSpec(name="ok", tenant="t", model=P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4,
                                                           vocab_size=256, seq_length=64),
                  global_batch_size=16, iterations=10, max_retries=2)
    for k, v in kw.items():
        if isinstance(v, dict):
            getattr(s, k).update(v)
        elif isinstance(v, list):
            getattr(s, k).extend(v)
        elif isinstance(v, P.ModelSpec | P.Launcher | P.ResourceHint | P.ExecutionPlan):
            getattr(s, k).CopyFrom(v)
        else:
            setattr(s, k, v)
    return s


def opaque(**kw: Any) -> P.JobSpec:
    """A job without a model: its own program (an empty `entrypoint` list removes it)."""
    s = P.JobSpec(name="op", tenant="t", entrypoint=["/bin/true"], max_retries=2)
    for k, v in kw.items():
        if isinstance(v, list):
            s.ClearField(k)
            getattr(s, k).extend(v)
        elif isinstance(v, P.ResourceHint | P.ExecutionPlan):
            getattr(s, k).CopyFrom(v)
        else:
            setattr(s, k, v)
    return s


def dims(**kw: Any) -> P.ModelSpec:
    m = P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256, seq_length=64)
    for k, v in kw.items():
        setattr(m, k, v)
    return m


BAD: list[tuple[str, P.JobSpec, str]] = [
    ("no name", good(name=""), "name"),
    ("upper name", good(name="Upper"), "name"),
    ("rtl name", good(name="a\u202eb"), "name"),
    ("long name", good(name="a" * 64), "name"),
    ("tenant", good(tenant="a b"), "tenant"),
    ("unknown model", good(model=P.ModelSpec(name="gpt5")), "model.name"),
    ("model name charset", good(model=dims(name="a/b")), "model.name"),
    ("model name long", good(model=dims(name="m" * 65)), "model.name"),
    ("hidden 0", good(model=dims(hidden_size=0)), "model.hidden_size"),
    ("hidden big", good(model=dims(hidden_size=70_000, num_heads=1)), "model.hidden_size"),
    ("heads", good(model=dims(num_heads=3)), "model.hidden_size"),
    ("experts without moe", good(model=dims(num_experts=4)), "model.num_experts"),
    ("refinement big", good(model=dims(ffn_hidden=2_000_000)), "model.ffn_hidden"),
    # the decoder's layers bounded as num_layers: 2^20 of them held a round for minutes
    ("decoder layers big", good(model=dims(family=P.MODEL_FAMILY_ENCODER_DECODER, num_decoder_layers=1_025)),
     "model.num_decoder_layers"),
    ("experts big", good(model=dims(family=P.MODEL_FAMILY_MOE, num_experts=4_097, top_k=2)), "model.num_experts"),
    ("capacity", good(model=dims(family=P.MODEL_FAMILY_MOE, num_experts=4, capacity_factor=2000.0)),
     "model.capacity_factor"),
    ("batch 0", good(global_batch_size=0), "global_batch_size"),
    ("batch big", good(global_batch_size=2_000_000), "global_batch_size"),
    ("iterations big", good(iterations=2 * 10**9), "iterations"),
    ("gpus hint", good(hint=P.ResourceHint(gpus=5000)), "hint.gpus"),
    ("gpus negative", good(hint=P.ResourceHint(gpus=-1)), "hint.gpus"),
    ("gpu type", good(hint=P.ResourceHint(gpu_types=["TPU-v9"])), "hint.gpu_types[0]"),
    ("shell entrypoint", good(entrypoint=["python train.py"]), "entrypoint[0]"),
    ("empty program", good(entrypoint=["", "x"]), "entrypoint[0]"),
    ("nul arg", good(entrypoint=["python", "a\0b"]), "entrypoint[1]"),
    ("long arg", good(entrypoint=["python", "x" * 5000]), "entrypoint[1]"),
    ("many args", good(entrypoint=["python"] + ["x"] * 300), "entrypoint"),
    ("env name", good(env={"lower": "x"}), "env.lower"),
    ("env name long", good(env={"A" * 200: "x"}), "env." + "'" + "A" * 40 + "'..."),
    ("env reserved", good(env={"RANK": "3"}), "env.RANK"),
    ("env nul", good(env={"A": "x\0y"}), "env.A"),
    ("env long value", good(env={"A": "x" * 5000}), "env.A"),
    ("env count", good(env={f"V{i}": "x" for i in range(1100)}), "env"),
    ("env 1 MB", good(env={f"V{i}": "x" * 4000 for i in range(250)}), "spec"),
    ("whole spec", good(env={f"V{i}": "x" * 4000 for i in range(20)}), "spec"),
    ("launcher name", good(launcher=P.Launcher(name="mpirun")), "launcher.name"),
    ("launcher both", good(launcher=P.Launcher(name="torchrun", argv=["x"])), "launcher"),
    ("launcher shell", good(launcher=P.Launcher(argv=["sh -c x"])), "launcher.argv[0]"),
    ("launcher placeholder", good(launcher=P.Launcher(argv=["run", "--n={gpus}"])), "launcher.argv[1]"),
    ("head without per_node", good(launcher=P.Launcher(argv=["run"], head_argv=["h"])), "launcher.head_argv"),
    # The controller runs "direct" for a template without argv: its head_argv never ran (a review).
    ("head without argv", good(launcher=P.Launcher(per_node=True, head_argv=["{python}", "{entrypoint}"])),
     "launcher.head_argv"),
    ("template drops the entrypoint", good(entrypoint=["/tmp/a.py"], launcher=P.Launcher(
        argv=["{python}", "/tmp/x/envdump.py"], per_node=True)), "entrypoint"),
    ("checkpoint_every", good(checkpoint_every=2**40), "checkpoint_every"),
    ("checkpoint negative", good(checkpoint_every=-1), "checkpoint_every"),
    ("progress timeout", good(progress_timeout_seconds=-2), "progress_timeout_seconds"),
    ("progress timeout big", good(progress_timeout_seconds=10**8), "progress_timeout_seconds"),
    ("retries", good(max_retries=101), "max_retries"),
    ("retries negative", good(max_retries=-1), "max_retries"),
    ("plan size", good(plan=P.ExecutionPlan(tp=2)), "plan.tp"),
    ("plan cp", good(plan=P.ExecutionPlan(cp=2)), "plan.cp"),
    ("plan selective under flash", good(plan=P.ExecutionPlan(checkpointing=P.CHECKPOINTING_SELECTIVE)),
     "plan.checkpointing"),
    ("plan quant without lora", good(plan=P.ExecutionPlan(base_quant=P.BASE_QUANT_NF4)), "plan.base_quant"),
    ("plan frozen without lora", good(plan=P.ExecutionPlan(offload=P.OFFLOAD_FROZEN)), "plan.offload"),
    ("plan lora rank big", good(plan=P.ExecutionPlan(lora_rank=100_000)), "plan.lora_rank"),
    ("plan float8 fp32", good(plan=P.ExecutionPlan(float8=P.FLOAT8_LINEAR, precision=P.PRECISION_FP32)),
     "plan.float8"),
    ("softcap big", good(model=dims(gated=True, logit_softcap=5000.0)), "model.logit_softcap"),
    ("decoder layers of a decoder", good(model=dims(num_decoder_layers=2)), "model.num_decoder_layers"),
    ("dropless dense", good(model=dims(dropless=True)), "model.dropless"),
    # Opaque jobs (docs/opaque-jobs.md): no model needs a program of its own; workdir, max_runtime.
    ("opaque without a program", opaque(entrypoint=[]), "model"),
    ("opaque with a recipe", opaque(plan=P.ExecutionPlan(lora_rank=8)), "plan"),
    ("relative workdir", opaque(workdir="data"), "workdir"),
    ("negative max_runtime", opaque(max_runtime_seconds=-5), "max_runtime_seconds"),
]

GOOD: list[tuple[str, P.JobSpec]] = [
    ("plain", good()),
    ("registered", good(model=P.ModelSpec(name="gpt2-small"))),
    ("dotted model label", good(model=dims(name="moe-1.3b_x"))),
    ("bounds", good(name="a" * 63, global_batch_size=1_048_576, iterations=10**9, checkpoint_every=10**9,
                    max_retries=100, progress_timeout_seconds=-1, hint=P.ResourceHint(gpus=4096))),
    ("env at limits", good(env={"A" * 128: "x" * 4096, "B": ""})),
    ("argv at limits", good(entrypoint=["/usr/bin/python3"] + ["x"] * 10 + ["y" * 4096])),
    ("launcher", good(launcher=P.Launcher(argv=["{python}", "-m", "torch.distributed.run", "--nnodes={nnodes}",
                                                 "{entrypoint}"], per_node=True))),
    ("builtin launcher", good(launcher=P.Launcher(name="deepspeed"))),
    ("recipe", good(plan=P.ExecutionPlan(sharding=P.SHARDING_FSDP, checkpointing=P.CHECKPOINTING_OP, checkpoint_every=2,
                                         loss=P.LOSS_FP32, compile=True, lora_rank=16, lora_targets=P.LORA_TARGETS_QV,
                                         offload=P.OFFLOAD_FROZEN))),
    ("current families", good(model=dims(family=P.MODEL_FAMILY_ENCODER_DECODER, kv_channels=32, num_decoder_layers=3,
                                         decoder_seq_length=16, gated=True))),
    ("gemma-like", good(model=dims(gated=True, qkv_bias=True, sliding_window=32, logit_softcap=30.0,
                                   sandwich_norm=True, num_kv_heads=2))),
    ("mixtral-like", good(model=dims(family=P.MODEL_FAMILY_MOE, gated=True, num_experts=4, moe_every=1,
                                     dropless=True))),
    ("registered current", good(model=P.ModelSpec(name="qwen2.5-7b"))),
    ("opaque", opaque()),
    ("opaque cell, workdir, limit, iterations", opaque(hint=P.ResourceHint(gpus=8, gpu_types=["A100-80GB"]),
                                                      workdir="/srv/job", max_runtime_seconds=600, iterations=5)),
]


@pytest.mark.parametrize("spec", [s for _, s in GOOD], ids=[n for n, _ in GOOD])
def test_good_specs_pass_both(spec: P.JobSpec) -> None:
    assert validate_spec(spec) == []
    assert parse_job_yaml(to_yaml(spec)) == spec


@pytest.mark.parametrize("spec, field", [(s, f) for _, s, f in BAD], ids=[n for n, _, _ in BAD])
def test_bad_specs_are_refused_by_both_naming_the_field(spec: P.JobSpec, field: str) -> None:
    ctrl = [e.field for e in validate_spec(spec)]
    wanted = field.split("|")
    assert ctrl and ctrl[0] in wanted, ctrl
    with pytest.raises(JobFileError) as ei:
        parse_job_yaml(to_yaml(spec))
    as_proto = next((p + ei.value.field[len(k):] for p, k in FILE_KEYS.items()
                     if ei.value.field == k or ei.value.field.startswith((k + "[", k + "."))), ei.value.field)
    if spec.model.name and not spec.model.hidden_size and as_proto == "model":
        as_proto = "model.name"  # `model: NAME` in a file
    assert as_proto in ctrl, (ei.value, ctrl)


def test_launcher_names_are_the_controllers() -> None:
    assert sorted(launchers.BUILTIN) == list(jobspec.BUILTIN_LAUNCHERS)


def test_gpu_types_beyond_what_a_file_can_say() -> None:
    # A file's gpu_types are deduplicated to canonical names (at most the catalog's models); raw
    # gRPC can repeat one 33 times, which the shared bound refuses.
    spec = good(hint=P.ResourceHint(gpu_types=["A100"] * 33))
    assert [e.field for e in validate_spec(spec)] == ["hint.gpu_types"]
    assert list(parse_job_yaml(to_yaml(spec)).hint.gpu_types) == ["A100-80GB"]


def test_reported_errors_are_bounded() -> None:
    # thousands of bad variables under the size limit still make a short answer
    spec = good(env={f"v{i}": "" for i in range(1000)})
    errs = validate_spec(spec)
    assert len(errs) == 20 and all(e.field.startswith("env.v") for e in errs)
    assert len(summary(errs)) < 4096
    many_placeholders = good(launcher=P.Launcher(argv=["run"] + ["--x={" + "q" * (i + 1) + "}" for i in range(200)]))
    text = summary(validate_spec(many_placeholders))
    assert len(text) <= MAX_MESSAGE and text.startswith("launcher.argv[1]: unknown placeholder")
    assert text.endswith("; ... (more problems)")
