"""LoRA through PEFT (get_peft_model with a LoraConfig per plan.lora_targets), and QLoRA's quantized
frozen base.

bitsandbytes is not installed (and its 4-bit kernels need CUDA), so QLoRA's nf4/int8 base cannot be
built through its API: the frozen base weights of the adapted linears are replaced by uint8 tensors
of the quantized size (nf4: two weights per byte plus one fp32 absmax per 64-weight block, as
bitsandbytes' Params4bit with double quantization off; int8: one byte per weight plus one fp32 scale
per row, LLM.int8()'s Int8Params), and the forward dequantizes each to the compute dtype on use, as
bitsandbytes' matmul does (a weight-sized temporary that dies after the matmul).
"""

from __future__ import annotations

from typing import Any

from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan

# plan.lora_targets -> PEFT target_modules, per transformers naming (Llama/Qwen2/Mistral/Gemma2/Mixtral:
# q_proj, k_proj, v_proj, o_proj; T5: q, k, v, o; GPT-2: its fused c_attn / c_proj).
TARGETS: dict[str, dict[str, Any]] = {
    "qv": {"llama": ["q_proj", "v_proj"], "t5": ["q", "v"], "gpt2": ["c_attn"]},
    "attention": {"llama": ["q_proj", "k_proj", "v_proj", "o_proj"], "t5": ["q", "k", "v", "o"],
                  "gpt2": ["c_attn", "attn.c_proj"]},
    "all-linear": {"llama": "all-linear", "t5": "all-linear", "gpt2": "all-linear"},
}

NF4_BLOCK = 64  # QLoRA (Dettmers et al. 2023, section 3): 64-weight blocks, one absmax each


def _naming(m: ModelDims) -> str:
    if m.family == "encoder-decoder":
        return "t5"
    return "llama" if m.gated else "gpt2"


def apply(model: Any, m: ModelDims, plan: ExecutionPlan, prec: Any) -> str:
    """Turn `model` (a transformers PreTrainedModel) into its PEFT LoRA model in place; returns a note."""
    from peft import LoraConfig, get_peft_model

    targets = TARGETS[plan.lora_targets][_naming(m)]
    cfg = LoraConfig(r=plan.lora_rank, lora_alpha=2 * plan.lora_rank, lora_dropout=0.0, target_modules=targets,
                     bias="none", task_type="SEQ_2_SEQ_LM" if m.family == "encoder-decoder" else "CAUSAL_LM")
    import torch

    # PEFT's autocast_adapter_dtype keeps bf16/fp16 adapters in fp32 (the recipe's master); pure bf16 not
    peft_model = get_peft_model(model, cfg, autocast_adapter_dtype=prec.storage == torch.float32)
    # get_peft_model wraps `model` and injects the adapters into it in place; the wrapper's forward
    # is the model's, so the caller keeps tracing `model`.
    del peft_model
    note = f"PEFT LoRA r={plan.lora_rank} on {targets}"
    if plan.base_quant != "none":
        n = quantize_base(model, plan.base_quant, prec.compute)
        note += f"; {plan.base_quant} base emulated on {n} frozen linears"
    return note


def notes(plan: ExecutionPlan) -> list[str]:
    if plan.lora_rank and plan.base_quant != "none":
        return [(f"{plan.base_quant} base weights: uint8 tensors of the quantized size, dequantized per matmul "
                 "(bitsandbytes is not installed)")]
    return []


def quantized_bytes(weight_numel: int, rows: int, kind: str) -> int:
    """Bytes of one quantized frozen weight: nf4 = numel/2 + 4 * ceil(numel/64); int8 = numel + 4 * rows."""
    if kind == "nf4":
        return -(-weight_numel // 2) + 4 * -(-weight_numel // NF4_BLOCK)
    return weight_numel + 4 * rows


def quantize_base(model: Any, kind: str, compute: Any) -> int:
    """Replace the frozen base weight of every LoRA-adapted linear by its quantized bytes."""
    import torch
    from peft.tuners.lora import Linear as LoraLinear

    count = 0
    for mod in model.modules():
        if not isinstance(mod, LoraLinear):
            continue
        base: Any = mod.get_base_layer()
        w: Any = base.weight
        packed = torch.empty(quantized_bytes(w.numel(), w.shape[0], kind), dtype=torch.uint8, device=w.device)
        base.weight = torch.nn.Parameter(packed, requires_grad=False)
        base.forward = _dequant_forward(base, tuple(w.shape), compute)
        count += 1
    return count


def _dequant_forward(base: Any, shape: tuple[int, ...], compute: Any) -> Any:
    import torch

    def forward(x: Any) -> Any:
        # bitsandbytes dequantizes the whole weight to the compute dtype for each matmul
        w = torch.empty(shape, dtype=compute)
        w.copy_(base.weight.new_zeros(()).to(compute).expand(shape))
        out = torch.nn.functional.linear(x.to(compute), w, getattr(base, "bias", None))
        return out

    return forward
