"""The shared vocabulary (estimator/convert.py) and tessctl's cluster files (clients/estimate.py)."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from tessera.clients.estimate import ClusterFileError, cluster_pools, load_cluster, plan_arg, to_json
from tessera.clients.jobfile import JobFileError, job_spec_from_dict
from tessera.controller.core.validate import resolve_model, validate_spec
from tessera.estimator.convert import execution_plan, model_dims, model_spec, plan_fields, plan_message
from tessera.estimator.models import REGISTERED, ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError
from tessera.v1 import common_pb2 as c
from tessera.v1 import estimator_pb2 as pb

REPO = Path(__file__).resolve().parents[2]


def test_model_spec_round_trip_for_every_registered_model() -> None:
    for dims in REGISTERED.values():
        assert model_dims(model_spec(dims)) == dims


def test_a_spec_without_family_fields_is_the_decoder_it_always_was() -> None:
    spec = c.ModelSpec(hidden_size=128, num_layers=4, num_heads=4, vocab_size=512, seq_length=64)
    assert model_dims(spec) == ModelDims(128, 4, 4, 512, 64)
    assert resolve_model(spec) == ModelDims(128, 4, 4, 512, 64)


def test_family_fields_reach_the_controller_and_are_validated() -> None:
    moe = c.ModelSpec(hidden_size=256, num_layers=4, num_heads=8, vocab_size=1000, seq_length=128,
                      family=c.MODEL_FAMILY_MOE, num_experts=8, top_k=1, untied_embeddings=True)
    dims = resolve_model(moe)
    assert (dims.family, dims.num_experts, dims.top_k, dims.moe_every, dims.tied_embeddings) == ("moe", 8, 1, 2, False)
    spec = c.JobSpec(name="j", model=moe, global_batch_size=8, iterations=1)
    assert validate_spec(spec) == []
    spec.model.num_experts = 0
    assert [str(e) for e in validate_spec(spec)] == ["model.num_experts: a moe model needs num_experts >= 1"]


def test_plan_defaults_and_the_global_batch() -> None:
    assert execution_plan(c.ExecutionPlan()) == ExecutionPlan()
    assert execution_plan(c.ExecutionPlan(dp=2, micro_batch=4), global_batch=64).grad_accum == 8
    with pytest.raises(PlanInputError) as err:
        execution_plan(c.ExecutionPlan(dp=3), global_batch=64)
    assert err.value.field == "plan.grad_accum"
    with pytest.raises(PlanInputError) as err:
        execution_plan(c.ExecutionPlan(dp=2, grad_accum=2), global_batch=64)
    assert err.value.field == "plan"
    plan = ExecutionPlan(dp=4, tp=2, pp=2, micro_batch=2, grad_accum=8, sharding="zero3", offload="optimizer+params",
                         checkpointing="selective", sequence_parallel=True, flash_attention=False, precision="fp32",
                         virtual_stages=2, schedule="gpipe")
    assert execution_plan(plan_message(plan)) == plan


def test_plan_flag() -> None:
    msg = plan_arg("dp=2, tp=2,micro_batch=4,sharding=zero2,flash_attention=false,precision=mixed-adafactor")
    assert execution_plan(msg.plan) == ExecutionPlan(dp=2, tp=2, micro_batch=4, sharding="zero2", flash_attention=False,
                                                     precision="mixed-adafactor")
    for bad, text in (("dp=0", "plan.dp: must be an integer >= 1"), ("sharding=zero9", "plan.sharding: 'zero9'"),
                      ("dp", "key=value"), ("dp=1,dp=2", "twice"), ("mb=2", "plan.mb: unknown field")):
        with pytest.raises(argparse.ArgumentTypeError, match=text):
            plan_arg(bad)
    assert plan_fields({"offload": "optimizer+params"}).offload == c.OFFLOAD_OPTIMIZER_AND_PARAMS


def test_job_file_model_families() -> None:
    base = {"name": "m", "global_batch_size": 8, "iterations": 1}
    spec = job_spec_from_dict({**base, "model": {"hidden_size": 256, "num_layers": 4, "num_heads": 8,
                                                 "vocab_size": 1000, "seq_length": 128, "family": "moe",
                                                 "num_experts": 8, "tied_embeddings": False}})
    assert model_dims(spec.model) == ModelDims(256, 4, 8, 1000, 128, family="moe", num_experts=8,
                                               tied_embeddings=False)
    with pytest.raises(JobFileError, match="model.num_experts: only the moe family"):
        job_spec_from_dict({**base, "model": {"hidden_size": 256, "num_layers": 4, "num_heads": 8,
                                              "vocab_size": 1000, "seq_length": 128, "num_experts": 8}})
    with pytest.raises(JobFileError, match="model.family: must be one of"):
        job_spec_from_dict({**base, "model": {"hidden_size": 256, "num_layers": 4, "num_heads": 8,
                                              "vocab_size": 1000, "seq_length": 128, "family": "rnn"}})


def test_cluster_files_in_three_formats(tmp_path: Path) -> None:
    pools = cluster_pools({"pools": [{"gpu": "a100", "nodes": 2, "gpus_per_node": 4},
                                     {"gpu": "A10", "num_gpus": 6, "gpus_per_node": 2, "nic_gbps": 3.125}]})
    assert [(p.gpu, p.num_gpus, p.gpus_per_node, p.nic_gbps) for p in pools] == [
        ("A100-80GB", 8, 4, 0.0), ("A10-24GB", 6, 2, 3.125)]
    assert not pools[0].HasField("price_per_hour")
    priced = cluster_pools({"pools": [{"gpu": "H100", "nodes": 1, "gpus_per_node": 8, "price_per_hour": 0,
                                       "currency": "EUR"}]})
    assert priced[0].HasField("price_per_hour") and (priced[0].price_per_hour, priced[0].currency) == (0.0, "EUR")
    inv = REPO / "examples" / "inventories"
    merged = load_cluster([f"{inv / 'a100-node.yaml'},{inv / 'a100-node.yaml'}", str(inv / "a10-node.yaml")])
    assert [(p.gpu, p.num_gpus, p.gpus_per_node, p.intra_link) for p in merged.pools] == [
        ("A100-80GB", 8, 4, pb.INTRA_LINK_NVLINK), ("A10-24GB", 4, 4, pb.INTRA_LINK_PCIE)]
    sim = load_cluster([str(REPO / "controller/sim/clusters/crius-testbed.json")])
    assert [(p.gpu, p.num_gpus, p.gpus_per_node) for p in sim.pools] == [("A40-48GB", 32, 2), ("A10-24GB", 32, 2)]
    bad = tmp_path / "bad.yaml"
    for doc, text in (("pools: [{gpu: Z9, nodes: 1, gpus_per_node: 4}]", "pools[0].gpu: unknown GPU model 'Z9'"),
                      ("pools: [{gpu: A100, gpus_per_node: 4}]", "pools[0]: give nodes or num_gpus"),
                      ("pools: [{gpu: A100, nodes: 1, gpus_per_node: 0}]", "pools[0].gpus_per_node: must be"),
                      ("pools: [{gpu: A100, nodes: 1, gpus_per_node: 4, color: red}]", "pools[0].color: unknown"),
                      ("pools: [{gpu: A100, nodes: 1, gpus_per_node: 4, price_per_hour: -1}]",
                       "pools[0].price_per_hour: must be a number >= 0"),
                      ("pools: [{gpu: A100, nodes: 1, gpus_per_node: 4, price_per_hour: 2, currency: usd}]",
                       "pools[0].currency: must be an ISO 4217 code"),
                      ("pools: [{gpu: A100, nodes: 1, gpus_per_node: 4, currency: USD}]",
                       "pools[0].currency: given without price_per_hour"),
                      ("gpus: [{model: A100, count: 0}]", "gpus[0].count"), ("[1, 2]", "must be a mapping"),
                      ("{", "not valid YAML")):
        bad.write_text(doc)
        with pytest.raises(ClusterFileError, match=f"^{re.escape(str(bad))} line 1: .*{re.escape(text)}"):
            load_cluster([str(bad)])


def test_json_has_integer_numbers_and_plans_in_the_flag_vocabulary() -> None:
    resp = pb.EstimateMemoryResponse(memory=pb.MemoryBreakdown(total=2**40, capacity=80 * 10**9, fits=True),
                                     plan=plan_message(ExecutionPlan(dp=2, sharding="zero1")))
    doc = to_json(resp)
    assert doc["memory"]["total"] == 2**40 and doc["memory"]["fits"] is True
    assert doc["plan"] == ExecutionPlan(dp=2, sharding="zero1").to_dict()
    assert "fits" not in to_json(pb.EstimateMemoryResponse(memory=pb.MemoryBreakdown()))["memory"]


def test_the_estimator_library_imports_without_torch_and_grpc() -> None:
    """The pure modules and the API handlers need neither torch nor grpc (only the service does)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"  # None in sys.modules makes the import fail
        "sys.modules['grpc'] = None\n"
        "import tessera.estimator.catalog, tessera.estimator.models, tessera.estimator.plans, tessera.estimator.memory, tessera.estimator.cells\n"
        "import tessera.estimator.perf_model, tessera.estimator.convert, tessera.estimator.service.handlers, tessera.estimator.tuning\n"
        "from tessera.v1 import common_pb2, estimator_pb2\n"
        "from tessera.estimator.service.handlers import Estimator\n"
        "r = Estimator().estimate_memory(estimator_pb2.EstimateMemoryRequest(model=common_pb2.ModelSpec(name='gpt2-small')))\n"
        "assert r.memory.total > 0\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr


def test_wide_resnet_through_the_shared_vocabulary() -> None:
    spec = c.ModelSpec(hidden_size=224, num_layers=50, num_heads=1, vocab_size=1024, seq_length=224,
                       family=c.MODEL_FAMILY_WIDE_RESNET)
    dims = model_dims(spec)
    assert (dims.family, dims.width_factor, dims.is_transformer) == ("wresnet", 2, False)  # 0 = 2
    assert dims == dataclasses.replace(REGISTERED["wide-resnet-500m"], name="")
    assert model_dims(model_spec(REGISTERED["wide-resnet-6.8b"])).width_factor == 16
    for field, changes in (("model.num_layers", {"num_layers": 34}), ("model.num_heads", {"num_heads": 2}),
                           ("model.width_factor", {"width_factor": -1})):
        bad = c.ModelSpec()
        bad.CopyFrom(spec)
        for k, v in changes.items():
            setattr(bad, k, v)
        with pytest.raises(PlanInputError) as err:
            model_dims(bad)
        assert err.value.field == field
    gpt_with_width = c.ModelSpec(hidden_size=128, num_layers=4, num_heads=4, vocab_size=512, seq_length=64,
                                 width_factor=2)
    with pytest.raises(PlanInputError, match="only the wresnet family"):
        model_dims(gpt_with_width)


def test_a_wide_resnet_job_is_refused_by_the_controller_with_the_field() -> None:
    want = [("model.family: a wide_resnet job cannot run on this control plane: its plans, memory checks and workers "
             "are for transformers (the estimator answers its Cells: tessctl estimate cells)")]
    named = c.JobSpec(name="w", model=c.ModelSpec(name="wide-resnet-500m"), global_batch_size=256, iterations=1)
    assert [str(e) for e in validate_spec(named)] == want
    explicit = c.JobSpec(name="w", model=model_spec(REGISTERED["wide-resnet-1b"]), global_batch_size=256,
                         iterations=1)
    assert [str(e) for e in validate_spec(explicit)] == want


def test_job_file_wide_resnet() -> None:
    base = {"name": "w", "global_batch_size": 256, "iterations": 1}
    spec = job_spec_from_dict({**base, "model": {"hidden_size": 320, "num_layers": 50, "num_heads": 1,
                                                 "vocab_size": 1024, "seq_length": 224, "family": "wide_resnet",
                                                 "width_factor": 16}})
    assert model_dims(spec.model) == ModelDims(320, 50, 1, 1024, 224, family="wresnet", width_factor=16)
    with pytest.raises(JobFileError, match="model.num_layers: a Wide-ResNet's depth"):
        job_spec_from_dict({**base, "model": {"hidden_size": 320, "num_layers": 34, "num_heads": 1,
                                              "vocab_size": 1024, "seq_length": 224, "family": "wide_resnet"}})


def test_memory_and_traced_refuse_a_wide_resnet_naming_the_family() -> None:
    from tessera.estimator.memory import estimate_memory, marp_memory, num_params
    from tessera.estimator.torch.traced import traced_memory

    wrn = REGISTERED["wide-resnet-500m"]
    assert num_params(wrn) == 495_046_176
    for call in (lambda: estimate_memory(wrn, ExecutionPlan()), lambda: marp_memory(wrn, 1, 1),
                 lambda: traced_memory(wrn, ExecutionPlan())):
        with pytest.raises(PlanInputError) as err:
            call()
        assert err.value.field == "model.family" and "has Cells only" in err.value.reason


def test_the_estimator_applies_the_job_specs_model_bounds() -> None:
    # the service's requests are bounded as SubmitJob's: the estimator's work grows with them
    m = c.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256, seq_length=64,
                    family=c.MODEL_FAMILY_ENCODER_DECODER, num_decoder_layers=1_048_576)
    with pytest.raises(PlanInputError) as err:
        model_dims(m)
    assert (err.value.field, err.value.reason) == ("model.num_decoder_layers", "must be <= 1,024, got 1,048,576")
    m.num_decoder_layers = 1_024
    assert model_dims(m).num_decoder_layers == 1_024
