"""The PyTorch-native recipes in the memory formula (estimator/memory_recipes.py, memory_layers.py):
each term against values derived by hand from what PyTorch/torchtitan/PEFT/torchao keep."""

from __future__ import annotations

import pytest

from tessera.estimator.memory import estimate_memory, num_params
from tessera.estimator.memory_layers import Shape, layer_saved, stored_bytes
from tessera.estimator.memory_recipes import (
    NF4_BYTES,
    adapter_params,
    loss_terms,
    native_activations,
    native_estimate,
    native_state,
    shape_of,
)
from tessera.estimator.memory_terms import allocator_reserved
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError

# A tiny Llama-style model: h 64, 4 layers, 4 heads of 16, V 128, s 32, SwiGLU 128, untied.
# Per layer: norms 2*64 + q,k,v 3*64*64 + o 64*64 + MLP 3*64*128 = 41,088; embedding 128*64 = 8,192;
# final norm 64 + output 8,192: 180,800 parameters.
TINY = ModelDims(64, 4, 4, 128, 32, "tiny", ffn_hidden=128, gated=True, tied_embeddings=False)
LAYER = 41_088
TOTAL = 180_800


def test_parameter_counts_of_current_families() -> None:
    assert num_params(TINY) == TOTAL
    # Hugging Face's counts: Qwen2.5-0.5B (q/k/v biases), Gemma-2-2B (sandwich norms, head_dim 256),
    # Mixtral-8x7B (8 SwiGLU experts, router), t5-small (encoder-decoder, relative position bias).
    assert num_params(ModelDims(896, 24, 14, 151936, 4096, num_kv_heads=2, ffn_hidden=4864, gated=True,
                                qkv_bias=True)) == 494_032_768
    assert num_params(ModelDims(2304, 26, 8, 256000, 8192, num_kv_heads=4, kv_channels=256, ffn_hidden=9216,
                                gated=True, sandwich_norm=True, logit_softcap=30.0)) == 2_614_341_888
    assert num_params(ModelDims(4096, 32, 32, 32000, 4096, family="moe", num_kv_heads=8, ffn_hidden=14336,
                                gated=True, num_experts=8, moe_every=1, capacity_factor=0,
                                tied_embeddings=False)) == 46_702_792_704
    assert num_params(ModelDims(512, 6, 8, 32128, 512, family="encoder-decoder", ffn_hidden=2048,
                                kv_channels=64)) == 60_506_624


def test_fsdp2_state_shards_over_dp_times_cp() -> None:
    # amp under FSDP2: fp32 sharded params (4 B), fp32 grads (4 B), AdamW m, v (8 B), bf16 compute
    st = native_state(TINY, ExecutionPlan(dp=4, sharding="fsdp", loss="fp32", precision="amp"), 0)
    assert (st.parameters, st.gradients, st.optimizer) == (4 * TOTAL / 4, 4 * TOTAL / 4, 8 * TOTAL / 4)
    # two layers' bf16 params in flight; one layer's bf16 gradient and fp32 reduce-scatter input
    assert (st.layer_ws, st.layer_grad_ws, st.layer_rs) == (2 * 2 * LAYER, 2 * LAYER, 4 * LAYER)
    assert (st.head_ws, st.head_grad_ws, st.head_rs) == (2 * 8192, 2 * 8192, 4 * 8192)
    assert st.unsharded_params == st.unsharded_grads == 0
    cp = native_state(TINY, ExecutionPlan(dp=2, cp=2, sharding="fsdp", loss="fp32", precision="amp"), 0)
    assert cp.parameters == st.parameters and cp.optimizer == st.optimizer  # dp*cp = 4 shards as well


def test_fsdp2_under_pp_keeps_unsharded_params_and_fp32_grads() -> None:
    plan = ExecutionPlan(dp=2, pp=2, grad_accum=4, sharding="fsdp", loss="fp32", precision="amp")
    assert not plan.reshards_after_forward
    st = native_state(TINY, plan, 0)
    stage0 = 2 * LAYER + 8192  # two layers and the embedding
    assert st.parameters == 4 * stage0 / 2
    assert (st.unsharded_params, st.unsharded_grads) == (2 * stage0, 4 * stage0)
    assert st.layer_ws == 0
    # 'always' reshards under PP too
    st2 = native_state(TINY, ExecutionPlan(dp=2, pp=2, grad_accum=4, sharding="fsdp", loss="fp32",
                                           precision="amp", reshard_after_forward="always"), 0)
    assert st2.unsharded_params == 0 and st2.layer_ws == 4 * LAYER


def test_lora_adapters_and_quantized_base() -> None:
    r = 8
    # qv: q (64 -> 64) and v (64 -> 64): r*(in + out) each, 4 layers
    assert adapter_params(TINY, ExecutionPlan(lora_rank=r, lora_targets="qv", loss="fp32"), 0) == 4 * 2 * r * 128
    assert adapter_params(TINY, ExecutionPlan(lora_rank=r, lora_targets="attention", loss="fp32"), 0) == 4 * 4 * r * 128
    # all-linear adds w1, w3 (64 -> 128) and w2 (128 -> 64)
    assert adapter_params(TINY, ExecutionPlan(lora_rank=r, loss="fp32"), 0) == 4 * (4 * r * 128 + 3 * r * 192)
    # QLoRA: 4-bit weights + absmax quantized to 8 bits per 64 and an fp32 constant per 256 blocks
    assert NF4_BYTES == pytest.approx(0.5 + 0.127 / 8, abs=1e-4)
    # a bf16 base ('bf16' recipe), its linear weights in nf4; pure bf16 adapters, grads and AdamW states
    plan = ExecutionPlan(lora_rank=r, lora_targets="qv", base_quant="nf4", loss="fp32", precision="bf16")
    st = native_state(TINY, plan, 0)
    linear = 4 * (3 * 64 * 64 + 64 * 64 + 3 * 64 * 128)
    adapters = 4 * 2 * r * 128
    assert st.parameters == pytest.approx(linear * NF4_BYTES + (TOTAL - linear) * 2 + 2 * adapters)
    assert (st.gradients, st.optimizer) == (2 * adapters, 4 * adapters)  # the frozen base trains nothing
    # amp: the frozen base in the compute dtype (bf16) all the same, the adapters in fp32
    amp = native_state(TINY, ExecutionPlan(lora_rank=r, lora_targets="qv", loss="fp32", precision="amp"), 0)
    assert amp.parameters == 2 * TOTAL + 4 * adapters
    off = native_state(TINY, ExecutionPlan(lora_rank=r, lora_targets="qv", offload="frozen", loss="fp32",
                                           precision="bf16"), 0)
    assert off.parameters == 2 * adapters and off.cpu == TOTAL * 2
    assert off.layer_ws == 2 * LAYER  # one layer's bf16 base weights on the GPU at a time


def _shape(**kw: object) -> Shape:
    base = {"tokens": 32, "batch": 1, "seq": 32, "e": 2, "tp": 1, "sp": 1, "flash": True, "stack": "torchtitan"}
    base.update(kw)
    return Shape(**base)  # type: ignore[arg-type]


def test_layer_kept_tensors_by_policy() -> None:
    x = _shape()
    t, e, h, f = 32, 2, 64, 128
    lse = 4 * 1 * 4 * 32  # fp32 logsumexp per head and token
    # none: two fused norms (input + fp32 rstd), q/k/v input, q, k, v, attention output, lse, MLP input,
    # w1, w3, silu(w1), product
    none = 2 * (e * t * h + 4 * t) + e * t * h + 3 * e * t * h + e * t * h + lse + e * t * h + 4 * e * t * f
    assert stored_bytes(TINY, x, 0, "none") == none == 66_304
    # op (torchtitan's _save_list): the input, the attention outputs, the 1st/3rd/5th matmul outputs:
    # torchtitan fuses q, k, v into one matmul (wqkv, wo, w1, w3, w2): wqkv, w1, w2
    op = e * t * h + (e * t * h + lse) + e * t * 3 * h + e * t * f + e * t * h
    assert stored_bytes(TINY, x, 0, "op") == op == 33_280
    # transformers' separate q, k, v, o, gate, up, down: q, v, gate, down
    hf = e * t * h + (e * t * h + lse) + e * t * h + e * t * h + e * t * f + e * t * h
    assert stored_bytes(TINY, _shape(stack="transformers"), 0, "op") == hf == 29_184
    assert stored_bytes(TINY, x, 0, "full") == e * t * h
    # compile: SwiGLU fused, silu(w1) and the product recomputed
    assert stored_bytes(TINY, _shape(compile=True), 0, "none") == none - 2 * e * t * f
    # LoRA on q and v with a frozen base: only the adapters keep inputs (x once) and lora_A's r outputs
    lora = _shape(lora=frozenset({"attn.q", "attn.v"}), rank=8, frozen=True)
    kept = {s.name: s.nbytes for s in layer_saved(TINY, lora, 0) if s.nbytes}
    assert kept["attn.qkv_in"] == e * t * h and kept["attn.q.lora_a"] == kept["attn.v.lora_a"] == e * t * 8
    assert "mlp.mlp_in" not in kept and "mlp.prod" not in kept  # the frozen MLP keeps no linear inputs


def test_transformers_norms_keep_fp32_copies() -> None:
    x = _shape(stack="transformers")
    kept = {s.name: s.nbytes for s in layer_saved(TINY, x, 0)}
    # LlamaRMSNorm: fp32 copy (4 B), rstd (4 B/token), the normalised bf16 tensor (2 B)
    assert (kept["attn.norm.fp32"], kept["attn.norm.rstd"], kept["attn.norm.normed"]) == (4 * 32 * 64, 4 * 32, 2 * 32 * 64)


def test_checkpoint_every_nth_layer() -> None:
    plan = ExecutionPlan(checkpointing="full", checkpoint_every=2, loss="fp32")
    x = shape_of(TINY, plan, "torchtitan", TINY.seq_length)
    none, full = stored_bytes(TINY, x, 0, "none"), stored_bytes(TINY, x, 0, "full")
    from tessera.estimator.memory_recipes import native_activations

    act = native_activations(TINY, plan, 0, "torchtitan")
    every = native_activations(TINY, ExecutionPlan(checkpointing="full", loss="fp32"), 0, "torchtitan")
    # layers 1 and 3 checkpointed, 0 and 2 keep everything
    assert act.stored - every.stored == 2 * (none - full)


def test_loss_implementations() -> None:
    x = _shape()
    n, v = 32, 128
    assert loss_terms(TINY, ExecutionPlan(loss="fp32"), x, True)[:2] == (4 * n * v + 8 * n, 8 * n * v)
    kept, peak, _ = loss_terms(TINY, ExecutionPlan(loss="chunked"), x, True)
    # targets, the hidden states, their chunk copies and the fp32 gradient accumulator; one chunk's peak
    assert (kept, peak) == (8 * n + (2 + 2 + 4) * n * 64, (16 + 2) * n * v / 8)
    capped = ModelDims(64, 4, 4, 128, 32, ffn_hidden=128, gated=True, logit_softcap=30.0)
    assert loss_terms(capped, ExecutionPlan(loss="fp32"), x, True)[0] == 4 * n * v + 8 * n + 2 * n * v  # tanh output


def test_context_parallel_divides_tokens() -> None:
    plan = ExecutionPlan(dp=1, cp=4, sharding="fsdp", loss="fp32", precision="amp")
    x = shape_of(TINY, plan, "torchtitan", TINY.seq_length)
    assert (x.tokens, x.seq) == (8, 8)


def test_the_peak_moves_through_backward() -> None:
    # a small vocabulary: the peak is in a layer's backward (what the loss kept is freed by then); at the
    # k-th layer (from the top) the k-1 layers above have their sharded fp32 gradients (4 B x LAYER / 4 ranks each)
    small = ModelDims(64, 4, 4, 32, 256, ffn_hidden=128, gated=True, tied_embeddings=False)
    plan = ExecutionPlan(dp=4, sharding="fsdp", loss="fp32", precision="amp")
    est = native_estimate(small, plan, 0, "torchtitan")
    k = int(est.moment.split()[1].split("'")[0])
    assert est.moment.startswith("layer") and est.gradients == (k - 1) * 4 * LAYER // 4
    # the optimizer state is the same at every moment
    assert est.optimizer == int(native_state(small, plan, 0).optimizer)
    # a large vocabulary with full checkpointing: the loss's backward (8 T V of fp32 gradients) dominates
    big = ModelDims(64, 4, 4, 32000, 256, ffn_hidden=128, gated=True, tied_embeddings=False)
    assert native_estimate(big, ExecutionPlan(dp=4, sharding="fsdp", loss="fp32", precision="amp",
                                              checkpointing="full"), 0, "torchtitan").moment == "the loss's backward"


def test_warnings_and_refusals() -> None:
    mistral = ModelDims(64, 4, 4, 128, 32, ffn_hidden=128, gated=True, sliding_window=16)
    est = estimate_memory(mistral, ExecutionPlan(loss="fp32"))
    assert any(w.startswith("model.sliding_window") for w in est.warnings)
    assert est.to_dict()["warnings"] == list(est.warnings)
    t5 = ModelDims(64, 2, 4, 128, 32, family="encoder-decoder", ffn_hidden=128, num_decoder_layers=2)
    with pytest.raises(PlanInputError) as e:
        estimate_memory(t5, ExecutionPlan(pp=2, grad_accum=2))
    assert e.value.field == "plan.pp"
    with pytest.raises(PlanInputError) as e:
        estimate_memory(t5, ExecutionPlan(cp=2))
    assert e.value.field == "plan.cp"
    with pytest.raises(PlanInputError) as e:
        estimate_memory(TINY, ExecutionPlan(loss="fp32", precision="mixed-adafactor"))
    assert e.value.field == "plan.precision"


def test_reserved_and_fits() -> None:
    # 1 GiB of tensors of which 0.5 GiB transient: + 10% of the transients + one 20 MiB segment, in 2 MiB pages
    gib, mib = 1 << 30, 1 << 20
    assert allocator_reserved(gib, gib // 2) == gib + 52 * mib + 20 * mib
    est = estimate_memory(TINY, ExecutionPlan(loss="fp32"), gpu="a100-80gb")
    assert est.reserved >= est.tensor_bytes and est.fits is (est.reserved + est.other <= est.capacity_bytes)
    assert est.to_dict()["reserved"] == est.reserved


def test_fsdp_stream_pools_hold_every_gradient_and_the_largest_gather() -> None:
    # a layer: q 64x64, k and v 64x32 (2 of 4 heads' width), o 64x64, gate/up/down 64x128, two norms of 64:
    # 36,992; two layers, the tied 512 x 64 embedding and the final norm: 106,816 parameters on one rank
    m = ModelDims(64, 2, 4, 512, 64, ffn_hidden=128, gated=True, num_kv_heads=2)
    plan = ExecutionPlan(micro_batch=2, sharding="fsdp", precision="amp", loss="fp32")
    est = estimate_memory(m, plan, num_gpus=1)
    # the peak (the loss's backward) has no gradient alive: the reduce-scatter stream's pool keeps every
    # fp32 gradient of the last step (4 x 106,816), the all-gather stream's a layer and its prefetch in bf16
    assert est.gradients == 0
    assert est.stream_pools == 4 * 106_816 + 2 * 2 * 36_992
    assert est.reserved == allocator_reserved(est.tensor_bytes, est.activations, 4 * 106_816 + 2 * 2 * 36_992)
    assert est.to_dict()["stream_pools"] == est.stream_pools
    # one stream without FSDP2: no such pools
    assert estimate_memory(m, plan.with_(sharding="none"), num_gpus=1).stream_pools == 0
    # 8 tokens: the peak is the end of backward, every gradient alive and counted in the tensors; the
    # compute stream's largest moment without them is that same moment, so only the gather pool is added
    short = ModelDims(64, 2, 4, 512, 8, ffn_hidden=128, gated=True, num_kv_heads=2)
    est = estimate_memory(short, plan.with_(micro_batch=1), num_gpus=1)
    assert est.gradients == 4 * 106_816 and est.stream_pools == 2 * 2 * 36_992


def test_amp_without_fsdp_is_autocast() -> None:
    from tessera.estimator.memory_layers import stored_bytes
    from tessera.estimator.memory_recipes import shape_of, uses_autocast

    # one layer of 8 tokens, hidden 64: linears q 64x64, k and v 64x32, o 64x64, w1 and w3 64x128, w2 128x64
    m = ModelDims(64, 1, 4, 512, 8, ffn_hidden=128, gated=True, num_kv_heads=2)
    qwen = ModelDims(64, 1, 4, 512, 8, ffn_hidden=128, gated=True, num_kv_heads=2, qkv_bias=True)
    amp = ExecutionPlan(micro_batch=1, precision="amp", loss="fp32", sharding="none")
    fsdp = amp.with_(sharding="fsdp")
    assert uses_autocast(amp) and not uses_autocast(fsdp) and not uses_autocast(amp.with_(precision="bf16"))
    assert not uses_autocast(amp.with_(lora_rank=8))  # LoRA's frozen base is stored in bf16

    def more(model: ModelDims, stack: str, policy: str) -> float:
        return (stored_bytes(model, shape_of(model, amp, stack, 8), 0, policy)  # type: ignore[arg-type]
                - stored_bytes(model, shape_of(model, fsdp, stack, 8), 0, policy))  # type: ignore[arg-type]

    weights = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128)  # every weight's bf16 cast: 73,728
    token_h = 8 * 64
    # torchtitan: the fused norms keep an fp32 input (+2 B, twice); one cast for the fused wqkv, two for w1, w3
    assert more(m, "torchtitan", "none") == weights + 2 * 2 * token_h + 2 * token_h
    # transformers: LlamaRMSNorm's normalised tensor is fp32 (+2 B, twice); q, k, v and w1, w3 cast apart
    assert more(qwen, "transformers", "none") == weights + 2 * 2 * token_h + (2 + 1) * 2 * token_h
    # a checkpointed layer keeps its fp32 input only: the casts are recomputed in backward
    assert more(m, "torchtitan", "full") == more(m, "torchtitan", "op") == 2 * token_h


def test_encoder_decoder_keeps_the_encoder_output_once() -> None:
    from tessera.estimator.memory_recipes import native_activations

    def t5(dec: int) -> ModelDims:
        return ModelDims(64, 2, 4, 128, 32, family="encoder-decoder", ffn_hidden=128, num_decoder_layers=dec,
                         decoder_seq_length=16)

    plan = ExecutionPlan(loss="fp32")
    xd = shape_of(t5(3), plan, "transformers", 16, enc_seq=32)
    layer = stored_bytes(t5(3), xd, 0, "none", "cross")
    # one more decoder layer adds exactly its own tensors: the encoder output (2 B x 32 tokens x 64) that
    # its cross-attention K and V projections read is kept once for all layers
    diff = native_activations(t5(4), plan, 0, "transformers").stored - native_activations(t5(3), plan, 0,
                                                                                            "transformers").stored
    assert diff == layer
    names = {s.name for s in layer_saved(t5(3), xd, 0, "cross")}
    assert "cross.enc_out" not in names and "cross.k_rot" in names


def test_t5_attention_and_gelu_new() -> None:
    t5 = ModelDims(64, 2, 4, 128, 32, family="encoder-decoder", ffn_hidden=128, gated=True, kv_channels=16)
    amp = {s.name: s.nbytes for s in layer_saved(t5, _shape(stack="transformers", storage=4), 0)}
    # fp32 parameters: the fp32 relative bias sends SDPA down its fp32 math path: fp32 q, k, v, softmax
    assert amp["attn.softmax32"] == 4 * 1 * 4 * 32 * 32 and amp["attn.q32"] == 4 * 32 * 64
    bf16 = {s.name: s.nbytes for s in layer_saved(t5, _shape(stack="transformers", storage=2), 0)}
    assert bf16["attn.softmax"] == 2 * 1 * 4 * 32 * 32 and "attn.q32" not in bf16
    # gated-gelu is NewGELUActivation: tanh's output, 0.5 x and 1 + tanh, beside its input
    assert amp["mlp.gelu_new"] == 3 * 2 * 32 * 128


def test_dropless_moe_keeps_tokens_times_top_k_rows() -> None:
    from tessera.estimator.memory_layers import moe_saved

    mx = ModelDims(64, 2, 4, 128, 32, family="moe", ffn_hidden=128, gated=True, num_experts=8, top_k=2,
                   moe_every=1, capacity_factor=0)
    kept = {s.name: s.nbytes for s in moe_saved(mx, _shape())[0]}
    rows = 32 * 2  # dropless: every token goes to its top-2 experts
    assert kept["moe.rows_in"] == 2 * rows * 64 and kept["moe.w1"] == kept["moe.prod"] == 2 * rows * 128
    assert kept["moe.probs"] == 4 * 32 * 8  # fp32 routing probabilities


def test_t5_bottom_encoder_layer_moment() -> None:
    # T5 v1.1 XL (google/t5-v1_1-xl config.json) under full checkpointing: the last layer backward of the
    # step (the bottom encoder layer) is the peak: every sharded gradient exists but the root unit's
    # (shared embedding + untied head) and the two bottom encoder layers'; the root holds its two
    # unsharded bf16 gradients (head, shared embedding) as temporaries
    xl = ModelDims(2048, 24, 32, 32128, 1024, "t5-v1_1-xl", family="encoder-decoder", ffn_hidden=5120,
                   kv_channels=64, gated=True, tied_embeddings=False, decoder_seq_length=256)
    plan = ExecutionPlan(dp=8, sharding="fsdp", loss="fp32", precision="amp", checkpointing="full")
    est = native_estimate(xl, plan, 0, "transformers", device="cpu")
    assert est.moment == "the bottom encoder layer's backward"
    layer = 4 * 2048 * 2048 + 3 * 2048 * 5120 + 2 * 2048  # attention, gated MLP, two norm weights
    root = 2 * 32128 * 2048
    total = int(native_state(xl, plan, 0, "transformers").gradients) // 4 * 8
    assert est.gradients == int(4 * (total - root - 2 * layer) / 8)
    assert est.comm == 2 * layer + 4 * layer  # its all-gather buffer, the layer above's fp32 reduce-scatter input


def test_loss_parallel_and_pipeline_held_logits() -> None:
    # torchtitan's loss parallel holds 12 T V/t beside the kept log-softmax in its backward (8 T V without TP)
    n, v = 32, 128
    tp2 = ExecutionPlan(dp=2, tp=2, sequence_parallel=True, sharding="fsdp", loss="fp32", precision="amp")
    x = shape_of(TINY, tp2, "torchtitan", TINY.seq_length)
    assert loss_terms(TINY, tp2, x, True)[1] == 12 * n * v // 2
    one = ExecutionPlan(dp=2, sharding="fsdp", loss="fp32", precision="amp")
    assert loss_terms(TINY, one, shape_of(TINY, one, "torchtitan", TINY.seq_length), True)[1] == 8 * n * v
    # the last pipeline stage keeps its output (the bf16 logits) until its backward; without PP it is dropped
    pp = ExecutionPlan(dp=2, pp=2, grad_accum=1, sharding="fsdp", loss="fp32", precision="amp")
    a_pp = native_activations(TINY, pp, 1, "torchtitan")
    last_only = ExecutionPlan(dp=2, sharding="fsdp", loss="fp32", precision="amp")
    a_one = native_activations(TINY, last_only, 0, "torchtitan")
    assert a_pp.head_kept - a_one.head_kept == 2 * n * v
