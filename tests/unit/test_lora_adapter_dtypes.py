"""LoRA adapters train as the recipe trains weights (docs/estimator-memory.md, LoRA row): fp32 with fp32
grads and AdamW (4 + 4 + 8 B) under fp32 and the mixed recipes (PEFT's autocast_adapter_dtype), bf16
(2 + 2 + 4 B) under pure bf16, as the traced mode builds them (realtrace/adapters.py; the two compared
on a trace in tests/integration/test_lora_adapter_dtype_traced.py)."""

from __future__ import annotations

import pytest

from tessera.estimator.memory_params import adapter_params
from tessera.estimator.memory_recipes import native_state
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan

TINY = ModelDims(64, 4, 4, 256, 32, "tiny", ffn_hidden=128, gated=True)


@pytest.mark.parametrize(("precision", "per_param"), [("bf16", (2, 2, 4)), ("megatron-bf16", (4, 4, 8)),
                                                      ("amp", (4, 4, 8)), ("mixed", (4, 4, 8)), ("fp32", (4, 4, 8))])
def test_adapter_bytes_follow_the_recipe(precision: str, per_param: tuple[int, int, int]) -> None:
    plan = ExecutionPlan(lora_rank=8, lora_targets="qv", loss="fp32", precision=precision)  # type: ignore[arg-type]
    n = adapter_params(TINY, plan, 0)
    st = native_state(TINY, plan, 0)
    assert (st.gradients, st.optimizer) == (per_param[1] * n, per_param[2] * n)  # the frozen base trains nothing
    wider = plan.with_(lora_rank=16)  # the same frozen base: the difference is the adapters' own bytes
    assert native_state(TINY, wider, 0).parameters - st.parameters == per_param[0] * (adapter_params(TINY, wider, 0) - n)
