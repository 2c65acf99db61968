"""The real-code trace's entry points: `python -m tessera.estimator.torch.realtrace` and the
estimator service's traced:<stack> memory modes."""

from __future__ import annotations

import json

import pytest

from tessera.estimator.plans import ExecutionPlan, PlanInputError
from tessera.v1 import common_pb2 as c
from tessera.v1 import estimator_pb2 as pb

pytest.importorskip("torch")
pytest.importorskip("torchtitan")

from tessera.estimator.models import ModelDims
from tessera.estimator.torch.realtrace import real_memory
from tessera.estimator.torch.realtrace.__main__ import main

DIMS = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 256, "seq_length": 64, "gated": True,
        "num_kv_heads": 2, "ffn_hidden": 128, "tied_embeddings": False}


def test_cli_prints_the_trace_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dims", json.dumps(DIMS), "--plan", json.dumps({"dp": 4, "sharding": "fsdp", "loss": "fp32"}),
                 "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stack"] == "torchtitan"
    assert out["peak"] == sum(out[k] for k in ("parameters", "gradients", "optimizer", "activations", "other"))
    assert out["detail"]["tracker_peak"]["Sharded Param"] == 106816  # 4 bytes x N / dp (test_realtrace_titan)


def test_cli_names_the_refused_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dims", json.dumps(DIMS), "--plan", "{}", "--stack", "torchtitan"]) == 2
    assert "plan.loss" in capsys.readouterr().err


def test_real_memory_adds_the_reserve_and_counts_buffers_as_activations() -> None:
    plan = ExecutionPlan(dp=4, sharding="fsdp", loss="fp32")
    mem = real_memory(ModelDims(**DIMS), plan, gpu="a100-80gb", num_gpus=4)  # type: ignore[arg-type]
    assert mem.source == "traced:torchtitan" and mem.other == 1024**3
    assert mem.capacity_bytes is not None and mem.fits
    assert mem.tensor_bytes > 0 and any(n.startswith("peak by tracker category") for n in mem.notes)


def test_service_dispatches_the_traced_stack_modes() -> None:
    from tessera.estimator.service.handlers import MODES, Estimator

    assert MODES[pb.MEMORY_MODE_TRACED_TORCHTITAN] == "traced:torchtitan"
    assert MODES[pb.MEMORY_MODE_TRACED_TRANSFORMERS] == "traced:transformers"
    spec = c.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256, seq_length=64, gated=True,
                       num_kv_heads=2, ffn_hidden=128, untied_embeddings=True)
    req = pb.EstimateMemoryRequest(model=spec, plan=c.ExecutionPlan(dp=2, sharding=c.SHARDING_FSDP),
                                   mode=pb.MEMORY_MODE_TRACED_TORCHTITAN)
    # the plan message's default loss is Megatron's fused one, which torchtitan does not run: the
    # trace itself answers, naming the field
    with pytest.raises(PlanInputError) as e:
        Estimator().estimate_memory(req)
    assert e.value.field == "plan.loss"
