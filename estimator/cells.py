"""Cells of a job and their agile estimation (Crius Sec. 4.2 and 5.1).

Crius: "A Codesign of Scheduling and Parallelization for Large Model Training in Heterogeneous
Clusters", arXiv 2024 (arXiv:2403.16125; docs/reference/papers.md).

A Cell is (job, GPU type, GPU count, pipeline stages). Inside a Cell the stage partition is fixed
(partition.py: by FLOPs and inter-operator communication) and only data and tensor parallelism per
stage remain. The paper's estimate is the best of 2^Ns assembled plans (every stage data-parallel-only
or tensor-parallel-only); Tessera's takes every dp x tp layout of a stage, FSDP on one-stage Cells
where plain DP does not fit, and the number of micro-batches per Cell (cell_search.py,
cell_fsdp.py). A stage's computation comes from compute.py (analytical prior or one-device
profiling) and its communication from comm.py (profiled table or alpha-beta). The pipeline latency
follows Sec. 5.1 (cell_types.py):

    T_iter = sum_i T_i + (B - 1) * max_i (T_i - Tcomm_i) + max_i (Tsync_i + Topt_i)

with T_i = compute + intra-stage communication + the communication from the previous stage for one
micro-batch, Tcomm_i that inter-stage part (overlapped in the steady state), B micro-batches (the
paper: 4 * Ns, GPipe, Figure 10; here chosen per Cell, cell_search.py), and a last term that the paper leaves implicit: the gradient
all-reduce of data-parallel stages and the optimizer step, once per iteration, stages in parallel.
We read "the slowest stage" as the stage with the largest latency once its overlapped communication
is taken off. A plan whose memory exceeds the GPU's usable memory on any stage is dropped (a
pipelined stage's memory is also taken on the even layer splits a worker runs: cell_worker.py).

The best assembled plan is found exactly without enumerating the plans (thresholds on the two max
terms, then an independent choice per stage: cell_search.exact_best); `enumerate_plans` enumerates
them for checks.

Everything here is pure: frozen dataclasses in, frozen dataclasses out; `CellEstimator` keeps an
in-memory cache keyed by (model signature, plan, GPU type).

Why one piece (about a thousand lines): it is the one computation of Sec. 5.1, read top to bottom
in the paper's order (the model as an operator chain, the cluster's pools and links, one stage's
costs, the Cells of a job; the plan types, the search and the FSDP options are in cell_types.py,
cell_search.py and cell_fsdp.py). Its parts
share the Cell estimator's own types (`StagePlan`, `CellPlan`, `_Placement`, `CellConfig`) and one
error type (`CellInputError`), raised by every part; tuning.py and stage_placer.py reuse them and the
stage cost. Each part sits under its own section header. The seam to cut first, once the pools-file
parsing has moved to its own parser, is the model description (`CellModel`, `model_operators`),
which needs nothing else here but `CellInputError`.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tessera.common.gpus import GB, GpuType, UnknownGpuError, lookup
from tessera.estimator import clusterfile, partition
from tessera.estimator.catalog import Price, price
from tessera.estimator.cell_encdec import encoder_decoder_operators
from tessera.estimator.cell_fsdp import FsdpContext, fsdp_variant
from tessera.estimator.cell_search import CellSearch, exact_best, search_cell, stage_layouts
from tessera.estimator.cell_types import CellInputError as CellInputError  # noqa: PLC0414 (re-exported)
from tessera.estimator.cell_types import CellPlan as CellPlan  # noqa: PLC0414
from tessera.estimator.cell_types import PlanEstimate as PlanEstimate  # noqa: PLC0414
from tessera.estimator.cell_types import StageCost as StageCost  # noqa: PLC0414
from tessera.estimator.cell_types import StagePlan as StagePlan  # noqa: PLC0414
from tessera.estimator.cell_types import iteration_time as iteration_time  # noqa: PLC0414
from tessera.estimator.cell_types import pipeline_latency as pipeline_latency  # noqa: PLC0414
from tessera.estimator.cell_worker import recipe_plan_fields, with_memory_of, worker_op_ranges
from tessera.estimator.clusterfile import MAX_GPUS_PER_NODE, MAX_NODES_PER_GROUP, PoolSpec, parse_pools
from tessera.estimator.comm import CommModel, Link
from tessera.estimator.compute import (
    DEFAULT_PRIOR,
    EfficiencyPrior,
    OperatorProfiler,
    has_fp8,
    optimizer_step_time,
    profile_stage_compute,
    stage_compute_time,
)
from tessera.estimator.convnets import STAGE_SIZES, wide_resnet_operators
from tessera.estimator.layer_costs import Attention
from tessera.estimator.lora_costs import lora_cell_operators
from tessera.estimator.models import ModelDims
from tessera.estimator.partition import LayerShape, Operator, PartitionError, StagePartition, partition_stages
from tessera.estimator.plans import PRECISIONS, ExecutionPlan, PlanInputError

# ---------------------------------------------------------------------------------------------------
# Values with their source


@dataclass(frozen=True)
class Sourced:
    """A number and where it comes from: formula, traced, profiled, fitted or measured (+ detail)."""

    value: float
    source: str


# ---------------------------------------------------------------------------------------------------
class CellsTooSlow(Exception):
    """`CellEstimator.cells` passed its deadline after `done` Cells (kept in its caches)."""

    def __init__(self, done: int) -> None:
        super().__init__(f"deadline passed after {done} Cells")
        self.done = done


# The most a GPU-hour may cost (tessctl plan-cost's bound too, clients/plancost.py MAX_PRICE).
MAX_PRICE_PER_HOUR = 1e6

# Model description (local to the Cell estimator until models.py carries the family fields)

FAMILIES = ("gpt", "bert", "moe", "wresnet", "t5")


_FAMILY_OF_DIMS = {"decoder": "gpt", "encoder": "bert", "moe": "moe", "wresnet": "wresnet", "encoder-decoder": "t5"}


@dataclass(frozen=True)
class CellModel:
    """A training job's model as the Cell estimator needs it.

    `family`: "gpt" (decoder) and "bert" (encoder) are dense transformers with the same costs in the
    non-causal FLOP count; "moe" is GShard: every `moe_every`-th layer's FFN is `num_experts` experts
    with top-`top_k` routing over groups of `expert_group_size` tokens with `capacity_factor`, experts
    sharded across the DP ranks of a stage. `ffn_mult`: FFN width / hidden (a gated MLP counts 1.5x).
    `recompute`: full activation recomputation (Alpa's default in the Crius artifact).
    `dtype_bytes`: activation bytes (2 for fp16/bf16). Model state per parameter:
    `weight_grad_bytes` for the weights and gradients (0 = 2 x dtype_bytes) plus
    `optimizer_bytes_per_param` (12: fp32 master weights and two Adam moments, docs/reference/estimation.md
    1.2); `precision` names the recipe of estimator/memory.py they come from. Under
    `CellConfig.dp_shards_optimizer` the optimizer bytes are divided over the DP ranks (ZeRO-1).

    "t5" is an encoder-decoder (T5 / mT5, estimator/cell_encdec.py): `num_layers` counts all its
    layers, the last `decoder_layers` of them the decoder's (causal, over `target_length` tokens,
    with cross-attention over the encoder's `seq_length` tokens); `tied_embeddings` False = T5 v1.1 /
    mT5's untied output layer; `ffn_hidden` and `gated` give its MLP's parameters exactly.

    "wresnet" is Alpa's Wide-ResNet (estimator/convnets.py); build it with `CellModel.wide_resnet`.
    Its fields read: `hidden_size` = the stem's filters, `num_layers` = the ResNet depth (50, 101,
    152, 200), `vocab_size` = classes, `seq_length` = image side, `num_heads` = 1, `width_factor` =
    the widening of each block's 3x3 convolution (0 for transformers).
    """

    family: str
    hidden_size: int
    num_layers: int
    num_heads: int
    vocab_size: int
    seq_length: int
    global_batch: int
    ffn_mult: float = 4
    num_experts: int = 0
    top_k: int = 2
    expert_group_size: int = 2048
    moe_every: int = 2
    capacity_factor: float = 1.0
    dtype_bytes: int = 2
    recompute: bool = True
    weight_grad_bytes: float = 0.0
    optimizer_bytes_per_param: float = 12.0
    precision: str = "mixed"
    name: str = ""
    width_factor: int = 0
    # Attention (estimator/layer_costs.py): kv_heads 0 = num_heads (GQA when fewer), head_dim 0 =
    # hidden / heads (kv_channels); causal and sliding_window count only under flash_attention
    # (unfused attention computes the whole score matrix); sliding_every 2 = Gemma 2's alternation
    # (even layers local, HF Gemma2DecoderLayer), 1 = every layer (Mistral).
    kv_heads: int = 0
    head_dim: int = 0
    causal: bool = False
    flash_attention: bool = False
    sliding_window: int = 0
    sliding_every: int = 1
    # The job's recipe (estimator/cell_recipe.py maps an ExecutionPlan onto these; the defaults keep
    # every earlier Cell). `checkpoint_every` n: only every n-th layer recomputes (torchtitan's
    # ac_freq); `op_checkpoint`: those layers run torchtitan's per-op SAC instead of full recompute
    # (needs `recompute`). LoRA: `lora_rank` adapters on `lora_targets`, the MLP linears of width
    # `ffn_hidden` (`gated`: three of them), the frozen base held at `frozen_bytes` per parameter.
    # `float8`/`compiled`: compute.stage_compute_time's factors. `sharding`: "" = CellConfig's
    # (ZeRO-1, FSDP where needed), "none", "zero1" or "fsdp" (one-stage Cells shard always) with
    # FSDP2's `reshard` (auto|always|never). `loss` "fp32" keeps the fp32 log-softmax for backward.
    checkpoint_every: int = 1
    op_checkpoint: bool = False
    lora_rank: int = 0
    lora_targets: str = "all-linear"
    ffn_hidden: int = 0
    gated: bool = False
    frozen_bytes: float = 2.0
    float8: str = "none"
    compiled: bool = False
    sharding: str = ""
    reshard: str = "auto"
    loss: str = "fused"
    # Encoder-decoder ("t5" only; 0 / True for every other family).
    decoder_layers: int = 0
    target_length: int = 0
    tied_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise CellInputError("family", f"unknown model family {self.family!r}; known: {', '.join(FAMILIES)}")
        for f in ("hidden_size", "num_layers", "num_heads", "vocab_size", "seq_length", "global_batch",
                  "dtype_bytes"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise CellInputError(f, f"must be a positive integer, got {v!r}")
        for f in ("ffn_mult", "capacity_factor"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise CellInputError(f, f"must be a positive number, got {v!r}")
        for f in ("weight_grad_bytes", "optimizer_bytes_per_param"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or v < 0:
                raise CellInputError(f, f"must be >= 0, got {v!r}")
        for f in ("kv_heads", "head_dim", "sliding_window"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise CellInputError(f, f"must be an integer >= 0, got {v!r}")
        if self.sliding_every not in (1, 2):
            raise CellInputError("sliding_every", f"must be 1 (every layer) or 2 (every other), got {self.sliding_every!r}")
        if not self.head_dim and self.hidden_size % self.num_heads:
            raise CellInputError(
                "num_heads", f"{self.num_heads} heads do not divide hidden_size {self.hidden_size}")
        if self.kv_heads and self.num_heads % self.kv_heads:
            raise CellInputError("kv_heads", f"{self.kv_heads} does not divide num_heads {self.num_heads}")
        if self.family == "moe":
            for f in ("num_experts", "top_k", "expert_group_size", "moe_every"):
                v = getattr(self, f)
                if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                    raise CellInputError(f, f"must be a positive integer for a MoE model, got {v!r}")
            if self.top_k > self.num_experts:
                raise CellInputError("top_k", f"{self.top_k} exceeds num_experts {self.num_experts}")
        self._check_recipe()
        self._check_encdec()
        if self.family == "wresnet":
            if self.num_layers not in STAGE_SIZES:
                raise CellInputError(
                    "num_layers", f"Wide-ResNet depth must be one of {', '.join(map(str, STAGE_SIZES))}, "
                    f"got {self.num_layers}")
            if self.num_heads != 1:
                raise CellInputError("num_heads", f"must be 1 for a Wide-ResNet, got {self.num_heads}")
            if isinstance(self.width_factor, bool) or not isinstance(self.width_factor, int) or self.width_factor < 1:
                raise CellInputError("width_factor", f"must be a positive integer for a Wide-ResNet, got {self.width_factor!r}")
        elif self.width_factor:
            raise CellInputError("width_factor", f"only the wresnet family has one (family {self.family!r})")

    def _check_recipe(self) -> None:
        if isinstance(self.checkpoint_every, bool) or not isinstance(self.checkpoint_every, int) or self.checkpoint_every < 1:
            raise CellInputError("checkpoint_every", f"must be an integer >= 1, got {self.checkpoint_every!r}")
        if self.op_checkpoint and not self.recompute:
            raise CellInputError("op_checkpoint", "per-op checkpointing is a recomputation: needs recompute")
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise CellInputError("lora_rank", f"must be an integer >= 0, got {self.lora_rank!r}")
        if self.lora_rank and (self.family not in ("gpt", "bert") or self.ffn_hidden < 1):
            raise CellInputError("lora_rank", "LoRA Cells need a dense transformer and its ffn_hidden")
        if self.frozen_bytes < 0:
            raise CellInputError("frozen_bytes", f"must be >= 0, got {self.frozen_bytes!r}")
        for f, allowed in (("float8", ("none", "linear", "linear+allgather")), ("sharding", ("", "none", "zero1", "fsdp")),
                           ("reshard", ("auto", "always", "never")), ("loss", ("fused", "fp32")),
                           ("lora_targets", ("qv", "attention", "all-linear"))):
            if getattr(self, f) not in allowed:
                raise CellInputError(f, f"{getattr(self, f)!r} is not one of {', '.join(map(repr, allowed))}")

    def _check_encdec(self) -> None:
        if self.family != "t5":
            for f in ("decoder_layers", "target_length"):
                if getattr(self, f):
                    raise CellInputError(f, f"only the t5 family has one (family {self.family!r})")
            if not self.tied_embeddings:
                raise CellInputError("tied_embeddings", f"only the t5 family's head is counted untied (family "
                                                        f"{self.family!r})")
            return
        for f in ("decoder_layers", "target_length", "ffn_hidden"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CellInputError(f, f"must be a positive integer for an encoder-decoder, got {v!r}")
        if self.decoder_layers >= self.num_layers:
            raise CellInputError("decoder_layers", f"{self.decoder_layers} of num_layers {self.num_layers} leaves "
                                                   "the encoder no layer")

    @property
    def encoder_layers(self) -> int:
        """The layers before the decoder's (all of them but for a t5)."""
        return self.num_layers - self.decoder_layers

    def checkpointed(self, idx: int) -> bool:
        """Whether layer idx recomputes its forward in backward (every `checkpoint_every`-th layer)."""
        return self.recompute and (idx + 1) % self.checkpoint_every == 0

    def recompute_passes(self, idx: int) -> float:
        """Forward passes of layer idx's weight GEMMs recomputed: 1 (full), 1/2 (per-op SAC: torchtitan's
        policy saves every second matmul output, plan_time.py's rule) or 0."""
        if not self.checkpointed(idx):
            return 0.0
        return 0.5 if self.op_checkpoint else 1.0

    @property
    def recipe_signature(self) -> str:
        """The recipe fields off their defaults, for the signature ("" when none is)."""
        parts = []
        if self.checkpoint_every != 1:
            parts.append(f"ce{self.checkpoint_every}")
        if self.op_checkpoint:
            parts.append(f"op{int(self.gated)}")
        if self.lora_rank:
            parts.append(f"lora{self.lora_rank}{self.lora_targets}f{self.ffn_hidden}g{int(self.gated)}"
                         f"fb{self.frozen_bytes:g}")
        if self.float8 != "none":
            parts.append(f"f8{self.float8}")
        if self.compiled:
            parts.append("comp")
        if self.sharding:
            parts.append(f"sh{self.sharding}{self.reshard}")
        if self.loss != "fused":
            parts.append(f"loss{self.loss}")
        return "-".join(parts)

    @property
    def state_bytes_per_param(self) -> float:
        return (self.weight_grad_bytes or 2.0 * self.dtype_bytes) + self.optimizer_bytes_per_param

    @property
    def signature(self) -> str:
        """Same dimensions, batch and recipe, same signature (the name does not count)."""
        s = (f"{self.family}-h{self.hidden_size}-l{self.num_layers}-a{self.num_heads}-v{self.vocab_size}"
             f"-s{self.seq_length}-b{self.global_batch}-f{self.ffn_mult:g}-d{self.dtype_bytes}"
             f"-r{int(self.recompute)}-w{self.weight_grad_bytes:g}-o{self.optimizer_bytes_per_param:g}")
        if self.family == "moe":
            s += (f"-e{self.num_experts}k{self.top_k}g{self.expert_group_size}m{self.moe_every}"
                  f"c{self.capacity_factor:g}")
        if self.family == "wresnet":
            s += f"-wf{self.width_factor}"
        if self.family == "t5":
            s += f"-dl{self.decoder_layers}-t{self.target_length}-fh{self.ffn_hidden}g{int(self.gated)}"
            if not self.tied_embeddings:
                s += "-untied"
        if self.kv_heads and self.kv_heads != self.num_heads:
            s += f"-kv{self.kv_heads}"
        if self.head_dim and self.head_dim * self.num_heads != self.hidden_size:
            s += f"-hd{self.head_dim}"
        if self.flash_attention:  # causal masking and windows change the costs only under flash
            s += f"-fa{int(self.causal)}w{self.sliding_window}x{self.sliding_every}"
        if self.recipe_signature:
            s += "-" + self.recipe_signature
        return s

    def attention(self, idx: int) -> Attention:
        """Layer idx's attention (estimator/layer_costs.py)."""
        local = self.sliding_window and (self.sliding_every == 1 or idx % self.sliding_every == 0)
        seq, causal = self.seq_length, self.causal
        if self.family == "t5" and idx >= self.encoder_layers:  # a decoder layer's self-attention
            seq, causal = self.target_length, True
        return Attention(self.hidden_size, self.num_heads, self.kv_heads or self.num_heads,
                         self.head_dim or self.hidden_size // self.num_heads, seq,
                         causal=causal, flash=self.flash_attention,
                         window=self.sliding_window if local else 0)

    @classmethod
    def wide_resnet(cls, depth: int, width_factor: int, filters: int, num_classes: int, image_size: int,
                    global_batch: int, name: str = "") -> CellModel:
        """Alpa's Wide-ResNet as the Crius artifact trains it: float32 throughout, SGD with Nesterov
        momentum (4 B weights + 4 B gradients + 4 B momentum per parameter), coarse-grained remat."""
        return cls(family="wresnet", hidden_size=filters, num_layers=depth, num_heads=1, vocab_size=num_classes,
                   seq_length=image_size, global_batch=global_batch, dtype_bytes=4, recompute=True,
                   weight_grad_bytes=8.0, optimizer_bytes_per_param=4.0, precision="fp32-sgd-momentum",
                   name=name, width_factor=width_factor)

    @classmethod
    def from_dims(cls, dims: ModelDims, global_batch: int, precision: str = "mixed", recompute: bool = True,
                  expert_group_size: int = 2048, name: str | None = None,
                  flash_attention: bool = False) -> CellModel:
        """From the shared ModelDims (estimator/models.py), the job's global batch and a precision recipe
        of estimator/memory.py (bytes of weights, gradients and optimizer per parameter). A Wide-ResNet
        takes the artifact's recipe (`wide_resnet`), whatever `precision` and `recompute` say."""
        from tessera.estimator.memory_terms import RECIPES

        if dims.family == "wresnet":
            return cls.wide_resnet(dims.num_layers, dims.width_factor, dims.hidden_size, dims.vocab_size,
                                   dims.seq_length, global_batch, name=dims.name if name is None else name)

        if precision not in RECIPES:
            raise CellInputError("precision", f"unknown recipe {precision!r}; known: {', '.join(RECIPES)}")
        r = RECIPES[precision]
        ffn = dims.ffn * (1.5 if dims.gated else 1.0) / dims.hidden_size
        capacity = dims.capacity_factor
        if dims.family == "moe" and capacity == 0:
            # Dropless (Mixtral, torchtitan): every token reaches its top-k experts. Timed and sized as
            # balanced routing, capacity 1.0 (each expert gets its k x tokens / E rows); a gated one
            # routes by index (no GShard one-hot dispatch/combine: groups of one token), as
            # plan_time.cell_model times it.
            capacity = 1.0
            expert_group_size = 1 if dims.gated else expert_group_size
        layers, encdec = dims.num_layers, dict[str, Any]()
        if dims.family == "encoder-decoder":  # num_layers counts the encoder's and the decoder's
            layers += dims.decoder_layers
            encdec = {"decoder_layers": dims.decoder_layers, "target_length": dims.target_length,
                      "tied_embeddings": dims.tied_embeddings, "ffn_hidden": dims.ffn, "gated": dims.gated}
        return cls(family=_FAMILY_OF_DIMS.get(dims.family, dims.family), hidden_size=dims.hidden_size,
                   num_layers=layers, num_heads=dims.num_heads, vocab_size=dims.vocab_size,
                   seq_length=dims.seq_length, global_batch=global_batch,
                   ffn_mult=int(ffn) if float(ffn).is_integer() else ffn,
                   num_experts=dims.num_experts, top_k=dims.top_k, expert_group_size=expert_group_size,
                   moe_every=dims.moe_every, capacity_factor=capacity, dtype_bytes=r.activation,
                   recompute=recompute, weight_grad_bytes=float(r.param + r.grad),
                   optimizer_bytes_per_param=float(r.optimizer), precision=precision,
                   name=dims.name if name is None else name,
                   kv_heads=dims.kv_heads if dims.kv_heads != dims.num_heads else 0, head_dim=dims.kv_channels,
                   causal=dims.family in ("decoder", "moe"), flash_attention=flash_attention,
                   sliding_window=dims.sliding_window, sliding_every=2 if dims.sandwich_norm else 1,
                   **encdec)


def _op_saved(m: CellModel, att: Attention, mlp: float) -> float:
    """Bytes per token a layer keeps under torchtitan's per-op SAC (torchtitan/distributed/
    activation_checkpoint.py, _custom_policy): its input, every second matmul output in execution order
    (q, v, then w1 and w2 of a SwiGLU MLP, or the first MLP linear of a two-matrix one), the attention
    output and its fp32 logsumexp (flash/efficient SDPA ops are on the save list)."""
    h, d = m.hidden_size, m.dtype_bytes
    return d * (h + att.width + att.kv_width + att.width + mlp) + 4 * att.heads


def _dense_layer(m: CellModel, idx: int) -> Operator:
    h, s, a, f, d = m.hidden_size, m.seq_length, m.num_heads, m.ffn_mult, m.dtype_bytes
    att = m.attention(idx)
    ckpt = m.checkpointed(idx)
    rec = m.recompute_passes(idx)  # the recomputed forward (of the weight GEMMs)
    full = 1 if ckpt and not m.op_checkpoint else 0  # the attention core is recomputed too
    lin = att.linear_fwd_flops + 2 * 2 * f * h * h  # per token: weight GEMMs (MLP: f x h x h twice)
    rep = 10 * h * d / 2  # Korthikanti bytes per token (written for 2-byte activations)
    shard = att.sharded_traffic(d) + 2 * f * h * d + att.score_traffic
    calls = 6 if full else 4
    mlp = ((m.ffn_hidden or f * h / 1.5) + h) if m.gated else f * h  # the MLP outputs per-op SAC saves
    stored = (s * h * d) if full else _op_saved(m, att, mlp) * s if ckpt else (rep + shard) * s
    return Operator(
        name=f"layer{idx}", flops=((3 + rec) * lin + att.score_train_flops + full * att.score_fwd_flops) * s,
        params=att.params + 2 * f * h * h + (9 + f) * h,
        out_bytes=s * h * d, traffic_bytes=rep * s, traffic_sharded_bytes=shard * s,
        tp_comm_bytes=calls * s * h * d, comm_calls=calls,
        stored_bytes=stored,
        shape=LayerShape("transformer", h, a, round(f * h), s, recompute=bool(full)),
        linear_flops=(3 + rec) * lin * s,
    )


def _moe_layer(m: CellModel, idx: int) -> Operator:
    h, s, a, f, d = m.hidden_size, m.seq_length, m.num_heads, m.ffn_mult, m.dtype_bytes
    e, k, g, cf = m.num_experts, m.top_k, m.expert_group_size, m.capacity_factor
    att = m.attention(idx)
    ckpt = m.checkpointed(idx)
    rec = m.recompute_passes(idx)
    full = 1 if ckpt and not m.op_checkpoint else 0
    slots = cf * k * g  # E * C expert slots per group: the one-hot dispatch/combine tensors per token
    # attention + top-k expert FFNs + gating (weight GEMMs), one-hot dispatch/combine einsums (not)
    lin = att.linear_fwd_flops + k * 4 * f * h * h + 2 * h * e
    einsum = 2 * 2 * h * slots
    rep = 10 * h * d / 2 + 2 * slots * d  # + dispatch mask and combine weights per token
    shard = att.sharded_traffic(d) + 2 * k * f * h * d + att.score_traffic
    calls = 6 if full else 4
    expert = e * (2 * f * h * h + f * h + h)
    # per-op SAC of a MoE layer: the attention's saved outputs, and every second of the routed tokens'
    # two expert matmul outputs (the first: f x h per routed token)
    op_saved = _op_saved(m, att, k * f * h)
    stored = (s * h * d) if full else op_saved * s if ckpt else (rep + shard) * s
    return Operator(
        name=f"moe{idx}",
        flops=((3 + rec) * (lin + einsum) + att.score_train_flops + full * att.score_fwd_flops) * s,
        params=att.params + 4 * h + h * e + expert,
        expert_params=expert, out_bytes=s * h * d, traffic_bytes=rep * s, traffic_sharded_bytes=shard * s,
        tp_comm_bytes=calls * s * h * d, a2a_bytes=calls * cf * k * s * h * d, comm_calls=calls,
        stored_bytes=stored,
        shape=LayerShape("moe", h, a, round(f * h), s, experts=e, top_k=k, recompute=bool(full)),
        linear_flops=(3 + rec) * lin * s,
    )


def model_operators(m: CellModel) -> tuple[Operator, ...]:
    """The operator chain: embedding, layers (dense or MoE), head (logits + loss), per sample; for a
    Wide-ResNet: stem, bottleneck blocks, head (estimator/convnets.py)."""
    if m.family == "wresnet":
        return wide_resnet_operators(m.num_layers, m.width_factor, m.hidden_size, m.vocab_size, m.seq_length,
                                     m.dtype_bytes, m.recompute)
    if m.family == "t5":
        # the encoder's layers as a BERT's, the decoder's as a GPT's over the target tokens (numbered on
        # through: their checkpointing counts from the first encoder layer), cell_encdec.py adds the rest
        n = m.encoder_layers
        enc = replace(m, family="bert", num_layers=n, decoder_layers=0, target_length=0, tied_embeddings=True)
        dec = replace(m, family="gpt", num_layers=m.decoder_layers, seq_length=m.target_length, causal=True,
                      decoder_layers=0, target_length=0, tied_embeddings=True)
        return encoder_decoder_operators(m, [_dense_layer(enc, i) for i in range(n)],
                                         [_dense_layer(dec, n + j) for j in range(m.decoder_layers)], _head(dec))
    h, s, v, d = m.hidden_size, m.seq_length, m.vocab_size, m.dtype_bytes
    ops = [Operator("embedding", flops=0.0, params=v * h + s * h, out_bytes=s * h * d,
                    traffic_bytes=2 * s * h * d, stored_bytes=0.0,
                    shape=LayerShape("embedding", h, seq=s, vocab=v))]
    for i in range(m.num_layers):
        if m.family == "moe" and (i % m.moe_every) == m.moe_every - 1:
            ops.append(_moe_layer(m, i))
        else:
            ops.append(_dense_layer(m, i))
    ops.append(_head(m))
    if m.lora_rank:
        return lora_cell_operators(m, tuple(ops))
    return tuple(ops)


def _head(m: CellModel) -> Operator:
    h, s, v, d = m.hidden_size, m.seq_length, m.vocab_size, m.dtype_bytes
    # logits: forward + backward matmuls (not recomputed); fp32 logits, softmax and their gradient.
    # An fp32 loss (torchtitan, transformers) keeps its fp32 log-softmax for backward; torchtitan's
    # Float8 converter leaves the output projection in bf16 (filter_fqns "output": linear_flops 0).
    kept = 4 * s * v if m.loss == "fp32" else 0.0
    return Operator("head", flops=6.0 * h * v * s, params=v * h, out_bytes=0.0,
                    traffic_sharded_bytes=3 * 4 * s * v, tp_comm_bytes=2 * s * h * d, comm_calls=2,
                    stored_bytes=s * h * d + kept, shape=LayerShape("head", h, seq=s, vocab=v),
                    linear_flops=0.0 if m.float8 != "none" else 6.0 * h * v * s)


# ---------------------------------------------------------------------------------------------------
# Cluster description


@dataclass(frozen=True)
class GpuPool:
    """The GPUs of one type in the cluster and how they are wired.

    `intra_link`: "nvlink" or "pcie" between GPUs of one node; `nic_gbps`: the node's network
    bandwidth in GB/s per direction (100 Gb/s InfiniBand = 12.5); `pcie_gbps` per direction (both
    0.0125..10,000: clusterfile.MIN_LINK_GBPS, MAX_LINK_GBPS).
    `intra_efficiency` / `network_efficiency` override the LinkPrior's achievable fraction for this
    pool's links (what a profiled table of this pool would say; None = the prior). `price_per_hour`:
    what one of these GPUs costs per hour in `currency` (an ISO 4217 code, or empty); None = the
    catalog's public price when it has one. `memory_bytes`: the memory each GPU offers when it is
    not the catalog's (what the nodes report: a declared inventory, memory other processes hold);
    0 = the catalog's.
    """

    gpu: str
    num_gpus: int
    gpus_per_node: int
    intra_link: str = ""
    nic_gbps: float = 12.5
    pcie_gbps: float = 32.0
    intra_efficiency: float | None = None
    network_efficiency: float | None = None
    price_per_hour: float | None = None
    currency: str = ""
    memory_bytes: float = 0.0

    def __post_init__(self) -> None:
        try:
            entry = lookup(self.gpu)
        except UnknownGpuError as exc:
            raise CellInputError("gpu", f"{exc}") from exc
        object.__setattr__(self, "gpu", entry.name)
        # The cluster file's bounds, here for every caller (the service's requests came without them).
        if self.num_gpus < 1:
            raise CellInputError("num_gpus", f"must be >= 1, got {self.num_gpus}")
        if self.gpus_per_node < 1:
            raise CellInputError("gpus_per_node", f"must be >= 1, got {self.gpus_per_node}")
        if self.gpus_per_node > MAX_GPUS_PER_NODE:
            raise CellInputError("gpus_per_node", f"must be at most {MAX_GPUS_PER_NODE}, got {self.gpus_per_node}")
        if self.num_gpus > MAX_NODES_PER_GROUP * self.gpus_per_node:
            raise CellInputError("num_gpus", f"must be at most {MAX_NODES_PER_GROUP:,} nodes of "
                                             f"{self.gpus_per_node} GPUs, got {self.num_gpus:,}")
        if not self.intra_link:
            object.__setattr__(self, "intra_link", "nvlink" if entry.nvlink_gbps > 0 else "pcie")
        if self.intra_link not in ("nvlink", "pcie"):
            raise CellInputError("intra_link", f"must be 'nvlink' or 'pcie', got {self.intra_link!r}")
        if self.intra_link == "nvlink" and entry.nvlink_gbps <= 0:
            raise CellInputError("intra_link", f"{entry.name} has no NVLink in the catalog")
        for f in ("nic_gbps", "pcie_gbps"):
            # A NaN bandwidth passed `<= 0` and made the Cell search loop forever (NaN != NaN).
            why = clusterfile.link_gbps_refusal(getattr(self, f))
            if why:
                raise CellInputError(f, why)
        for f in ("intra_efficiency", "network_efficiency"):
            v = getattr(self, f)
            if v is not None and not 0 < v <= 1:
                raise CellInputError(f, f"must be in (0, 1], got {v}")
        if self.price_per_hour is not None and not 0 <= self.price_per_hour <= MAX_PRICE_PER_HOUR:
            # Bounded, as tessctl plan-cost bounds its prices: 1e308 made every cost inf.
            raise CellInputError("price_per_hour", f"must be a number 0..{MAX_PRICE_PER_HOUR:,.0f} per GPU-hour, "
                                                   f"got {self.price_per_hour}")
        if self.currency and not (len(self.currency) == 3 and self.currency.isascii() and self.currency.isupper()):
            raise CellInputError("currency", f"must be an ISO 4217 code such as USD, got {self.currency[:16]!r}")
        mem = self.memory_bytes
        if isinstance(mem, bool) or not isinstance(mem, int | float) or not 0 <= mem < math.inf:
            raise CellInputError("memory_bytes", f"must be a number of bytes >= 0 (0 = the catalog's), got {mem!r}")
        if self.currency and self.price_per_hour is None:
            raise CellInputError("currency", "given without price_per_hour")

    @property
    def gpu_type(self) -> GpuType:
        entry = lookup(self.gpu)
        if self.memory_bytes:
            return replace(entry, memory_gb=self.memory_bytes / GB)
        return entry

    @property
    def price(self) -> Price | None:
        """One GPU's price per hour: the cluster's own, else the catalog's public one, else None."""
        if self.price_per_hour is not None:
            return Price(self.price_per_hour, self.currency, "cluster")
        return price(self.gpu)


@dataclass(frozen=True)
class ClusterSpec:
    pools: tuple[GpuPool, ...]

    @classmethod
    def from_mapping(cls, obj: Mapping[str, Any]) -> ClusterSpec:
        """{"pools": [{"gpu": "A100-40GB", "nodes": 80, "gpus_per_node": 4, "intra_link": "nvlink",
        "nic_gbps": 12.5, "price_per_hour": 1.9, "currency": "USD"}, ...]}; `num_gpus` may replace
        `nodes`. Checked by the one `pools:` parser (estimator/clusterfile.py): ClusterFileError."""
        return cls(tuple(pool_from_spec(p) for p in parse_pools(obj)))


def pool_from_spec(spec: PoolSpec) -> GpuPool:
    """The pool of a cluster file's PoolSpec; what the file leaves out takes GpuPool's defaults."""
    given = {k: v for k, v in (("nic_gbps", spec.nic_gbps), ("pcie_gbps", spec.pcie_gbps)) if v is not None}
    return GpuPool(spec.gpu, spec.num_gpus, spec.gpus_per_node, spec.intra_link, price_per_hour=spec.price_per_hour,
                   currency=spec.currency, **given)


@dataclass(frozen=True)
class LinkPrior:
    """Achievable fraction of nominal bandwidth and per-message latency per link kind (a prior).

    NVLink, PCIe and all-to-all efficiencies were fitted with the compute prior on the training half of
    the Crius artifact's optima (bench/estimator_arena.py --refit, seed 0). The network efficiency is
    the nccl-tests-typical 0.8, not fitted: the arena fit is per GPU pool (`GpuPool.network_efficiency`)
    because every cluster's fabric differs; measure yours with tessera.estimator.torch.comm_profile.
    """

    nvlink_efficiency: float = 0.5652
    pcie_efficiency: float = 0.7187
    network_efficiency: float = 0.8
    nvlink_latency_s: float = 5e-6
    pcie_latency_s: float = 10e-6
    network_latency_s: float = 20e-6
    all_to_all_efficiency: float = 0.0999
    source: str = "prior:links(nvlink=0.565,pcie=0.719,net=0.8,a2a=0.100;fit:arena-train-seed0)"


def pool_links(pool: GpuPool, prior: LinkPrior) -> tuple[Link, Link]:
    """(intra-node link, inter-node link) of a pool; NVLink bandwidth per direction = catalog / 2."""
    g = pool.gpu_type
    if pool.intra_link == "nvlink":
        eff = pool.intra_efficiency or prior.nvlink_efficiency
        intra = Link("nvlink", g.nvlink_gbps / 2, prior.nvlink_latency_s, eff, "catalog")
    else:
        eff = pool.intra_efficiency or prior.pcie_efficiency
        intra = Link("pcie", pool.pcie_gbps, prior.pcie_latency_s, eff, "cluster")
    inter = Link("ib", pool.nic_gbps, prior.network_latency_s, pool.network_efficiency or prior.network_efficiency,
                 "cluster")
    return intra, inter


# ---------------------------------------------------------------------------------------------------
# Plans and configuration


@dataclass(frozen=True)
class CellConfig:
    """Knobs of the Cell estimator, with their defaults and where each comes from.

    - `prior`: compute efficiency prior (compute.py);
    - `links`: link efficiency/latency prior;
    - `microbatches_per_stage`: with Ns > 1 stages, B is searched over the divisors of the batch from
      Ns up to this x Ns (GPipe; Crius Figure 10); one stage takes the smallest B that fits
      (estimator/cell_search.py);
    - `num_microbatches`: when > 0, B is this for every Cell instead (a runtime that fixes it: the
      Crius artifact's trainers all run 16), capped by the global batch;
    - `fsdp_stages`: one-stage Cells may shard the model state over the DP ranks (FSDP/ZeRO-3) where
      the unsharded layout does not fit (estimator/cell_fsdp.py);
    - `dp_shards_optimizer`: DP ranks of a stage shard the optimizer states (ZeRO-1, as Alpa's
      auto-sharding and FSDP/ZeRO trainers do); the gradient reduce-scatter + parameter all-gather
      move the same bytes as the all-reduce, so only memory and the optimizer step change;
    - `usable_memory_fraction` of the catalog memory, after `reserved_bytes` (CUDA context,
      workspace, communicator buffers);
    - `max_gpus`: the largest GPU count considered for one job; `stage_counts`: None = powers of two;
    - `balance_tolerance`: partition.py.
    """

    prior: EfficiencyPrior = DEFAULT_PRIOR
    links: LinkPrior = LinkPrior()
    microbatches_per_stage: int = 4
    num_microbatches: int = 0
    dp_shards_optimizer: bool = True
    usable_memory_fraction: float = 0.95
    reserved_bytes: float = 1.5e9
    max_gpus: int = 64
    stage_counts: tuple[int, ...] | None = None
    balance_tolerance: float = 0.1
    fsdp_stages: bool = True

    def __post_init__(self) -> None:
        if self.microbatches_per_stage < 1:
            raise CellInputError("microbatches_per_stage", "must be >= 1")
        if self.num_microbatches < 0:
            raise CellInputError("num_microbatches", "must be >= 0 (0 = microbatches_per_stage x stages)")
        if not 0 < self.usable_memory_fraction <= 1:
            raise CellInputError("usable_memory_fraction", "must be in (0, 1]")
        if self.max_gpus < 1:
            raise CellInputError("max_gpus", "must be >= 1")


# ---------------------------------------------------------------------------------------------------
# Stage costs


def shards_optimizer(model: CellModel, cfg: CellConfig) -> bool:
    """Whether a stage's DP ranks shard the optimizer states: the recipe's sharding when it fixes one,
    else the configuration's (ZeRO-1)."""
    return cfg.dp_shards_optimizer if not model.sharding else model.sharding != "none"


def _node(rank: int, per_node: int) -> int:
    return rank // per_node


@dataclass(frozen=True)
class _Placement:
    nodes: int
    per_node: int


def _stage_cost(
    ops: Sequence[Operator],
    plan: StagePlan,
    first_rank: int,
    prev: tuple[int, int] | None,
    place: _Placement,
    gpu: GpuType,
    intra: Link,
    inter: Link,
    micro_batch: float,
    stage_index: int,
    num_stages: int,
    num_microbatches: int,
    cfg: CellConfig,
    comm: CommModel,
    profiler: OperatorProfiler | None,
    model: CellModel,
) -> StageCost:
    dp, tp = plan.dp, plan.tp
    pn = place.per_node
    sops = ops[plan.start:plan.end]
    samples = micro_batch / dp
    if profiler is not None and all(o.shape is not None for o in sops):
        ce = profile_stage_compute(sops, dp, tp, micro_batch, profiler)
    else:
        ce = stage_compute_time(sops, gpu, dp, tp, micro_batch, cfg.prior, fp32=model.dtype_bytes >= 4,
                                flash=model.flash_attention, float8=model.float8 != "none",
                                compiled=model.compiled)
    sources: set[str] = set()

    # groups: TP = tp consecutive ranks; DP = dp ranks with stride tp
    tp_cross = _node(first_rank, pn) != _node(first_rank + tp - 1, pn)
    dp_cross = _node(first_rank, pn) != _node(first_rank + (dp - 1) * tp, pn)
    tp_link = inter if tp_cross else intra
    dp_link = inter if dp_cross else intra
    dp_share = min(tp, pn) if dp_cross else 1

    intra_t = 0.0
    for o in sops:
        if tp > 1 and o.tp_comm_bytes > 0:
            calls = max(1, o.comm_calls)
            e = comm.time("all_reduce", o.tp_comm_bytes * samples / calls, tp, tp_link)
            intra_t += calls * e.seconds
            sources.add(e.source)
        if dp > 1 and o.a2a_bytes > 0:
            calls = max(1, o.comm_calls)
            a2a_link = replace(dp_link, efficiency=dp_link.efficiency * cfg.links.all_to_all_efficiency)
            e = comm.time("all_to_all", o.a2a_bytes * samples / calls / tp, dp, a2a_link, dp_share)
            intra_t += calls * e.seconds
            sources.add(e.source)

    # inter-stage: activation forward + gradient backward from the previous stage
    inter_t = 0.0
    if prev is not None and plan.start > 0:
        nbytes = 2 * ops[plan.start - 1].out_bytes * micro_batch
        prev_first, prev_gpus = prev
        cur_nodes = {_node(r, pn) for r in range(first_rank, first_rank + plan.gpus)}
        prev_nodes = {_node(r, pn) for r in range(prev_first, prev_first + prev_gpus)}
        if cur_nodes == prev_nodes and len(cur_nodes) == 1:
            pieces = plan.gpus if intra.kind == "nvlink" else 1
            e = comm.time("p2p", nbytes / pieces, 2, intra)
        else:
            e = comm.time("p2p", nbytes / min(len(cur_nodes), len(prev_nodes)), 2, inter)
        inter_t += e.seconds
        sources.add(e.source)
        if tp > 1:  # Alpa-style: send 1/tp slices, then all-gather inside the TP group
            e = comm.time("all_gather", nbytes, tp, tp_link)
            inter_t += e.seconds
            sources.add(e.source)

    # per iteration: gradient all-reduce of replicated parameters, then the optimizer step; a frozen
    # base (LoRA) has neither gradients nor optimizer states, only its weights
    frozen = sum(o.frozen_params for o in sops)
    dense = sum(o.params - o.expert_params for o in sops) - frozen
    expert = sum(o.expert_params for o in sops)
    sync = 0.0
    if dp > 1:
        e = comm.time("all_reduce", dense / tp * model.dtype_bytes, dp, dp_link, dp_share)
        sync += e.seconds
        sources.add(e.source)
    weight_bytes = model.weight_grad_bytes or 2.0 * model.dtype_bytes  # weights + gradients
    opt_shard = dp if shards_optimizer(model, cfg) else 1
    params_opt = dense / (tp * opt_shard) + expert / (tp * dp)  # whose optimizer states live here
    sync += optimizer_step_time(params_opt, gpu, weight_bytes + model.optimizer_bytes_per_param)

    mem = _stage_memory(sops, dp, tp, samples, stage_index, num_stages, num_microbatches, cfg, model)
    fits = mem <= gpu.memory_bytes * cfg.usable_memory_fraction
    comm_src = "+".join(sorted(sources)) if sources else "formula:none"
    compute_t = ce.seconds + cfg.prior.microbatch_overhead_s
    return StageCost(plan, compute_t, intra_t, inter_t, sync, mem, fits, ce.source, comm_src)


def _stage_memory(sops: Sequence[Operator], dp: int, tp: int, samples: float, stage_index: int, num_stages: int,
                  num_microbatches: int, cfg: CellConfig, model: CellModel) -> float:
    """Bytes per GPU of a stage holding operators `sops` in a (dp, tp) layout: model states + stored
    activations of the in-flight micro-batches (1F1B) + one operator's transient activations + the
    reserve."""
    frozen = sum(o.frozen_params for o in sops)
    dense = sum(o.params - o.expert_params for o in sops) - frozen
    expert = sum(o.expert_params for o in sops)
    params_here = dense / tp + expert / (tp * dp)
    weight_bytes = model.weight_grad_bytes or 2.0 * model.dtype_bytes  # weights + gradients
    opt_shard = dp if shards_optimizer(model, cfg) else 1
    params_opt = dense / (tp * opt_shard) + expert / (tp * dp)  # whose optimizer states live here
    inflight = min(num_microbatches, num_stages - stage_index)
    stored = sum(o.stored_bytes for o in sops) * samples * inflight
    transient = max((o.traffic_bytes + o.traffic_sharded_bytes / tp for o in sops), default=0.0) * samples
    states = params_here * weight_bytes + params_opt * model.optimizer_bytes_per_param + frozen / tp * model.frozen_bytes
    if num_stages > 1 and model.sharding == "fsdp" and not frozen:
        # FSDP2 under PP (torchtitan: no resharding after forward, pipelining's no reshard after
        # backward): the fp32 state sharded over the DP ranks, plus the stage's unsharded compute-dtype
        # weights and, once a micro-batch's backward ran before the peak, its unsharded reduce-dtype
        # gradient (tessera.estimator.memory's native formula); ZeRO-1's bytes fell 2-28 % short
        grad = (2.0 if model.precision == "bf16" else 4.0) if num_microbatches > inflight else 0.0
        states = (dense / (tp * dp) + expert / (tp * dp)) * model.state_bytes_per_param + params_here * (
            model.dtype_bytes + grad)
    return states + stored + transient + cfg.reserved_bytes


# ---------------------------------------------------------------------------------------------------
# The assembled plans and the exact best one


def stage_options(gpus: int, gpus_per_node: int | None = None, num_heads: int | None = None) -> tuple[tuple[int, int], ...]:
    """Every (dp, tp) of a stage: DP-only, the hybrids and TP-only, tp a power of two within a node
    that divides the heads (cell_search.stage_layouts; Sec. 5.1 had DP-only or TP-only)."""
    return stage_layouts(gpus, gpus_per_node, num_heads)


def enumerate_plans(options: Sequence[Sequence[StageCost]], num_microbatches: int) -> list[PlanEstimate]:
    """Every combination of one option per stage (the product of the options' counts), memory-infeasible dropped."""
    out = []
    for combo in itertools.product(*options):
        if not all(c.fits for c in combo):
            continue
        plan = CellPlan(tuple(c.plan for c in combo), num_microbatches)
        out.append(PlanEstimate(plan, iteration_time(combo, num_microbatches), tuple(combo)))
    return out


def best_plan(options: Sequence[Sequence[StageCost]], num_microbatches: int) -> PlanEstimate | None:
    """The fastest feasible combination, exactly, without enumerating them (cell_search.exact_best:
    thresholds on max busy and max sync, then an independent choice per stage)."""
    return exact_best(options, num_microbatches)


# ---------------------------------------------------------------------------------------------------
# Cells


@dataclass(frozen=True)
class Cell:
    """One scheduling candidate: job x GPU type x GPU count x pipeline stages, with its estimate.

    `iter_time`, `memory_per_gpu` (bytes, the most loaded GPU of the best plan) and the breakdown
    carry their sources. `execution_plan` is the best plan as the shared tessera.estimator.plans.ExecutionPlan
    when all its stages have the same (dp, tp) (None otherwise), e.g. for tessera.estimator.memory's breakdown. `fits` is False with a `reason` when no assembled plan fits in memory or
    the Cell cannot be formed.
    """

    signature: str
    gpu_type: str
    num_gpus: int
    num_stages: int
    nodes: int
    gpus_per_node: int
    fits: bool
    reason: str
    plan: CellPlan | None = None
    iter_time: Sourced | None = None
    memory_per_gpu: Sourced | None = None
    breakdown: tuple[tuple[str, float], ...] = ()
    plans_assembled: int = 0
    plans_feasible: int = 0
    stage_gpus: tuple[int, ...] = ()
    execution_plan: ExecutionPlan | None = None
    # Espresso's cost (Eq. 1 for one iteration): GPUs x price per hour, and x iteration time when the
    # Cell fits; in `currency`. None when the pool has no known price.
    cost_per_hour: Sourced | None = None
    cost_per_iteration: Sourced | None = None
    currency: str = ""
    # The best plan's stages: times per micro-batch (compute, intra, inter) and per iteration (sync).
    stage_costs: tuple[StageCost, ...] = ()
    # When no plan fits for memory: the least memory (bytes) a plan would need on its most loaded
    # GPU (cell_search.CellSearch.need_bytes); 0 otherwise.
    memory_needed_per_gpu: float = 0.0

    @property
    def key(self) -> tuple[str, str, int, int, int, int]:
        return (self.signature, self.gpu_type, self.num_gpus, self.num_stages, self.nodes, self.gpus_per_node)


# A refused partition is memoised as its (field, reason), so the refusal is raised again as a
# CellInputError without keeping the exception (and its traceback's frames) alive.
_PARTITIONS: dict[tuple[str, int, int, float], StagePartition | tuple[str, str]] = {}


def clear_caches() -> None:
    """Drop the module-level partition memos, this one and partition.py's stage bounds
    (CellEstimator instances hold their own caches)."""
    _PARTITIONS.clear()
    partition.clear_cache()


def _partition(signature: str, ops: Sequence[Operator], num_gpus: int, num_stages: int,
               tolerance: float) -> StagePartition:
    """partition_stages, memoised by model signature (the operators are a function of it)."""
    key = (signature, num_gpus, num_stages, tolerance)
    hit = _PARTITIONS.get(key)
    if hit is None:
        try:
            hit = partition_stages(ops, num_gpus, num_stages, tolerance)
        except PartitionError as exc:
            hit = (exc.field, exc.reason)
        if len(_PARTITIONS) > 100_000:
            _PARTITIONS.clear()
        _PARTITIONS[key] = hit
    if isinstance(hit, tuple):
        raise CellInputError(*hit)
    return hit


def execution_plan(model: CellModel, plan: CellPlan, config: CellConfig | None = None) -> ExecutionPlan | None:
    """The shared ExecutionPlan of a Cell plan whose stages share one (dp, tp, sharding), with the
    model's recipe (cell_worker.py); None when the stages differ, the batch does not split into whole
    micro-batches per rank, a MoE's experts do not shard evenly over the DP ranks (the Cells hold
    1/dp of them per rank: no ep expresses that) or the recipe has no plan at that layout. An FSDP
    stage is sharding "fsdp" (one stage: FSDP2 reshards after forward, the "auto" default)."""
    cfg = config or CellConfig()
    if model.family == "wresnet":  # the shared plan vocabulary (and tessera.estimator.memory) is for transformers
        return None
    layouts = {(s.dp, s.tp, s.sharding) for s in plan.stages}
    if len(layouts) != 1:
        return None
    dp, tp, sharded = layouts.pop()
    b = plan.num_microbatches
    if model.global_batch % (b * dp):
        return None
    experts = model.num_experts if model.family == "moe" else 0
    if experts and experts % dp:
        return None
    if sharded == "fsdp" or model.sharding == "fsdp":
        sharding = "fsdp"
    else:
        sharding = "zero1" if shards_optimizer(model, cfg) and dp > 1 else "none"
    try:
        return ExecutionPlan(
            dp=dp, tp=tp, pp=plan.num_stages, micro_batch=model.global_batch // (b * dp), grad_accum=b,
            sharding=sharding,  # type: ignore[arg-type]
            precision=model.precision if model.precision in PRECISIONS else "mixed",  # type: ignore[arg-type]
            ep=dp if experts else 1, schedule="1f1b", **recipe_plan_fields(model, sharding))
    except PlanInputError:
        return None


def check_recipe_cell(model: CellModel, gpu: GpuType, num_stages: int) -> None:
    """CellInputError, naming the recipe's field, for a Cell the recipe cannot run in: Float8 on a GPU
    without FP8 tensor cores, FSDP2 resharding after forward under PP (the Cells hold a pipelined
    stage's weights unsharded, cell_fsdp.py) or never resharding without PP (every weight unsharded
    at the peak: not an option the Cells cost)."""
    if model.float8 != "none" and not has_fp8(gpu):
        raise CellInputError("plan.float8", f"{gpu.name} has no FP8 tensor cores: torchao Float8 would run slower, "
                                            "not faster (plan_time.py refuses it too)")
    if model.sharding == "fsdp" and model.reshard == "always" and num_stages > 1:
        raise CellInputError("plan.reshard_after_forward", "'always' under pipeline stages is not costed: "
                                                           "a pipelined Cell keeps its stage's weights unsharded")
    if model.sharding == "fsdp" and model.reshard == "never" and num_stages == 1:
        raise CellInputError("plan.reshard_after_forward", "'never' without pipeline stages is not costed: the "
                                                           "one-stage FSDP option reshards after forward")


def _pow2_upto(n: int) -> list[int]:
    out, c = [], 1
    while c <= n:
        out.append(c)
        c *= 2
    return out


MAX_CACHED_MODELS = 256  # distinct models whose operators, stage costs and Cells a CellEstimator keeps
# Stage costs and Cells kept in all: one model asked about on many pool shapes (links, node sizes,
# prices) grew them by about 100 MB per request of 120 pools. A stage cost holds about 0.9 KB (seen:
# 2,972 of them, 2.7 MB, for llama2-7b on four pools of 32-64 GPUs), so this is ~90 MB, some 30
# such models at once.
MAX_CACHED_ENTRIES = 100_000


@dataclass
class CellEstimator:
    """Cells of jobs with caches; one instance per configuration (the controller keeps one).

    Caches: stage costs by (model signature, stage plan, micro-batch, placement, GPU type); Cells by
    their key; both in memory. `record_measured` overrides a Cell's iteration time with a live
    measurement (source "measured"); `invalidate` drops a model's entries.
    """

    config: CellConfig = field(default_factory=CellConfig)
    comm: CommModel = field(default_factory=CommModel)
    profiler: OperatorProfiler | None = None
    _ops: dict[str, tuple[Operator, ...]] = field(default_factory=dict)
    _stage_cache: dict[tuple[Any, ...], StageCost] = field(default_factory=dict)
    _cell_cache: dict[tuple[Any, ...], Cell] = field(default_factory=dict)
    _measured: dict[tuple[str, str, int, int], float] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0

    def operators(self, model: CellModel) -> tuple[Operator, ...]:
        sig = model.signature
        if sig not in self._ops:
            if len(self._ops) >= MAX_CACHED_MODELS:
                # Models come from requests: a caller sending model after model would grow the
                # caches without end. A cluster's working set is far smaller; starting over is cheap.
                self.invalidate()
            self._ops[sig] = model_operators(model)
        return self._ops[sig]

    def invalidate(self, signature: str | None = None) -> None:
        if signature is None:
            self._ops.clear()
            self._stage_cache.clear()
            self._cell_cache.clear()
            return
        self._ops.pop(signature, None)
        self._stage_cache = {k: v for k, v in self._stage_cache.items() if k[0] != signature}
        self._cell_cache = {k: v for k, v in self._cell_cache.items() if k[0] != signature}

    def forget_measured(self, signature: str, gpu: str, num_gpus: int, num_stages: int) -> None:
        """Drop a live iteration time (the service keeps a bounded number): the Cell is estimated again."""
        if self._measured.pop((signature, gpu, num_gpus, num_stages), None) is not None:
            self._drop_cells(signature, gpu, num_gpus, num_stages)

    def record_measured(self, signature: str, gpu: str, num_gpus: int, num_stages: int, seconds: float) -> None:
        """A live iteration time for a Cell; later answers carry it with source "measured"."""
        if seconds <= 0:
            raise CellInputError("seconds", f"must be > 0, got {seconds}")
        try:
            name = lookup(gpu).name
        except UnknownGpuError as exc:
            raise CellInputError("gpu", f"{exc}") from exc
        self._measured[(signature, name, num_gpus, num_stages)] = seconds
        self._drop_cells(signature, name, num_gpus, num_stages)

    def _drop_cells(self, signature: str, gpu: str, num_gpus: int, num_stages: int) -> None:
        self._cell_cache = {k: v for k, v in self._cell_cache.items()
                            if not (k[0] == signature and k[1] == gpu and k[2] == num_gpus and k[3] == num_stages)}

    # -- one Cell ------------------------------------------------------------------------------------

    def stage_costs(
        self, model: CellModel, pool: GpuPool, num_gpus: int, num_stages: int,
        nodes: int | None = None, gpus_per_node: int | None = None,
        options: Sequence[Sequence[tuple[int, int]]] | None = None,
        num_microbatches: int | None = None,
    ) -> tuple[list[list[StageCost]], tuple[int, ...], _Placement]:
        """Stage options with their costs for a Cell (every `stage_options` layout unless `options` are given).

        Returns (options per stage, GPUs per stage, placement). `num_microbatches` defaults to
        the configuration's (`_default_microbatches`).
        """
        place = self._placement(pool, num_gpus, nodes, gpus_per_node)
        ops = self.operators(model)
        part = _partition(model.signature, ops, num_gpus, num_stages, self.config.balance_tolerance)
        b = num_microbatches or self._default_microbatches(model, num_stages)
        if b < 1 or b > model.global_batch:
            raise CellInputError("num_microbatches", f"must be in [1, {model.global_batch}], got {b}")
        mb = model.global_batch / b
        gpu = pool.gpu_type
        intra, inter = pool_links(pool, self.config.links)
        out: list[list[StageCost]] = []
        first = 0
        prev: tuple[int, int] | None = None
        # the layer ranges a worker may run each stage on (cell_worker.py): memory holds for them too
        worker = worker_op_ranges(len(ops), model.num_layers, num_stages) if model.family != "wresnet" else ()
        for i, ((start, end), g) in enumerate(zip(part.bounds, part.gpus)):
            opts = options[i] if options is not None else stage_options(g, place.per_node, model.num_heads)
            row = []
            for dp, tp in opts:
                if dp * tp != g:
                    raise CellInputError(f"options[{i}]", f"dp {dp} x tp {tp} != {g} GPUs of stage {i}")
                if dp > mb:  # a micro-batch cannot be split over more DP ranks than it has samples
                    continue
                if tp > model.num_heads:
                    continue
                sp = StagePlan(start, end, dp, tp)
                key = (model.signature, sp, b, first, prev, place, pool, self.profiler is not None)
                c = self._stage_cache.get(key)
                if c is None:
                    c = _stage_cost(ops, sp, first, prev, place, gpu, intra, inter, mb, i, num_stages, b,
                                    self.config, self.comm, self.profiler, model)
                    if worker:
                        usable = gpu.memory_bytes * self.config.usable_memory_fraction
                        c = with_memory_of(c, [
                            _stage_memory(ops[a:z], dp, tp, mb / dp, i, num_stages, b, self.config, model)
                            for a, z in worker[i] if (a, z) != (start, end)], usable)
                    if len(self._stage_cache) >= MAX_CACHED_ENTRIES:
                        self._stage_cache.clear()  # start over, as for models (cheap to rebuild)
                    self._stage_cache[key] = c
                row.append(c)
            out.append(row)
            prev = (first, g)
            first += g
        return out, part.gpus, place

    def _placement(self, pool: GpuPool, num_gpus: int, nodes: int | None, per_node: int | None) -> _Placement:
        if num_gpus < 1:
            raise CellInputError("num_gpus", f"must be >= 1, got {num_gpus}")
        if num_gpus > pool.num_gpus:
            raise CellInputError("num_gpus", f"{num_gpus} exceeds the {pool.num_gpus} {pool.gpu} GPUs of the pool")
        if per_node is None and nodes is None:
            per_node = min(num_gpus, pool.gpus_per_node)
            nodes = math.ceil(num_gpus / per_node)
        elif per_node is None:
            assert nodes is not None
            per_node = num_gpus // nodes if nodes > 0 else 0
        elif nodes is None:
            nodes = num_gpus // per_node if per_node > 0 else 0
        if per_node < 1 or nodes < 1 or per_node * nodes != num_gpus:
            raise CellInputError("nodes", f"{nodes} nodes x {per_node} GPUs per node != num_gpus {num_gpus}")
        if per_node > pool.gpus_per_node:
            raise CellInputError(
                "gpus_per_node", f"{per_node} exceeds the {pool.gpus_per_node} GPUs of a {pool.gpu} node")
        return _Placement(nodes, per_node)

    def cell(
        self, model: CellModel, pool: GpuPool, num_gpus: int, num_stages: int,
        nodes: int | None = None, gpus_per_node: int | None = None,
    ) -> Cell:
        """Estimate one Cell: the best of its assembled plans (memory-infeasible ones dropped) over
        the micro-batch counts estimator/cell_search.py chooses for it."""
        place = self._placement(pool, num_gpus, nodes, gpus_per_node)
        key = (model.signature, pool.gpu, num_gpus, num_stages, place.nodes, place.per_node, pool)
        hit = self._cell_cache.get(key)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        cell = self._cell(model, pool, num_gpus, num_stages, place)
        if len(self._cell_cache) >= MAX_CACHED_ENTRIES:
            self._cell_cache.clear()
        self._cell_cache[key] = cell
        return cell

    def _default_microbatches(self, model: CellModel, num_stages: int) -> int:
        """B of `stage_costs` when none is given: the configuration's fixed count, else
        microbatches_per_stage x Ns (the paper's); at most the batch. Cells choose theirs (cell_search)."""
        b = self.config.num_microbatches or self.config.microbatches_per_stage * num_stages
        return min(b, model.global_batch)

    def _cell(self, model: CellModel, pool: GpuPool, num_gpus: int, num_stages: int, place: _Placement) -> Cell:
        base: dict[str, Any] = {"signature": model.signature, "gpu_type": pool.gpu, "num_gpus": num_gpus,
                                "num_stages": num_stages, "nodes": place.nodes, "gpus_per_node": place.per_node}
        unit = pool.price
        if unit is not None:
            where = "cluster" if unit.source == "cluster" else f"catalog:{unit.source}"
            base["cost_per_hour"] = Sourced(num_gpus * unit.per_hour, where)
            base["currency"] = unit.currency
        try:
            found = self._search(model, pool, num_gpus, num_stages, place)
        except CellInputError as exc:
            return Cell(**base, fits=False, reason=str(exc))
        best, assembled, stage_gpus = found.best, found.assembled, found.stage_gpus
        if best is None:
            return Cell(**base, fits=False, reason=found.reason, plans_assembled=assembled, stage_gpus=stage_gpus,
                        memory_needed_per_gpu=found.need_bytes)
        feasible = found.feasible
        srcs = sorted({s.compute_source for s in best.stages} | {s.comm_source for s in best.stages})
        source = "+".join(s for s in srcs if s != "formula:none")
        mkey = (model.signature, pool.gpu, num_gpus, num_stages)
        it = (Sourced(self._measured[mkey], "measured") if mkey in self._measured
              else Sourced(best.iter_time, source))
        cost = base.get("cost_per_hour")
        if cost is not None:
            base["cost_per_iteration"] = Sourced(cost.value * it.value / 3600, "formula:cost_per_hour x iter_time")
        return Cell(**base, fits=True, reason="", plan=best.plan, iter_time=it,
                    memory_per_gpu=Sourced(best.memory_bytes, "formula:cells-memory"),
                    breakdown=tuple(best.breakdown().items()), plans_assembled=assembled,
                    plans_feasible=feasible, stage_gpus=stage_gpus, stage_costs=best.stages,
                    execution_plan=execution_plan(model, best.plan, self.config))

    def _search(self, model: CellModel, pool: GpuPool, num_gpus: int, num_stages: int,
                place: _Placement) -> CellSearch:
        """The Cell's best plan over its stage layouts and micro-batch counts (cell_search.py)."""
        cfg = self.config
        part = _partition(model.signature, self.operators(model), num_gpus, num_stages, cfg.balance_tolerance)
        heads = math.gcd(model.num_heads, model.kv_heads or model.num_heads)  # whole query and KV heads per TP rank
        layouts = [stage_options(g, place.per_node, heads) for g in part.gpus]

        check_recipe_cell(model, pool.gpu_type, num_stages)
        forced = model.sharding == "fsdp"  # the recipe shards: one-stage Cells take FSDP for every dp > 1

        def rows(opts: Sequence[Sequence[tuple[int, int]]], b: int) -> list[list[StageCost]]:
            out, _, _ = self.stage_costs(model, pool, num_gpus, num_stages, place.nodes, place.per_node,
                                         options=opts, num_microbatches=b)
            if num_stages == 1 and forced:
                out[0] = [self._fsdp(c, model, pool, place) if c.plan.dp > 1 else c for c in out[0]]
            elif num_stages == 1 and cfg.fsdp_stages and not model.sharding:
                # cell_fsdp.py: only where the unsharded layout does not fit
                out[0] = out[0] + [self._fsdp(c, model, pool, place) for c in out[0] if c.plan.dp > 1 and not c.fits]
            return out

        return search_cell(rows, layouts, part.gpus, model.global_batch, fixed_microbatches=cfg.num_microbatches,
                           microbatches_per_stage=cfg.microbatches_per_stage,
                           memory_gb=pool.gpu_type.memory_gb * cfg.usable_memory_fraction)

    def _fsdp(self, c: StageCost, model: CellModel, pool: GpuPool, place: _Placement) -> StageCost:
        """The FSDP variant of a one-stage option (its DP group: ranks tp apart from rank 0)."""
        dp, tp, pn = c.plan.dp, c.plan.tp, place.per_node
        intra, inter = pool_links(pool, self.config.links)
        crosses = _node(0, pn) != _node((dp - 1) * tp, pn)
        weight_grad = model.weight_grad_bytes or 2.0 * model.dtype_bytes
        gathered = 1.0 if model.float8 == "linear+allgather" else float(model.dtype_bytes)  # Float8 all-gather
        ctx = FsdpContext(inter if crosses else intra, min(tp, pn) if crosses else 1, gathered,
                          weight_grad, model.optimizer_bytes_per_param, pool.gpu_type,
                          pool.gpu_type.memory_bytes * self.config.usable_memory_fraction,
                          shards_optimizer(model, self.config), self.comm, model.frozen_bytes)
        return fsdp_variant(c, self.operators(model), ctx)

    # -- all Cells of a job ---------------------------------------------------------------------------

    def cells(self, model: CellModel, cluster: ClusterSpec | Iterable[GpuPool],
              deadline: float | None = None) -> tuple[Cell, ...]:
        """All Cells of a job on the cluster's GPU types: power-of-two GPU counts up to
        min(max_gpus, GPUs of the type), packed onto as few nodes as possible, and pipeline stage
        counts (powers of two by default) up to min(GPUs, layers). Past `deadline` (time.monotonic)
        CellsTooSlow, the Cells computed so far kept in the caches for the next call."""
        pools = cluster.pools if isinstance(cluster, ClusterSpec) else tuple(cluster)
        out: list[Cell] = []
        for pool in pools:
            for n in _pow2_upto(min(self.config.max_gpus, pool.num_gpus)):
                counts = self.config.stage_counts or tuple(_pow2_upto(n))
                for s in counts:
                    if s > n or s > model.num_layers:
                        continue
                    if deadline is not None and time.monotonic() > deadline:
                        raise CellsTooSlow(len(out))
                    out.append(self.cell(model, pool, n, s))
        return tuple(out)

    def best_cells(self, model: CellModel, cluster: ClusterSpec | Iterable[GpuPool],
                   deadline: float | None = None) -> tuple[Cell, ...]:
        """Per (GPU type, GPU count), the fitting Cell with the smallest iteration time."""
        best: dict[tuple[str, int], Cell] = {}
        for c in self.cells(model, cluster, deadline):
            if not c.fits or c.iter_time is None:
                continue
            k = (c.gpu_type, c.num_gpus)
            cur = best.get(k)
            if cur is None or (cur.iter_time is not None and c.iter_time.value < cur.iter_time.value):
                best[k] = c
        return tuple(best[k] for k in sorted(best))


def job_cells(model: CellModel, cluster: ClusterSpec, config: CellConfig | None = None,
              comm: CommModel | None = None) -> tuple[Cell, ...]:
    """All Cells of one job (a fresh estimator: no cache across calls)."""
    est = CellEstimator(config or CellConfig(), comm or CommModel())
    return est.cells(model, cluster)


def with_prior(config: CellConfig, prior: EfficiencyPrior, links: LinkPrior | None = None) -> CellConfig:
    return replace(config, prior=prior, links=links or config.links)
