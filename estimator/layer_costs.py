"""Per-token costs of a transformer layer's attention: the formulas behind cells.model_operators.

One place for what attention costs, so that the Cell estimator's operators (cells.py) and the time
of one execution plan (plan_time.py) read the same numbers. Per token of one sample, forward pass:

- weight GEMMs (`linear_fwd_flops`): q and o projections of `heads x head_dim` (= the attention
  width A, hidden_size unless kv_channels says otherwise), k and v projections of
  `kv_heads x head_dim` (grouped-query attention shares one k/v head among heads/kv_heads query
  heads: Ainslie et al., "GQA", EMNLP 2023): 2 x (2hA + 2h KV) FLOPs;
- attention scores (`score_fwd_flops`): Q K^T and P V, 2A FLOPs each per (query, key) pair, over
  `keys_per_query` keys. Unfused attention (Megatron's core attention, HF "eager") computes the
  whole s x s score matrix and masks it afterwards: s keys, causal or not. Flash attention skips
  the blocks that the causal mask zeroes (FlashAttention-2, Dao 2023, Sec. 3.1.1 "Causal masking":
  about half the blocks), so a causal query sees s/2 keys on average; with a sliding window of w
  tokens (Mistral; Gemma 2's local layers) query i sees min(i + 1, w) keys, on average w - w^2/2s;
- flash attention's backward recomputes the scores from the saved log-sum-exp: its backward costs
  2.5 x its forward matmul FLOPs (FlashAttention-2, Sec. 3.2 / 4.1: five matmuls against two),
  where unfused attention's backward costs 2 x (four matmuls);
- memory traffic: Korthikanti et al. (docs/reference/estimation.md 1.1) count 24sbh bytes of the
  activations that TP shards, 8sbh of them the attention's Q, K, V and its output (2 bytes each per
  element); with GQA and kv_channels those are A + KV + KV + A elements. The 5as^2b bytes of the
  score matrix (softmax input and output, dropout mask) exist only without flash attention: flash
  attention never writes the s x s scores to DRAM (Dao et al., FlashAttention, NeurIPS 2022, Sec. 3).

Pure: numbers in, numbers out.
"""

from __future__ import annotations

from dataclasses import dataclass

# FlashAttention-2 (Dao, arXiv:2307.08691, Sec. 4.1): "the backward pass ... 2.5 times the forward" in
# matmul FLOPs; unfused attention: dS = dP-path and dV, dQ, dK: four matmuls = 2 x forward.
FLASH_BACKWARD_FACTOR = 2.5
UNFUSED_BACKWARD_FACTOR = 2.0


@dataclass(frozen=True)
class Attention:
    """One layer's attention as its costs need it (all counts per token of one sample)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    seq: int
    causal: bool = False
    flash: bool = False
    window: int = 0  # 0: every position (no sliding window)

    @property
    def width(self) -> int:
        """A: the q projection's output (heads x head_dim)."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """KV: the k (and the v) projection's output (kv_heads x head_dim)."""
        return self.kv_heads * self.head_dim

    @property
    def params(self) -> int:
        """Weights of q, k, v, o (no biases)."""
        return 2 * self.hidden * self.width + 2 * self.hidden * self.kv_width

    @property
    def linear_fwd_flops(self) -> float:
        return 2.0 * self.params

    @property
    def keys_per_query(self) -> float:
        """Keys each query's scores are computed against, on average (see the module docstring)."""
        s = self.seq
        if not self.flash:
            return float(s)
        w = self.window if 0 < self.window < s else s
        if not self.causal:
            return float(s)  # bidirectional windows are not modelled: full attention
        return w - w * w / (2.0 * s)

    @property
    def score_fwd_flops(self) -> float:
        return 4.0 * self.width * self.keys_per_query

    @property
    def score_backward_factor(self) -> float:
        return FLASH_BACKWARD_FACTOR if self.flash else UNFUSED_BACKWARD_FACTOR

    @property
    def score_train_flops(self) -> float:
        """Forward + backward score FLOPs (no recomputation)."""
        return (1.0 + self.score_backward_factor) * self.score_fwd_flops

    def sharded_traffic(self, dtype_bytes: int) -> float:
        """Bytes of Q, K, V and the attention output (TP-sharded), Korthikanti's 8sbh generalised."""
        return (2 * self.width + 2 * self.kv_width) * dtype_bytes

    @property
    def score_traffic(self) -> float:
        """Korthikanti's 5as^2b bytes per token (softmax in/out, dropout mask); 0 under flash attention."""
        return 0.0 if self.flash else 5.0 * self.heads * self.seq


def keys_causal_window(seq: int, window: int) -> float:
    """Average keys per query of a causal sliding window (exact discrete count, for checks):
    sum_i min(i + 1, w) / s."""
    w = min(window, seq) if window > 0 else seq
    return (w * (w + 1) / 2 + w * (seq - w)) / seq
