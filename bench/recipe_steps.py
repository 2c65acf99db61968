"""The torch side of bench/estimator_gpu_recipes.py: build a case's model with its recipe through the
stack's own APIs (torchtitan; transformers + PEFT), run real training steps, time them, and read the
CUDA allocator's peaks. Imported only in the process that runs a case."""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from cuda_stats import CudaPeak
from recipe_cases import Case, tiny_llama


@dataclass
class StepRun:
    step_s: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


def _init_dist(device: str) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        # One rank: FSDP2's fully_shard and torchtitan's meshes need a process group even so.
        dist.init_process_group("nccl" if device == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1)


def _tiny_tt_config() -> Any:
    """A torchtitan Llama 3 config of the tiny dims, built by torchtitan's own layer builder."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers

    d = tiny_llama(0, "tiny")
    dim, heads = d.hidden_size, d.num_heads
    return Llama3Model.Config(
        dim=dim, vocab_size=d.vocab_size,
        tok_embeddings=Embedding.Config(num_embeddings=d.vocab_size, embedding_dim=dim),
        norm=RMSNorm.Config(normalized_shape=dim),
        lm_head=Linear.Config(in_features=dim, out_features=d.vocab_size),
        enable_weight_tying=True,
        layers=_build_llama3_layers(
            n_layers=d.num_layers, dim=dim, n_heads=heads, n_kv_heads=d.num_kv_heads, hidden_dim=d.ffn,
            rope=ComplexRoPE.Config(dim=dim // heads, max_seq_len=4096, theta=500000, scaling="llama"),
            attn_backend="flex"),
    )


def build_torchtitan(case: Case, device: str, tiny: bool) -> tuple[Any, Any, Any]:
    """(model, loss_fn, optimizer) through torchtitan's own builders, as its Trainer assembles them."""
    import torch
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.components.optimizer import default_adamw
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import llama3_configs, parallelize_llama

    plan = case.plan
    cfg = _tiny_tt_config() if case.arch == "tiny" else llama3_configs[case.arch](attn_backend="flex")
    # Plain causal SDPA (flash/cuDNN kernels) as torchtitan's graph_trainer tests set it: the
    # batches are single documents, so no block-causal mask is needed.
    for layer in cfg.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    # torch.compile on CPU would compile C++ with inductor (minutes on 2 cores): the dry run checks
    # the same dynamo/AOT path with the aot_eager backend.
    compile_cfg = CompileConfig(enable=plan.compile, components=["model", "loss"],
                                backend="inductor" if device == "cuda" else "aot_eager")
    if plan.float8 != "none":
        from torchtitan.components.quantization import Float8LinearConverter

        # torchtitan's default Float8 recipe (rowwise scaling). Without an fp8 GPU the CPU dry run
        # emulates the fp8 matmuls (torchtitan's `emulate`, eager only) to run the same conversion.
        cfg = Float8LinearConverter.Config(model_compile_enabled=plan.compile,
                                           emulate=device != "cuda").build().convert(cfg)
    parallelism = ParallelismConfig()
    dist_utils.set_spmd_backend(parallelism.spmd_backend)
    training = TrainingConfig(local_batch_size=plan.micro_batch, seq_len=case.dims.seq_length)
    if device != "cuda":
        # torchtitan takes its device type from torch._utils._get_available_device_type() or "cuda";
        # on a machine without an accelerator the CPU dry run builds the mesh on "cpu" (gloo).
        import torchtitan.distributed.parallel_dims as tt_pd

        tt_pd.device_type = device
    parallel_dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, world_size=1,
                                 spmd_backend=parallelism.spmd_backend)
    parallel_dims.build_mesh()

    # What Llama3Model.Config.update_from_config does with a Trainer.Config, without importing
    # torchtitan.trainer (it pulls in the datasets stack, which the device image lacks): the RoPE
    # cache sized to the training sequence, and the model's sharding config.
    from torchtitan.models.llama3.sharding import set_llama3_sharding_config

    for layer in cfg.layers:
        layer.attention.rope = dataclasses.replace(layer.attention.rope, max_seq_len=case.dims.seq_length)
    set_llama3_sharding_config(cfg, enable_sp=parallelism.enable_sequence_parallel)
    with torch.device("meta"):
        model = cfg.build()
    ac = {"op": SelectiveAC.Config(), "full": FullAC.Config()}.get(plan.checkpointing)
    model = parallelize_llama(model, parallel_dims=parallel_dims, training=training, parallelism=parallelism,
                              compile_config=compile_cfg, ac_config=ac, dump_folder="/tmp/tessera-recipes")
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    vocab = case.dims.vocab_size
    if plan.loss == "chunked":
        loss_fn = ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=vocab)).build(
            compile_config=compile_cfg)
        loss_fn.set_lm_head(model.lm_head)
        model._skip_lm_head = True
    else:
        loss_fn = CrossEntropyLoss.Config(global_vocab_size=vocab).build(compile_config=compile_cfg)
    opt_cfg = default_adamw(lr=8e-4)
    if device != "cuda":
        opt_cfg.implementation = "foreach"
    optimizer = opt_cfg.build(model_parts=[model])
    return model, loss_fn, optimizer


def train_torchtitan(case: Case, device: str, tiny: bool, warmup: int, steps: int) -> tuple[StepRun, int, dict]:
    import torch

    # TESSERA_RECIPES_TORCHTITAN (set by the driver's --torchtitan): "auto" builds with torchtitan and,
    # should that fail (an import or an API this torch lacks), with recipe_native's stand-in;
    # "only" never falls back; "native" skips torchtitan.
    mode = os.environ.get("TESSERA_RECIPES_TORCHTITAN", "auto")
    info: dict[str, Any] = {"built_with": "torchtitan"}
    try:
        if mode == "native":
            raise RuntimeError("TESSERA_RECIPES_TORCHTITAN=native")
        model, loss_fn, optimizer = build_torchtitan(case, device, tiny)
    except Exception as exc:
        if mode == "only":
            raise
        from recipe_native import build_native

        info = {"built_with": "native", "torchtitan_error": f"{type(exc).__name__}: {exc}"[:600]}
        try:
            model, loss_fn, optimizer = build_native(case, device)
        except Exception as native_exc:
            raise RuntimeError(f"torchtitan: {info['torchtitan_error']}; "
                               f"native: {type(native_exc).__name__}: {native_exc}") from native_exc
    n_params = sum(p.numel() for p in model.parameters())
    if case.needs_float8:
        f8 = [n for n, m in model.named_modules() if "Float8" in type(m).__name__]
        info["float8_linears"] = {"count": len(f8), "lm_head": any(n.endswith("lm_head") for n in f8)}
    b, s, v = case.plan.micro_batch, case.dims.seq_length, case.dims.vocab_size

    def step() -> float:
        tokens = torch.randint(0, v, (b, s + 1), device=device)
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        optimizer.zero_grad()
        pred = model(inputs)
        loss, _ = loss_fn(pred, labels, torch.tensor(b * s, device=device))
        del pred
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], 1.0)
        optimizer.step()
        return float(loss.detach())

    return _timed(step, device, warmup, steps), n_params, info


def build_transformers(case: Case, device: str) -> tuple[Any, Any, dict]:
    import torch
    import transformers

    d, plan = case.dims, case.plan
    common: dict[str, Any] = {
        "hidden_size": d.hidden_size, "intermediate_size": d.ffn, "num_hidden_layers": d.num_layers,
        "num_attention_heads": d.num_heads, "num_key_value_heads": d.kv_heads, "vocab_size": d.vocab_size,
        "tie_word_embeddings": d.tied_embeddings, "max_position_embeddings": max(4096, d.seq_length),
        "use_cache": False}
    if case.arch == "qwen2":
        config = transformers.Qwen2Config(**common)
    else:  # Llama 3.2 1B's rope
        config = transformers.LlamaConfig(**common, rope_theta=500000.0)
    config._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if plan.lora_rank else torch.float32
    torch.set_default_device(device)
    try:
        try:
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
        except TypeError:  # transformers 4.x names it torch_dtype
            model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    finally:
        torch.set_default_device("cpu")
    model.to(device)
    info: dict[str, Any] = {"transformers": transformers.__version__}
    if plan.checkpointing == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if plan.lora_rank:
        import peft

        targets = {"qv": ["q_proj", "v_proj"], "attention": ["q_proj", "k_proj", "v_proj", "o_proj"],
                   "all-linear": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
        lcfg = peft.LoraConfig(r=plan.lora_rank, lora_alpha=2 * plan.lora_rank, lora_dropout=0.0,
                               target_modules=targets[plan.lora_targets], task_type="CAUSAL_LM")
        model = peft.get_peft_model(model, lcfg)
        info["peft"] = peft.__version__
        info["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, fused=device == "cuda")
    return model, optimizer, info


def train_transformers(case: Case, device: str, tiny: bool, warmup: int, steps: int) -> tuple[StepRun, int, dict]:
    import torch

    model, optimizer, info = build_transformers(case, device)
    n_params = sum(p.numel() for p in model.parameters())
    b, s, v = case.plan.micro_batch, case.dims.seq_length, case.dims.vocab_size

    def step() -> float:
        ids = torch.randint(0, v, (b, s), device=device)
        optimizer.zero_grad()
        # As transformers' Trainer.training_step: compute_loss returns the loss alone, so the model's
        # output (the logits) is dropped before backward. A loop that keeps it holds them too.
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return _timed(step, device, warmup, steps), n_params, info


def _timed(step: Any, device: str, warmup: int, steps: int) -> StepRun:
    import torch

    run = StepRun()
    for i in range(warmup + steps):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step()  # float(loss) waits for the step's kernels
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            run.step_s.append(time.perf_counter() - t0)
            run.losses.append(round(loss, 4))
    return run


def run_case(case: Case, device: str, tiny: bool, warmup: int, steps: int) -> dict[str, Any]:
    """One case in this process: build, train, measure. Raises on failure (the caller records it)."""
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    _init_dist(device)
    train = train_torchtitan if case.stack == "torchtitan" else train_transformers
    t0 = time.perf_counter()
    if device == "cuda":
        with CudaPeak(base=False) as peak:
            run, n_params, info = train(case, device, tiny, warmup, steps)
        memory: dict[str, Any] = {"max_allocated": peak.allocated, "max_reserved": peak.reserved, **peak.extra}
    else:
        run, n_params, info = train(case, device, tiny, warmup, steps)
        memory = {"note": "cpu: no cuda memory stats"}
    med = statistics.median(run.step_s)
    tokens = case.plan.micro_batch * case.dims.seq_length
    return {"params_real": n_params, "memory": memory, "step_s": [round(t, 5) for t in run.step_s],
            "step_median_s": round(med, 5), "tokens_per_s": round(tokens / med, 1), "losses": run.losses,
            "wall_s": round(time.perf_counter() - t0, 2), "info": info}


def reset_between_cases() -> None:
    """In one process (the CPU dry run), the next case must not see the last one's compiled code."""
    import gc

    import torch

    torch._dynamo.reset()
    gc.collect()
