"""The formula's LoRA adapters and the traced mode's (PEFT on transformers, realtrace/adapters.py) hold
the same bytes: fp32 adapters, grads and AdamW states under a mixed recipe, bf16 under pure bf16."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")
pytestmark = pytest.mark.slow  # imports torch, transformers and peft

from tessera.estimator.memory_recipes import native_estimate
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan
from tessera.estimator.torch.realtrace import trace_real

TINY = ModelDims(512, 4, 8, 32000, 1024, "tiny-llama", ffn_hidden=1536, gated=True, num_kv_heads=2,
                 tied_embeddings=False)


@pytest.mark.parametrize("precision", ["bf16", "megatron-bf16"])
def test_adapter_state_is_the_traced_state(precision: str) -> None:
    plan = ExecutionPlan(lora_rank=16, lora_targets="qv", loss="fp32", precision=precision)  # type: ignore[arg-type]
    tr = trace_real(TINY, plan, stack="transformers")
    n = native_estimate(TINY, plan, 0, "transformers", device="cpu")
    # the trace's optimizer adds AdamW's step counters (a few bytes per tensor)
    assert n.optimizer == pytest.approx(tr.optimizer, rel=1e-3), (n.optimizer, tr.optimizer)
    assert n.parameters == pytest.approx(tr.parameters, rel=1e-4), (n.parameters, tr.parameters)
