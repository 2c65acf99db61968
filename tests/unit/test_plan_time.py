"""The time of one execution plan (estimator/plan_time.py) and the attention terms it adds
(estimator/layer_costs.py, cells.model_operators): each term against a hand-derived value."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tessera.common.gpus import lookup
from tessera.estimator.cells import CellModel, model_operators
from tessera.estimator.comm import CommEstimate, CommModel, Link
from tessera.estimator.compute import EfficiencyPrior, has_fp8, stage_compute_time
from tessera.estimator.layer_costs import Attention, keys_causal_window
from tessera.estimator.models import ModelDims, registered
from tessera.estimator.partition import Operator
from tessera.estimator.plan_time import (
    BREAKDOWN_KEYS,
    cell_model,
    ddp_exposed,
    estimate_plan_time,
    fsdp_backward_exposed,
    fsdp_forward_exposed,
    lora_operators,
    plan_operators,
)
from tessera.estimator.plans import ExecutionPlan, PlanInputError

H, L, A, V, S = 4096, 4, 32, 32000, 2048
BASE = CellModel("gpt", hidden_size=H, num_layers=L, num_heads=A, vocab_size=V, seq_length=S, global_batch=8,
                 recompute=False)
# a small Llama-3-like decoder: GQA 32 query heads over 8 k/v heads, SwiGLU
LLAMA = ModelDims(4096, 8, 32, 128256, 4096, "llama3-8b-8l", ffn_hidden=14336, gated=True, num_kv_heads=8,
                  tied_embeddings=False)


def layer(m: CellModel) -> Operator:
    return model_operators(m)[1]


def test_flash_removes_exactly_the_score_traffic() -> None:
    unfused, flash = layer(BASE), layer(replace(BASE, flash_attention=True))
    # Korthikanti's 5as^2 bytes per sample (softmax input, output, dropout mask)
    assert unfused.traffic_sharded_bytes - flash.traffic_sharded_bytes == 5 * A * S * S
    assert unfused.traffic_bytes == flash.traffic_bytes
    assert unfused.linear_flops == flash.linear_flops


def test_flash_backward_is_two_and_a_half_forwards() -> None:
    unfused, flash = layer(BASE), layer(replace(BASE, flash_attention=True))
    score_fwd = 4 * H * S * S  # QK^T and PV, 2h FLOPs per (query, key) pair each, s x s pairs
    assert unfused.flops - unfused.linear_flops == 3 * score_fwd
    assert flash.flops - flash.linear_flops == 3.5 * score_fwd


def test_causal_halves_the_score_flops_under_flash_only() -> None:
    flash = replace(BASE, flash_attention=True)
    full, causal = layer(flash), layer(replace(flash, causal=True))
    assert causal.flops - causal.linear_flops == pytest.approx((full.flops - full.linear_flops) / 2)
    # unfused attention computes the whole score matrix, masked or not
    assert layer(replace(BASE, causal=True)).flops == layer(BASE).flops


def test_gqa_shrinks_the_kv_projections_by_hand() -> None:
    mha, gqa = layer(BASE), layer(replace(BASE, kv_heads=8))
    kv_width = 8 * (H // A)  # 1024
    # k and v: h x KV each instead of h x h; 2 FLOPs per weight per token; 3 passes (no recompute)
    assert mha.linear_flops - gqa.linear_flops == 3 * 2 * 2 * H * (H - kv_width) * S
    assert mha.params - gqa.params == 2 * H * (H - kv_width)
    # K and V activations: 2 bytes per element, two tensors
    assert mha.traffic_sharded_bytes - gqa.traffic_sharded_bytes == 2 * 2 * (H - kv_width) * S


def test_kv_channels_set_the_attention_width() -> None:
    # Gemma-2-9B-like: 16 heads of 256 on a 3584 hidden: q and o are 3584 x 4096
    m = CellModel("gpt", 3584, 2, 16, 1000, 1024, 4, recompute=False, kv_heads=8, head_dim=256)
    att = m.attention(0)
    assert (att.width, att.kv_width) == (4096, 2048)
    assert att.params == 2 * 3584 * 4096 + 2 * 3584 * 2048


def test_sliding_window_keys() -> None:
    att = Attention(64, 1, 1, 64, 4096, causal=True, flash=True, window=1024)
    assert att.keys_per_query == 1024 - 1024 ** 2 / (2 * 4096)
    # the continuous count is the discrete one less w / 2s (under one key)
    assert 0 < keys_causal_window(4096, 1024) - att.keys_per_query < 1
    assert Attention(64, 1, 1, 64, 4096, causal=True, flash=True).keys_per_query == 2048
    # Gemma 2 alternates: layer 0 local, layer 1 global
    m = CellModel("gpt", 512, 2, 8, 1000, 4096, 4, causal=True, flash_attention=True, sliding_window=1024,
                  sliding_every=2)
    assert m.attention(0).window == 1024 and m.attention(1).window == 0


def test_crius_families_unchanged_by_default() -> None:
    # the pre-issue-14 formula: 2 (4h^2 + 2fh^2) + 4sh forward FLOPs per token, 4 passes with remat
    m = replace(BASE, recompute=True)
    f = 4
    assert layer(m).flops == pytest.approx(4 * (2 * (4 * H * H + 2 * f * H * H) + 4 * S * H) * S, rel=1e-12)
    assert layer(m).traffic_sharded_bytes == pytest.approx(((8 * H + 4 * f * H) + 5 * A * S) * S, rel=1e-12)
    assert CellModel.from_dims(registered("bert-large"), 32).signature == \
        CellModel("bert", 1024, 24, 16, 30522, 512, 32, weight_grad_bytes=4.0).signature


def test_float8_doubles_only_the_linear_gemms() -> None:
    gpu = lookup("H100-80GB")
    prior = EfficiencyPrior(matmul_efficiency=0.5, traffic_multiplier=0.0)
    op = Operator("x", flops=3e12, linear_flops=2e12)
    base = stage_compute_time([op], gpu, 1, 1, 1, prior).seconds
    fp8 = stage_compute_time([op], gpu, 1, 1, 1, prior, float8=True).seconds
    assert base == pytest.approx(3e12 / (989e12 * 0.5))
    assert fp8 == pytest.approx((1e12 + 2e12 / 2) / (989e12 * 0.5))
    assert has_fp8(gpu) and not has_fp8(lookup("A100-80GB")) and not has_fp8(lookup("V100-32GB"))


def test_compile_scales_the_traffic_term() -> None:
    gpu = lookup("A100-80GB")
    prior = EfficiencyPrior(traffic_multiplier=4.0, compile_traffic_factor=0.5)
    op = Operator("x", flops=0.0, traffic_bytes=1e9)
    eager = stage_compute_time([op], gpu, 1, 1, 1, prior).seconds
    assert eager == pytest.approx(4.0 * 1e9 / 2039e9)
    assert stage_compute_time([op], gpu, 1, 1, 1, prior, compiled=True).seconds == pytest.approx(eager / 2)


def test_lora_backward_skips_the_base_weight_gradients() -> None:
    m = ModelDims(1024, 2, 16, 1000, 512, "tiny")
    plan = ExecutionPlan(lora_rank=8, lora_targets="qv", flash_attention=False)
    cm = cell_model(m, plan)
    ops = model_operators(cm)
    lo = lora_operators(m, cm, ops, plan)
    full, lora = ops[1], lo.ops[1]
    adapter_fwd = 2 * 8 * ((1024 + 1024) + (1024 + 1024)) * 512  # q and v: 2r(in + out) per token
    assert lo.adapter_fwd[1] == adapter_fwd
    # base linears: forward + input gradient = 2/3 of the three passes; adapters: three passes
    assert lora.linear_flops == pytest.approx(full.linear_flops * 2 / 3 + 3 * adapter_fwd)
    assert lora.flops - lora.linear_flops == pytest.approx(full.flops - full.linear_flops)  # scores untouched
    assert lo.adapter_params[1] == 8 * 4 * 1024
    assert lo.ops[-1].flops == pytest.approx(ops[-1].flops * 2 / 3)  # the frozen lm_head
    # all-linear adds k, o and the two MLP matrices (h -> 4h, 4h -> h)
    wide = lora_operators(m, cm, ops, replace(plan, lora_targets="all-linear"))
    assert wide.adapter_params[1] == 8 * (4 * 2048 + 2 * (1024 + 4096))


def test_overlap_rules_by_hand() -> None:
    assert fsdp_forward_exposed([3.0, 1.0, 5.0], [2.0, 2.0, 2.0]) == 3 + 0 + 3
    # reverse order: last unit's gather, first unit's reduce-scatter, the rest against the backward
    assert fsdp_backward_exposed([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [1.0, 1.0, 4.0]) == 1 + 2 + 2 + 0
    assert ddp_exposed(8.0, 100.0, 4) == 2.0
    assert ddp_exposed(8.0, 3.0, 4) == 5.0


class Recording(CommModel):
    """Every collective asked of the model, with a fixed 1 ms answer."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, float, int]] = []

    def time(self, op: str, nbytes: float, world: int, link: Link, sharing: int = 1) -> CommEstimate:
        self.calls.append((op, nbytes, world))
        return CommEstimate(1e-3, "test")


def test_ring_attention_exchanges_the_kv_blocks() -> None:
    rec = Recording()
    plan = ExecutionPlan(cp=4, micro_batch=2)
    estimate_plan_time(LLAMA, plan, "H100-80GB", comm=rec)
    p2p = [(n, w) for op, n, w in rec.calls if op == "p2p"]
    # per layer: forward K and V of seq/cp tokens of the micro-batch (kv width 8 x 128, bf16);
    # backward K, V and their gradients
    kv = 2 * (8 * 128) * (4096 // 4) * 2 * 2
    assert p2p == [(kv, 2), (2 * kv, 2)] * LLAMA.num_layers


def test_fsdp_gathers_per_layer_and_reduce_scatters_gradients() -> None:
    rec = Recording()
    plan = ExecutionPlan(dp=8, sharding="fsdp", precision="megatron-bf16")
    estimate_plan_time(LLAMA, plan, "H100-80GB", comm=rec)
    ops = model_operators(cell_model(LLAMA, plan))
    gathers = [n for op, n, w in rec.calls if op == "all_gather"]
    scatters = [n for op, n, w in rec.calls if op == "reduce_scatter"]
    assert gathers == [o.params * 2 for o in ops]  # bf16 parameters
    assert scatters == [o.params * 4 for o in ops]  # fp32 gradients (Megatron's main grads)
    assert {w for op, n, w in rec.calls if op in ("all_gather", "reduce_scatter")} == {8}


def test_fsdp_resharding_costs_a_second_gather() -> None:
    keep = ExecutionPlan(dp=8, sharding="fsdp", reshard_after_forward="never", grad_accum=2)
    again = keep.with_(reshard_after_forward="always")
    t_keep = estimate_plan_time(LLAMA, keep, "A100-80GB", gpus_per_node=4)
    t_again = estimate_plan_time(LLAMA, again, "A100-80GB", gpus_per_node=4)
    assert t_again.breakdown["dp_comm"] > t_keep.breakdown["dp_comm"] > 0


def test_breakdown_adds_up_and_bubble_shrinks_with_interleaving() -> None:
    plan = ExecutionPlan(dp=2, tp=2, pp=2, micro_batch=1, grad_accum=8, sequence_parallel=True)
    t = estimate_plan_time(LLAMA, plan, "H100-80GB")
    assert set(t.breakdown) == set(BREAKDOWN_KEYS)
    assert sum(t.breakdown.values()) == pytest.approx(t.iter_time)
    assert t.breakdown["pp_bubble"] > 0 and t.breakdown["tp_comm"] > 0
    assert t.tokens_per_second == pytest.approx(2 * 8 * 4096 / t.iter_time)
    v2 = estimate_plan_time(LLAMA, plan.with_(virtual_stages=2), "H100-80GB")
    assert v2.breakdown["pp_bubble"] < t.breakdown["pp_bubble"]
    single = estimate_plan_time(LLAMA, ExecutionPlan(dp=8), "H100-80GB")
    assert single.breakdown["pp_bubble"] == 0


def test_recompute_costs() -> None:
    plan = ExecutionPlan(dp=1, micro_batch=1)
    none = estimate_plan_time(LLAMA, plan, "H100-80GB")
    full = estimate_plan_time(LLAMA, plan.with_(checkpointing="full"), "H100-80GB")
    op = estimate_plan_time(LLAMA, plan.with_(checkpointing="op"), "H100-80GB")
    half = estimate_plan_time(LLAMA, plan.with_(checkpointing="full", checkpoint_every=2), "H100-80GB")
    assert none.breakdown["recompute"] == 0
    assert full.breakdown["recompute"] > op.breakdown["recompute"] > 0
    assert half.breakdown["recompute"] == pytest.approx(full.breakdown["recompute"] / 2)


def test_async_tp_and_float8_and_compile_make_it_faster() -> None:
    plan = ExecutionPlan(tp=8, sequence_parallel=True, compile=True)
    base = estimate_plan_time(LLAMA, plan, "H100-80GB")
    assert estimate_plan_time(LLAMA, plan.with_(async_tp=True), "H100-80GB").breakdown["tp_comm"] < \
        base.breakdown["tp_comm"]
    assert estimate_plan_time(LLAMA, plan.with_(float8="linear"), "H100-80GB").breakdown["compute"] < \
        base.breakdown["compute"]
    assert estimate_plan_time(LLAMA, plan.with_(compile=False), "H100-80GB").breakdown["compute"] > \
        base.breakdown["compute"]


@pytest.mark.parametrize(("model", "plan", "gpu", "kwargs", "field"), [
    (LLAMA, ExecutionPlan(float8="linear"), "A100-80GB", {}, "plan.float8"),
    (LLAMA, ExecutionPlan(float8="linear"), "V100-32GB", {}, "plan.float8"),
    (LLAMA, ExecutionPlan(), "Z9000", {}, "gpu"),
    (LLAMA, ExecutionPlan(dp=8), "H100-80GB", {"gpus_per_node": 3}, "gpus_per_node"),
    (LLAMA, ExecutionPlan(tp=3), "H100-80GB", {}, "plan.tp"),
    (LLAMA, ExecutionPlan(dp=2, sharding="zero3", offload="optimizer"), "H100-80GB", {}, "plan.offload"),
    (registered("wide-resnet-1b"), ExecutionPlan(), "A100-80GB", {}, "model.family"),
    (ModelDims(512, 2, 8, 1000, 512, "t5", family="encoder-decoder"), ExecutionPlan(cp=2), "A100-80GB", {},
     "plan.cp"),
])
def test_impossible_plans_are_refused_by_field(model: ModelDims | None, plan: ExecutionPlan, gpu: str,
                                              kwargs: dict[str, int], field: str) -> None:
    assert model is not None
    with pytest.raises(PlanInputError) as err:
        estimate_plan_time(model, plan, gpu, **kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


def test_flash_scores_run_at_flash_attention_utilization_on_hopper() -> None:
    prior = EfficiencyPrior(matmul_efficiency=0.5, traffic_multiplier=0.0)
    op = Operator("x", flops=3e12, linear_flops=2e12)
    h100, a100 = lookup("H100-80GB"), lookup("A100-80GB")
    # FlashAttention-3's abstract: FA2 reaches 35% of the H100's peak; on A100 the GEMM efficiency stands
    assert stage_compute_time([op], h100, 1, 1, 1, prior, flash=True).seconds == pytest.approx(
        2e12 / (989e12 * 0.5) + 1e12 / (989e12 * 0.35))
    assert stage_compute_time([op], a100, 1, 1, 1, prior, flash=True).seconds == pytest.approx(3e12 / (312e12 * 0.5))


def test_async_tp_hides_forward_collectives_only() -> None:
    plan = ExecutionPlan(tp=8, sequence_parallel=True, compile=True)
    rec = Recording()
    sync = estimate_plan_time(LLAMA, plan, "H100-80GB", comm=rec).breakdown["tp_comm"]
    # 4 all-reduces per layer (2 forward, 2 backward) and 2 for the head, 1 ms each (Recording)
    calls = 4 * LLAMA.num_layers + 2
    assert sync == pytest.approx(calls * 1e-3)
    hidden = estimate_plan_time(LLAMA, plan.with_(async_tp=True), "H100-80GB", comm=Recording())
    backward = calls / 2 * 1e-3
    assert backward + backward / 8 - 1e-12 <= hidden.breakdown["tp_comm"] < sync


def test_float8_leaves_the_output_projection_in_bf16() -> None:
    plan = ExecutionPlan(compile=True)
    t = estimate_plan_time(LLAMA, plan, "H100-80GB").breakdown["compute"]
    f8 = estimate_plan_time(LLAMA, plan.with_(float8="linear"), "H100-80GB").breakdown["compute"]
    ops = model_operators(cell_model(LLAMA, plan))
    gpu = lookup("H100-80GB")
    prior = EfficiencyPrior()
    layers = sum(o.linear_flops for o in ops[1:-1])
    saved = layers / 2 / (gpu.tflops_fp16 * 1e12 * prior.matmul_efficiency)  # x2 on the layers' GEMMs only
    assert t - f8 < saved  # the casts cost something back
    assert t - f8 > saved * 0.5


def test_t5_decoder_layers_add_cross_attention_by_hand() -> None:
    h, a, s_e, s_d = 1024, 16, 512, 128
    t5 = ModelDims(h, 2, a, 32128, s_e, "t5-tiny", family="encoder-decoder", ffn_hidden=4 * h, kv_channels=64,
                   decoder_seq_length=s_d, num_decoder_layers=3)
    plan = ExecutionPlan(flash_attention=False)
    _, ops = plan_operators(t5, plan)
    assert [o.name for o in ops] == ["embedding", *(f"layer{i}" for i in range(5)), "head"]
    dec = ModelDims(h, 3, a, 32128, s_d, "dec", family="decoder", ffn_hidden=4 * h, kv_channels=64)
    plain = model_operators(cell_model(dec, plan))[1]
    # q, o on the decoder's tokens, k, v on the encoder's; scores s_d x s_e; 3 passes, unfused backward 2x
    lin = 3 * (s_d * 4 * h * h + s_e * 4 * h * h)
    assert ops[3].linear_flops - plain.linear_flops == lin
    assert ops[3].flops - plain.flops == lin + 3 * 4 * h * s_e * s_d
    assert ops[3].comm_calls == 6 and ops[3].tp_comm_bytes == plain.tp_comm_bytes * 6 / 4
    t = estimate_plan_time(t5, ExecutionPlan(dp=2, micro_batch=4), "A100-80GB")
    assert t.tokens_per_second == pytest.approx(8 * (s_e + s_d) / t.iter_time)
