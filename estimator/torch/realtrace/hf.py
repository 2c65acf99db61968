"""The transformers stack: a Hugging Face model built from its config class (never downloaded) for the
ModelDims, with the recipe applied the way the HF ecosystem applies it: FSDP2 `fully_shard` per
decoder layer and at the root (what accelerate's FSDP2 plugin does), torchtitan's checkpoint wrappers
around the layers (the same torch.utils.checkpoint policies), PEFT's LoRA, and the model's own loss
(transformers' ForCausalLMLoss: logits upcast to fp32, cross-entropy; T5 the same on the decoder).

Model classes: LlamaConfig (LLaMA-style decoders), Qwen2Config (qkv_bias), MistralConfig
(sliding_window), Gemma2Config (logit_softcap / sandwich_norm), MixtralConfig (gated MoE), GPT2Config
(GPT-2-style decoders), T5Config (encoder-decoder; mT5 is the same architecture with untied
embeddings). Attention is "sdpa" throughout (docs/estimator-memory.md, "Traced on real model code").
"""

from __future__ import annotations

import importlib
from typing import Any

from tessera.estimator.memory_recipes import uses_autocast
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError
from tessera.estimator.torch.realtrace import adapters, float8, session
from tessera.estimator.torch.realtrace.result import RealTrace


def check_plan(m: ModelDims, plan: ExecutionPlan) -> None:
    if plan.pp > 1:
        raise PlanInputError("plan.pp", "transformers models are not split into pipeline stages here; "
                                        "trace pp > 1 with stack 'torchtitan'")
    if plan.tp > 1:
        raise PlanInputError("plan.tp", "tensor parallelism is not traced on transformers models")
    if plan.loss == "chunked":
        raise PlanInputError("plan.loss", "transformers computes the whole loss at once ('fp32'); "
                                          "'chunked' is torchtitan's ChunkedLossWrapper")
    if plan.checkpointing == "selective":
        raise PlanInputError("plan.checkpointing", "'selective' (Megatron's attention-core recompute) is not "
                                                   "traced here; use 'op' or 'full'")


def config_for(m: ModelDims, seq: int, flash: bool = True) -> tuple[Any, list[str]]:
    """The transformers config for `m`, and what the mapping approximates."""
    tf: Any = importlib.import_module("transformers")  # untyped use: configs take **dims

    notes: list[str] = []
    common: dict[str, Any] = {"vocab_size": m.vocab_size, "use_cache": False, "tie_word_embeddings": m.tied_embeddings}
    if m.family == "encoder-decoder":
        if m.kv_heads != m.num_heads:
            raise PlanInputError("model.num_kv_heads", "T5 has no grouped-query attention")
        cfg = tf.T5Config(d_model=m.hidden_size, d_kv=m.head_dim, d_ff=m.ffn, num_layers=m.num_layers,
                          num_decoder_layers=m.decoder_layers, num_heads=m.num_heads, dropout_rate=0.0,
                          feed_forward_proj="gated-gelu" if m.gated else "relu", **common)
        return cfg, notes
    if m.family == "encoder":
        raise PlanInputError("model.family", "BERT-style encoders are not traced on real code")
    if m.family == "moe":
        if not m.gated:
            raise PlanInputError("model.gated", "GShard-style (non-gated) MoE has no transformers class; "
                                                "Mixtral-style needs gated: true")
        if m.moe_every != 1:
            raise PlanInputError("model.moe_every", "Mixtral has experts in every layer (moe_every 1)")
        if m.capacity_factor:
            raise PlanInputError("model.capacity_factor", "Mixtral routes dropless (capacity_factor 0)")
        cfg = tf.MixtralConfig(hidden_size=m.hidden_size, intermediate_size=m.ffn, num_hidden_layers=m.num_layers,
                               num_attention_heads=m.num_heads, num_key_value_heads=m.kv_heads,
                               head_dim=m.head_dim, num_local_experts=m.num_experts,
                               num_experts_per_tok=m.top_k, max_position_embeddings=seq,
                               sliding_window=None, router_aux_loss_coef=0.0, **common)
        return cfg, notes
    if not m.gated:
        if m.kv_heads != m.num_heads or m.kv_channels:
            raise PlanInputError("model.num_kv_heads", "GPT-2 has plain multi-head attention")
        if not m.tied_embeddings:
            raise PlanInputError("model.tied_embeddings", "GPT-2 ties its output head to the embedding")
        # GPT-2 trains with dropout 0.1. Under flash attention the attention dropout runs in-kernel
        # (only its RNG state is kept); SDPA on CPU would fall back to the math kernel for it
        # (materialised scores), so the trace runs attention without it.
        cfg = tf.GPT2Config(n_embd=m.hidden_size, n_layer=m.num_layers, n_head=m.num_heads, n_positions=seq,
                            n_inner=m.ffn, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.0 if flash else 0.1,
                            **common)
        if flash:
            notes.append("GPT-2: attention dropout off under SDPA (a flash kernel drops in-kernel)")
        return cfg, notes
    dims = {"hidden_size": m.hidden_size, "intermediate_size": m.ffn, "num_hidden_layers": m.num_layers,
            "num_attention_heads": m.num_heads, "num_key_value_heads": m.kv_heads, "head_dim": m.head_dim,
            "max_position_embeddings": seq}
    if m.logit_softcap or m.sandwich_norm:
        if not m.sandwich_norm:
            raise PlanInputError("model.sandwich_norm", "logit soft-capping is Gemma 2's, whose layers have "
                                                        "sandwich norms: set sandwich_norm true")
        # Gemma 2 soft-caps the attention scores at 50 (Gemma 2 report, section 2.2), which
        # transformers computes in eager attention only (it refuses SDPA for Gemma 2); flash-attention
        # kernels apply the cap in-kernel, storing what SDPA stores. Under plan.flash_attention the
        # trace runs SDPA without the cap; otherwise eager attention with it.
        cfg = tf.Gemma2Config(final_logit_softcapping=m.logit_softcap or None,
                              attn_logit_softcapping=None if flash else 50.0,
                              sliding_window=m.sliding_window or seq, **dims, **common)
        if flash:
            notes.append("Gemma 2: SDPA without attention-score soft-capping (a flash kernel caps in-kernel)")
        return cfg, notes
    if m.sliding_window:
        # The window changes which scores a flash kernel computes, not what it stores.
        notes.append("sliding window traced as full causal attention (same stored bytes under flash kernels)")
        return tf.MistralConfig(sliding_window=None, **dims, **common), notes
    if m.qkv_bias:
        return tf.Qwen2Config(use_sliding_window=False, **dims, **common), notes
    return tf.LlamaConfig(attention_bias=False, mlp_bias=False, **dims, **common), notes


def layer_modules(model: Any) -> list[Any]:
    """The repeated blocks (FSDP units, checkpoint units) of a transformers model."""
    import torch

    def is_block(mod: Any) -> bool:  # a layer, or a layer inside a checkpoint wrapper
        inner = getattr(mod, "_checkpoint_wrapped_module", mod)
        return type(inner).__name__.endswith(("DecoderLayer", "Block"))

    blocks: list[Any] = []
    for mod in model.modules():
        for child in mod.children():
            if isinstance(child, torch.nn.ModuleList) and len(child) and is_block(child[0]):
                blocks.extend(child)
    seen: set[int] = set()
    return [b for b in blocks if not (id(b) in seen or seen.add(id(b)))]  # type: ignore[func-returns-value]


def _wrap_layers(model: Any, plan: ExecutionPlan) -> str:
    """torchtitan's checkpoint policies (torch.utils.checkpoint wrappers) around every n-th layer."""
    from tessera.estimator.torch.realtrace.titan import ac_policy

    policy = ac_policy(plan)
    if policy is None:
        return "none"
    import torch

    wrapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.ModuleList) and len(child) and \
                    type(child[0]).__name__.endswith(("DecoderLayer", "Block")):
                for i in range(len(child)):
                    if (i + 1) % plan.checkpoint_every == 0:
                        child[i] = policy._wrap_block(child[i], base_fqn=f"{name}.{i}")
                        wrapped += 1
    return f"torchtitan {type(policy).__name__} on {wrapped} layers"


def trace(m: ModelDims, plan: ExecutionPlan, stage: int) -> RealTrace:
    session.quiet()
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    check_plan(m, plan)
    session.check_common(plan)
    prec = session.precision_of(plan)
    world = session.fsdp_world(plan)
    b, s = plan.micro_batch, m.seq_length // plan.cp
    t = m.target_length // plan.cp
    rounds = session.accumulated(plan)  # grad_accum > 1: a second micro-batch beside the first's gradients
    cfg, notes = config_for(m, m.seq_length, plan.flash_attention)
    # plan.flash_attention: SDPA (the CPU flash kernel, storing what a GPU flash kernel stores) or
    # transformers' eager attention (materialised scores and probabilities)
    attn = "sdpa" if plan.flash_attention else "eager"
    gemma = type(cfg).__name__ == "Gemma2Config"
    # LoRA freezes the base: it is loaded in the compute dtype, as PEFT users load it (PEFT then
    # keeps the adapters in fp32 unless the recipe is pure bf16)
    dtype = prec.compute if plan.lora_rank else prec.storage
    with session.fake_world(world):
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
        # Built on the meta device, adapted and sharded there, then materialised as fake tensors
        # (torchtitan's flow: fully_shard on meta, then to_empty); PEFT cannot move fake parameters.
        with torch.device("meta"):
            tf: Any = importlib.import_module("transformers")
            auto = tf.AutoModelForSeq2SeqLM if m.family == "encoder-decoder" else tf.AutoModelForCausalLM
            model = auto.from_config(cfg, attn_implementation="eager" if gemma else attn, dtype=dtype)
        if gemma and plan.flash_attention:
            model.config._attn_implementation = "sdpa"
        if m.family == "encoder-decoder" and not m.tied_embeddings:
            # transformers 5's T5Config forces tie_word_embeddings (its T5 class serves T5 and T5 v1.1
            # alike); T5 v1.1 and mT5 have an output head of their own, so the trace gives it one
            model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight))
            model.config.tie_word_embeddings = False
            notes.append("T5: untied output head given its own weight (transformers 5 ties it always)")
        model.train()
        lora = adapters.apply(model, m, plan, prec) if plan.lora_rank else "none"
        f8 = float8.convert(model, plan) if plan.float8 != "none" else "none"
        ac = _wrap_layers(model, plan)
        mp = MixedPrecisionPolicy(param_dtype=prec.compute, reduce_dtype=prec.reduce)
        reshard = plan.reshards_after_forward
        amp = uses_autocast(plan)  # AMP without FSDP2: the Trainer's torch.autocast over fp32 weights
        if not amp:
            for block in layer_modules(model):
                fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
            fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        with session.fake_mode():
            model.to_empty(device="cpu")
            if m.tied_embeddings:
                model.tie_weights()
            trainable = [p for p in model.parameters() if p.requires_grad]
            opt = torch.optim.AdamW(trainable, lr=1e-4, foreach=False)

            def forward(x: Any) -> Any:
                with torch.autocast("cpu", dtype=prec.compute, enabled=amp):
                    return loss_of(x)

            def loss_of(x: Any) -> Any:
                if m.family == "encoder-decoder":
                    return model(input_ids=x, decoder_input_ids=torch.zeros(b, t, dtype=torch.long),
                                 labels=torch.zeros(b, t, dtype=torch.long)).loss
                return model(input_ids=x, labels=x).loss  # the Trainer keeps only the loss through backward

            # the FSDP root's second forward in one step (gradient accumulation) is accepted by the
            # tracker only below a parent module
            run = session.under_parent(forward)

            def step() -> None:
                for _ in range(rounds):
                    loss = run(torch.zeros(b, s, dtype=torch.long))
                    loss.backward()
                    del loss

            detail = {"model": type(model).__name__, "config": type(cfg).__name__, "stage": stage,
                      "fsdp_world": world, "accumulated": rounds, "tokens": [b, s] if m.family != "encoder-decoder" else [b, s, t],
                      "precision": session.AUTOCAST if amp else prec.note, "checkpointing": ac, "lora": lora, "float8": f8,
                      "reshard_after_forward": reshard, "loss": "transformers ForCausalLMLoss (fp32 logits)",
                      "approximations": notes + adapters.notes(plan)
                      + ([f"cp={plan.cp}: traced as the per-rank shape (seq/cp tokens)"] if plan.cp > 1 else [])}
            return session.measure(model, opt, step, stack="transformers", detail=detail)
