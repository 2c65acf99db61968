"""The job's recipe in the Cells (estimator/cell_recipe.py): hand-derived terms for LoRA, per-op SAC,
precision bytes, the fields kept from the Cells when the job does not set them, refusals by name and
the stated warnings."""

from __future__ import annotations

import pytest

from tessera.estimator.cell_recipe import JobRecipe, recipe_cell_model, recipe_on
from tessera.estimator.cells import CellEstimator, CellModel, GpuPool, model_operators
from tessera.estimator.models import ModelDims, registered
from tessera.estimator.plans import ExecutionPlan, PlanInputError

# GPT-2 style (two-matrix MLP, LayerNorm), small enough to count by hand: h 64, 4 heads of 16,
# FFN 128 (ffn_mult 2), 2 layers, 16 tokens.
H, A, F, L, V, S = 64, 4, 128, 2, 128, 16
DIMS = ModelDims(hidden_size=H, num_layers=L, num_heads=A, vocab_size=V, seq_length=S, ffn_hidden=F)
POOL = GpuPool("A100-80GB", 8, 8)


def _job(**given: object) -> JobRecipe:
    return JobRecipe(ExecutionPlan(**given), frozenset(given))  # type: ignore[arg-type]


def _model(recipe: JobRecipe | ExecutionPlan | None, **kw: object) -> CellModel:
    return recipe_cell_model(DIMS, 4, recipe, flash_attention=True, **kw).model  # type: ignore[arg-type]


def _stage_memory(m: CellModel, gpus: int = 1) -> float:
    rows, _, _ = CellEstimator().stage_costs(m, POOL, gpus, 1, options=[[(gpus, 1)]], num_microbatches=1)
    return rows[0][0].memory_bytes


def test_no_recipe_is_the_cells_own_model() -> None:
    assert _model(None) == CellModel.from_dims(DIMS, 4, flash_attention=True)
    assert _model(_job()) == _model(None)  # a plan that sets nothing


def test_fields_the_job_does_not_set_keep_the_cells_choice() -> None:
    m = _model(_job(lora_rank=8))
    assert m.precision == "mixed" and m.recompute and m.flash_attention  # the Cells' own
    # a whole ExecutionPlan says every recipe field: its precision and checkpointing count
    whole = _model(ExecutionPlan(lora_rank=8))
    assert whole.precision == "megatron-bf16" and not whole.recompute
    assert _model(_job(flash_attention=False)).flash_attention is False


def test_precision_sets_the_state_bytes() -> None:
    # memory_terms.RECIPES: bf16 2+2+4 = 8 B/param, megatron-bf16 2+4+12 = 18, mixed 2+2+12 = 16
    bf16 = _model(_job(precision="bf16"))
    assert (bf16.weight_grad_bytes, bf16.optimizer_bytes_per_param, bf16.dtype_bytes) == (4.0, 4.0, 2)
    meg = _model(_job(precision="megatron-bf16"))
    assert (meg.weight_grad_bytes, meg.optimizer_bytes_per_param) == (6.0, 12.0)
    params = sum(o.params for o in model_operators(_model(None)))
    # same activations (2-byte), states 16 vs 8 B/param on one GPU (no DP: nothing sharded)
    assert _stage_memory(_model(None)) - _stage_memory(bf16) == pytest.approx(8 * params)


def test_lora_holds_the_frozen_base_as_weights_only() -> None:
    full, lora = _model(None), _model(_job(lora_rank=4))
    p = sum(o.params for o in model_operators(full))
    # adapters on q, k, v, o (64 -> 64) and the MLP (64 -> 128, 128 -> 64): r (in + out) each
    adapters = L * 4 * (4 * (H + H) + (H + F) + (F + H))
    ops = model_operators(lora)
    assert sum(o.frozen_params for o in ops) == p
    assert sum(o.params for o in ops) == p + adapters
    # mixed: 16 B per trained parameter; the frozen base keeps its 2-byte weights only
    assert _stage_memory(full) - _stage_memory(lora) == pytest.approx(16 * p - (2 * p + 16 * adapters))
    qlora = _model(_job(lora_rank=4, base_quant="nf4"))
    assert _stage_memory(lora) - _stage_memory(qlora) == pytest.approx((2 - 0.5) * p)
    offloaded = _model(_job(lora_rank=4, offload="frozen"))
    assert _stage_memory(lora) - _stage_memory(offloaded) == pytest.approx(2 * p)


def test_lora_flops_skip_the_base_weight_gradient_and_add_the_adapters() -> None:
    full_ops = model_operators(_model(None))
    lora_ops = model_operators(_model(_job(lora_rank=4)))
    # the head: 6hvs (forward, input and weight gradient) -> 4hvs
    assert lora_ops[-1].flops == pytest.approx(4 * H * V * S)
    # a layer, fully recomputed (4 weight-GEMM passes): one pass less; adapters 2r(in + out) per token
    # forward, x3 to train, +1 recomputed
    lin_pass = full_ops[1].linear_flops / 4
    ad = 2 * 4 * (4 * (H + H) + (H + F) + (F + H)) * S
    assert lora_ops[1].flops == pytest.approx(full_ops[1].flops - lin_pass + 4 * ad)


def test_op_sac_lies_between_none_and_full() -> None:
    none, op, full = (_model(_job(checkpointing=c)) for c in ("none", "op", "full"))
    # per-op SAC keeps the input, q, v, the attention output, the first MLP output (2 B each) and the
    # fp32 logsumexp: 2 (64 + 64 + 64 + 64 + 128) + 4 x 4 = 784 B per token
    assert model_operators(op)[1].stored_bytes == 784 * S
    assert model_operators(full)[1].stored_bytes == 2 * H * S
    assert _stage_memory(full) < _stage_memory(op) < _stage_memory(none)
    # recompute: half the weight GEMMs' forward (plan_time.py's rule), not the attention core
    lin_fwd = (2 * 4 * H * H + 2 * 2 * (F / H) * H * H) * S
    f_none, f_op = model_operators(none)[1].flops, model_operators(op)[1].flops
    assert f_op - f_none == pytest.approx(lin_fwd / 2)
    assert model_operators(full)[1].flops > f_op


def test_checkpoint_every_recomputes_every_nth_layer_only() -> None:
    m = _model(_job(checkpointing="full", checkpoint_every=2))
    ops = model_operators(m)
    assert ops[1].stored_bytes > ops[2].stored_bytes == 2 * H * S  # layer 0 keeps all, layer 1 its input


def test_fsdp_recipe_shards_every_one_stage_option() -> None:
    est = CellEstimator()
    m = _model(_job(sharding="fsdp"))
    cell = est.cell(m, POOL, 4, 1)
    assert cell.fits and cell.plan is not None and all(s.sharding == "fsdp" for s in cell.plan.stages if s.dp > 1)
    # dp 4: ZeRO-1 shards Adam's 12 B/param over the 4 ranks, "none" keeps it whole
    params = sum(o.params for o in model_operators(_model(None)))
    none, zero1 = _stage_memory(_model(_job(sharding="none")), 4), _stage_memory(_model(_job(sharding="zero1")), 4)
    assert none - zero1 == pytest.approx(12 * params * (1 - 1 / 4))
    assert _stage_memory(_model(None), 4) == zero1  # the Cells' own choice is ZeRO-1
    assert est.cell(_model(_job(sharding="fsdp", reshard_after_forward="always")), POOL, 4, 2).reason.startswith(
        "plan.reshard_after_forward")


def test_float8_needs_fp8_tensor_cores_and_speeds_the_gemms() -> None:
    m = _model(_job(float8="linear"))
    est = CellEstimator()
    a100 = est.cell(m, POOL, 1, 1)
    assert not a100.fits and a100.reason.startswith("plan.float8")
    h100 = GpuPool("H100-80GB", 8, 8)
    fp8, bf16 = est.cell(m, h100, 1, 1), est.cell(_model(None), h100, 1, 1)
    assert fp8.fits and fp8.stage_costs[0].compute < bf16.stage_costs[0].compute
    assert model_operators(m)[-1].linear_flops == 0  # the output projection stays bf16 (torchtitan)


@pytest.mark.parametrize(("given", "field"), [
    ({"cp": 2}, "plan.cp"), ({"tp": 2}, "plan.tp"), ({"sharding": "zero2"}, "plan.sharding"),
    ({"checkpointing": "selective", "flash_attention": False}, "plan.checkpointing"),
    ({"offload": "optimizer"}, "plan.offload"), ({"schedule": "gpipe"}, "plan.schedule"),
])
def test_what_the_cells_cannot_express_is_refused_by_name(given: dict[str, object], field: str) -> None:
    with pytest.raises(PlanInputError) as exc:
        _model(_job(**given))
    assert exc.value.field == field


def test_lora_on_moe_is_refused() -> None:
    moe = ModelDims(hidden_size=H, num_layers=L, num_heads=A, vocab_size=V, seq_length=S, family="moe", num_experts=4)
    with pytest.raises(PlanInputError) as exc:
        recipe_cell_model(moe, 4, _job(lora_rank=4))
    assert exc.value.field == "plan.lora_rank"


def test_partial_fields_come_with_a_warning() -> None:
    got = recipe_cell_model(DIMS, 4, _job(loss="chunked", compile=True, float8="linear"))
    assert [w.split(":")[0] for w in got.warnings] == ["plan.loss", "plan.float8", "plan.compile"]
    assert got.model.compiled and got.model.float8 == "linear"
    assert recipe_cell_model(DIMS, 4, _job(lora_rank=4)).warnings == ()


def test_fp32_loss_keeps_the_log_softmax() -> None:
    ops = model_operators(_model(_job(loss="fp32")))
    assert ops[-1].stored_bytes - model_operators(_model(None))[-1].stored_bytes == 4 * S * V


def test_recipes_change_the_signature_and_cache_key() -> None:
    sigs = {_model(r).signature for r in (None, _job(lora_rank=4), _job(lora_rank=8), _job(checkpointing="op"))}
    assert len(sigs) == 4
    assert _job(lora_rank=4).key == "lora_rank=4"


def test_recipe_on_puts_the_job_fields_over_a_scheduler_plan() -> None:
    plan = recipe_on(_job(lora_rank=16, precision="bf16"), ExecutionPlan(dp=2, tp=2, micro_batch=4))
    assert (plan.dp, plan.tp, plan.micro_batch, plan.lora_rank, plan.precision) == (2, 2, 4, 16, "bf16")


def test_lora_8b_fits_one_24gb_gpu_where_the_full_fine_tune_does_not() -> None:
    dims = registered("llama3.1-8b")
    assert dims is not None
    short = ModelDims(**{**dims.__dict__, "seq_length": 2048})
    pool = GpuPool("L4-24GB", 8, 8)
    est = CellEstimator()
    full = est.cell(recipe_cell_model(short, 8, None, flash_attention=True).model, pool, 1, 1)
    lora = est.cell(recipe_cell_model(short, 8, _job(lora_rank=16), flash_attention=True).model, pool, 1, 1)
    assert not full.fits and "memory" in full.reason
    assert lora.fits and lora.memory_per_gpu is not None and lora.memory_per_gpu.value < 24e9


def test_lora_under_fsdp_shards_the_frozen_base_and_reduces_only_the_adapters() -> None:
    est = CellEstimator()
    zero1 = _model(_job(lora_rank=4, sharding="zero1"))
    rows, _, place = est.stage_costs(zero1, POOL, 4, 1, options=[[(4, 1)]], num_microbatches=1)
    base = rows[0][0]
    sharded = est._fsdp(base, _model(_job(lora_rank=4, sharding="fsdp")), POOL, place)
    ops = model_operators(zero1)
    frozen = sum(o.frozen_params for o in ops)
    adapters = sum(o.params - o.frozen_params for o in ops)
    largest = max(o.params for o in ops)
    # mixed: frozen 2 B, adapters 2 + 2 B (weights, gradients; Adam sharded by ZeRO-1 already), 3/4 of
    # it goes; FSDP adds two gathered units (2 B) and one unsharded gradient (2 B) of the largest unit
    want = (2 * frozen + 4 * adapters) * (1 - 1 / 4) - largest * (2 * 2 + 2)
    assert base.memory_bytes - sharded.memory_bytes == pytest.approx(want)
    assert sharded.plan.sharding == "fsdp"
