"""FSDP / ZeRO-3 stage options of a Cell: the data-parallel ranks of a stage shard the model state.

A stage option (dp, tp) normally keeps every weight and gradient on each DP rank and shards only
the optimizer states (ZeRO-1, `CellConfig.dp_shards_optimizer`), with one gradient all-reduce per
iteration. Its FSDP variant (PyTorch FSDP2 `fully_shard` per layer, as torchtitan applies it; the
same bytes as DeepSpeed ZeRO-3) shards weights, gradients and optimizer states over the dp ranks:

Memory per GPU: the model state of the stage divided by dp, plus the working set FSDP gathers: two
units' unsharded weights (the running one and the prefetched next) and one unit's unsharded
gradient before its reduce-scatter, each the stage's largest unit (a unit is one operator of the
chain: a layer, the embedding or the head, as torchtitan wraps blocks, embedding and output
apart; the working set of tessera.estimator.memory's `_zero3_working_set`, taken at the largest
unit, so a large vocabulary counts); activations and the reserve are the unsharded option's.

Time per micro-batch: every layer's weights are all-gathered for the forward and again for the
backward (reshard after forward: FSDP2's default without PP) and its gradient is reduce-scattered
(FSDP2 reduces every micro-batch unless told not to; torchtitan does not). The overlap rule: the
collectives run on their own stream while the stage computes, each layer's all-gather prefetched
during the previous layer's compute and each reduce-scatter during the next layer's backward; what
cannot overlap is the first layer's all-gather (nothing computes before it) and the last layer's
reduce-scatter (nothing computes after it), and whatever exceeds the compute time:

    exposed = ag_first + rs_last + max(0, 2 * sum(ag) + sum(rs) - ag_first - rs_last - compute)

charged on the stage's critical path (intra-stage communication). Per iteration there is no
gradient all-reduce left, only the optimizer step over the shard. Expert weights of a MoE stay
sharded over the DP ranks by expert parallelism, as in the unsharded option.

Which Cells offer it (estimator/cell_search.py): only one-stage Cells, and only where the unsharded
option does not fit at that micro-batch count (so the search keeps it where it is needed, or faster
because it fits with fewer micro-batches). Under pipeline parallelism FSDP2 keeps each stage's
weights unsharded between micro-batches and accumulates unsharded gradients until the last backward
(torch.distributed.pipelining's PipelineStage.backward_maybe_with_nosync calls
set_reshard_after_backward(False) and set_requires_gradient_sync(False) on FSDP modules; torchtitan's
reshard_after_forward default is False with PP): its memory is then ZeRO-1's, which every Cell's DP
option already has, so it is never needed there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from tessera.common.gpus import GpuType
from tessera.estimator.cell_types import StageCost
from tessera.estimator.comm import CommModel, Link
from tessera.estimator.compute import optimizer_step_time
from tessera.estimator.partition import Operator


@dataclass(frozen=True)
class FsdpContext:
    """What the FSDP variant of a stage option needs besides its unsharded cost: the DP group's link
    (and how many groups share it), the recipe's bytes per parameter (weights in the compute dtype,
    weights + gradients, optimizer), the GPU and its usable bytes, and whether the unsharded option
    already shards the optimizer (ZeRO-1)."""

    link: Link
    share: int
    weight_bytes: float
    weight_grad_bytes: float
    optimizer_bytes: float
    gpu: GpuType
    usable_bytes: float
    shards_optimizer: bool
    comm: CommModel
    # bytes per frozen parameter (LoRA's base: Operator.frozen_params), sharded like the weights
    frozen_bytes: float = 0.0


def exposed_fsdp_comm(all_gathers: Sequence[float], reduce_scatters: Sequence[float], compute: float) -> float:
    """Seconds of FSDP communication left on the critical path of one micro-batch (module doc)."""
    if not all_gathers:
        return 0.0
    head, tail = all_gathers[0], reduce_scatters[-1]
    total = 2 * sum(all_gathers) + sum(reduce_scatters)
    return head + tail + max(0.0, total - head - tail - compute)


def fsdp_variant(base: StageCost, ops: Sequence[Operator], ctx: FsdpContext) -> StageCost:
    """The FSDP form of an unsharded stage option `base` (dp > 1); `ops` the model's operator chain."""
    plan = base.plan
    dp, tp = plan.dp, plan.tp
    sops = ops[plan.start:plan.end]
    weight, state_wg = ctx.weight_bytes, ctx.weight_grad_bytes
    grad = max(state_wg - weight, weight)  # reduce-scattered in the recipe's gradient dtype
    units = [(o.params - o.expert_params) / tp for o in sops if o.params > o.expert_params]
    # what each unit reduce-scatters: its trained parameters (a frozen base has no gradients)
    trained = [(o.params - o.expert_params - o.frozen_params) / tp for o in sops if o.params > o.expert_params]
    sources = {base.comm_source} - {"formula:none"}
    ag, rs = [], []
    for u, t in zip(units, trained):
        e = ctx.comm.time("all_gather", u * weight, dp, ctx.link, ctx.share)
        r = ctx.comm.time("reduce_scatter", t * grad, dp, ctx.link, ctx.share)
        ag.append(e.seconds)
        rs.append(r.seconds)
        sources |= {e.source, r.source}
    exposed = exposed_fsdp_comm(ag, rs, base.compute)

    frozen = sum(o.frozen_params for o in sops) / tp
    dense = sum(o.params - o.expert_params for o in sops) / tp - frozen
    expert = sum(o.expert_params for o in sops) / (tp * dp)
    opt = ctx.optimizer_bytes
    sync = optimizer_step_time(dense / dp + expert, ctx.gpu, state_wg + opt)
    # the unsharded option holds weights + gradients whole (and a frozen base's weights), and the
    # optimizer whole unless ZeRO-1
    replicated = dense * state_wg + frozen * ctx.frozen_bytes + (0.0 if ctx.shards_optimizer else dense * opt)
    largest = max(units, default=0.0)
    working = largest * (2 * weight + grad)
    memory = base.memory_bytes - replicated * (1 - 1 / dp) + working
    return replace(base, plan=replace(plan, sharding="fsdp"), intra_comm=base.intra_comm + exposed, sync=sync,
                   memory_bytes=memory, fits=memory <= ctx.usable_bytes,
                   comm_source="+".join(sorted(sources)) or "formula:none")
