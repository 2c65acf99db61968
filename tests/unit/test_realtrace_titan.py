"""The real-code trace on torchtitan's Llama 3 (fake tensors, FSDP2 over a fake process group).

Parameter counts are derived by hand from the tiny model below, torchtitan's layout (fused wqkv,
SwiGLU w1/w2/w3, two RMSNorms per block, untied output head):
  per block: wqkv (a + 2 kv) d h = 8*16*64 = 8192, wo a d h = 4096, w1 + w3 = 2 h f = 16384,
  w2 = f h = 8192, norms 2 h = 128  ->  36992
  N = embedding V h 16384 + 2 blocks 73984 + final norm 64 + head V h 16384 = 106816 in 17 tensors.
FSDP2 keeps fp32 sharded parameters (4 N / dp bytes) and AdamW m, v (8 N / dp) plus a 4-byte `step`
per tensor.
"""

from __future__ import annotations

import pytest

from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError

pytest.importorskip("torch")
pytest.importorskip("torchtitan")

from tessera.estimator.torch.realtrace import pick_stack, trace_real, trace_real_peak

TINY = ModelDims(64, 2, 4, 256, 64, name="tiny-llama3", gated=True, num_kv_heads=2, ffn_hidden=128,
                 tied_embeddings=False)
N = 106816
TENSORS = 17
FSDP = ExecutionPlan(dp=4, sharding="fsdp", loss="fp32")


def test_categories_sum_to_peak() -> None:
    tr = trace_real(TINY, FSDP, stack="torchtitan")
    assert tr.stack == "torchtitan"
    assert tr.peak == tr.parameters + tr.gradients + tr.optimizer + tr.activations + tr.other
    assert tr.activations > 0 and tr.detail["layers"] == 2


@pytest.mark.parametrize(("dp", "sharding"), [(1, "none"), (2, "fsdp"), (4, "fsdp")])
def test_fsdp_divides_parameters_and_optimizer_by_dp(dp: int, sharding: str) -> None:
    tr = trace_real(TINY, ExecutionPlan(dp=dp, sharding=sharding, loss="fp32"), stack="torchtitan")
    raw = tr.detail["tracker_peak"]
    assert raw["Sharded Param"] == 4 * N // dp
    assert tr.optimizer == raw["OptState"] == 8 * N // dp + 4 * TENSORS
    assert tr.detail["fsdp_world"] == dp


@pytest.mark.parametrize("sp", [True, False])
def test_tensor_parallel_shards_over_dp_times_tp(sp: bool) -> None:
    # torchtitan's TP plan shards every matrix over tp (embedding and head included) and replicates
    # the RMSNorm weights (5 of 64: two per block and the final one), which FSDP then shards over dp
    norms = 5 * 64
    tr = trace_real(TINY, ExecutionPlan(dp=2, tp=2, sequence_parallel=sp, sharding="fsdp", loss="fp32"),
                    stack="torchtitan")
    raw = tr.detail["tracker_peak"]
    assert raw["Sharded Param"] == 4 * (N - norms) // 4 + 4 * norms // 2
    assert tr.optimizer == 8 * (N - norms) // 4 + 8 * norms // 2 + 4 * TENSORS
    assert (tr.detail["tp"], tr.detail["sequence_parallel"]) == (2, sp)


def test_tensor_parallel_inside_pipeline_stages() -> None:
    model = ModelDims(64, 4, 4, 256, 64, gated=True, num_kv_heads=2, ffn_hidden=128, tied_embeddings=False)
    plan = ExecutionPlan(dp=2, tp=2, pp=2, grad_accum=2, sequence_parallel=True, sharding="fsdp", loss="fp32")
    last = trace_real(model, plan, stack="torchtitan", stage=1)
    # the last stage: 2 blocks (2 * 36992, norms 4 * 64), final norm 64, head 16384 over dp*tp, norms over dp
    norms = 5 * 64
    n = 2 * 36992 + 64 + 16384
    assert last.detail["tracker_peak"]["Sharded Param"] == 4 * (n - norms) // 4 + 4 * norms // 2


def test_tied_embedding_is_one_tensor() -> None:
    tied = TINY.__class__(64, 2, 4, 256, 64, gated=True, num_kv_heads=2, ffn_hidden=128, tied_embeddings=True)
    tr = trace_real(tied, FSDP, stack="torchtitan")
    assert tr.optimizer == 8 * (N - 256 * 64) // 4 + 4 * (TENSORS - 1)


def test_bf16_recipe_halves_parameters_and_optimizer() -> None:
    tr = trace_real(TINY, FSDP.with_(precision="bf16"), stack="torchtitan")
    assert tr.detail["tracker_peak"]["Sharded Param"] == 2 * N // 4
    assert tr.optimizer == 4 * N // 4 + 4 * TENSORS


def test_op_sac_stores_less_than_none_and_more_than_full() -> None:
    # enough blocks that the stored checkpoints of all of them, not one block's recompute, set the peak
    model = ModelDims(256, 6, 4, 256, 512, gated=True, num_kv_heads=2, ffn_hidden=512, tied_embeddings=False)
    acts = {ck: trace_real(model, FSDP.with_(checkpointing=ck), stack="torchtitan").activations
            for ck in ("none", "op", "full")}
    assert acts["none"] > acts["op"] > acts["full"]


def test_checkpoint_every_wraps_every_nth_block() -> None:
    model = ModelDims(64, 4, 4, 256, 64, gated=True, num_kv_heads=2, ffn_hidden=128, tied_embeddings=False)
    tr = trace_real(model, FSDP.with_(checkpointing="full", checkpoint_every=2), stack="torchtitan")
    assert tr.detail["checkpointing"] == "torchtitan FullAC on 2 of 4 blocks"


def test_pipeline_stages_hold_their_micro_batches() -> None:
    model = ModelDims(64, 4, 4, 256, 64, gated=True, num_kv_heads=2, ffn_hidden=128, tied_embeddings=False)
    plan = ExecutionPlan(dp=2, pp=2, grad_accum=4, sharding="fsdp", loss="fp32")
    first = trace_real(model, plan, stack="torchtitan", stage=0)
    last = trace_real(model, plan, stack="torchtitan", stage=1)
    assert (first.detail["inflight"], last.detail["inflight"]) == (2, 1)
    # PP keeps parameters unsharded after forward (torchtitan's default): the bf16 copy of the stage
    # (2 bytes per parameter) stays next to the fp32 shard (4 / dp = 2 bytes per parameter)
    raw = first.detail["tracker_peak"]
    assert raw["Unsharded Param"] == raw["Sharded Param"]
    assert trace_real_peak(model, plan, stack="torchtitan").peak == max(first.peak, last.peak)


def test_grad_accumulation_runs_beside_the_first_micro_batch_gradients() -> None:
    from tessera.estimator.memory_recipes import native_estimate

    # torchtitan's trainer runs grad_accum (forward, loss, backward) pairs before one optimizer step;
    # FSDP2 accumulates the reduce-scattered fp32 shards in param.grad, so the second micro-batch's
    # peak holds all of them: 4 N / dp bytes. A third micro-batch repeats the second.
    plan = FSDP.with_(precision="amp", grad_accum=2)
    tr = trace_real(TINY, plan, stack="torchtitan")
    assert tr.detail["accumulated"] == 2
    assert tr.gradients == tr.detail["tracker_peak"]["Sharded Grad"] == 4 * N // 4
    n = native_estimate(TINY, plan, 0, "torchtitan", device="cpu")
    formula = n.parameters + n.gradients + n.optimizer + n.activations + n.comm
    assert n.gradients == tr.gradients
    assert abs(formula - tr.peak) <= 0.02 * tr.peak, tr.to_dict()
    one = trace_real(TINY, plan.with_(grad_accum=1), stack="torchtitan")
    assert one.gradients < tr.gradients and one.detail["accumulated"] == 1
    assert trace_real(TINY, plan.with_(grad_accum=3), stack="torchtitan").peak == tr.peak


def test_chunked_loss_and_context_parallel_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.tensor.experimental._context_parallel import _attention

    chunked = trace_real(TINY, FSDP.with_(loss="chunked"), stack="torchtitan")
    assert chunked.detail["loss"] == "torchtitan ChunkedLossWrapper"
    rings: list[int] = []
    ring = _attention._templated_ring_attention
    monkeypatch.setattr(_attention, "_templated_ring_attention", lambda *a, **k: rings.append(1) or ring(*a, **k))
    cp = trace_real(TINY, ExecutionPlan(dp=2, cp=2, sharding="fsdp", loss="fp32"), stack="torchtitan")
    assert len(rings) == 2  # torch's ring attention ran in each block's forward
    # FSDP shards over dp*cp ranks, each rank holds seq/cp tokens
    assert cp.detail["fsdp_world"] == 4 and cp.detail["tokens"] == [1, 32]
    assert cp.detail["tracker_peak"]["Sharded Param"] == 4 * N // 4
    # the CP dispatcher is process-wide: a TP trace after it must not be ringed
    tp = trace_real(TINY, ExecutionPlan(dp=2, tp=2, sequence_parallel=True, sharding="fsdp", loss="fp32"),
                    stack="torchtitan")
    assert len(rings) == 2 and tp.peak > 0
    # without data sharding torchtitan still shards over the cp ranks
    replicas = trace_real(TINY, ExecutionPlan(dp=2, cp=2, loss="fp32"), stack="torchtitan")
    assert replicas.detail["tracker_peak"]["Sharded Param"] == 4 * N // 2


def test_float8_all_gather_halves_the_gathered_weights() -> None:
    model = ModelDims(512, 2, 4, 256, 1024, gated=True, num_kv_heads=2, ffn_hidden=1024, tied_embeddings=False)
    plan = ExecutionPlan(dp=4, sharding="fsdp", loss="fp32", precision="megatron-bf16")
    bf16 = trace_real(model, plan.with_(float8="linear"), stack="torchtitan")
    f8 = trace_real(model, plan.with_(float8="linear+allgather"), stack="torchtitan")
    assert "Float8Linear" in bf16.detail["float8"]
    # every block linear converted: 5 per block (wqkv, wo, w1, w2, w3), the head left in bf16
    assert bf16.detail["float8"].startswith("torchao Float8Linear (tensorwise) on 10 linears")
    assert f8.detail["tracker_peak"]["All Gather"] < bf16.detail["tracker_peak"]["All Gather"]


@pytest.mark.parametrize(("model", "plan", "field"), [
    (TINY, ExecutionPlan(dp=4, sharding="fsdp"), "plan.loss"),  # fused is Megatron's
    (TINY, ExecutionPlan(dp=2, sharding="zero2", loss="fp32"), "plan.sharding"),
    (TINY, ExecutionPlan(pp=2, loss="fp32", compile=True), "plan.compile"),
    (TINY.__class__(64, 2, 4, 256, 64, gated=False), ExecutionPlan(loss="fp32"), "model.gated"),
    (TINY, ExecutionPlan(loss="fp32", precision="mixed-adafactor"), "plan.precision"),
])
def test_refusals_name_the_field(model: ModelDims, plan: ExecutionPlan, field: str) -> None:
    with pytest.raises(PlanInputError) as e:
        trace_real(model, plan, stack="torchtitan")
    assert e.value.field == field


def test_auto_picks_torchtitan_for_llama_and_transformers_otherwise() -> None:
    assert pick_stack(TINY, FSDP) == "torchtitan"
    assert pick_stack(TINY, FSDP.with_(lora_rank=4)) == "transformers"
    assert pick_stack(ModelDims(64, 2, 4, 256, 64), FSDP) == "transformers"
    with pytest.raises(PlanInputError) as e:
        trace_real(TINY, FSDP, stage=1)
    assert e.value.field == "stage"
