"""The cases of bench/estimator_gpu_recipes.py: which model, which recipe (an ExecutionPlan), on which
stack. No torch here: the driver predicts from these without importing it."""

from __future__ import annotations

from dataclasses import dataclass

from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan


@dataclass(frozen=True)
class Case:
    name: str
    stack: str  # "torchtitan" | "transformers"
    arch: str  # torchtitan flavor ("debugmodel", "1B") or transformers config ("llama", "qwen2")
    dims: ModelDims
    plan: ExecutionPlan
    recipe: str  # how the plan's fields are realised, in words (recorded with the result)

    @property
    def needs_float8(self) -> bool:
        return self.plan.float8 != "none"


# ------------------------------------------------------------------------------------------------
# The cases

# torchtitan 0.3.0's flavors (torchtitan/models/llama3/__init__.py): debugmodel dim 256, 6 layers,
# 16 heads, ffn compute_ffn_hidden_dim(256, 256) = 768, vocab 2048, untied; 1B = Llama 3.2 1B: dim
# 2048, 16 layers, 32 heads, 8 KV heads, ffn 8192 (multiplier 1.5, multiple of 1024), vocab 128256,
# tied embeddings. The worker checks its built model's parameter count against num_params(dims).
def _tt_debug(seq: int) -> ModelDims:
    return ModelDims(256, 6, 16, 2048, seq, "llama3-debugmodel", ffn_hidden=768, gated=True,
                     tied_embeddings=False)


def _llama_1b(seq: int, name: str) -> ModelDims:
    return ModelDims(2048, 16, 32, 128256, seq, name, ffn_hidden=8192, gated=True, num_kv_heads=8)


# Qwen2.5-0.5B's config.json (huggingface.co/Qwen/Qwen2.5-0.5B): hidden 896, 24 layers, 14 heads,
# 2 KV heads, intermediate 4864, vocab 151936, q/k/v biases, tied embeddings.
def _qwen05(seq: int) -> ModelDims:
    return ModelDims(896, 24, 14, 151936, seq, "qwen2.5-0.5b", ffn_hidden=4864, gated=True, num_kv_heads=2,
                     qkv_bias=True)


# torchtitan 0.3.0's 3B flavor = Llama 3.2 3B (huggingface.co/meta-llama/Llama-3.2-3B, config.json): hidden
# 3072, 28 layers, 24 heads, 8 KV heads, intermediate 8192, vocab 128256, tied embeddings.
def _llama_3b(seq: int) -> ModelDims:
    return ModelDims(3072, 28, 24, 128256, seq, "llama3.2-3b", ffn_hidden=8192, gated=True, num_kv_heads=8)


# Tiny shapes for the CPU dry run: the same code paths in a second or two each.
def tiny_llama(seq: int, name: str) -> ModelDims:
    return ModelDims(64, 2, 4, 512, seq, name, ffn_hidden=128, gated=True, num_kv_heads=2)


def _tiny_qwen(seq: int) -> ModelDims:
    return ModelDims(64, 2, 4, 512, seq, "tiny-qwen2", ffn_hidden=128, gated=True, num_kv_heads=2, qkv_bias=True)


TT_RECIPE = ("torchtitan: FSDP2 over a 1-rank mesh (fp32 master weights, bf16 param_dtype, fp32 reduce), "
             "fused AdamW, clip_grad_norm 1.0, SDPA causal attention")
HF_FULL = "transformers full fine-tune: fp32 weights, bf16 autocast, fused AdamW, SDPA attention"
HF_LORA = ("transformers + PEFT LoRA (alpha 2r, no dropout) on a bf16 base, adapters as PEFT keeps them "
           "(fp32), bf16 autocast, fused AdamW, SDPA attention")


def cases(tiny: bool = False) -> list[Case]:
    """Every case, cheapest first (the run keeps going while its time budget lasts).
    Sizes fit one 80 GB GPU with room: the largest (1B full fine-tune) is about 20 GB of state."""
    s_tt, b_tt = (64, 2) if tiny else (2048, 2)
    s_hf, b_hf = (64, 2) if tiny else (1024, 4)
    debug = _tt_debug(s_tt)
    tt1b = tiny_llama(s_tt, "tiny-llama3") if tiny else _llama_1b(s_tt, "llama3.2-1b")
    flavor = "tiny" if tiny else "1B"
    qwen = _tiny_qwen(s_hf) if tiny else _qwen05(s_hf)
    hf1b = tiny_llama(s_hf, "tiny-llama-hf") if tiny else _llama_1b(s_hf, "llama3.2-1b-hf")
    fsdp = ExecutionPlan(micro_batch=b_tt, sharding="fsdp", precision="amp", loss="fp32")
    full_ft = ExecutionPlan(micro_batch=b_hf, precision="amp", loss="fp32")
    lora = ExecutionPlan(micro_batch=b_hf, precision="bf16", loss="fp32", lora_rank=16, lora_targets="all-linear")
    # torchtitan's own debug flavor first: seconds on a GPU. The CPU dry run leaves it out (the
    # tiny flavor below runs the same recipes faster; the test builds debugmodel on the meta device).
    out = [] if tiny else [
        Case("tt debugmodel fsdp", "torchtitan", "debugmodel", debug, fsdp, TT_RECIPE),
        Case("tt debugmodel fsdp op-sac chunked", "torchtitan", "debugmodel", debug,
             fsdp.with_(checkpointing="op", loss="chunked"), TT_RECIPE),
    ]
    out += [
        Case(f"tt {flavor} fsdp", "torchtitan", flavor, tt1b, fsdp, TT_RECIPE),
        Case(f"tt {flavor} fsdp op-sac", "torchtitan", flavor, tt1b, fsdp.with_(checkpointing="op"), TT_RECIPE),
        Case(f"tt {flavor} fsdp full-ac", "torchtitan", flavor, tt1b, fsdp.with_(checkpointing="full"), TT_RECIPE),
        Case(f"tt {flavor} fsdp op-sac chunked", "torchtitan", flavor, tt1b,
             fsdp.with_(checkpointing="op", loss="chunked"), TT_RECIPE),
        Case(f"tt {flavor} fsdp none chunked", "torchtitan", flavor, tt1b, fsdp.with_(loss="chunked"), TT_RECIPE),
        Case(f"{'tiny-qwen2' if tiny else 'qwen2.5-0.5b'} full", "transformers", "qwen2", qwen, full_ft, HF_FULL),
        Case(f"{'tiny-qwen2' if tiny else 'qwen2.5-0.5b'} lora16", "transformers", "qwen2", qwen, lora, HF_LORA),
        Case(f"{hf1b.name} lora16", "transformers", "llama", hf1b, lora, HF_LORA),
        Case(f"{hf1b.name} lora16 full-ac", "transformers", "llama", hf1b, lora.with_(checkpointing="full"),
             HF_LORA + "; gradient_checkpointing (non-reentrant) per decoder layer"),
        Case(f"{hf1b.name} full", "transformers", "llama", hf1b, full_ft, HF_FULL),
        Case(f"tt {flavor} fsdp float8 op-sac", "torchtitan", flavor, tt1b,
             fsdp.with_(checkpointing="op", float8="linear"), TT_RECIPE + "; Float8LinearConverter (rowwise, its default)"),
        Case(f"tt {flavor} fsdp op-sac compile", "torchtitan", flavor, tt1b,
             fsdp.with_(checkpointing="op", compile=True), TT_RECIPE + "; per-block torch.compile + compiled loss"),
        Case(f"tt {flavor} fsdp float8 op-sac compile", "torchtitan", flavor, tt1b,
             fsdp.with_(checkpointing="op", float8="linear", compile=True),
             TT_RECIPE + "; Float8LinearConverter (rowwise) + per-block torch.compile"),
    ]
    if tiny:  # code paths the other tiny cases run already: the CPU dry run stays well under a minute
        return [c for c in out if c.name not in (f"tt {flavor} fsdp none chunked", f"{hf1b.name} full")]
    # Held out: sizes no earlier GPU run measured, predicted and committed before they ran (docs/estimator-gpu.md).
    tt3b = _llama_3b(s_tt)
    return out + [
        Case("held-out tt 1B fsdp mb4", "torchtitan", flavor, tt1b, fsdp.with_(micro_batch=4), TT_RECIPE),
        Case("held-out tt 1B fsdp full-ac mb8", "torchtitan", flavor, tt1b,
             fsdp.with_(micro_batch=8, checkpointing="full"), TT_RECIPE),
        Case("held-out tt 3B fsdp op-sac", "torchtitan", "3B", tt3b, fsdp.with_(checkpointing="op"), TT_RECIPE),
        Case("held-out tt 3B fsdp full-ac mb4", "torchtitan", "3B", tt3b,
             fsdp.with_(micro_batch=4, checkpointing="full"), TT_RECIPE),
        # autocast without FSDP2 (the second held-out run): the transformers loop drops the model's
        # output before backward since then (recipe_steps.train_transformers)
        Case("held-out qwen2.5-0.5b full mb8", "transformers", "qwen2", qwen, full_ft.with_(micro_batch=8), HF_FULL),
        Case("held-out llama3.2-1b-hf full mb2", "transformers", "llama", hf1b, full_ft.with_(micro_batch=2),
             HF_FULL),
        # Held out from the host floor (estimator/host_time.py, measured on tiny widths by
        # bench/host_overhead.py): recipes and sizes on both sides of where the host binds.
        Case("host-check qwen2.5-0.5b lora16 full-ac", "transformers", "qwen2", qwen,
             lora.with_(checkpointing="full"), HF_LORA + "; gradient_checkpointing (non-reentrant) per decoder layer"),
        Case("host-check qwen2.5-0.5b full mb2", "transformers", "qwen2", qwen, full_ft.with_(micro_batch=2), HF_FULL),
        Case("host-check llama3.2-1b-hf lora16 mb8", "transformers", "llama", hf1b, lora.with_(micro_batch=8),
             HF_LORA),
        Case("host-check llama3.2-1b-hf full full-ac", "transformers", "llama", hf1b,
             full_ft.with_(checkpointing="full"), HF_FULL + "; gradient_checkpointing (non-reentrant) per decoder layer"),
        Case("host-check tt 1B fsdp float8", "torchtitan", flavor, tt1b, fsdp.with_(float8="linear"),
             TT_RECIPE + "; Float8LinearConverter (rowwise, its default)"),
        Case("host-check tt 3B fsdp mb1", "torchtitan", "3B", tt3b, fsdp.with_(micro_batch=1), TT_RECIPE),
    ] + [
        # Per-op SAC over the micro-batch, beside the same recipe without checkpointing: whether the
        # host's launching and the GPU's work overlap (the step flat until the GPU binds, as the
        # host floor's maximum assumes) or add up (the step growing from the smallest batch on).
        Case(f"sac-sweep tt {name} fsdp{' op-sac' if op else ''} mb{mb}", "torchtitan", flav, dims,
             fsdp.with_(micro_batch=mb, checkpointing="op" if op else "none"), TT_RECIPE)
        for name, flav, dims, op, mbs in (("1B", flavor, tt1b, True, (1, 2, 4, 8)), ("1B", flavor, tt1b, False, (1, 8)),
                                          ("3B", "3B", tt3b, True, (1, 2)))
        for mb in mbs
    ]
