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
        name="tiny", model=_model(64, 2, 4, 256, 64), global_batch_size=16, iterations=40,
        checkpoint_every=10, max_retries=2,
    ),
    "small.yaml": common_pb2.JobSpec(
        name="small", tenant="research", model=_model(128, 4, 4, 512, 64), global_batch_size=16, iterations=40,
        checkpoint_every=10, max_retries=1, env={"PYTHONUNBUFFERED": "1"},
    ),
    "medium.yaml": common_pb2.JobSpec(
        name="medium", model=_model(192, 4, 6, 512, 128), global_batch_size=8, iterations=30,
        hint=common_pb2.ResourceHint(gpus=0, gpu_types=["A100-80GB", "A40-48GB"]), checkpoint_every=10,
        max_retries=2,
    ),
    "wide.yaml": common_pb2.JobSpec(
        name="wide", model=_model(64, 2, 4, 256, 64), global_batch_size=32, iterations=30,
        hint=common_pb2.ResourceHint(gpus=8), checkpoint_every=10, max_retries=2,
    ),
    "opaque.yaml": common_pb2.JobSpec(
        name="opaque", hint=common_pb2.ResourceHint(gpus=2, gpu_types=["A40-48GB"]),
        entrypoint=["{python}", "-c", "import os; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])"],
        max_runtime_seconds=600, max_retries=0,
    ),
    "llama-tiny.yaml": common_pb2.JobSpec(
        name="llama-tiny", model=common_pb2.ModelSpec(
            hidden_size=64, num_layers=2, num_heads=4, vocab_size=256, seq_length=64, ffn_hidden=96, gated=True,
            num_kv_heads=2, untied_embeddings=True),
        global_batch_size=16, iterations=40, checkpoint_every=10, max_retries=2,
    ),
    "moe-tiny.yaml": common_pb2.JobSpec(
        name="moe-tiny", model=common_pb2.ModelSpec(
            hidden_size=64, num_layers=2, num_heads=4, vocab_size=256, seq_length=64,
            family=common_pb2.MODEL_FAMILY_MOE, ffn_hidden=96, gated=True, num_kv_heads=2, num_experts=4, top_k=2,
            moe_every=1, untied_embeddings=True, dropless=True),
        global_batch_size=16, iterations=40, checkpoint_every=10, max_retries=2,
    ),
    "huge.yaml": common_pb2.JobSpec(
        name="huge", model=_model(25600, 128, 160, 50257, 2048), global_batch_size=1536,
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
    assert spec.tenant == ""  # the controller's to fill: the caller's own tenant
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
    (with_("urgency", "high"), "urgency", "unknown field"),
    (with_("priority", "high"), "priority", "must be one of guaranteed, best-effort"),
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
    assert str(err.value) == (
        "<string> line 5: field entrypoint: must be a list of arguments (argv), not a shell string")


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("", "job", "the file must be a mapping"),
        ("- a\n- b\n", "job", "the file must be a mapping"),
        ("name: a\nname: b\n", "name", "duplicate key (first at line 1)"),
        ("name: [unclosed\n", "", "while parsing"),
        ("a: 1\n---\nb: 2\n", "", "expected a single document"),
        ("name: !!python/object:os.system x\n", "", "could not determine a constructor"),
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


# -- read from a file: `FILE line N: field F: why`, the line of the offending key ---------------------

VALID = """\
name: lab-job
tenant: research
model:
  hidden_size: 128
  num_layers: 4
  num_heads: 4
  vocab_size: 512
  seq_length: 64
global_batch_size: 16
iterations: 40
gpu_types: [a100-80gb]
env: {WANDB_MODE: offline}
"""


def test_valid_file_gives_the_spec(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(VALID)
    assert load_job_file(path) == common_pb2.JobSpec(
        name="lab-job", tenant="research", model=_model(128, 4, 4, 512, 64), global_batch_size=16, iterations=40,
        hint=common_pb2.ResourceHint(gpus=0, gpu_types=["A100-80GB"]), env={"WANDB_MODE": "offline"},
        max_retries=2,
    )


FILE_BAD = [
    (VALID.replace("num_heads: 4", "num_heads: 0"), 6, "model.num_heads", "must be >= 1, got 0"),
    (VALID.replace("  seq_length: 64\n", ""), 3, "model.seq_length", "required"),
    (VALID.replace("num_layers: 4", "num_layer: 4"), 5, "model.num_layer",
     "unknown field (did you mean 'num_layers'? known: name, hidden_size"),
    (VALID.replace("[a100-80gb]", "[a100-80gb, z9]"), 11, "gpu_types[1]", "unknown GPU model 'z9'"),
    (VALID.replace("{WANDB_MODE: offline}", "{WANDB_MODE: offline, RANK: '1'}"), 12, "env.RANK", "reserved"),
    (VALID.replace("{WANDB_MODE: offline}", "{LR: .nan}"), 12, "env.LR", "must be a finite number, got '.nan'"),
    (VALID + "iterations: 41\n", 13, "iterations", "duplicate key (first at line 10)"),
    (VALID + "urgency: high\n", 13, "urgency", "unknown field"),
    (VALID + "priority: high\n", 13, "priority", "must be one of guaranteed, best-effort"),
    (VALID + "plan: {dp: 100000000000}\n", 13, "plan.dp", "must be an integer from 1 to 2,147,483,647, got 100000000000"),
    ("\n\n- name: a\n", 3, "job", "the file must be a mapping of fields"),
]


@pytest.mark.parametrize(("text", "line", "field", "why"), FILE_BAD, ids=[b[2] for b in FILE_BAD])
def test_bad_file_names_file_line_and_field(tmp_path: Path, text: str, line: int, field: str, why: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(JobFileError) as err:
        load_job_file(path)
    assert (err.value.file, err.value.line, err.value.field) == (str(path), line, field)
    assert err.value.reason.startswith(why), err.value.reason
    assert str(err.value) == f"{path} line {line}: field {field}: {err.value.reason}"


LOL = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdef", "bcdefg"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (LOL, "line 1: field e[7][8][8][8][4]: more than 100,000 values once aliases are expanded"),
        ("name: &x [*x]\n", "line 1: field name[0]: an alias refers to a node that contains it"),
        ("name: " + "[" * 200 + "]" * 200 + "\n", "line 1: nested deeper than 64 levels"),
        ("model:\n  capacity_factor: .inf\n", "line 2: field model.capacity_factor: must be a finite number, got '.inf'"),
        (b"name: caf\xe9\n", "line 1: not UTF-8 text (byte 9)"),
        ("name: x\nmodel: a\x03\n", ("line 2: not valid YAML or JSON: character U+0003 at column 9 is not allowed "
                                     "(a control character)")),
    ],
    ids=["alias-bomb", "recursive-alias", "deep", "inf", "latin-1", "control-character"],
)
def test_hostile_files_are_refused_with_a_line(tmp_path: Path, text: str | bytes, message: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(JobFileError) as err:
        load_job_file(path)
    assert str(err.value) == f"{path} {message}"


def test_every_command_reports_the_same_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`tessctl submit` and `tessctl estimate` read job files through load_job_file: one message."""
    from tessera.clients import tessctl

    path = tmp_path / "job.yaml"
    path.write_text(FILE_BAD[0][0])
    expected = f"tessctl: error: {path} line 6: field model.num_heads: must be >= 1, got 0\n"
    assert tessctl.main(["submit", "-f", str(path)]) == 1
    assert capsys.readouterr().err == expected
    assert tessctl.main(["estimate", "memory", "-f", str(path), "--gpu", "a100"]) == 1
    assert capsys.readouterr().err == expected


def test_numbers_with_an_exponent_are_numbers_and_env_keeps_them_as_written() -> None:
    """`1e6` is a float (YAML 1.2, JSON), no longer the string "1e6"; an env value (a string made of a
    number) keeps the text as written, as it did; a quoted "1e6" stays a string everywhere."""
    spec = parse_job_yaml(VALID.replace("{WANDB_MODE: offline}", "{LR: 1e-4, STEPS: 1e6, Q: '2e3', F: 1.5e+3}"))
    assert dict(spec.env) == {"LR": "1e-4", "STEPS": "1e6", "Q": "2e3", "F": "1500.0"}
    with pytest.raises(JobFileError) as err:
        parse_job_yaml(VALID.replace("name: ", "name: 1e6 #"), "job.yaml")
    assert (err.value.field, err.value.line) == ("name", 1)  # a number, not a name: quote it
    assert parse_job_yaml(VALID.replace("name: ", "name: '1e6' #")).name == "1e6"
