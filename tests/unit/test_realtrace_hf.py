"""The real-code trace on transformers models built from their configs (never downloaded), with
FSDP2, PEFT LoRA and the model's own loss, on fake tensors.

Hand-derived counts for the tiny Llama below (h 64, 4 heads of 16, 2 kv heads, ffn 128, V 256, 2 layers):
  per layer q 4096 + k 2048 + v 2048 + o 4096 + gate/up/down 3 * 8192 + norms 128 = 36992,
  N = embedding 16384 + 2 * 36992 + final norm 64 + head 16384 = 106816.
LoRA adds r (in + out) per adapted linear: all-linear per layer r (128 + 96 + 96 + 128 + 3 * 192) = 1024 r
(PEFT leaves the output head out); qv per layer r (128 + 96) = 224 r.
"""

from __future__ import annotations

import pytest

from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from tessera.estimator.torch.realtrace import trace_real
from tessera.estimator.torch.realtrace.adapters import quantized_bytes

BASE = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 256, "seq_length": 64}
LLAMA = {"gated": True, "num_kv_heads": 2, "ffn_hidden": 128, "tied_embeddings": False}
TINY = ModelDims(**BASE, **LLAMA)  # type: ignore[arg-type]
N = 106816
PLAN = ExecutionPlan(loss="fp32")


@pytest.mark.parametrize(("targets", "adapter", "tensors"), [("all-linear", 2 * 1024, 2 * 7 * 2), ("qv", 2 * 224, 2 * 2 * 2)])
def test_lora_trains_only_the_adapters(targets: str, adapter: int, tensors: int) -> None:
    r = 4
    tr = trace_real(TINY, PLAN.with_(lora_rank=r, lora_targets=targets), stack="transformers")
    params = adapter * r
    # AdamW m and v in fp32 for the adapters only, plus a 4-byte step per adapter tensor (A and B)
    assert tr.optimizer == 8 * params + 4 * tensors
    assert tr.gradients <= 4 * params
    # the frozen base in bf16, the adapters in fp32 (PEFT's autocast of adapters)
    assert tr.detail["tracker_peak"]["Sharded Param"] == 2 * N + 4 * params
    assert tr.peak == tr.parameters + tr.gradients + tr.optimizer + tr.activations + tr.other


def test_qlora_nf4_base_holds_the_quantized_bytes() -> None:
    r = 4
    tr = trace_real(TINY, PLAN.with_(lora_rank=r, base_quant="nf4"), stack="transformers")
    linears = 2 * (4096 + 2048 + 2048 + 4096 + 3 * 8192)  # the 14 adapted linears' weights
    assert quantized_bytes(4096, 64, "nf4") == 2048 + 4 * 64
    nf4 = linears // 2 + 4 * linears // 64
    rest = 2 * (N - linears)  # embedding, norms, head in bf16
    assert tr.detail["tracker_peak"]["Sharded Param"] == nf4 + rest + 4 * 2 * 1024 * r
    assert any("nf4" in a for a in tr.detail["approximations"])


def test_full_fine_tune_fsdp_shards_state_over_dp() -> None:
    tr = trace_real(TINY, PLAN.with_(dp=4, sharding="fsdp"), stack="transformers")
    assert tr.detail["tracker_peak"]["Sharded Param"] == 4 * N // 4
    assert tr.optimizer == 8 * N // 4 + 4 * (2 * 9 + 3)  # 9 tensors per layer, embedding, norm, head


def test_grad_accumulation_keeps_the_sharded_gradients() -> None:
    from tessera.estimator.memory_recipes import native_estimate

    # transformers' Trainer keeps .grad between accumulated micro-batches: under FSDP2 the second
    # micro-batch runs beside the fp32 gradient shards of all N parameters, 4 N / dp bytes
    plan = PLAN.with_(dp=4, sharding="fsdp", precision="amp", grad_accum=2)
    tr = trace_real(TINY, plan, stack="transformers")
    assert tr.detail["accumulated"] == 2
    assert tr.gradients == tr.detail["tracker_peak"]["Sharded Grad"] == 4 * N // 4
    n = native_estimate(TINY, plan, 0, "transformers", device="cpu")
    formula = n.parameters + n.gradients + n.optimizer + n.activations + n.comm
    assert n.gradients == tr.gradients
    assert abs(formula - tr.peak) <= 0.02 * tr.peak, tr.to_dict()
    assert trace_real(TINY, plan.with_(grad_accum=1), stack="transformers").gradients == 0


def test_t5_encoder_decoder_traces() -> None:
    # h 64, 4 heads of d_kv 16, gated-GELU ffn 128, V 256, 2 encoder + 2 decoder layers, untied head:
    # encoder layer 4*64*64 + 3*64*128 + 2*64 = 41088; decoder layer 8*64*64 + 3*64*128 + 3*64 = 57536;
    # a relative-position bias (32 buckets x 4 heads) in each stack's first layer, a final norm each.
    t5 = ModelDims(**BASE, family="encoder-decoder", gated=True, kv_channels=16, ffn_hidden=128,  # type: ignore[arg-type]
                   num_decoder_layers=2, decoder_seq_length=32, tied_embeddings=False)
    n = 16384 + (2 * 41088 + 128 + 64) + (2 * 57536 + 128 + 64) + 16384
    tensors = 1 + (2 * 9 + 2) + (2 * 14 + 2) + 1
    tr = trace_real(t5, PLAN.with_(dp=2, sharding="fsdp"))
    assert tr.stack == "transformers" and tr.detail["config"] == "T5Config"
    assert tr.detail["tokens"] == [1, 64, 32]
    assert tr.optimizer == 8 * n // 2 + 4 * tensors
    assert tr.peak == tr.parameters + tr.gradients + tr.optimizer + tr.activations + tr.other


@pytest.mark.parametrize(("extra", "config"), [
    ({"qkv_bias": True}, "Qwen2Config"),
    ({"sliding_window": 32}, "MistralConfig"),
    ({"kv_channels": 32, "logit_softcap": 30.0, "sandwich_norm": True, "sliding_window": 32}, "Gemma2Config"),
    ({"family": "moe", "num_experts": 4, "moe_every": 1, "capacity_factor": 0}, "MixtralConfig"),
])
def test_families_map_to_their_configs(extra: dict[str, object], config: str) -> None:
    model = ModelDims(**BASE, **{**LLAMA, **extra})  # type: ignore[arg-type]
    tr = trace_real(model, PLAN.with_(dp=2, sharding="fsdp"))
    assert tr.detail["config"] == config
    assert tr.peak == tr.parameters + tr.gradients + tr.optimizer + tr.activations + tr.other > 0


def test_gpt2_and_eager_attention_store_the_scores() -> None:
    gpt = ModelDims(64, 2, 4, 256, 256)
    flash = trace_real(gpt, PLAN, stack="transformers")
    eager = trace_real(gpt, PLAN.with_(flash_attention=False), stack="transformers")
    assert flash.detail["config"] == "GPT2Config"
    # eager attention keeps b a s^2 scores/probabilities per layer: 2 layers x 4 heads x 256^2 elements
    assert eager.activations - flash.activations >= 2 * 4 * 256 * 256 * 2


def test_op_sac_between_none_and_full() -> None:
    model = ModelDims(128, 4, 4, 256, 512, **LLAMA)  # type: ignore[arg-type]
    acts = {ck: trace_real(model, PLAN.with_(checkpointing=ck), stack="transformers").activations
            for ck in ("none", "op", "full")}
    assert acts["none"] > acts["op"] > acts["full"]


@pytest.mark.parametrize(("plan", "field"), [
    (ExecutionPlan(pp=2, loss="fp32"), "plan.pp"),
    (ExecutionPlan(tp=2, loss="fp32"), "plan.tp"),
    (ExecutionPlan(loss="chunked"), "plan.loss"),
    (ExecutionPlan(loss="fp32", offload="optimizer"), "plan.offload"),
])
def test_refusals_name_the_field(plan: ExecutionPlan, field: str) -> None:
    with pytest.raises(PlanInputError) as e:
        trace_real(TINY, plan, stack="transformers")
    assert e.value.field == field


def test_bert_is_refused_by_family() -> None:
    with pytest.raises(PlanInputError) as e:
        trace_real(ModelDims(**BASE, family="encoder"), PLAN)  # type: ignore[arg-type]
    assert e.value.field == "model.family"


def test_lora_with_full_checkpointing() -> None:
    r = 4
    tr = trace_real(TINY, PLAN.with_(lora_rank=r, lora_targets="attention", checkpointing="full"))
    assert tr.detail["checkpointing"] == "torchtitan FullAC on 2 layers"
    # attention per layer r (q 64+64, k 64+32, v 64+32, o 64+64) = 448 r, 4 adapter tensors each A and B
    assert tr.optimizer == 8 * 2 * 448 * r + 4 * 2 * 4 * 2


def test_both_stacks_build_the_same_parameters_with_kv_channels() -> None:
    pytest.importorskip("torchtitan")
    # kv_channels 32 on h 64: q out 4*32, k/v out 2*32; per layer wqkv 8*32*64 + wo 4*32*64 + 3*64*128 + 128
    model = ModelDims(**BASE, **LLAMA, kv_channels=32)  # type: ignore[arg-type]
    n = 2 * (16384 + 8192 + 24576 + 128) + 2 * 16384 + 64
    for stack in ("torchtitan", "transformers"):
        tr = trace_real(model, PLAN, stack=stack)
        assert tr.detail["tracker_peak"]["Sharded Param"] == 4 * n, stack


def test_float8_converts_the_layer_linears() -> None:
    pytest.importorskip("torchao")
    model = ModelDims(128, 2, 4, 256, 128, **{**LLAMA, "ffn_hidden": 256})  # type: ignore[arg-type]
    tr = trace_real(model, PLAN.with_(dp=2, sharding="fsdp", float8="linear"), stack="transformers")
    # q, k, v, o, gate, up, down per layer; the output head stays in bf16
    assert tr.detail["float8"] == "torchao Float8Linear (tensorwise) on 14 linears"
