"""The recipe vocabulary through the shared conversion (estimator/convert.py), the job file's `plan:`
and `model:` keys, SubmitJob's validation, and the worker contract."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from tessera.clients.jobfile import JobFileError, job_spec_from_dict, load_job_file
from tessera.controller.core.validate import validate_spec
from tessera.estimator.convert import (
    PLAN_KEYS,
    execution_plan,
    merged_plan,
    model_dims,
    model_spec,
    plan_fields,
    plan_message,
)
from tessera.estimator.models import REGISTERED, ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError
from tessera.v1 import common_pb2 as c

# Every recipe field at each non-default value, with what the value needs around it.
RECIPES: list[dict[str, Any]] = [
    {"cp": 2}, {"cp": 4, "sequence_parallel": True, "tp": 2},
    {"checkpointing": "op"}, {"checkpointing": "op", "checkpoint_every": 2}, {"checkpointing": "full", "checkpoint_every": 3},
    {"checkpointing": "selective", "flash_attention": False},
    {"sharding": "fsdp", "reshard_after_forward": "always"}, {"sharding": "fsdp", "reshard_after_forward": "never"},
    {"loss": "fp32"}, {"loss": "chunked"},
    {"float8": "linear"}, {"float8": "linear+allgather", "sharding": "fsdp"},
    {"compile": True}, {"async_tp": True, "tp": 2, "sequence_parallel": True, "compile": True},
    {"lora_rank": 16}, {"lora_rank": 8, "lora_targets": "qv"}, {"lora_rank": 8, "lora_targets": "attention"},
    {"lora_rank": 64, "base_quant": "nf4"}, {"lora_rank": 64, "base_quant": "int8"},
    {"lora_rank": 16, "offload": "frozen"},
]


def test_every_plan_field_is_in_the_message_and_the_flag_vocabulary() -> None:
    fields = {f.name for f in dataclasses.fields(ExecutionPlan)}
    assert set(PLAN_KEYS) == fields
    assert fields <= set(c.ExecutionPlan.DESCRIPTOR.fields_by_name)


def test_an_empty_message_is_the_dataclass_default() -> None:
    assert execution_plan(c.ExecutionPlan()) == ExecutionPlan()


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: ",".join(f"{k}={v}" for k, v in r.items()))
def test_every_recipe_field_round_trips(recipe: dict[str, Any]) -> None:
    plan = ExecutionPlan(**recipe)
    assert execution_plan(plan_message(plan)) == plan
    texts = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in recipe.items()}
    assert execution_plan(plan_fields(texts)) == plan
    # through the proto's bytes, as the controller stores and sends it
    wire = c.ExecutionPlan.FromString(plan_message(plan).SerializeToString())
    assert execution_plan(wire) == plan


def test_flag_errors_name_the_field() -> None:
    for pairs, field in (({"cp": "0"}, "plan.cp"), ({"lora_rank": "-1"}, "plan.lora_rank"),
                         ({"loss": "fp16"}, "plan.loss"), ({"float8": "yes"}, "plan.float8"),
                         ({"compile": "maybe"}, "plan.compile"), ({"lora": "8"}, "plan.lora")):
        with pytest.raises(PlanInputError) as err:
            plan_fields(pairs)
        assert err.value.field == field
    with pytest.raises(PlanInputError, match="plan.checkpointing"):  # a value the combination refuses
        execution_plan(plan_fields({"checkpointing": "selective"}))


def test_merged_plan_overrides_only_what_is_set() -> None:
    job = plan_fields({"checkpointing": "op", "loss": "fp32", "flash_attention": "true"})
    chosen = plan_message(ExecutionPlan(dp=4, tp=2, sharding="fsdp", flash_attention=False, checkpointing="full"))
    merged = execution_plan(merged_plan(chosen, job))
    assert (merged.dp, merged.tp, merged.sharding) == (4, 2, "fsdp")
    assert (merged.checkpointing, merged.loss, merged.flash_attention) == ("op", "fp32", True)


NEW_MODEL_FIELDS: list[ModelDims] = [
    ModelDims(512, 4, 8, 1000, 128, "x", kv_channels=128),
    ModelDims(512, 4, 8, 1000, 128, "x", gated=True, qkv_bias=True, num_kv_heads=2),
    ModelDims(512, 4, 8, 1000, 128, "x", family="encoder-decoder", num_decoder_layers=2, decoder_seq_length=32),
    ModelDims(512, 4, 8, 1000, 128, "x", gated=True, sliding_window=64, logit_softcap=30.0, sandwich_norm=True),
    ModelDims(512, 4, 8, 1000, 128, "x", family="moe", gated=True, num_experts=8, moe_every=1, capacity_factor=0.0),
    ModelDims(512, 4, 8, 1000, 128, "x", family="moe", num_experts=8, capacity_factor=1.25),
]


@pytest.mark.parametrize("dims", NEW_MODEL_FIELDS, ids=lambda d: d.signature)
def test_every_model_field_round_trips(dims: ModelDims) -> None:
    assert model_dims(model_spec(dims)) == dims
    assert model_dims(c.ModelSpec.FromString(model_spec(dims).SerializeToString())) == dims


def test_dropless_and_capacity_factor_keep_their_old_meaning() -> None:
    base = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 100, "seq_length": 16,
                "family": c.MODEL_FAMILY_MOE, "num_experts": 4}
    assert model_dims(c.ModelSpec(**base)).capacity_factor == 1.0  # 0 = 1.0, as before the field
    assert model_dims(c.ModelSpec(**base, dropless=True)).capacity_factor == 0.0
    with pytest.raises(PlanInputError, match="model.dropless"):
        model_dims(c.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=100, seq_length=16, dropless=True))


# -- job files and SubmitJob -------------------------------------------------------------------------

JOB: dict[str, Any] = {"name": "ft", "model": "llama3.1-8b", "global_batch_size": 16, "iterations": 10}


def test_job_plan_is_the_recipe_and_reaches_the_spec() -> None:
    spec = job_spec_from_dict({**JOB, "plan": {"sharding": "fsdp", "checkpointing": "op", "checkpoint_every": 2,
                                               "loss": "fp32", "compile": True, "lora_rank": 16,
                                               "lora_targets": "qv", "offload": "frozen"}})
    plan = execution_plan(spec.plan)
    assert (plan.checkpointing, plan.checkpoint_every, plan.loss, plan.compile) == ("op", 2, "fp32", True)
    assert (plan.lora_rank, plan.lora_targets, plan.offload, plan.dp) == (16, "qv", "frozen", 1)
    assert validate_spec(spec) == []
    assert not job_spec_from_dict(JOB).HasField("plan")


@pytest.mark.parametrize("plan, field, needle", [
    ({"tp": 2}, "plan.tp", "scheduler's choice"),
    ({"cp": 2}, "plan.cp", "scheduler's choice"),
    ({"checkpointing": "selective"}, "plan.checkpointing", "flash attention"),
    ({"base_quant": "nf4"}, "plan.base_quant", "lora_rank > 0"),
    ({"lora_rank": "16"}, "plan.lora_rank", "must be an integer"),
    ({"compile": "yes"}, "plan.compile", "true or false"),
    ({"loss": "fp16"}, "plan.loss", "not one of"),
    ({"los": "fp32"}, "plan.los", "did you mean 'loss'"),
    ({"lora_rank": 70000}, "plan.lora_rank", "<= 65,536"),
])
def test_job_plan_errors_name_the_field(plan: dict[str, Any], field: str, needle: str) -> None:
    with pytest.raises(JobFileError) as err:
        job_spec_from_dict({**JOB, "plan": plan})
    assert err.value.field == field and needle in err.value.reason, (err.value.field, err.value.reason)


def test_submit_job_refuses_what_a_job_file_refuses() -> None:
    base = job_spec_from_dict(JOB)
    for plan, field in ((c.ExecutionPlan(dp=2), "plan.dp"),
                        (c.ExecutionPlan(checkpointing=c.CHECKPOINTING_SELECTIVE), "plan.checkpointing"),
                        (c.ExecutionPlan(lora_rank=-1), "plan.lora_rank"),
                        (c.ExecutionPlan(loss=99), "plan.loss")):  # type: ignore[arg-type]
        spec = c.JobSpec()
        spec.CopyFrom(base)
        spec.plan.CopyFrom(plan)
        assert [e.field for e in validate_spec(spec)][:1] == [field], validate_spec(spec)


def test_job_file_model_keys_for_the_new_fields() -> None:
    model = {"hidden_size": 512, "num_layers": 4, "num_heads": 8, "vocab_size": 1000, "seq_length": 128,
             "family": "encoder_decoder", "kv_channels": 128, "num_decoder_layers": 2, "decoder_seq_length": 32,
             "gated": True}
    spec = job_spec_from_dict({**JOB, "model": model})
    dims = model_dims(spec.model)
    assert (dims.family, dims.head_dim, dims.decoder_layers, dims.target_length) == ("encoder-decoder", 128, 2, 32)
    gemma = {**{k: model[k] for k in ("hidden_size", "num_layers", "num_heads", "vocab_size", "seq_length")},
             "gated": True, "qkv_bias": True, "sliding_window": 64, "logit_softcap": 30, "sandwich_norm": True}
    dims = model_dims(job_spec_from_dict({**JOB, "model": gemma}).model)
    assert (dims.qkv_bias, dims.sliding_window, dims.logit_softcap, dims.sandwich_norm) == (True, 64, 30.0, True)
    moe = {**gemma, "family": "moe", "num_experts": 8, "moe_every": 1, "dropless": True}
    del moe["logit_softcap"]
    assert model_dims(job_spec_from_dict({**JOB, "model": moe}).model).capacity_factor == 0.0
    with pytest.raises(JobFileError) as err:
        job_spec_from_dict({**JOB, "model": {**moe, "capacity_factor": 1.0}})
    assert err.value.field == "model.dropless"


def test_job_file_hf_config_relative_to_the_job_file(tmp_path: Path) -> None:
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 131072, "tie_word_embeddings": False}))
    job = tmp_path / "job.yaml"
    job.write_text("name: ft\nmodel: {hf_config: llama/config.json, seq_length: 4096, name: my-llama}\n"
                   "global_batch_size: 8\niterations: 1\n")
    spec = load_job_file(job)
    dims = model_dims(spec.model)
    assert dims == dataclasses.replace(REGISTERED["llama3.1-8b"], seq_length=4096, name="my-llama")
    assert validate_spec(spec) == []
    job.write_text("name: ft\nmodel: {hf_config: llama, hidden_size: 12}\nglobal_batch_size: 8\niterations: 1\n")
    with pytest.raises(JobFileError) as err:
        load_job_file(job)
    assert err.value.field == "model.hidden_size" and "comes from model.hf_config" in err.value.reason
    job.write_text("name: ft\nmodel: {hf_config: nowhere/config.json}\nglobal_batch_size: 8\niterations: 1\n")
    with pytest.raises(JobFileError) as err:
        load_job_file(job)
    assert err.value.field == "model.hf_config" and "no such file" in err.value.reason


# -- tessctl estimate --------------------------------------------------------------------------------


def _job_file(tmp_path: Path, plan: str = "") -> Path:
    path = tmp_path / "job.yaml"
    path.write_text("name: ft\nmodel: llama3.1-8b\nglobal_batch_size: 8\niterations: 10\n" + plan)
    return path


def test_estimate_memory_takes_the_job_recipe_under_the_plan_flag(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from tessera.clients import tessctl

    path = _job_file(tmp_path, "plan: {checkpointing: op, loss: fp32, sharding: fsdp}\n")
    args = ["estimate", "memory", "-f", str(path), "--gpu", "h20", "--gpus", "8", "-o", "json",
            "--plan", "dp=8,loss=chunked,lora_rank=8,lora_targets=qv"]
    assert tessctl.main(args) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert (plan["dp"], plan["checkpointing"], plan["sharding"]) == (8, "op", "fsdp")  # the job's recipe
    assert (plan["loss"], plan["lora_rank"], plan["lora_targets"]) == ("chunked", 8, "qv")  # the flag wins


def test_estimate_hf_config_replaces_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tessera.clients import tessctl

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "t5", "d_model": 512, "d_ff": 2048, "d_kv": 64, "num_heads": 8,
                                  "num_layers": 6, "vocab_size": 32128, "n_positions": 512}))
    path = _job_file(tmp_path)
    assert tessctl.main(["estimate", "memory", "-f", str(path), "--gpu", "l40s", "--hf-config", str(config),
                         "-o", "json"]) == 0
    assert "encoder-decoder" in json.loads(capsys.readouterr().out)["model_signature"]
    assert tessctl.main(["estimate", "memory", "-f", str(path), "--gpu", "l40s", "--hf-config",
                         str(tmp_path / "none.json")]) == 1
    assert "model.hf_config" in capsys.readouterr().err


def test_estimate_cells_and_stages_send_the_job_recipe(tmp_path: Path) -> None:
    from tessera.clients.estimate import _job, cells_request, stages_request
    from tessera.v1 import estimator_pb2

    spec = _job(str(_job_file(tmp_path, "plan: {lora_rank: 8, checkpointing: op}\n")))
    cells = cells_request(spec, estimator_pb2.ClusterSpec())
    assert [d.name for d, _ in cells.recipe.ListFields()] == ["checkpointing", "lora_rank"]
    assert cells.recipe.lora_rank == 8
    stages = stages_request(spec, "a100-80gb", 1, None)
    assert stages.recipe == cells.recipe
    plain = cells_request(_job(str(_job_file(tmp_path))), estimator_pb2.ClusterSpec())
    assert not plain.HasField("recipe")
