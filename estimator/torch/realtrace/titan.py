"""The torchtitan stack: torchtitan's Llama 3 model (torchtitan.models.llama3) built from ModelDims,
with torchtitan's own tensor parallelism (its Llama 3 sharding plan and Module.parallelize on the
partial_dtensor backend: DTensor on the TP axis, loss parallel), activation checkpointing (FullAC /
SelectiveAC), FSDP2 wrapping (apply_fsdp_to_decoder: per-block fully_shard, MixedPrecisionPolicy,
reshard_after_forward) and loss (CrossEntropyLoss, or ChunkedLossWrapper for plan.loss 'chunked'),
in the order parallelize_llama applies them, on a model built on the meta device and materialised
as fake tensors.

Where the trace departs from a GPU run (docs/estimator-memory.md, "Traced on real model code"):
- attention runs torchtitan's ScaledDotProductAttention module instead of its default FlexAttention
  (flex_attention is a compiled kernel that cannot run on fake CPU tensors), calling the GPU
  flash-attention op directly (_flash_attention_config): it stores the output and the log-sum-exp,
  never the scores, as FlexAttention does; op-level SAC saves it; torch's context-parallel
  dispatcher rings it.
- the rotary table is sized to the trained sequence (torchtitan's registry sizes it to 131072 tokens,
  a few tens of MB of buffer the formula does not count).
- context parallelism runs through torchtitan's apply_cp_to_forward and torch's ring attention over
  the fake process group (seq/cp tokens per rank, FSDP over dp*cp), without the positions torchtitan
  passes for the load-balanced split (the rotary angles, not the bytes, depend on them).
- pipeline stages run their 1F1B in-flight micro-batches (forwards, then backwards), not
  torch.distributed.pipelining's schedule objects; the step does what torchtitan's trainer does with
  the model output: without PP it is dropped before loss.backward() (`del pred`), under PP the last
  stage's output stays referenced until its backward, as the pipelining stage's fwd_cache keeps it.
- without PP, grad_accum > 1 runs two (forward, loss, backward) micro-batches before the optimizer
  step, as torchtitan's trainer runs gradient_accumulation_steps of them: the second runs beside the
  sharded gradients FSDP2 accumulated from the first (later ones repeat the second's memory).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tessera.estimator.memory_recipes import uses_autocast
from tessera.estimator.memory_terms import stage_layers
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError
from tessera.estimator.torch.realtrace import float8, session
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
    if plan.loss == "chunked" and (m.seq_length // plan.cp) % CHUNKS:
        raise PlanInputError("plan.loss", f"torchtitan's ChunkedLossWrapper splits the sequence into {CHUNKS} "
                                          f"chunks: model.seq_length / cp must be divisible by {CHUNKS}")


def build(m: ModelDims, layers: int, first: bool, last: bool, sp: bool | None = None) -> Any:
    """torchtitan's Llama3Model with `layers` blocks; the first stage holds the embedding, the last
    the final norm and output head (torchtitan's pipeline split sets the others to None). With `sp`
    set, the config carries torchtitan's TP sharding plan (sequence parallel or not), as
    Llama3Model.Config.update_from_config fills it."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.config_utils import make_gqa_config
    from torchtitan.models.llama3 import _LINEAR_INIT, Llama3Model, _build_llama3_layers, _depth_init

    specs = _build_llama3_layers(
        n_layers=layers, dim=m.hidden_size, n_heads=m.num_heads, n_kv_heads=m.kv_heads, hidden_dim=m.ffn,
        rope=ComplexRoPE.Config(dim=m.head_dim, max_seq_len=m.seq_length, theta=500000, scaling="llama"),
        attn_backend="flex", fuse_qkv=True)
    for i, spec in enumerate(specs):
        if m.kv_channels:  # a per-head width of its own: the same GQA config, with head_dim set
            spec.attention = make_gqa_config(
                dim=m.hidden_size, n_heads=m.num_heads, n_kv_heads=m.kv_heads, head_dim=m.head_dim,
                wqkv_param_init=_LINEAR_INIT, wo_param_init=_depth_init(i), fuse_qkv=True,
                inner_attention=_flash_attention_config(), rope=spec.attention.rope)
        spec.attention.inner_attention = _flash_attention_config()
    cfg = Llama3Model.Config(
        dim=m.hidden_size, vocab_size=m.vocab_size, enable_weight_tying=m.tied_embeddings,
        tok_embeddings=Embedding.Config(num_embeddings=m.vocab_size, embedding_dim=m.hidden_size),
        norm=RMSNorm.Config(normalized_shape=m.hidden_size),
        lm_head=Linear.Config(in_features=m.hidden_size, out_features=m.vocab_size), layers=specs)
    if sp is not None:
        from torchtitan.models.llama3.sharding import set_llama3_sharding_config

        set_llama3_sharding_config(cfg, enable_sp=sp)
    model = cfg.build()
    if not first:
        model.tok_embeddings = None
    if not last:
        model.norm = None
        model.lm_head = None
    return model


def _flash_attention_config() -> Any:
    """torchtitan's ScaledDotProductAttention calling the GPU flash-attention op itself.

    F.scaled_dot_product_attention on CPU tensors picks the CPU flash kernel, which torch's context
    parallel dispatcher has no rule for; the GPU op (aten._scaled_dot_product_flash_attention, with
    grouped-query heads natively, as FlashAttention-2) runs on fake CPU tensors through its meta
    implementation, stores what a GPU step stores (output, log-sum-exp, RNG state) and is the op
    context_parallel's ring attention and op-level SAC know."""
    import torch
    from torchtitan.models.common.attention import ScaledDotProductAttention

    class GpuFlashAttention(ScaledDotProductAttention):  # type: ignore[misc]
        def forward(self, q: Any, k: Any, v: Any, *, attention_masks: Any = None, scale: float | None = None,
                    enable_gqa: bool = False, is_causal: bool = True, **kwargs: Any) -> Any:
            out = torch.ops.aten._scaled_dot_product_flash_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.0, is_causal, scale=scale)[0]
            return out.transpose(1, 2)

    class Config(ScaledDotProductAttention.Config):  # type: ignore[misc]
        def build(self, **kwargs: Any) -> Any:
            return GpuFlashAttention(self)

    return Config()


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


@contextlib.contextmanager
def _cpu_meshes() -> Iterator[None]:
    """torchtitan builds its meshes on its module-level device type (cuda when no accelerator is
    found) and reads the SPMD backend from a global: CPU meshes and 'partial_dtensor' (DTensor on
    the TP axis, FSDP2 on the data axis: torchtitan's classic path) while tracing, restored after,
    and the context-parallel dispatcher switched off again."""
    import torchtitan.distributed.parallel_dims as pdims
    from torch.distributed.tensor.experimental._attention import _disable_context_parallel_dispatcher
    from torchtitan.distributed.utils import get_spmd_backend, set_spmd_backend

    device, backend = pdims.device_type, get_spmd_backend()
    pdims.device_type = "cpu"
    set_spmd_backend("partial_dtensor")
    try:
        yield
    finally:
        pdims.device_type = device
        set_spmd_backend(backend)
        # apply_cp_to_forward enables torch's CP dispatcher for every DTensor SDPA op, process-wide;
        # left on, a later trace's TP-sharded attention would be ringed too
        _disable_context_parallel_dispatcher()


def approximations(plan: ExecutionPlan) -> list[str]:
    attention = ("attention: torchtitan's ScaledDotProductAttention module calling the GPU flash-attention op "
                 "(aten._scaled_dot_product_flash_attention) instead of FlexAttention, which is compiled")
    out = [attention]
    if plan.cp > 1 and plan.tp == 1:
        out.append("cp: positions are not passed (rotary angles of the local chunk); the bytes do not depend "
                   "on them")
    if plan.cp > 1 and plan.tp > 1:
        out.append("cp with tp: traced as the per-rank shape (seq/cp tokens, FSDP over dp*cp) without ring "
                   "attention's K/V exchange: torchtitan's CP wrapper meets TP's local tensors in a mixed "
                   "DTensor op on this path")
    return out


def trace(m: ModelDims, plan: ExecutionPlan, stage: int) -> RealTrace:
    """One rank of `stage`: build, checkpoint, shard, and measure one training step."""
    session.quiet()
    import torch
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    check_dims(m, plan)
    session.check_common(plan)
    prec = session.precision_of(plan)
    world = session.fsdp_world(plan)
    layers = stage_layers(m, plan)[stage]
    first, last = stage == 0, stage == plan.pp - 1
    b, s = plan.micro_batch, m.seq_length // plan.cp
    n_in = session.inflight(plan, stage)
    rounds = session.accumulated(plan)  # without PP, grad_accum > 1 runs a second micro-batch after the first
    tp = plan.tp
    with session.fake_world(world * tp), _cpu_meshes():
        # the FSDP mesh folds the cp ranks in (torchtitan's "fsdp" = dp_shard x cp)
        dims = ParallelDims(dp_replicate=1, dp_shard=world // plan.cp, cp=plan.cp, tp=tp, pp=1, ep=1,
                            world_size=world * tp,
                            spmd_backend="partial_dtensor")
        dims.build_mesh()
        # torchtitan's flow: build on the meta device, convert, TP-shard, checkpoint, FSDP-wrap, then
        # materialise (here as fake tensors; DeviceMesh and FSDP's init cannot run under a fake mode)
        with torch.device("meta"):
            torch.set_default_dtype(prec.storage)
            try:
                model = build(m, len(layers), first, last, sp=plan.sequence_parallel if tp > 1 else None)
            finally:
                torch.set_default_dtype(torch.float32)
        f8 = float8.convert(model, plan) if plan.float8 != "none" else "none"
        ring = plan.cp > 1 and tp == 1
        if ring:  # before parallelize, as parallelize_llama orders them
            from torchtitan.distributed.context_parallel import apply_cp_to_forward

            apply_cp_to_forward([blk.attention.inner_attention for blk in model.layers.values()],
                                dims.get_mesh("cp"))
        if tp > 1:
            model.parallelize(dims)
        ac = apply_ac(model, plan)
        # plan 'auto' is torchtitan's 'default' (reshard without PP, and never the final norm and
        # output head, which backward needs first)
        policy = {"auto": "default"}.get(plan.reshard_after_forward, plan.reshard_after_forward)
        amp = uses_autocast(plan)  # no FSDP2: torchtitan's maybe_enable_amp turns torch.autocast on instead
        if not amp:
            apply_fsdp_to_decoder(model, dims.get_mesh("fsdp"), param_dtype=prec.compute, reduce_dtype=prec.reduce,
                                  pp_enabled=plan.pp > 1, reshard_after_forward_policy=policy)
        with session.fake_mode():
            model.to_empty(device="cpu")
            model.train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
            loss_fn: Any
            if plan.loss == "chunked":
                loss_fn = ChunkedLossWrapper(ChunkedLossWrapper.Config(num_chunks=CHUNKS))
                if last:
                    loss_fn.set_lm_head(model.lm_head)
                    model._skip_lm_head = True
            else:
                loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config(global_vocab_size=m.vocab_size))

            runner = session.microbatches(model)
            loss_call = session.under_parent(loss_fn) if plan.loss == "chunked" else loss_fn

            def received() -> Any:
                """A later stage's input: the previous stage's output, in the TP layout its first block takes
                (sequence-sharded under SP, replicated otherwise), as torchtitan's stages pass it on."""
                if tp == 1:
                    return torch.zeros(b, s, m.hidden_size, dtype=prec.compute, requires_grad=True)
                from torch.distributed.tensor import DTensor, Replicate, Shard

                local = torch.zeros(b, s // tp if plan.sequence_parallel else s, m.hidden_size, dtype=prec.compute,
                                    requires_grad=True)
                return DTensor.from_local(local, dims.get_mesh("tp"),
                                          [Shard(1) if plan.sequence_parallel else Replicate()], run_check=False)

            held: list[Any] = []

            def step() -> None:
                for _ in range(rounds):
                    micro_batches()

            def micro_batches() -> None:
                inputs = [torch.zeros(b, s, dtype=torch.long) if first else received() for _ in range(n_in)]
                with torch.autocast("cpu", dtype=prec.compute, enabled=amp):
                    outs = runner(inputs)
                while outs:
                    out = outs.pop(0)
                    if last:
                        with torch.autocast("cpu", dtype=prec.compute, enabled=amp):
                            loss, _ = loss_call(out, torch.zeros(b, s, dtype=torch.long))
                        if plan.pp > 1:
                            # torch.distributed.pipelining keeps the stage's output in its fwd_cache until
                            # that micro-batch's backward (stage.py, forward_one_chunk / backward_one_chunk)
                            held.append(out)
                        # else torchtitan's trainer drops `pred` before `loss.backward()`
                        # (trainer.py, _forward_backward_body: `del pred`)
                        del out
                        loss.backward()
                        held.clear()
                    else:  # the gradient received from the next stage
                        out.backward(torch.ones_like(out))
                        del out

            detail = {"model": "torchtitan.models.llama3.Llama3Model", "stage": stage, "pp": plan.pp,
                      "layers": len(layers), "fsdp_world": world, "tp": tp, "sequence_parallel": plan.sequence_parallel,
                      "tokens": [b, s], "inflight": n_in, "accumulated": rounds,
                      "precision": session.AUTOCAST if amp else prec.note, "checkpointing": ac, "float8": f8,
                      "reshard_after_forward": policy, "loss": "torchtitan " + type(loss_fn).__name__,
                      "context_parallel": (f"torchtitan apply_cp_to_forward, ring attention over {plan.cp} ranks" if ring
                                           else f"per-rank shape over {plan.cp} ranks" if plan.cp > 1 else "none"),
                      "approximations": approximations(plan)}
            return session.measure(model, opt, step, stack="torchtitan", detail=detail)
