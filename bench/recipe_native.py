"""The torchtitan cases of bench/estimator_gpu_recipes.py without torchtitan: where its build fails
(the device image's torch is older than the one torchtitan 0.3.0 was installed against here), the
same recipe is applied with torch's and torchao's own APIs to a transformers Llama of the same dims,
the way torchtitan applies it:

- FSDP2 `fully_shard` on every decoder layer and on the root over a one-rank mesh, bf16 params and
  fp32 reduce (MixedPrecisionPolicy), resharded after forward (torchtitan's default without PP);
- `op`: torchtitan's per-op selective checkpointing policy (torchtitan/distributed/
  activation_checkpoint.py, SelectiveAC: save the outputs of compute-intensive ops, attention and
  reductions, but recompute every second matmul), `full`: checkpoint_wrapper around each layer;
- `compile`: torch.compile of each decoder layer (after AC, before FSDP, as torchtitan orders it);
- `float8 linear`: torchao's convert_to_float8_training with the rowwise recipe (torchtitan's
  default) on the linears whose dims are multiples of 16;
- loss `fp32`: logits upcast to fp32, summed cross-entropy over the tokens; `chunked` is torchtitan's
  ChunkedLossWrapper and has no stand-in here (the builder refuses it).
"""

from __future__ import annotations

from typing import Any

from recipe_cases import Case


def _sac_context_fn() -> Any:
    """torchtitan 0.3.0's SelectiveAC policy, restated (its save list without the MoE/DeepEP ops)."""
    import torch
    from torch._functorch.partitioners import get_default_op_list
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save = {op.default for op in get_default_op_list().compute_intensive_ops}
    for name in ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
                 "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_fused_attention_overrideable", "max", "linear"):
        op = getattr(torch.ops.aten, name, None)
        if op is not None:
            save.add(op.default)
    mm_ops = (torch.ops.aten.mm.default, torch.ops.aten.linear.default)
    meta = {"forward": 0, "recompute": 0}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in mm_ops:
            meta[mode] += 1
        if func in save:
            if func in mm_ops and meta[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def build_native(case: Case, device: str) -> tuple[Any, Any, Any]:
    """(model, loss_fn, optimizer) with the interfaces recipe_steps.train_torchtitan drives:
    model(tokens) -> logits, loss_fn(logits, labels, n_tokens) -> (loss, {})."""
    import torch
    import transformers
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    d, plan = case.dims, case.plan
    if plan.loss == "chunked":
        raise NotImplementedError("loss 'chunked' is torchtitan's ChunkedLossWrapper: no native stand-in")
    config = transformers.LlamaConfig(
        hidden_size=d.hidden_size, intermediate_size=d.ffn, num_hidden_layers=d.num_layers,
        num_attention_heads=d.num_heads, num_key_value_heads=d.kv_heads, vocab_size=d.vocab_size,
        tie_word_embeddings=d.tied_embeddings, max_position_embeddings=max(4096, d.seq_length),
        rope_theta=500000.0, use_cache=False)
    config._attn_implementation = "sdpa"
    torch.set_default_device(device)
    try:
        model = transformers.AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_device("cpu")
    if plan.float8 != "none":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        f8 = Float8LinearConfig.from_recipe_name("rowwise")
        # as torchtitan's Float8LinearConverter sets it for rowwise (pytorch/pytorch#150859)
        torch._inductor.config.emulate_precision_casts = True
        if device != "cuda":  # no fp8 matmuls on a CPU: torchao's emulation (eager only)
            f8 = Float8LinearConfig(emulate=True)
        convert_to_float8_training(
            model, config=f8,
            module_filter_fn=lambda m, fqn: m.in_features % 16 == 0 and m.out_features % 16 == 0)
    layers = model.model.layers
    for i, layer in enumerate(layers):
        if plan.checkpointing == "op":
            layer = checkpoint_wrapper(layer, context_fn=_sac_context_fn, preserve_rng_state=True)
        elif plan.checkpointing == "full":
            layer = checkpoint_wrapper(layer, preserve_rng_state=True)
        if plan.compile:
            layer = torch.compile(layer, backend="inductor" if device == "cuda" else "aot_eager")
        layers[i] = layer
    mesh = init_device_mesh(device, (1,), mesh_dim_names=("fsdp",))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    model.train()

    class Forward(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids=tokens).logits  # type: ignore[no-any-return]

    def loss_fn(pred: torch.Tensor, labels: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, dict]:
        loss = torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum")
        return loss / n, {}

    optimizer = torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.95), weight_decay=0.1,
                                  fused=device == "cuda")
    return Forward(model), loss_fn, optimizer
