"""Memory per GPU: Frenzy's MARP formula (frenzy.txt Sec. IV-A).

MARP counts W = V*h + l*(12h^2 + 13h) weights, 20 bytes of static state per weight (mixed-precision
Adam, split by TP size t), and Korthikanti et al.'s activation bytes for TP without sequence
parallelism, s*b*h*l*(10 + 24/t + 5as/(ht)), with the micro-batch b = B/d of the global batch B over
d data-parallel ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from estimator.models import ModelDims

STATIC_BYTES_PER_PARAM = 20  # Frenzy: fp16 params+grads, fp32 master, Adam m and v (Megatron fp16 recipe)


def marp_params(m: ModelDims) -> int:
    """Frenzy's approximation of the weight count W."""
    h, l, v = m.hidden_size, m.num_layers, m.vocab_size
    return v * h + l * (12 * h * h + 13 * h)


@dataclass(frozen=True)
class MemoryEstimate:
    static_bytes: int
    activation_bytes: int
    source: str = "formula:marp"

    @property
    def total_bytes(self) -> int:
        return self.static_bytes + self.activation_bytes


def marp_memory(m: ModelDims, micro_batch: int, tp: int) -> MemoryEstimate:
    """Peak bytes per GPU under MARP for a micro-batch and a TP size (DP does not change it)."""
    if micro_batch < 1 or tp < 1:
        raise ValueError("micro_batch and tp must be >= 1")
    s, h, l, a = m.seq_length, m.hidden_size, m.num_layers, m.num_heads
    static = STATIC_BYTES_PER_PARAM * marp_params(m) / tp
    act = s * micro_batch * h * l * (10 + 24 / tp + 5 * a * s / (h * tp))
    return MemoryEstimate(int(static), int(act))
