"""Cells of encoder-decoder models (CellModel family "t5", estimator/cell_encdec.py): the operator chain
of a tiny T5 by hand, parameters equal to memory.num_params, the bytes a pipeline boundary carries,
stage memory, the recipe map, and the one-stage Cell's time against plan_time's for the same plan."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tessera.estimator.cell_recipe import recipe_cell_model
from tessera.estimator.cells import (
    CellConfig,
    CellEstimator,
    CellInputError,
    CellModel,
    GpuPool,
    iteration_time,
    model_operators,
    pool_links,
)
from tessera.estimator.memory import num_params
from tessera.estimator.models import REGISTERED, ModelDims
from tessera.estimator.partition import partition_stages
from tessera.estimator.plan_time import estimate_plan_time, plan_operators
from tessera.estimator.plans import ExecutionPlan, PlanInputError

# h 64, 4 heads of 16, ReLU MLP of 256, 2 encoder layers over 8 tokens, 1 decoder layer over 4, V 100
H, A, F, V, S_E, S_D = 64, 4, 256, 100, 8, 4
TINY = ModelDims(H, 2, A, V, S_E, "t5-tiny", family="encoder-decoder", ffn_hidden=F, num_decoder_layers=1,
                 decoder_seq_length=S_D)


def _tiny(recompute: bool = False, batch: int = 2) -> CellModel:
    return CellModel.from_dims(TINY, batch, recompute=recompute)


def test_tiny_t5_chain_by_hand() -> None:
    m = _tiny()
    assert (m.family, m.num_layers, m.decoder_layers, m.target_length, m.encoder_layers) == ("t5", 3, 1, S_D, 2)
    ops = model_operators(m)
    assert [o.name for o in ops] == ["embedding", "layer0", "layer1", "layer2", "head"]
    # encoder layer, per sample: weight GEMMs 2 x (4h^2 attention + 2 h F MLP) = 24 h^2 per token, 3 passes,
    # over 8 tokens; scores (unfused: every key) 4 A s per token, forward + 2 x backward
    enc = 3 * 24 * H * H * S_E + 3 * 4 * H * S_E * S_E
    assert ops[1].flops == enc == 2_408_448
    # decoder layer: the same over 4 tokens (4 keys each), plus cross-attention: q, o on 4 tokens, k, v on
    # the encoder's 8, scores of 4 queries x 8 keys
    self_att = 3 * 24 * H * H * S_D + 3 * 4 * H * S_D * S_D
    cross = 3 * (S_D * 4 * H * H + S_E * 4 * H * H) + 3 * 4 * H * S_E * S_D
    assert ops[3].flops == self_att + cross == 1_806_336
    assert ops[3].linear_flops == 3 * 24 * H * H * S_D + 3 * (S_D + S_E) * 4 * H * H
    assert ops[3].comm_calls == 6 and ops[1].comm_calls == 4
    assert ops[4].flops == 6 * H * V * S_D  # the head on the decoder's tokens
    # parameters (T5: no biases, RMS norms of one scale): attention 4h^2, MLP 2hF, 2 norms; the last
    # encoder layer also the encoder's final norm; the decoder's two attentions and 3 norms; the first
    # layer of each stack its relative position bias (32 buckets x A heads); the tied head is its final
    # norm only
    assert [o.params for o in ops] == [V * H, 4 * H * H + 2 * H * F + 2 * H + 32 * A,
                                       4 * H * H + 2 * H * F + 3 * H, 8 * H * H + 2 * H * F + 3 * H + 32 * A, H]
    assert sum(o.params for o in ops) == num_params(TINY) == 171_072
    # every boundary carries both sequences' hidden states (2-byte activations)
    assert [o.out_bytes for o in ops[:-1]] == [(S_E + S_D) * H * 2] * 4


def test_full_recompute_adds_the_forward_of_both_attentions() -> None:
    plain, rec = model_operators(_tiny()), model_operators(_tiny(recompute=True))
    fwd = 24 * H * H * S_D + 4 * H * S_D * S_D + (S_D + S_E) * 4 * H * H + 4 * H * S_E * S_D
    assert rec[3].flops - plain[3].flops == fwd == 602_112
    assert rec[3].comm_calls == 9
    assert rec[3].stored_bytes == S_D * H * 2  # the decoder layer's input only


@pytest.mark.parametrize("name", sorted(n for n, d in REGISTERED.items() if d.family == "encoder-decoder"))
def test_cell_parameters_equal_num_params(name: str) -> None:
    dims = REGISTERED[name]
    ops = model_operators(CellModel.from_dims(dims, 8))
    assert sum(o.params for o in ops) == num_params(dims)


def test_decoder_layers_attend_causally_over_the_target() -> None:
    m = CellModel.from_dims(TINY, 2, flash_attention=True)
    assert (m.attention(1).seq, m.attention(1).causal) == (S_E, False)
    assert (m.attention(2).seq, m.attention(2).causal) == (S_D, True)
    assert "-dl1-t4-" in m.signature and "untied" not in m.signature
    untied = CellModel.from_dims(REGISTERED["flan-t5-base"], 8)
    tied = CellModel.from_dims(replace(REGISTERED["flan-t5-base"], tied_embeddings=True), 8)
    assert untied.signature.replace("-untied", "") == tied.signature != untied.signature


def test_encdec_fields_are_checked_by_name() -> None:
    with pytest.raises(CellInputError) as e:
        CellModel("gpt", 64, 2, 4, 100, 8, 2, decoder_layers=1)
    assert e.value.field == "decoder_layers"
    with pytest.raises(CellInputError) as e:
        CellModel("gpt", 64, 2, 4, 100, 8, 2, tied_embeddings=False)
    assert e.value.field == "tied_embeddings"
    with pytest.raises(CellInputError) as e:
        CellModel("t5", 64, 2, 4, 100, 8, 2, decoder_layers=2, target_length=4, ffn_hidden=256)
    assert e.value.field == "decoder_layers"
    with pytest.raises(CellInputError) as e:
        CellModel("t5", 64, 3, 4, 100, 8, 2, decoder_layers=1, ffn_hidden=256)
    assert e.value.field == "target_length"


def test_a_pipeline_boundary_carries_the_encoder_output() -> None:
    est = CellEstimator()
    pool = GpuPool("A100-80GB", 2, 2)
    m = _tiny(batch=4)
    carry = (S_E + S_D) * H * 2
    rows, gpus, _ = est.stage_costs(m, pool, 2, 2, options=[[(1, 1)], [(1, 1)]], num_microbatches=2)
    first, second = rows[0][0], rows[1][0]
    assert gpus == (1, 1) and first.inter_comm == 0.0
    # forward activation + its gradient, 2 samples per micro-batch, over NVLink (one piece per GPU)
    intra, _ = pool_links(pool, est.config.links)
    assert second.inter_comm == pytest.approx(est.comm.time("p2p", 2 * carry * 2, 2, intra).seconds)
    # three stages: the cuts fall where the FLOPs say (one in the encoder, one at the decoder here), and
    # each carries both sequences
    part = partition_stages(model_operators(m), 3, 3)
    assert part.bounds == ((0, 2), (2, 3), (3, 5)) and part.cut_bytes == (carry, carry)


def test_one_stage_memory_by_hand() -> None:
    # full recompute, 1 GPU, 1 micro-batch of 2 samples: model states, every layer's input kept (the
    # head its input), and the largest operator's transient activations (an encoder layer's)
    m = _tiny(recompute=True, batch=2)
    est = CellEstimator()
    rows, _, _ = est.stage_costs(m, GpuPool("A100-80GB", 1, 1), 1, 1, num_microbatches=1)
    stored = 2 * (S_E * H * 2) + S_D * H * 2 + S_D * H * 2
    # Korthikanti's 10 sbh (5 bytes per element, written for 2 bytes) replicated, Q, K, V, output, the
    # MLP's two F-wide tensors and 5 a s score bytes sharded, per token of the encoder's 8
    transient = S_E * (5 * H * 2 + 4 * H * 2 + 2 * F * 2 + 5 * A * S_E)
    want = 171_072 * 16 + 2 * stored + 2 * transient + CellConfig().reserved_bytes
    assert rows[0][0].memory_bytes == pytest.approx(want)


def test_the_recipe_maps_onto_a_t5_and_refuses_lora_by_name() -> None:
    got = recipe_cell_model(TINY, 2, ExecutionPlan(checkpointing="op", precision="bf16"))
    assert got.model.family == "t5" and got.model.op_checkpoint and got.model.decoder_layers == 1
    ops = model_operators(got.model)
    # per-op SAC keeps, in the decoder layer, the cross-attention's q and output, v of the encoder's
    # tokens and the log-sum-exp besides the self-attention's saved outputs
    plain = recipe_cell_model(ModelDims(H, 1, A, V, S_D, ffn_hidden=F, family="decoder"), 2,
                              ExecutionPlan(checkpointing="op", precision="bf16")).model
    self_saved = model_operators(plain)[1].stored_bytes
    assert ops[3].stored_bytes - self_saved == 2 * (2 * H * S_D + H * S_E) + 4 * A * S_D
    with pytest.raises(PlanInputError) as e:
        recipe_cell_model(TINY, 2, ExecutionPlan(lora_rank=8))
    assert e.value.field == "plan.lora_rank"


def test_plan_time_times_the_same_chain() -> None:
    plan = ExecutionPlan(flash_attention=False)
    cm, ops = plan_operators(TINY, plan)
    assert cm.family == "t5"
    assert ops == model_operators(CellModel.from_dims(TINY, plan.global_batch, precision=plan.precision,
                                                      recompute=False))


@pytest.mark.parametrize(("dp", "b", "recompute"), [(1, 1, False), (4, 2, True), (8, 1, True)])
def test_one_stage_cell_time_against_plan_time(dp: int, b: int, recompute: bool) -> None:
    """The same plan (dp ranks, b micro-batches, mixed precision, ZeRO-1 over dp, flash attention) under
    the same priors: compute, recompute and the optimizer step are the same; the stated difference is
    the gradient reduction (the Cells: one whole all-reduce per iteration, Crius Sec. 5.1; plan_time:
    ZeRO-1's reduce-scatter overlapped with the last backward, then its all-gather). plan_time's host
    floor (its host_wait), which the Cells do not have, is left out."""
    dims, gb = REGISTERED["t5-base"], 32
    cfg = CellConfig()
    est = CellEstimator(cfg)
    m = CellModel.from_dims(dims, gb, recompute=recompute, flash_attention=True)
    rows, _, _ = est.stage_costs(m, GpuPool("A100-80GB", 8, 8), dp, 1, options=[[(dp, 1)]], num_microbatches=b)
    cell = rows[0][0]
    plan = ExecutionPlan(dp=dp, micro_batch=gb // (b * dp), grad_accum=b, precision="mixed",
                         sharding="zero1" if dp > 1 else "none", checkpointing="full" if recompute else "none",
                         flash_attention=True)
    pt = estimate_plan_time(dims, plan, "A100-80GB", config=cfg)
    br = pt.breakdown
    assert b * cell.compute == pytest.approx(br["compute"] + br["recompute"], rel=1e-9)
    cell_time = iteration_time([cell], b)
    device = pt.iter_time - br["host_wait"]
    assert cell_time - device == pytest.approx(cell.sync - br["optimizer"] - br["dp_comm"], rel=1e-9)
    if dp == 1:
        assert cell_time == pytest.approx(device, rel=1e-9)
    else:
        assert 0 < br["dp_comm"] < cell.sync - br["optimizer"]  # the overlap hides part of it
