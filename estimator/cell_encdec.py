"""An encoder-decoder (T5 / mT5) as one operator chain, shared by the Cells (cells.model_operators,
family "t5") and the time of one plan (plan_time.plan_operators).

Raffel et al., "Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer",
JMLR 2020 (T5); Xue et al., NAACL 2021 (mT5, T5 v1.1's architecture). The chain is

    embedding, encoder layers (bidirectional, seq_length tokens), decoder layers (causal,
    target_length tokens, each with a cross-attention over the encoder's output), head

with the layers numbered on through ("layer0" ... "layer{L_enc + L_dec - 1}"), so that a pipeline
split may fall anywhere, the encoder/decoder boundary included.

What crosses a pipeline boundary (every operator's `out_bytes` before the head): the source and the
target hidden states of one sample, (seq_length + target_length) x hidden x dtype bytes. The first
stage embeds both sequences with the one shared table (T5 shares its input embedding between encoder
and decoder); encoder stages pass the target embeddings on untouched, decoder stages pass the encoder's
output on with the decoder's hidden states, since every later decoder layer's cross-attention projects
its keys and values from it. The partition (partition.py), the Cells' inter-stage term
(cells._stage_cost), the stage placer and plan_time's p2p all read these bytes, so they all carry the
encoder output to the decoder stages.

Parameters are counted as estimator/memory.py counts them (no biases, RMS-style norms of a scale
each, no position table); per encoder layer: attention + MLP + 2 norms (the last one also the
encoder's final norm), the first one also T5's relative position bias (32 buckets x heads, one table
per stack, as Hugging Face's T5 keeps it in each stack's first block); per decoder layer: self- and
cross-attention + MLP + 3 norms (the first one also its stack's bias table); head: the decoder's final norm and, untied (T5 v1.1,
mT5), the output projection. A tied head (the original T5) is the embedding itself: under pipeline
stages Megatron keeps a copy of it on the last stage, which is not counted here (as memory.num_params
does not).

Pure: numbers in, numbers out; no import of cells.py (it imports this module).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from tessera.estimator.layer_costs import Attention
from tessera.estimator.partition import LayerShape, Operator

# T5's relative attention bias: relative_attention_num_buckets = 32 (transformers' T5Config default,
# and every published T5/mT5 config) entries per head.
_BIAS_BUCKETS = 32


class EncDecModel(Protocol):
    """What the chain reads of a cells.CellModel of family "t5"."""

    @property
    def hidden_size(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def seq_length(self) -> int: ...
    @property
    def target_length(self) -> int: ...
    @property
    def dtype_bytes(self) -> int: ...
    @property
    def ffn_hidden(self) -> int: ...
    @property
    def gated(self) -> bool: ...
    @property
    def tied_embeddings(self) -> bool: ...
    @property
    def op_checkpoint(self) -> bool: ...

    def attention(self, idx: int) -> Attention: ...

    def checkpointed(self, idx: int) -> bool: ...

    def recompute_passes(self, idx: int) -> float: ...


def cross_attention(op: Operator, att: Attention, enc_seq: int, dtype_bytes: int, passes: float = 0.0,
                    core: bool = False) -> Operator:
    """A T5 decoder layer plus its cross-attention (Raffel et al., JMLR 2020): q and o projections on
    the decoder's tokens, k and v on the encoder's (enc_seq tokens), scores of every decoder token
    against every encoder token (not causal), one more TP all-reduce per pass (the o projection).
    `passes`: forward passes of the weight GEMMs recomputed (1 full, 1/2 per-op SAC, 0 none); `core`:
    the attention core is recomputed too (full recomputation)."""
    s_d = att.seq
    lin = s_d * 2 * 2 * att.hidden * att.width + enc_seq * 2 * 2 * att.hidden * att.kv_width
    cross = replace(att, seq=enc_seq, causal=False)  # the keys are the encoder's
    score = (cross.score_train_flops + (1 if core else 0) * cross.score_fwd_flops) * s_d
    calls = op.comm_calls + op.comm_calls // 2  # one more for every two of the self-attention layer's
    return replace(op, flops=op.flops + (3 + passes) * lin + score, linear_flops=op.linear_flops + (3 + passes) * lin,
                   params=op.params + 2 * att.hidden * att.width + 2 * att.hidden * att.kv_width,
                   traffic_sharded_bytes=op.traffic_sharded_bytes + cross_traffic(att, enc_seq, dtype_bytes),
                   tp_comm_bytes=op.tp_comm_bytes / op.comm_calls * calls, comm_calls=calls)


def cross_traffic(att: Attention, enc_seq: int, dtype_bytes: int) -> float:
    """Bytes per sample of the cross-attention's TP-sharded activations: q and its output on the decoder's
    tokens, k and v on the encoder's, and (unfused attention only) Korthikanti's 5 bytes per score."""
    s_d = att.seq
    return ((2 * att.width * s_d + 2 * att.kv_width * enc_seq) * dtype_bytes
            + (0.0 if att.flash else 5.0 * att.heads * enc_seq * s_d))


def _cross_stored(m: EncDecModel, idx: int, att: Attention) -> float:
    """Activation bytes per sample the cross-attention adds to what decoder layer idx keeps for backward.
    Not checkpointed: its sharded activations (`cross_traffic`) and its replicated ones, Korthikanti's
    count for one attention block (its norm's input and output, the dropout mask: 5 bytes per
    hidden element at 2-byte activations). Full recomputation: nothing more than the layer's input
    (the encoder output the recomputation reads is one tensor all decoder layers share). Per-op SAC
    (torchtitan's policy, cells._op_saved): every second matmul output (q on the decoder's tokens, v on
    the encoder's), the attention output and its fp32 log-sum-exp."""
    h, d, s_e, s_d = m.hidden_size, m.dtype_bytes, m.seq_length, m.target_length
    if not m.checkpointed(idx):
        return cross_traffic(att, s_e, d) + 5 * h * d / 2 * s_d
    if not m.op_checkpoint:
        return 0.0
    return d * (2 * att.width * s_d + att.kv_width * s_e) + 4 * att.heads * s_d


def encoder_decoder_operators(m: EncDecModel, encoder: Sequence[Operator], decoder: Sequence[Operator],
                              head: Operator) -> tuple[Operator, ...]:
    """The chain of the module doc from the plain layers cells.py builds: `encoder` (bidirectional
    layers over seq_length tokens, numbered 0..), `decoder` (causal layers over target_length tokens,
    numbered on after the encoder's, without cross-attention) and the `head` on target_length tokens.
    Adds the cross-attention, T5's parameter count and the carried bytes."""
    h, v, d = m.hidden_size, m.vocab_size, m.dtype_bytes
    s_e, s_d = m.seq_length, m.target_length
    carry = float((s_e + s_d) * h * d)  # both sequences' hidden states, per sample
    mlp = (3 if m.gated else 2) * h * m.ffn_hidden
    ops = [Operator("embedding", flops=0.0, params=float(v * h), out_bytes=carry, traffic_bytes=2 * carry,
                    stored_bytes=0.0, shape=LayerShape("embedding", h, seq=s_e + s_d, vocab=v))]
    n = len(encoder)
    for i, op in enumerate(encoder):
        att = m.attention(i)
        norms = 2 + (1 if i == n - 1 else 0)  # the last layer carries the encoder's final norm
        bias_table = _BIAS_BUCKETS * m.num_heads if i == 0 else 0
        ops.append(replace(op, params=float(att.params + mlp + norms * h + bias_table), out_bytes=carry))
    for j, op in enumerate(decoder):
        idx = n + j
        att = m.attention(idx)
        full = m.checkpointed(idx) and not m.op_checkpoint
        x = cross_attention(op, att, s_e, d, m.recompute_passes(idx), full)
        bias_table = _BIAS_BUCKETS * m.num_heads if j == 0 else 0
        ops.append(replace(x, params=float(2 * att.params + mlp + 3 * h + bias_table), out_bytes=carry,
                           stored_bytes=x.stored_bytes + _cross_stored(m, idx, att)))
    ops.append(replace(head, params=float(h + (0 if m.tied_embeddings else v * h))))
    return tuple(ops)
