"""torchao Float8 training (plan.float8) on the model's linears, through torchao's own API.

`convert_to_float8_training` swaps each nn.Linear for torchao's Float8Linear with tensorwise dynamic
scaling (torchao's default recipe; torchtitan's Float8LinearConverter builds the same modules, but
refuses to run without an SM89+ GPU unless it emulates, which changes the matmul path). The output head
and any linear whose dims are not multiples of 16 stay in bf16, as torchtitan's module_filter_fn
decides. 'linear+allgather' sets enable_fsdp_float8_all_gather: FSDP2 all-gathers float8 weights
(1 byte per parameter instead of 2). torchtitan also precomputes the weights' scales after each
optimizer step (precompute_float8_dynamic_scale_for_fsdp): not done here, because torchao's weight
wrapper then tests a fake tensor for truth when the memory tracker flattens it (`if
self._precomputed_scale:`, torchao 0.18 fsdp_utils.py); without it each all-gather computes the
scale itself, and the bytes differ by one fp32 scalar per weight.
"""

from __future__ import annotations

from typing import Any

from tessera.estimator.plans import ExecutionPlan

SKIP = ("lm_head", "output")  # the output projection: torchtitan leaves it in high precision


def convert(model: Any, plan: ExecutionPlan) -> str:
    """Swap the eligible linears of `model` in place; returns a note saying how many."""
    import torch
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    converted = 0

    def keep(mod: torch.nn.Module, fqn: str) -> bool:
        nonlocal converted
        if not isinstance(mod, torch.nn.Linear):
            return False
        if any(fqn == s or fqn.endswith("." + s) for s in SKIP):
            return False
        if mod.in_features % 16 or mod.out_features % 16:  # float8 GEMMs need multiples of 16
            return False
        converted += 1
        return True

    cfg = Float8LinearConfig(enable_fsdp_float8_all_gather=plan.float8 == "linear+allgather")
    convert_to_float8_training(model, config=cfg, module_filter_fn=keep)
    return f"torchao Float8Linear (tensorwise) on {converted} linears" + \
        (", float8 FSDP all-gather" if plan.float8 == "linear+allgather" else "")
