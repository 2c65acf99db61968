"""The reference trainer's pure parts: plan checks, batch layout, model resolution, synthetic data."""

from __future__ import annotations

import signal

import pytest

from tessera.clients.trainer import ModelDims, Plan, TrainerContext
from tessera.clients.trainer.reference.cli import main
from tessera.clients.trainer.reference.config import (
    EXIT_UNSUPPORTED,
    Options,
    Unsupported,
    batch_layout,
    parse_options,
    resolve,
    resolve_model,
    resolve_model_arch,
)
from tessera.clients.trainer.reference.data import MarkovData, rank_slice

TINY = ModelDims("t", 32, 2, 2, 64, 32)


def ctx_for(plan: Plan, world_size: int, global_batch: int, model: ModelDims = TINY) -> TrainerContext:
    return TrainerContext(plan=plan, world_size=world_size, global_batch_size=global_batch, model=model,
                          iterations=10)


@pytest.mark.parametrize(
    ("global_batch", "dp", "micro", "accum", "expected"),
    [
        (32, 4, 2, 4, (2, 4)),  # exact: kept
        (32, 4, 4, 4, (4, 2)),  # too big: the plan's micro batch is kept, accumulation shrinks
        (24, 2, 5, 1, (4, 3)),  # largest divisor of 12 that is <= 5
        (7, 1, 8, 1, (7, 1)),  # micro batch larger than the per-rank batch
        (13, 1, 4, 1, (1, 13)),  # a prime per-rank batch
    ],
)
def test_batch_layout_keeps_the_global_batch(global_batch: int, dp: int, micro: int, accum: int,
                                             expected: tuple[int, int]) -> None:
    mb, ga, note = batch_layout(global_batch, dp, micro, accum)
    assert (mb, ga) == expected and mb * ga * dp == global_batch
    assert (note == "") == ((micro, accum) == expected)


@pytest.mark.parametrize(("global_batch", "dp", "why"), [(10, 4, "not divisible by dp=4"), (0, 1, "> 0")])
def test_batch_layout_impossible(global_batch: int, dp: int, why: str) -> None:
    with pytest.raises(Unsupported, match=why):
        batch_layout(global_batch, dp, 1, 1)


def test_resolve_refuses_what_the_trainer_cannot_run_with_one_line() -> None:
    with pytest.raises(Unsupported, match=r"^plan dp=2 does not match WORLD_SIZE=1 \(tp=pp=1\)$"):
        resolve(ctx_for(Plan(dp=2, micro_batch=4), 1, 8), Options())
    with pytest.raises(Unsupported, match=r"^plan dp=1 x tp=2 x pp=2 = 4 processes does not match WORLD_SIZE=2$"):
        resolve(ctx_for(Plan(dp=1, tp=2, pp=2, micro_batch=4), 2, 4), Options())
    with pytest.raises(Unsupported, match="tp=4 does not divide the model's num_heads=2"):
        resolve(ctx_for(Plan(dp=1, tp=4, micro_batch=4), 4, 4), Options())
    with pytest.raises(Unsupported, match="pp=4 has more pipeline stages than the model has layers"):
        resolve(ctx_for(Plan(dp=1, pp=4, micro_batch=4), 4, 4), Options())
    with pytest.raises(Unsupported, match="1f1b with pp=2 needs at least 2 micro-batches per step"):
        resolve(ctx_for(Plan(dp=2, pp=2, micro_batch=1, pp_schedule="1f1b"), 4, 2), Options())


def test_resolve_tp_pp_and_options() -> None:
    cfg = resolve(ctx_for(Plan(dp=1, tp=2, pp=2, micro_batch=2, grad_accum=4), 4, 8), Options())
    assert (cfg.tp, cfg.pp, cfg.micro_batch, cfg.grad_accum, cfg.pp_schedule, cfg.zero_stage) == (2, 2, 2, 4, "1f1b", 0)
    assert cfg.describe() == "dp=1 tp=2 pp=2 replicated schedule=1f1b"
    # 1F1B needs >= pp micro-batches: the micro batch shrinks (the global batch stays).
    cfg = resolve(ctx_for(Plan(dp=1, pp=2, micro_batch=8), 2, 8), Options())
    assert (cfg.micro_batch, cfg.grad_accum, cfg.pp_schedule) == (4, 2, "1f1b") and "1F1B" in cfg.notes[0]
    # ... and a default schedule falls back to GPipe when one sample per micro-batch is still too few.
    cfg = resolve(ctx_for(Plan(dp=2, pp=2, micro_batch=1), 4, 2), Options())
    assert (cfg.micro_batch, cfg.grad_accum, cfg.pp_schedule) == (1, 1, "gpipe")
    cfg = resolve(ctx_for(Plan(dp=1, pp=2, micro_batch=2, grad_accum=4, pp_schedule="gpipe"), 2, 8), Options())
    assert (cfg.micro_batch, cfg.grad_accum, cfg.pp_schedule) == (2, 4, "gpipe") and cfg.notes == ()
    # ZeRO-1 and offload without sharding run as ZeRO-2, said in a note.
    cfg = resolve(ctx_for(Plan(dp=2, micro_batch=4, zero_stage=1), 2, 8), Options())
    assert cfg.zero_stage == 2 and "ZeRO-2" in cfg.notes[0]
    cfg = resolve(ctx_for(Plan(dp=2, micro_batch=4, offload="optimizer", activation_checkpointing="full"), 2, 8),
                  Options())
    assert (cfg.zero_stage, cfg.offload, cfg.activation_checkpointing) == (2, "optimizer", "full")
    assert cfg.describe() == "dp=2 tp=1 pp=1 zero2(fsdp2) offload=optimizer activation-checkpointing=full"
    cfg = resolve(ctx_for(Plan(dp=2, micro_batch=4, zero_stage=3, offload="optimizer+params"), 2, 8), Options())
    assert (cfg.zero_stage, cfg.offload, cfg.notes) == (3, "optimizer+params", ())


@pytest.mark.parametrize(("extra", "why"), [
    ({"sequence_parallel": True}, "sequence_parallel is not supported"),
    ({"virtualStages": 2}, r"interleaved 1F1B \(virtual_stages > 1\) is not supported"),
    ({"ep": 2}, r"ep=2: expert parallelism needs a mixture of experts"),
    # the estimator refuses Megatron's selective recompute under flash attention (its default): so does the trainer
    ({"checkpointing": "selective"}, "under flash attention it changes nothing"),
    ({"checkpointing": "selective", "flash_attention": True}, "under flash attention it changes nothing"),
    ({"checkpointing": "selective", "flashAttention": "maybe"}, "is not true or false"),
])
def test_resolve_refuses_estimator_options_it_cannot_run(extra: dict[str, object], why: str) -> None:
    plan = Plan.from_dict({"dp": 2, "micro_batch": 4, **extra})
    with pytest.raises(Unsupported, match=why):
        resolve(ctx_for(plan, 2, 8), Options())
    # Their defaults (and options that change nothing this trainer does) only make a note.
    plan = Plan.from_dict({"dp": 2, "micro_batch": 4, "sequence_parallel": False, "virtual_stages": 1,
                           "precision": "fp32"})
    assert "ignoring plan fields" in resolve(ctx_for(plan, 2, 8), Options()).notes[-1]


def test_resolve_runs_selective_recompute_on_plain_attention() -> None:
    plan = Plan.from_dict({"dp": 2, "micro_batch": 4, "checkpointing": "selective", "flash_attention": False})
    cfg = resolve(ctx_for(plan, 2, 8), Options())
    assert (cfg.activation_checkpointing, cfg.flash_attention, cfg.notes) == ("selective", False, ())
    assert cfg.describe() == "dp=2 tp=1 pp=1 ddp activation-checkpointing=selective plain-attention"
    assert resolve(ctx_for(Plan.from_dict({"dp": 2, "micro_batch": 4}), 2, 8), Options()).flash_attention


def test_plan_reads_the_estimators_vocabulary() -> None:
    p = Plan.from_dict({"dp": 4, "sharding": "fsdp", "offload": "optimizer+params", "checkpointing": "selective"})
    assert (p.zero_stage, p.offload, p.activation_checkpointing, dict(p.extra)) == (3, "optimizer+params",
                                                                                    "selective", {})
    p = Plan.from_dict({"dp": 4, "zero": 2, "offload": True, "activation_checkpointing": True})
    assert (p.zero_stage, p.offload, p.activation_checkpointing) == (2, "optimizer", "full")
    assert Plan.from_dict(p.to_dict()) == p
    # common.proto's ExecutionPlan in protobuf's JSON mapping (enum names, camelCase).
    p = Plan.from_dict({"dp": 2, "microBatch": 4, "sharding": "SHARDING_ZERO2", "offload": "OFFLOAD_OPTIMIZER_AND_PARAMS",
                        "checkpointing": "CHECKPOINTING_SELECTIVE", "schedule": "PIPELINE_SCHEDULE_GPIPE",
                        "precision": "PRECISION_FP32"})
    assert (p.zero_stage, p.offload, p.activation_checkpointing, p.pp_schedule, dict(p.extra)) == (
        2, "optimizer+params", "selective", "gpipe", {"precision": "PRECISION_FP32"})
    p = Plan.from_dict({"sharding": "SHARDING_UNSPECIFIED", "offload": "OFFLOAD_UNSPECIFIED",
                        "checkpointing": "CHECKPOINTING_NONE", "schedule": "PIPELINE_SCHEDULE_UNSPECIFIED",
                        "gradient_checkpointing": False})
    assert (p.zero_stage, p.offload, p.activation_checkpointing, p.pp_schedule) == (0, "none", "none", "")


def test_resolve_dp_plan() -> None:
    cfg = resolve(ctx_for(Plan(dp=2, micro_batch=2, grad_accum=2), 2, 8), Options())
    assert (cfg.micro_batch, cfg.grad_accum, cfg.global_batch, cfg.checkpoint_every) == (2, 2, 8, 10)
    assert cfg.notes == ()


def test_resolve_model() -> None:
    assert resolve_model(TINY) == TINY
    with pytest.raises(Unsupported, match="missing dimensions"):
        resolve_model(ModelDims(name="no-such-model"))
    with pytest.raises(Unsupported, match="not divisible by num_heads=3"):
        resolve_model(ModelDims("odd", 32, 1, 3, 64, 8))


def test_resolve_registered_model_name() -> None:
    models = pytest.importorskip("tessera.estimator.models")
    known = models.registered("gpt2-small")
    if known is None:
        pytest.skip("gpt2-small is not registered")
    m = resolve_model(ModelDims(name="gpt2-small", seq_length=128))
    assert (m.hidden_size, m.num_layers, m.num_heads, m.vocab_size, m.seq_length) == (
        known.hidden_size, known.num_layers, known.num_heads, known.vocab_size, 128)


def test_options_from_flags_and_env() -> None:
    o = parse_options(["--seed", "7", "--lr", "0.01", "--untied-head"],
                      {"TESSERA_TORCH_THREADS": "2", "TESSERA_TRAINER_MIN_STEP_SECONDS": "0.25"})
    assert (o.seed, o.lr, o.tied_head, o.torch_threads, o.min_step_seconds) == (7, 0.01, False, 2, 0.25)
    assert parse_options([], {}) == Options()
    assert parse_options(["--local_rank=3"], {}) == Options()  # DeepSpeed's launcher passes it


def test_cli_exits_3_before_importing_torch(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TESSERA_PLAN", '{"dp": 1, "tp": 2, "pp": 1, "micro_batch": 4, "grad_accum": 1}')
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert main([]) == EXIT_UNSUPPORTED
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    assert capsys.readouterr().err == "plan dp=1 x tp=2 x pp=1 = 2 processes does not match WORLD_SIZE=4\n"


def test_markov_data_is_a_pure_function_of_seed_and_index() -> None:
    a, b = MarkovData(64, 32, seed=1), MarkovData(64, 32, seed=1)
    assert a.sample(12345) == b.sample(12345)
    assert a.samples(10, 3) == [a.sample(10), a.sample(11), a.sample(12)]
    s = a.sample(0)
    assert len(s) == 33 and all(0 <= t < 64 for t in s)
    assert MarkovData(64, 32, seed=2).sample(0) != s or MarkovData(64, 32, seed=2).sample(1) != a.sample(1)
    # Low entropy: most transitions follow the first successor.
    first = a._first
    seqs = a.samples(0, 50)
    hits = sum(seq[i + 1] == first[seq[i]] for seq in seqs for i in range(32))
    assert hits / (50 * 32) > 0.8


def test_rank_slice_partitions_each_global_batch() -> None:
    assert [rank_slice(3, 8, 2, r) for r in (0, 1)] == [(24, 4), (28, 4)]
    assert rank_slice(3, 8, 1, 0) == (24, 8)


RECIPE_REFUSALS = [
    ({"cp": 2}, "cp=2", r"context parallelism \(cp > 1\)"),
    ({"checkpointing": "op"}, "checkpointing=op", "per-op selective checkpointing"),
    ({"checkpointing": "full", "checkpoint_every": 2}, "checkpoint_every=2", "every n-th layer"),
    ({"sharding": "fsdp", "reshard_after_forward": "never"}, "reshard_after_forward='RESHARD_NEVER'", "FSDP2"),
    ({"loss": "chunked"}, "loss='LOSS_CHUNKED'", "chunked loss"),
    ({"float8": "linear"}, "float8='FLOAT8_LINEAR'", "Float8"),
    ({"compile": True}, "compile=True", "torch.compile"),
    ({"lora_rank": 16}, "lora_rank=16", r"LoRA \(lora_rank > 0\)"),
    ({"lora_rank": 16, "offload": "frozen"}, "offload=frozen", "frozen base weights"),
]


@pytest.mark.parametrize(("recipe", "field", "why"), RECIPE_REFUSALS, ids=[r[1] for r in RECIPE_REFUSALS])
def test_the_reference_trainer_refuses_a_recipe_by_name(recipe: dict[str, object], field: str, why: str) -> None:
    """The job's recipe as the controller launches it (controller.convert.plan_pb: the scheduler's sizes,
    the job's recipe on top), through the agent's TESSERA_PLAN (nodeagent.contract.plan_json), refused
    by the reference trainer with the field named: never trained as a plain full fine-tune."""
    import json

    from tessera.controller.convert import plan_pb
    from tessera.controller.core.snapshot import PlanChoice
    from tessera.estimator.convert import plan_fields
    from tessera.estimator.plans import ExecutionPlan
    from tessera.nodeagent.contract import plan_json

    texts = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in recipe.items()}
    job_recipe = plan_fields(texts)
    choice = PlanChoice(2, 1, 1, 4, 1, "A100-80GB", 0, "formula", ExecutionPlan(dp=2, micro_batch=4))
    plan = Plan.from_dict(json.loads(plan_json(plan_pb(choice, job_recipe))))
    with pytest.raises(Unsupported, match=why) as err:
        resolve(ctx_for(plan, 2, 8), Options())
    assert field in str(err.value), str(err.value)
    # the defaults a scheduler's whole plan carries (LOSS_FUSED, FLOAT8_NONE, ...) ask for nothing
    plain = Plan.from_dict(json.loads(plan_json(plan_pb(choice))))
    assert resolve(ctx_for(plain, 2, 8), Options()).zero_stage == 0


def _contract_model(name: str, by_name: bool) -> ModelDims:
    """The model as the agent gives it (nodeagent.contract.model_json of the spec: the family fields ride
    along), or by registered name."""
    import json

    from tessera.estimator.convert import model_spec
    from tessera.estimator.models import REGISTERED
    from tessera.nodeagent.contract import model_json
    from tessera.v1 import common_pb2

    spec = common_pb2.ModelSpec(name=name) if by_name else model_spec(REGISTERED[name])
    return ModelDims.from_dict(json.loads(model_json(spec)))


@pytest.mark.parametrize(("name", "by_name", "why"), [
    ("t5-small", False, r"model.family=encoder_decoder"),
    ("mt5-base", True, r"model.family=encoder_decoder"),
    ("bert-base", True, r"model.family=encoder"),
    ("gemma2-2b", True, r"model.sandwich_norm=True: sandwich norms"),
    ("gemma2-2b", False, r"model.sandwich_norm=True: sandwich norms"),
    ("moe-690m", True, r"model.family=moe without model.gated: GShard-style"),
    ("moe-690m", False, r"model.family=moe without model.gated: GShard-style"),
])
def test_the_reference_trainer_refuses_a_model_it_does_not_build(name: str, by_name: bool, why: str) -> None:
    """Refused with the field named, not trained as another model under its name."""
    with pytest.raises(Unsupported, match=why):
        resolve_model(_contract_model(name, by_name))


@pytest.mark.parametrize(("name", "by_name"), [
    ("llama3.1-8b", False), ("llama3.1-8b", True), ("llama3.2-1b", True), ("mixtral-8x7b", True),
    ("mixtral-8x7b", False), ("qwen2.5-0.5b", True), ("qwen2.5-7b", False), ("mistral-7b-v0.3", True),
    ("llama2-7b", True),
])
def test_registered_llama_and_mixtral_models_resolve_with_their_real_structure(name: str, by_name: bool) -> None:
    """A registered LLaMA / Mixtral / Qwen2.5 name (or its spec with the family fields) is built as that
    architecture, with its real dimensions: GQA, MLP width, head width, q/k/v biases, tied or not, experts."""
    from tessera.estimator.models import REGISTERED

    known = REGISTERED[name]
    model, arch = resolve_model_arch(_contract_model(name, by_name))
    assert (model.hidden_size, model.num_layers, model.num_heads, model.vocab_size, model.seq_length) == (
        known.hidden_size, known.num_layers, known.num_heads, known.vocab_size, known.seq_length)
    assert arch.gated
    assert (arch.kv_heads, arch.head_dim, arch.ffn, arch.qkv_bias, arch.tied_embeddings) == (
        known.kv_heads, known.head_dim, known.ffn, known.qkv_bias, known.tied_embeddings)
    assert (arch.num_experts, arch.moe) == (known.num_experts, known.family == "moe")
    if arch.moe:
        assert (arch.top_k, arch.moe_every) == (known.top_k, known.moe_every)
        assert all(arch.is_moe_layer(i) == known.is_moe_layer(i) for i in range(known.num_layers))


GATED = {"gated": True, "num_kv_heads": 2, "ffn_hidden": 48}
MOE = {**GATED, "family": "MODEL_FAMILY_MOE", "num_experts": 4, "top_k": 2, "moe_every": 1, "dropless": True}


@pytest.mark.parametrize(("fields", "why"), [
    ({"num_kv_heads": 2}, r"model.num_kv_heads=2 is not built for a GPT-2-style model"),
    ({"ffn_hidden": 48}, r"model.ffn_hidden=48 is not built for a GPT-2-style model"),
    ({**GATED, "num_kv_heads": 3}, r"model.num_kv_heads=3 does not divide num_heads=4"),
    ({**GATED, "kv_channels": 7}, r"head width 7 .* is odd"),
    ({**GATED, "num_experts": 4}, r"model.num_experts=4: only the moe family has experts"),
    ({**MOE, "dropless": False}, r"model.dropless=false: routing with a capacity factor"),
    ({**MOE, "top_k": 5}, r"model.top_k=5 is more than num_experts=4"),
    ({**MOE, "moe_every": 3}, r"model.moe_every=3 puts experts in none of the 2 layers"),
    ({**GATED, "sliding_window": 8}, r"model.sliding_window=8: sliding-window attention"),
    ({**GATED, "logit_softcap": 30.0}, r"model.logit_softcap=30.0: logit soft-capping"),
])
def test_structures_not_built_are_refused_by_field(fields: dict[str, object], why: str) -> None:
    with pytest.raises(Unsupported, match=why):
        resolve_model(ModelDims.from_dict({**MODEL4, **fields}))


MODEL4 = {"name": "t", "hidden_size": 32, "num_layers": 2, "num_heads": 4, "vocab_size": 64, "seq_length": 16}


def test_gated_and_moe_fields_resolve_to_what_is_built() -> None:
    _, arch = resolve_model_arch(ModelDims.from_dict({**MODEL4, **GATED, "qkv_bias": True, "untiedEmbeddings": True}))
    assert (arch.kind, arch.kv_heads, arch.head_dim, arch.ffn, arch.qkv_bias, arch.tied_embeddings, arch.moe) == (
        "llama", 2, 8, 48, True, False, False)
    assert arch.describe() == "llama-kv2-d8-f48-qkvbias-untied"
    # common.proto's defaults: top_k 0 = 2, moe_every 0 = 2; a hand-written capacity_factor 0 is dropless too.
    _, arch = resolve_model_arch(ModelDims.from_dict({**MODEL4, **MOE, "top_k": 0, "moe_every": 0, "dropless": False,
                                                      "capacity_factor": 0, "kv_channels": 16,
                                                      "tied_embeddings": False}))
    assert (arch.num_experts, arch.top_k, arch.moe_every, arch.head_dim, arch.tied_embeddings) == (4, 2, 2, 16, False)
    assert [arch.is_moe_layer(i) for i in range(2)] == [False, True]
    # A GPT-2-style model with untied embeddings is built untied (it was trained tied before).
    _, arch = resolve_model_arch(ModelDims.from_dict({**MODEL4, "untied_embeddings": True}))
    assert (arch.kind, arch.tied_embeddings) == ("gpt2", False)


def test_tensor_parallelism_must_split_whole_kv_heads_and_mlp_columns() -> None:
    model = ModelDims.from_dict({**MODEL4, **GATED})
    with pytest.raises(Unsupported, match=r"plan tp=4 does not divide the model's num_kv_heads=2"):
        resolve(ctx_for(Plan(dp=1, tp=4, micro_batch=4), 4, 4, model), Options())
    odd = ModelDims.from_dict({**MODEL4, **GATED, "ffn_hidden": 45})
    with pytest.raises(Unsupported, match=r"plan tp=2 does not divide the model's ffn_hidden=45"):
        resolve(ctx_for(Plan(dp=1, tp=2, micro_batch=4), 2, 4, odd), Options())
    cfg = resolve(ctx_for(Plan(dp=1, tp=2, micro_batch=4), 2, 4, model), Options())
    assert cfg.structure.kv_heads == 2 and cfg.arch is not None and cfg.arch.gated
    assert resolve(ctx_for(Plan(dp=1, micro_batch=4), 1, 4), Options()).structure.kind == "gpt2"


def test_gpt2_style_models_still_resolve_with_their_family_fields() -> None:
    import json

    from tessera.estimator.convert import model_spec
    from tessera.estimator.models import REGISTERED
    from tessera.nodeagent.contract import model_json

    for name in ("gpt2-small", "gpt2-medium"):
        model = ModelDims.from_dict(json.loads(model_json(model_spec(REGISTERED[name]))))
        assert "family" in model.extra  # the refinements travel...
        assert resolve_model(model).hidden_size == REGISTERED[name].hidden_size  # ...and ask for nothing
    assert resolve_model(ModelDims(name="gpt2-small")).num_layers == 12


MOE_DIMS = ModelDims("m", 64, 2, 4, 96, 16, extra={"family": "MODEL_FAMILY_MOE", "gated": True, "num_kv_heads": 2,
                                                  "ffn_hidden": 96, "num_experts": 4, "top_k": 2, "moe_every": 1,
                                                  "dropless": True})


def test_expert_parallelism_runs_with_every_expert_on_every_rank() -> None:
    # The Cells give a MoE ep = dp; it exited 3, and every such job failed all its attempts (a live audit).
    cfg = resolve(ctx_for(Plan.from_dict({"dp": 2, "micro_batch": 4, "ep": 2}), 2, 8, MOE_DIMS), Options())
    assert any(n.startswith("ep=2 runs with every expert on every data-parallel rank") for n in cfg.notes)
    assert not any("ignoring plan fields" in n and "ep" in n for n in cfg.notes)
    with pytest.raises(Unsupported, match="ep=4 does not divide dp=2"):
        resolve(ctx_for(Plan.from_dict({"dp": 2, "micro_batch": 4, "ep": 4}), 2, 8, MOE_DIMS), Options())

