"""The torchtitan stack: torchtitan's Llama 3 model (torchtitan.models.llama3) built from ModelDims,
with torchtitan's own activation checkpointing (FullAC / SelectiveAC), FSDP2 wrapping
(apply_fsdp_to_decoder: per-block fully_shard, MixedPrecisionPolicy, reshard_after_forward) and loss
(CrossEntropyLoss, or ChunkedLossWrapper for plan.loss 'chunked').

Where the trace departs from a GPU run (docs/estimator-memory.md, "Traced on real model code"):
- attention runs torchtitan's ScaledDotProductAttention module (causal SDPA) instead of its default
  FlexAttention: flex_attention is a compiled kernel that cannot run on fake CPU tensors. On CPU the
  SDPA call dispatches to the flash kernel for CPU, which stores what the GPU flash kernel stores (the
  output and the log-sum-exp, never the scores); op-level SAC saves it as it saves the GPU kernels.
- the rotary table is sized to the trained sequence (torchtitan's registry sizes it to 131072 tokens,
  a few tens of MB of buffer the formula does not count).
"""

from __future__ import annotations

from typing import Any

from tessera.estimator.memory_terms import stage_layers
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError
from tessera.estimator.torch.realtrace import session
from tessera.estimator.torch.realtrace.result import RealTrace

CHUNKS = 8  # torchtitan's ChunkedLossWrapper.Config.num_chunks default


def check_dims(m: ModelDims, plan: ExecutionPlan) -> None:
    """Refuse, by field, what torchtitan's Llama 3 cannot express."""
    if m.family != "decoder":
        raise PlanInputError("model.family", f"torchtitan's Llama 3 is a decoder; a {m.family} model needs "
                                             "stack 'transformers'")
    if not m.gated:
        raise PlanInputError("model.gated", "torchtitan's Llama 3 is LLaMA-style (gated SwiGLU, RMSNorm, no "
                                            "biases); a GPT-2-style model needs stack 'transformers'")
    for name in ("qkv_bias", "sliding_window", "logit_softcap", "sandwich_norm"):
        if getattr(m, name):
            raise PlanInputError(f"model.{name}", "torchtitan's Llama 3 has none; use stack 'transformers'")
    if m.tied_embeddings and plan.pp > 1:
        raise PlanInputError("model.tied_embeddings", "tied embeddings across pipeline stages are not "
                                                      "traced (torchtitan ties them within one stage only)")
    if plan.lora_rank:
        raise PlanInputError("plan.lora_rank", "LoRA is traced through PEFT: use stack 'transformers'")
    if plan.tp > 1:
        raise PlanInputError("plan.tp", "tensor parallelism is not traced on torchtitan's model yet")
    if plan.loss == "chunked" and (m.seq_length // plan.cp) % CHUNKS:
        raise PlanInputError("plan.loss", f"torchtitan's ChunkedLossWrapper splits the sequence into {CHUNKS} "
                                          f"chunks: model.seq_length / cp must be divisible by {CHUNKS}")


def build(m: ModelDims, layers: int, first: bool, last: bool) -> Any:
    """torchtitan's Llama3Model with `layers` blocks; the first stage holds the embedding, the last
    the final norm and output head (torchtitan's pipeline split sets the others to None)."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers

    specs = _build_llama3_layers(
        n_layers=layers, dim=m.hidden_size, n_heads=m.num_heads, n_kv_heads=m.kv_heads, hidden_dim=m.ffn,
        rope=ComplexRoPE.Config(dim=m.head_dim, max_seq_len=m.seq_length, theta=500000, scaling="llama"),
        attn_backend="flex", fuse_qkv=True)
    for spec in specs:
        spec.attention.inner_attention = ScaledDotProductAttention.Config()
        if m.kv_channels:
            spec.attention.head_dim = m.head_dim
    cfg = Llama3Model.Config(
        dim=m.hidden_size, vocab_size=m.vocab_size, enable_weight_tying=m.tied_embeddings,
        tok_embeddings=Embedding.Config(num_embeddings=m.vocab_size, embedding_dim=m.hidden_size),
        norm=RMSNorm.Config(normalized_shape=m.hidden_size),
        lm_head=Linear.Config(in_features=m.hidden_size, out_features=m.vocab_size), layers=specs)
    model = cfg.build()
    if not first:
        model.tok_embeddings = None
    if not last:
        model.norm = None
        model.lm_head = None
    return model


def _selective_ac() -> Any:
    import torch
    from torchtitan.distributed.activation_checkpoint import SelectiveAC

    class CpuSelectiveAC(SelectiveAC):  # type: ignore[misc]
        """torchtitan's op-level SAC policy, saving the CPU flash kernel as it saves the GPU ones."""

        def get_save_ops(self) -> set[Any]:
            ops: set[Any] = set(super().get_save_ops())
            ops.add(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)
            return ops

    return CpuSelectiveAC(CpuSelectiveAC.Config())


def ac_policy(plan: ExecutionPlan) -> Any:
    """torchtitan's policy for plan.checkpointing: SelectiveAC for 'op', FullAC for 'full', None."""
    from torchtitan.distributed.activation_checkpoint import FullAC

    if plan.checkpointing == "none":
        return None
    if plan.checkpointing == "selective":
        raise PlanInputError("plan.checkpointing", "'selective' (Megatron's attention-core recompute) is not "
                                                   "torchtitan's; use 'op' or 'full'")
    return _selective_ac() if plan.checkpointing == "op" else FullAC(FullAC.Config())


def apply_ac(model: Any, plan: ExecutionPlan) -> str:
    """torchtitan's AC on every block, or on every n-th one (plan.checkpoint_every = n: blocks
    n-1, 2n-1, ..., as torchtitan's layer-frequency option wrapped them)."""
    policy = ac_policy(plan)
    if policy is None:
        return "none"
    n = plan.checkpoint_every
    wrapped = 0
    for layer_id, block in list(model.layers.named_children()):
        if (int(layer_id) + 1) % n == 0:
            model.layers.register_module(layer_id, policy._wrap_block(block, base_fqn=f"layers.{layer_id}"))
            wrapped += 1
    return f"torchtitan {type(policy).__name__} on {wrapped} of {len(model.layers)} blocks"


def approximations(plan: ExecutionPlan) -> list[str]:
    out = ["attention: torchtitan ScaledDotProductAttention (the CPU flash kernel) instead of FlexAttention"]
    if plan.cp > 1:
        out.append(f"cp={plan.cp}: traced as the per-rank shape (seq/cp tokens, FSDP over dp*cp); ring "
                   "attention's exchanged K/V blocks are not traced")
    return out


def trace(m: ModelDims, plan: ExecutionPlan, stage: int) -> RealTrace:
    """One rank of `stage`: build, checkpoint, shard, and measure one training step."""
    session.quiet()
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    check_dims(m, plan)
    session.check_common(plan)
    prec = session.precision_of(plan)
    world = session.fsdp_world(plan)
    layers = stage_layers(m, plan)[stage]
    first, last = stage == 0, stage == plan.pp - 1
    b, s = plan.micro_batch, m.seq_length // plan.cp
    n_in = session.inflight(plan, stage)
    with session.fake_world(world):
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
        with session.fake_mode():
            torch.set_default_dtype(prec.storage)
            try:
                model = build(m, len(layers), first, last)
            finally:
                torch.set_default_dtype(torch.float32)
            ac = apply_ac(model, plan)
            # plan 'auto' is torchtitan's 'default' (reshard without PP, and never the final norm and
            # output head, which backward needs first)
            policy = {"auto": "default"}.get(plan.reshard_after_forward, plan.reshard_after_forward)
            apply_fsdp_to_decoder(model, mesh, param_dtype=prec.compute, reduce_dtype=prec.reduce,
                                  pp_enabled=plan.pp > 1, reshard_after_forward_policy=policy)
            model.train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
            loss_fn: Any
            if plan.loss == "chunked":
                loss_fn = ChunkedLossWrapper(ChunkedLossWrapper.Config(num_chunks=CHUNKS))
                if last:
                    loss_fn.set_lm_head(model.lm_head)
                    model._skip_lm_head = True
            else:
                loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config())

            runner = session.microbatches(model)
            loss_call = session.under_parent(loss_fn) if plan.loss == "chunked" else loss_fn

            def step() -> None:
                inputs = [torch.zeros(b, s, dtype=torch.long) if first else  # or the previous stage's output
                          torch.zeros(b, s, m.hidden_size, dtype=prec.compute, requires_grad=True)
                          for _ in range(n_in)]
                outs = runner(inputs)
                for out in outs:
                    if last:
                        loss, _ = loss_call(out, torch.zeros(b, s, dtype=torch.long))
                        loss.backward()
                    else:  # the gradient received from the next stage
                        out.backward(torch.ones_like(out))
                    del out
                outs.clear()

            detail = {"model": "torchtitan.models.llama3.Llama3Model", "stage": stage, "pp": plan.pp,
                      "layers": len(layers), "fsdp_world": world, "tokens": [b, s], "inflight": n_in,
                      "precision": prec.note, "checkpointing": ac,
                      "reshard_after_forward": policy, "loss": "torchtitan " + type(loss_fn).__name__,
                      "approximations": approximations(plan)}
            return session.measure(model, opt, step, stack="torchtitan", detail=detail)
