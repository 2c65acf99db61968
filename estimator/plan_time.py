"""Iteration time of ONE execution plan on one GPU type (issue 14; `tessctl estimate time`).

The Cell estimator (cells.py) searches DP-only/TP-only plans of Alpa-like runtimes; this module
times a given `ExecutionPlan` of a PyTorch-native stack (torchtitan, Megatron, transformers + PEFT)
with the same pieces: the operator chain (`cells.model_operators`, attention costs of
layer_costs.py), the compute roofline (`compute.stage_compute_time` with the configured
`EfficiencyPrior`; without a config, the Cell prior with the constants fitted per GPU generation on
torchtitan's runs, time_constants.py), the communication model (`comm.CommModel` over `cells.pool_links`) and the
pipeline latency of Crius Sec. 5.1 (`cells.pipeline_latency`). What it adds is how a plan's recipe
changes those numbers; every rule is in docs/estimator-cells.md ("Time of one plan") with its source.

Rank layout (torchtitan's device mesh, outermost first): pp, dp, cp, tp. A stage holds
L / (pp x virtual_stages) layers per chunk (the remainder to the first chunks), the embedding on the
first stage and the head on the last. Per micro-batch a rank runs micro_batch samples of
seq_length / cp tokens. An encoder-decoder (T5) is its encoder's layers, then its decoder's with
cross-attention (`plan_operators`).

Per stage and micro-batch: compute (+ the prior's per-micro-batch overhead), recompute (the
checkpointed layers' forward again: `full` all of it, `op` half of the weight GEMMs (torchtitan's
per-op policy saves every second matmul output), `selective` the attention core), TP all-reduces
(4 per layer and 2 for the head, 2 more per fully recomputed layer; async TP hides the forward's
behind the forward weight GEMMs, all but 1/tp), ring attention's (cp - 1) K/V exchanges per layer overlapped
with the block attention compute, MoE all-to-all over the ep group, and under FSDP/ZeRO-3 the
exposed part of the per-layer all-gathers and reduce-scatters. Per iteration: the exposed gradient
reduction of replicated parameters (DDP: overlapped with the last micro-batch's backward except
the last bucket; ZeRO-1/2: its parameter all-gather is exposed), and the memory-bound optimizer step.

    iter_time = max(B x busy_k + pp_bubble + max_i (dp_comm_i + optimizer_i), host)

with busy_k the busiest stage's per-micro-batch time, B = grad_accum and pp_bubble = (Crius's
pipeline latency - B x busy_k) / virtual_stages; host is the time the busiest rank's host takes to
launch an eager step (host_time.py; `host_wait` is what it adds). The breakdown keys add up to
iter_time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tessera.common.gpus import GpuType, UnknownGpuError, lookup
from tessera.estimator.cells import (
    CellConfig,
    CellInputError,
    CellModel,
    GpuPool,
    model_operators,
    pipeline_latency,
    pool_links,
    with_prior,
)
from tessera.estimator.comm import CommModel, Link
from tessera.estimator.compute import flash_efficiency, has_fp8, optimizer_step_time, stage_compute_time
from tessera.estimator.host_time import extrapolation, host_seconds
from tessera.estimator.lora_costs import LoraOperators as LoraOperators  # noqa: PLC0414 (re-exported)
from tessera.estimator.lora_costs import layer_index as _layer_index
from tessera.estimator.lora_costs import lora_operators as lora_operators  # noqa: PLC0414
from tessera.estimator.memory_terms import RECIPES
from tessera.estimator.models import ModelDims
from tessera.estimator.partition import Operator
from tessera.estimator.plans import ExecutionPlan, PlanInputError
from tessera.estimator.time_constants import plan_prior

BREAKDOWN_KEYS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "dp_comm", "pp_bubble", "optimizer",
                  "host_wait")
# HGX/DGX servers: 8 GPUs per node unless the caller says otherwise.
DEFAULT_GPUS_PER_NODE = 8
# Bytes per parameter of the quantized LoRA base (QLoRA NF4: 4 bits; LLM.int8: 1 byte).
QUANT_BYTES = {"nf4": 0.5, "int8": 1.0}


@dataclass(frozen=True)
class PlanTime:
    """Seconds per training iteration of one plan, its breakdown (seconds, adding up to iter_time),
    where the numbers come from, and the tokens processed per second (global batch x seq / time)."""

    iter_time: float
    breakdown: dict[str, float]
    source: str
    tokens_per_second: float
    stages: tuple[dict[str, float], ...] = field(default=(), compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"iter_time": self.iter_time, "breakdown": dict(self.breakdown), "source": self.source,
                "tokens_per_second": self.tokens_per_second, "stages": [dict(s) for s in self.stages]}


# ---------------------------------------------------------------------------------------------------
# Inputs


def _gpu(name: str | GpuType) -> GpuType:
    if isinstance(name, GpuType):
        return name
    try:
        return lookup(name)
    except UnknownGpuError as exc:
        raise PlanInputError("gpu", str(exc)) from exc


def _refuse(model: ModelDims, plan: ExecutionPlan, gpu: GpuType) -> None:
    """What this model cannot time, by field."""
    if model.family == "wresnet":
        raise PlanInputError("model.family", "a Wide-ResNet has no execution plan (Cells only: tessctl estimate cells)")
    if model.family == "encoder-decoder" and plan.cp > 1:
        raise PlanInputError("plan.cp", "context parallelism of an encoder-decoder (two sequences) is not timed")
    if plan.float8 != "none" and not has_fp8(gpu):
        raise PlanInputError("plan.float8", f"{gpu.name} has no FP8 tensor cores (Hopper, Ada and MI300 do; "
                                            "Ampere and older do not): torchao Float8 would run slower, not faster")
    if plan.offload != "none":
        raise PlanInputError("plan.offload", f"offload {plan.offload!r}: host-memory traffic and the CPU optimizer "
                                             "step are not timed")
    if plan.lora_rank and model.family == "moe":
        raise PlanInputError("plan.lora_rank", "LoRA on mixture-of-experts models is not timed")


def _per_node(plan: ExecutionPlan, given: int | None) -> int:
    if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < 1):
        raise PlanInputError("gpus_per_node", f"must be an integer >= 1, got {given!r}")
    per_node = min(plan.num_gpus, given or DEFAULT_GPUS_PER_NODE)
    if plan.num_gpus % per_node:
        raise PlanInputError("gpus_per_node", f"the plan's {plan.num_gpus} GPUs do not fill whole nodes of {per_node}")
    return per_node


def cell_model(model: ModelDims, plan: ExecutionPlan) -> CellModel:
    """The plan's model for the operators: no recomputation (added apart), the plan's attention.
    Dropless MoE (capacity 0) is timed as balanced (capacity 1); gated (Mixtral-style) MoE routes by
    index gather/scatter (torchtitan, MegaBlocks), not GShard's one-hot einsums: groups of 1 token
    make that einsum term vanish."""
    dims = model
    group = 2048
    if model.family == "moe":
        if model.capacity_factor == 0:
            dims = replace(dims, capacity_factor=1.0)
        if model.gated:
            group = 1
    try:
        return CellModel.from_dims(dims, plan.global_batch, precision=plan.precision, recompute=False,
                                   expert_group_size=group, flash_attention=plan.flash_attention)
    except CellInputError as exc:
        raise PlanInputError(f"model.{exc.field}", exc.reason) from exc


def plan_operators(model: ModelDims, plan: ExecutionPlan, recompute: bool = False) -> tuple[CellModel, tuple[Operator, ...]]:
    """The plan's model and its operator chain (no recomputation unless asked). An encoder-decoder is
    the Cells' chain of family "t5" (estimator/cell_encdec.py): its encoder (bidirectional,
    seq_length tokens), then its decoder (causal, target_length tokens, plus cross-attention), then
    the head on the decoder's tokens; layers are numbered on through."""
    cm = cell_model(model, plan)
    return cm, model_operators(replace(cm, recompute=recompute))


# ---------------------------------------------------------------------------------------------------
# The plan's stages


def _stage_ops(n_ops: int, num_layers: int, pp: int, v: int) -> list[list[int]]:
    """Operator indices per pipeline stage: layers in pp x v chunks, chunk c on stage c % pp."""
    chunks = pp * v
    base, extra = divmod(num_layers, chunks)
    out: list[list[int]] = [[] for _ in range(pp)]
    start = 1  # operator 0 is the embedding
    for c in range(chunks):
        n = base + (1 if c < extra else 0)
        out[c % pp].extend(range(start, start + n))
        start += n
    out[0].insert(0, 0)
    out[-1].append(n_ops - 1)
    return out


def _node(rank: int, per_node: int) -> int:
    return rank // per_node


def _group_link(first: int, stride: int, size: int, per_node: int, intra: Link, inter: Link) -> tuple[Link, int]:
    """The link of a group of `size` ranks `stride` apart starting at `first`, and how many such groups
    share a node's NIC when it crosses nodes."""
    if size <= 1 or _node(first, per_node) == _node(first + (size - 1) * stride, per_node):
        return intra, 1
    return inter, max(1, min(stride, per_node))


@dataclass
class _Stage:
    compute: float = 0.0
    recompute: float = 0.0
    tp_comm: float = 0.0
    cp_comm: float = 0.0
    ep_comm: float = 0.0
    fsdp_mb: float = 0.0  # exposed FSDP/ZeRO-3 communication per micro-batch
    p2p: float = 0.0  # from the previous stage, per micro-batch (overlapped in the steady state)
    dp_iter: float = 0.0  # exposed gradient reduction per iteration
    optimizer: float = 0.0

    @property
    def busy(self) -> float:
        return self.compute + self.recompute + self.tp_comm + self.cp_comm + self.ep_comm + self.fsdp_mb


def estimate_plan_time(model: ModelDims, plan: ExecutionPlan, gpu: str | GpuType, *, gpus_per_node: int | None = None,
                       config: CellConfig | None = None, comm: CommModel | None = None,
                       pool: GpuPool | None = None) -> PlanTime:
    """Seconds per iteration of `plan` training `model` on GPUs of type `gpu` (see the module doc).

    `gpu` is a catalog name, or a GpuType for a part the catalog lacks (its name must still be a
    catalog name for the pool's links). `gpus_per_node` (default 8, at most the plan's GPUs) places
    the ranks; `config` gives the compute and link priors: without one, CellConfig's link prior and
    the compute constants fitted for the GPU's generation (time_constants.PLAN_TIME_CONSTANTS); with
    one, its prior as given (a caller's own calibration). `comm` a profiled table;
    `pool` the cluster's links (NIC bandwidth, PCIe; default GpuPool's: 100 Gb/s per node). Raises
    PlanInputError naming the field for what cannot be timed.
    """
    g = _gpu(gpu)
    cfg = config or with_prior(CellConfig(), plan_prior(g, CellConfig().prior))
    cm_comm = comm or CommModel()
    plan.check(model=model)
    _refuse(model, plan, g)
    per_node = _per_node(plan, gpus_per_node)
    if pool is None:
        pool = GpuPool(g.name, plan.num_gpus, per_node)
    elif pool.gpu != g.name or pool.gpus_per_node < per_node:
        raise PlanInputError("pool", f"pool {pool.gpu} x {pool.gpus_per_node} per node does not hold the plan on "
                                     f"{g.name} x {per_node} per node")
    intra, inter = pool_links(pool, cfg.links)
    cm, base_ops = plan_operators(model, plan)
    ops = base_ops
    ops_r = plan_operators(model, plan, recompute=True)[1]
    lora = lora_operators(model, cm, ops, plan) if plan.lora_rank else None
    if lora is not None:
        ops = lora.ops
    if plan.sequence_parallel:
        # Korthikanti et al. 2022, Sec. 4.2.2: sequence parallelism shards the norm and dropout regions
        # (the 10sbh that plain TP replicates) over the TP ranks
        ops = tuple(replace(o, traffic_sharded_bytes=o.traffic_sharded_bytes + o.traffic_bytes, traffic_bytes=0.0)
                    for o in ops)
    if plan.float8 != "none":
        # torchtitan's Float8 converter leaves the output projection in bf16 (filter_fqns "output"):
        # the head's GEMMs take the bf16 rate (linear_flops 0: not split, not converted)
        ops = tuple(replace(o, linear_flops=0.0) if o.name == "head" else o for o in ops)
    recipe = RECIPES[plan.precision]
    fp32 = recipe.activation >= 4
    tp, cp, dp, pp, v, b = plan.tp, plan.cp, plan.dp, plan.pp, plan.virtual_stages, plan.grad_accum
    samples = plan.micro_batch / cp  # samples' worth of tokens per rank and micro-batch
    prior = cfg.prior
    sources: set[str] = set()

    def seconds(sel: Sequence[Operator]) -> float:
        e = stage_compute_time(sel, g, 1, tp, samples, prior, fp32=fp32, float8=plan.float8 != "none",
                               compiled=plan.compile, flash=plan.flash_attention)
        sources.add(e.source)
        return e.seconds

    def ctime(op: str, nbytes: float, world: int, link: Link, sharing: int = 1) -> float:
        e = cm_comm.time(op, nbytes, world, link, sharing)
        if e.source != "formula:none":
            sources.add(e.source)
        return e.seconds

    stage_ranks = dp * cp * tp
    layers = model.num_layers + (model.decoder_layers if model.family == "encoder-decoder" else 0)
    layout = _stage_ops(len(ops), layers, pp, v)
    stages: list[_Stage] = []
    for si, idx in enumerate(layout):
        first = si * stage_ranks
        tp_link, _ = _group_link(first, 1, tp, per_node, intra, inter)
        cp_link, cp_share = _group_link(first, tp, cp, per_node, intra, inter)
        dp_link, dp_share = _group_link(first, tp, dp * cp, per_node, intra, inter)
        ep_link, ep_share = _group_link(first, tp * cp, plan.ep, per_node, intra, inter)
        st = _Stage()
        sops = [ops[i] for i in idx]
        per_op = [seconds([o]) for o in sops]
        st.compute = sum(per_op) + prior.microbatch_overhead_s

        # recomputation: the checkpointed layers' forward again (torchtitan's ac_freq: every n-th block)
        rec_ops: list[Operator] = []
        rec_per_op: list[float] = []
        full_layers: set[int] = set()
        for i in idx:
            li = _layer_index(ops[i])
            ckpt = li is not None and plan.checkpointing != "none" and (li + 1) % plan.checkpoint_every == 0
            d_flops = ops_r[i].flops - base_ops[i].flops  # the forward (LoRA's frozen base runs it too)
            d_lin = ops_r[i].linear_flops - base_ops[i].linear_flops
            if not ckpt:
                rec_per_op.append(0.0)
                continue
            if plan.checkpointing == "full":
                full_layers.add(i)
                ad = lora.adapter_fwd[i] if lora is not None else 0.0
                r_op = Operator("recompute", flops=d_flops + ad, linear_flops=d_lin + ad)
            elif plan.checkpointing == "op":
                r_op = Operator("recompute", flops=d_lin / 2, linear_flops=d_lin / 2)
            else:  # selective: the attention core (scores, softmax, dropout)
                r_op = Operator("recompute", flops=d_flops - d_lin)
            rec_ops.append(r_op)
            rec_per_op.append(seconds([r_op]))
        st.recompute = sum(rec_per_op)
        if lora is not None and plan.base_quant != "none":
            # QLoRA (Dettmers et al. 2023, Sec. 3): each pass dequantizes the frozen weights to bf16
            # before the matmul: read the quantized bytes, write bf16, per forward, backward and recompute
            passes = sum(2 + (1 if i in full_layers else 0) for i in idx) / max(1, len(idx))
            base = sum(lora.base_linear_params[i] for i in idx) / tp
            st.compute += passes * base * (QUANT_BYTES[plan.base_quant] + 2) / (g.bandwidth_gbps * 1e9)

        if plan.float8 != "none":
            st.compute += float8_cast_seconds(model, cm, [ops[i] for i in idx], tp, samples, g)

        # tensor parallel all-reduces (sequence parallel: reduce-scatter + all-gather, the same ring bytes);
        # half of an operator's calls are the backward's, the rest its forward and recomputed forward
        if tp > 1:
            fwd_t = bwd_t = fwd_lin = 0.0
            for i in idx:
                o = ops_r[i] if i in full_layers else ops[i]
                if o.tp_comm_bytes > 0:
                    calls = max(1, o.comm_calls)
                    one = ctime("all_reduce", o.tp_comm_bytes * samples / calls, tp, tp_link)
                    back = max(1, ops[i].comm_calls) // 2
                    fwd_t += (calls - back) * one
                    bwd_t += back * one
                fwd_lin += ops[i].linear_flops / 3 + (ops_r[i].linear_flops - base_ops[i].linear_flops
                                                      if i in full_layers else 0.0)
            if plan.async_tp:
                # micro-pipelined TP (Wang et al., ASPLOS'23; PyTorch's async TP, 2024): the forward's
                # all-gather -> matmul and matmul -> reduce-scatter run in tp chunks under the weight
                # GEMMs, the first chunk (1/tp) exposed; the backward's collectives stay exposed (the
                # authors report forward-pass speedups of up to 20-29% and about 8% end to end)
                lin = seconds([Operator("linear", flops=fwd_lin, linear_flops=fwd_lin)])
                fwd_t = max(fwd_t / tp, fwd_t - lin)
            st.tp_comm = fwd_t + bwd_t

        # ring attention (Liu et al., Ring Attention, ICLR 2024): cp - 1 K/V block exchanges per layer
        # and pass, each overlapped with the attention of the block in hand
        if cp > 1:
            t = 0.0
            for i in idx:
                li = _layer_index(ops[i])
                if li is None:
                    continue
                att = cm.attention(li)
                kv = 2 * att.kv_width / tp * (model.seq_length / cp) * plan.micro_batch * recipe.activation
                # one block pair's forward scores: this rank's seq/cp queries against seq/cp keys
                block = (att.score_fwd_flops * model.seq_length * samples / tp / cp
                         / (g.tflops_fp16 * 1e12 * flash_efficiency(g, prior.matmul_efficiency, prior.flash_utilization)))
                fwd = (cp - 1) * max(0.0, ctime("p2p", kv, 2, cp_link, cp_share) - block)
                bwd = (cp - 1) * max(0.0, ctime("p2p", 2 * kv, 2, cp_link, cp_share)
                                     - att.score_backward_factor * block)
                t += fwd * (2 if i in full_layers else 1) + bwd
            st.cp_comm = t

        # MoE all-to-all (dispatch + combine) over the ep ranks
        if plan.ep > 1:
            a2a = replace(ep_link, efficiency=ep_link.efficiency * cfg.links.all_to_all_efficiency)
            for i in idx:
                o = ops_r[i] if i in full_layers else ops[i]
                if o.a2a_bytes > 0:
                    calls = max(1, o.comm_calls)
                    st.ep_comm += calls * ctime("all_to_all", o.a2a_bytes * samples / calls / tp, plan.ep, a2a,
                                                ep_share)

        # data parallel: gradients (and ZeRO/FSDP parameters)
        world = dp * cp  # CP ranks hold the same weights: their gradients are reduced with DP's
        dense = [(ops[i].params - ops[i].expert_params) / tp for i in idx]
        expert = [ops[i].expert_params / (tp * plan.ep) for i in idx]
        trained = ([lora.adapter_params[i] / tp for i in idx] if lora is not None
                   else [d + e for d, e in zip(dense, expert)])
        # FSDP2's MixedPrecisionPolicy casts the parameters to the compute dtype before gathering them
        # (torchtitan: bf16 gathers of fp32 shards); Float8 all-gather sends 1 byte per linear weight
        pbytes = 1.0 if plan.float8 == "linear+allgather" else float(min(recipe.param, recipe.activation))
        if world > 1 and plan.zero_stage >= 3:
            ag = [ctime("all_gather", (d + e) * pbytes, world, dp_link, dp_share) for d, e in zip(dense, expert)]
            rs = [ctime("reduce_scatter", t_ * recipe.grad, world, dp_link, dp_share) for t_ in trained]
            fwd_c = [c / 3 for c in per_op]
            bwd_c = [2 * c / 3 + r for c, r in zip(per_op, rec_per_op)]
            again = plan.sharding == "zero3" or plan.reshards_after_forward
            exposed_f = fsdp_forward_exposed(ag, fwd_c)
            exposed_b = fsdp_backward_exposed(ag if again else [0.0] * len(ag), rs, bwd_c)
            if pp > 1 and not again:
                st.dp_iter = exposed_f + exposed_b  # torchtitan with PP: gathered once, reduced once
            else:
                st.fsdp_mb = exposed_f + exposed_b
        elif world > 1:
            grads = sum(trained)
            if plan.zero_stage == 0:
                t = ctime("all_reduce", grads * recipe.grad, world, dp_link, dp_share)
                after = 0.0
            else:  # ZeRO-1/2: reduce-scatter the gradients, all-gather the updated parameters
                t = ctime("reduce_scatter", grads * recipe.grad, world, dp_link, dp_share)
                after = ctime("all_gather", grads * recipe.param, world, dp_link, dp_share)
            bwd = 2 * (st.compute - prior.microbatch_overhead_s) / 3 + st.recompute
            st.dp_iter = ddp_exposed(t, bwd, len(idx)) + after

        opt_world = world if plan.zero_stage >= 1 else 1
        if lora is not None:
            opt_params = sum(lora.adapter_params[i] for i in idx) / tp / opt_world
        else:
            opt_params = sum(dense) / opt_world + sum(expert) / max(1, (world // plan.ep) if plan.zero_stage else 1)
        st.optimizer = optimizer_step_time(opt_params, g, recipe.param + recipe.grad + recipe.optimizer)

        # pipeline: activation forward and its gradient backward from the previous stage (Megatron
        # scatters it over the TP ranks); v chunks per stage send v times
        if si > 0:
            nbytes = 2 * ops[layout[si - 1][-1]].out_bytes * plan.micro_batch / cp / tp
            link, share = _group_link(first - stage_ranks, stage_ranks, 2, per_node, intra, inter)
            if link is inter:
                share = min(stage_ranks, per_node)
            st.p2p = v * ctime("p2p", nbytes, 2, link, share)
        stages.append(st)

    k = max(range(pp), key=lambda i: stages[i].busy)
    busy = stages[k]
    lat = pipeline_latency([s.busy + s.p2p for s in stages], [s.p2p for s in stages], b)
    bubble = (lat - b * busy.busy) / v
    j = max(range(pp), key=lambda i: stages[i].dp_iter + stages[i].optimizer)
    breakdown = {
        "compute": b * busy.compute, "recompute": b * busy.recompute, "tp_comm": b * busy.tp_comm,
        "cp_comm": b * busy.cp_comm, "ep_comm": b * busy.ep_comm,
        "dp_comm": b * busy.fsdp_mb + stages[j].dp_iter, "pp_bubble": bubble, "optimizer": stages[j].optimizer,
    }
    device = sum(breakdown.values())
    # An eager rank cannot finish before its host has launched its stage's kernels (host_time.py)
    host: tuple[float, str] | None = None
    for idx in layout:
        lis = [li for i in idx if (li := _layer_index(ops[i])) is not None]
        h = host_seconds(plan, len(lis), sum((li + 1) % plan.checkpoint_every == 0 for li in lis))
        if h is not None and (host is None or h[0] > host[0]):
            host = h
    breakdown["host_wait"] = max(0.0, host[0] - device) if host else 0.0
    total = device + breakdown["host_wait"]
    if host:
        sources.add(host[1] + extrapolation(model.family, plan))
    src = "formula:plan-time;" + ";".join(sorted(sources)) + f";{cfg.links.source}"
    per_stage = tuple({"busy": s.busy, "compute": s.compute, "recompute": s.recompute, "tp_comm": s.tp_comm,
                       "cp_comm": s.cp_comm, "ep_comm": s.ep_comm, "fsdp_per_microbatch": s.fsdp_mb,
                       "p2p": s.p2p, "dp_per_iteration": s.dp_iter, "optimizer": s.optimizer} for s in stages)
    tokens = plan.global_batch * (model.seq_length + (model.target_length if model.family == "encoder-decoder" else 0))
    return PlanTime(total, breakdown, src, tokens / total if total > 0 else math.inf, per_stage)


def float8_cast_seconds(model: ModelDims, cm: CellModel, sops: Sequence[Operator], tp: int, samples: float,
                        gpu: GpuType) -> float:
    """Memory-bound work of torchao's dynamic tensorwise Float8 per micro-batch (torchao float8 README;
    torchtitan docs/float8.md: scales from max(abs) of each high-precision operand): every GEMM
    operand is read for its amax, then read and written as FP8 (2 + 2 + 1 bytes per bf16 element) in
    the forward (input, weight), and again transposed for the weight-gradient GEMM (2 + 1) in the
    backward, where the output gradient is cast for both backward GEMMs (2 + 2 x 3): 8 bytes per
    element of each linear's input and output, per token, and per weight per micro-batch. Operand
    sizes per rank: a column-parallel linear sees its whole input and 1/tp of its output, a
    row-parallel one the reverse."""
    h, f = model.hidden_size, model.ffn
    per_token = weights = 0.0
    for op in sops:
        li = _layer_index(op)
        if li is None:
            continue
        att = cm.attention(li)
        a, kv = att.width, att.kv_width
        mult = model.top_k if op.expert_params else 1  # routed tokens through the expert MLPs
        col = [(h, a, 1), (h, kv, 1), (h, kv, 1)] + [(h, f, mult)] * (2 if model.gated else 1)
        row = [(a, h, 1), (f, h, mult)]
        per_token += sum(k * (i + o / tp) for i, o, k in col) + sum(k * (i / tp + o) for i, o, k in row)
        weights += sum(i * o for i, o, _ in col + row) / tp
    nbytes = 8.0 * (per_token * samples * model.seq_length + weights)
    return nbytes / (gpu.bandwidth_gbps * 1e9)


# ---------------------------------------------------------------------------------------------------
# Overlap rules (docs/estimator-cells.md, "Time of one plan")


def fsdp_forward_exposed(ag: Sequence[float], fwd: Sequence[float]) -> float:
    """FSDP forward (Zhao et al., PyTorch FSDP, VLDB 2023, Sec. 3.3.2; FSDP2 implicit prefetch): unit j's
    all-gather runs while unit j-1 computes; the first one is exposed, then what exceeds compute."""
    if not ag:
        return 0.0
    return ag[0] + sum(max(0.0, ag[j] - fwd[j - 1]) for j in range(1, len(ag)))


def fsdp_backward_exposed(ag: Sequence[float], rs: Sequence[float], bwd: Sequence[float]) -> float:
    """FSDP backward, units in reverse order (backward prefetch): unit k's all-gather (when resharded
    after forward) and unit k+1's reduce-scatter run while unit k+1 computes its backward; the last
    unit's all-gather and the first unit's reduce-scatter are exposed."""
    n = len(rs)
    if n == 0:
        return 0.0
    t = ag[-1] + rs[0]
    for k in range(n - 1):
        t += max(0.0, ag[k] + rs[k + 1] - bwd[k + 1])
    return t


def ddp_exposed(comm: float, backward: float, buckets: int) -> float:
    """DDP (Li et al., PyTorch Distributed, VLDB 2020, Sec. 3.2.3): gradient buckets are all-reduced
    during the backward of the last micro-batch; the last bucket (about 1/buckets of the bytes, one
    bucket per operator here) waits for the backward's end, and what exceeds the backward is exposed."""
    return max(comm / max(1, buckets), comm - backward)
