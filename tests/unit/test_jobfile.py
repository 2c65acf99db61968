"""Job files: golden JobSpecs of the examples, and the field and reason of every bad input."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.clients.jobfile import JobFileError, job_spec_from_dict, load_job_file, parse_job_yaml
from tessera.v1 import common_pb2

JOBS = Path(__file__).resolve().parents[2] / "examples" / "jobs"


def _model(h: int, layers: int, heads: int, vocab: int, seq: int, name: str = "") -> common_pb2.ModelSpec:
    return common_pb2.ModelSpec(name=name, hidden_size=h, num_layers=layers, num_heads=heads, vocab_size=vocab,
                                seq_length=seq)


GOLDEN: dict[str, common_pb2.JobSpec] = {
    "tiny.yaml": common_pb2.JobSpec(
        name="tiny", tenant="default", model=_model(64, 2, 4, 256, 64), global_batch_size=16, iterations=40,
        checkpoint_every=10, max_retries=2,
    ),
    "small.yaml": common_pb2.JobSpec(
        name="small", tenant="research", model=_model(128, 4, 4, 512, 64), global_batch_size=16, iterations=40,
        checkpoint_every=10, max_retries=1, env={"PYTHONUNBUFFERED": "1"},
    ),
    "medium.yaml": common_pb2.JobSpec(
        name="medium", tenant="default", model=_model(192, 4, 6, 512, 128), global_batch_size=8, iterations=30,
        hint=common_pb2.ResourceHint(gpus=0, gpu_types=["A100-80GB", "A40-48GB"]), checkpoint_every=10,
        max_retries=2,
    ),
    "wide.yaml": common_pb2.JobSpec(
        name="wide", tenant="default", model=_model(64, 2, 4, 256, 64), global_batch_size=32, iterations=30,
        hint=common_pb2.ResourceHint(gpus=8), checkpoint_every=10, max_retries=2,
    ),
    "huge.yaml": common_pb2.JobSpec(
        name="huge", tenant="default", model=_model(25600, 128, 160, 50257, 2048), global_batch_size=1536,
        iterations=100_000, max_retries=2,
    ),
}


def test_every_example_has_a_golden_spec() -> None:
    assert sorted(p.name for p in JOBS.glob("*.yaml")) == sorted(GOLDEN)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_example_golden(name: str) -> None:
    spec = load_job_file(JOBS / name)
    assert spec == GOLDEN[name]
    assert spec.HasField("hint") == GOLDEN[name].HasField("hint")


BASE: dict[str, Any] = {
    "name": "job-1",
    "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 256, "seq_length": 64},
    "global_batch_size": 16,
    "iterations": 10,
}


def with_(path: str, value: Any) -> dict[str, Any]:
    """BASE with one (dotted) key set; value DELETE removes it."""
    data = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node = data
    for p in parents:
        node = node[p]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return data


DELETE = object()


def test_minimal_defaults() -> None:
    spec = job_spec_from_dict(BASE)
    assert spec.tenant == "default"
    assert spec.max_retries == 2
    assert spec.checkpoint_every == 0
    assert not spec.HasField("hint")
    assert list(spec.entrypoint) == [] and dict(spec.env) == {}
    assert spec.model.name == ""


def test_full_job() -> None:
    data = with_("tenant", "team-a") | {
        "gpus": 8, "gpu_types": ["a100", "A40_48GB", "A100-80GB"],
        "entrypoint": ["python", "-m", "my.train", "--steps", "10"],
        "env": {"FOO": "bar", "N": 3, "_X1": "1.5"}, "checkpoint_every": 0, "max_retries": 0,
    }
    data["model"]["name"] = "my-gpt"
    spec = job_spec_from_dict(data)
    assert spec.tenant == "team-a"
    assert spec.hint.gpus == 8
    assert list(spec.hint.gpu_types) == ["A100-80GB", "A40-48GB"]  # canonical, deduplicated
    assert list(spec.entrypoint) == ["python", "-m", "my.train", "--steps", "10"]
    assert dict(spec.env) == {"FOO": "bar", "N": "3", "_X1": "1.5"}
    assert spec.max_retries == 0
    assert spec.model.name == "my-gpt"


def test_registered_model_name() -> None:
    spec = job_spec_from_dict(with_("model", "gpt2-small"))
    assert spec.model == common_pb2.ModelSpec(name="gpt2-small")


def test_gpus_zero_is_a_hint_of_any() -> None:
    spec = job_spec_from_dict(with_("gpus", 0))
    assert spec.HasField("hint") and spec.hint.gpus == 0


BAD: list[tuple[dict[str, Any], str, str]] = [
    # name
    (with_("name", DELETE), "name", "required"),
    (with_("name", "Job"), "name", "must be 1-63 lowercase"),
    (with_("name", "-job"), "name", "must be 1-63 lowercase"),
    (with_("name", "a" * 64), "name", "must be 1-63 lowercase"),
    (with_("name", "job_1"), "name", "must be 1-63 lowercase"),
    (with_("name", 12), "name", "must be 1-63 lowercase"),
    # tenant
    (with_("tenant", "Team A"), "tenant", "must be 1-63 lowercase"),
    # model
    (with_("model", DELETE), "model", "required"),
    (with_("model", 5), "model", "must be a registered model name or a mapping"),
    (with_("model", "bad name!"), "model", "invalid registered model name"),
    (with_("model.hidden_size", DELETE), "model.hidden_size", "required"),
    (with_("model.hidden_size", 0), "model.hidden_size", "must be >= 1"),
    (with_("model.hidden_size", 65_537), "model.hidden_size", "must be <= 65,536"),
    (with_("model.hidden_size", 66), "model.hidden_size", "must be divisible by num_heads"),
    (with_("model.hidden_size", 64.0), "model.hidden_size", "must be an integer"),
    (with_("model.hidden_size", True), "model.hidden_size", "must be an integer"),
    (with_("model.num_layers", -1), "model.num_layers", "must be >= 1"),
    (with_("model.num_layers", 1025), "model.num_layers", "must be <= 1,024"),
    (with_("model.num_heads", 1025), "model.num_heads", "must be <= 1,024"),
    (with_("model.num_heads", 0), "model.num_heads", "must be >= 1"),
    (with_("model.vocab_size", 4_000_001), "model.vocab_size", "must be <= 4,000,000"),
    (with_("model.vocab_size", "256"), "model.vocab_size", "must be an integer"),
    (with_("model.seq_length", 1_048_577), "model.seq_length", "must be <= 1,048,576"),
    (with_("model.seq_length", 0), "model.seq_length", "must be >= 1"),
    (with_("model.name", "x y"), "model.name", "invalid model name"),
    (with_("model.hidden", 64), "model.hidden", "unknown field (did you mean 'hidden_size'?"),
    # batch and iterations
    (with_("global_batch_size", DELETE), "global_batch_size", "required"),
    (with_("global_batch_size", 0), "global_batch_size", "must be >= 1"),
    (with_("global_batch_size", 1_048_577), "global_batch_size", "must be <= 1,048,576"),
    (with_("global_batch_size", "16"), "global_batch_size", "must be an integer"),
    (with_("iterations", DELETE), "iterations", "required"),
    (with_("iterations", 0), "iterations", "must be >= 1"),
    (with_("iterations", 10**9 + 1), "iterations", "must be <= 1,000,000,000"),
    # hints
    (with_("gpus", -1), "gpus", "must be >= 0"),
    (with_("gpus", 4097), "gpus", "must be <= 4,096"),
    (with_("gpus", 2.5), "gpus", "must be an integer"),
    (with_("gpu_types", "A100"), "gpu_types", "must be a list of GPU model names"),
    (with_("gpu_types", ["A100", "Z9000"]), "gpu_types[1]", "unknown GPU model 'Z9000'"),
    (with_("gpu_types", [100]), "gpu_types[0]", "must be a GPU model name"),
    # entrypoint
    (with_("entrypoint", "python train.py"), "entrypoint",
     "must be a list of arguments (argv), not a shell string"),
    (with_("entrypoint", {"cmd": "x"}), "entrypoint", "must be a list of arguments (argv)"),
    (with_("entrypoint", ["python", 10]), "entrypoint[1]", "must be a string"),
    (with_("entrypoint", ["", "x"]), "entrypoint[0]", "the program must not be empty"),
    # env
    (with_("env", ["A=1"]), "env", "must be a mapping of NAME: value"),
    (with_("env", {"lower": "1"}), "env.lower", "invalid name: must match [A-Z_][A-Z0-9_]*"),
    (with_("env", {"1ABC": "1"}), "env.1ABC", "invalid name"),
    (with_("env", {"A-B": "1"}), "env.A-B", "invalid name"),
    (with_("env", {"FLAG": True}), "env.FLAG", "must be a string (quote it)"),
    (with_("env", {"EMPTY": None}), "env.EMPTY", "must be a string (quote it)"),
    (with_("env", {"NESTED": {"a": 1}}), "env.NESTED", "must be a string (quote it)"),
    (with_("env", {"RANK": "3"}), "env.RANK", "reserved"),
    (with_("env", {"TESSERA_PLAN": "{}"}), "env.TESSERA_PLAN", "reserved"),
    # checkpoint, retries
    (with_("checkpoint_every", -1), "checkpoint_every", "must be >= 0"),
    (with_("checkpoint_every", "10"), "checkpoint_every", "must be an integer"),
    (with_("max_retries", -1), "max_retries", "must be >= 0"),
    (with_("max_retries", 101), "max_retries", "must be <= 100"),
    # unknown keys
    (with_("iteration", 10), "iteration", "unknown field (did you mean 'iterations'?"),
    (with_("priority", "high"), "priority", "unknown field"),
]


@pytest.mark.parametrize(("data", "field", "reason"), BAD, ids=[f"{f}:{r[:30]}" for _, f, r in BAD])
def test_bad_input(data: dict[str, Any], field: str, reason: str) -> None:
    with pytest.raises(JobFileError) as err:
        job_spec_from_dict(data)
    assert err.value.field == field
    assert err.value.reason.startswith(reason), err.value.reason
    assert str(err.value) == f"{field}: {err.value.reason}"
    # The same through YAML text.
    with pytest.raises(JobFileError) as err2:
        parse_job_yaml(yaml.safe_dump(data))
    assert err2.value.field == field


def test_shell_string_entrypoint_message() -> None:
    text = "name: a\nmodel: gpt2-small\nglobal_batch_size: 8\niterations: 1\nentrypoint: python train.py --lr 3e-4\n"
    with pytest.raises(JobFileError) as err:
        parse_job_yaml(text)
    assert str(err.value) == "entrypoint: must be a list of arguments (argv), not a shell string"


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("", "job", "the file must be a mapping"),
        ("- a\n- b\n", "job", "the file must be a mapping"),
        ("name: a\nname: b\n", "name", "duplicate key (line 2)"),
        ("name: [unclosed\n", "yaml", "while parsing"),
        ("a: 1\n---\nb: 2\n", "yaml", "expected a single document"),
        ("name: !!python/object:os.system x\n", "yaml", "could not determine a constructor"),
    ],
)
def test_bad_yaml(text: str, field: str, reason: str) -> None:
    with pytest.raises(JobFileError) as err:
        parse_job_yaml(text)
    assert err.value.field == field
    assert reason in err.value.reason
    assert "\n" not in str(err.value)


def test_load_job_file_missing(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        load_job_file(tmp_path / "none.yaml")


def test_the_documented_example_parses() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "job-file.md").read_text()
    block = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    spec = parse_job_yaml(block)
    assert spec.name == "small" and spec.tenant == "research"
    assert list(spec.hint.gpu_types) == ["A100-80GB", "A40-48GB"]
    assert list(spec.entrypoint) == ["python", "-m", "my_project.train", "--lr", "3e-4"]
    assert dict(spec.env) == {"WANDB_MODE": "offline"}
