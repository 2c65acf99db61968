"""The host's floor under a step's time: eager PyTorch launches every kernel from Python, so a step
whose kernels are short (small models, small micro-batches, many small ops: LoRA adapters, per-op
checkpointing, Float8's scaling) takes as long as its launching, whatever the GPU could do.

A rank's step cannot end before its host has issued it:

    host = grad_accum x layers_on_the_rank x per_layer + fixed

with `per_layer` and `fixed` measured per recipe by bench/host_overhead.py (tiny-width models at
several depths on a GPU server: the slope and the intercept of the median step), never fitted to a
full-size run. The plan's time is then max(the GPU-side formula, host) (estimator/plan_time.py); the
difference is its `host_wait` component. Recipes the table lacks are composed from the measured
ones (a base plus what checkpointing, LoRA and Float8 add per layer); a compiled plan takes only a
measured compiled variant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tessera.estimator.plans import ExecutionPlan

# The recipes bench/host_overhead.py measures: ExecutionPlan fields beyond micro_batch=1.
_FSDP: dict[str, Any] = {"sharding": "fsdp", "precision": "amp", "loss": "fp32"}
_AMP: dict[str, Any] = {"precision": "amp", "loss": "fp32"}
_LORA: dict[str, Any] = {"precision": "bf16", "loss": "fp32", "lora_rank": 16, "lora_targets": "all-linear"}
VARIANTS: dict[str, dict[str, Any]] = {
    "fsdp": _FSDP,
    "fsdp op": {**_FSDP, "checkpointing": "op"},
    "fsdp full": {**_FSDP, "checkpointing": "full"},
    "fsdp float8": {**_FSDP, "float8": "linear"},
    "fsdp float8 op": {**_FSDP, "float8": "linear", "checkpointing": "op"},
    "amp": _AMP,
    "amp full": {**_AMP, "checkpointing": "full"},
    "lora": _LORA,
    "lora full": {**_LORA, "checkpointing": "full"},
    "fsdp compile": {**_FSDP, "compile": True},
    "fsdp op compile": {**_FSDP, "checkpointing": "op", "compile": True},
    "fsdp float8 op compile": {**_FSDP, "float8": "linear", "checkpointing": "op", "compile": True},
}


@dataclass(frozen=True)
class HostCost:
    per_layer_s: float  # per decoder layer and micro-batch
    fixed_s: float  # per step outside the layers


# Measured by bench/host_overhead.py on lent H200 servers (16 cores; torch 2.11.0+cu130, transformers
# 5.17.0; the FSDP2 recipes on the native stand-in of torchtitan's): every recorded run of a variant
# pooled, the probe's hidden width 128 and, for five variants, Llama 3.2 1B's and 3B's layer shapes
# (`--width 2048/3072`, 64 tokens), which gave no higher cost per layer but for plain FSDP2's
# (docs/estimator-gpu.md, "Run 5"). `python bench/host_overhead.py --pool bench/recorded/host_overhead_h200_*`
# prints these lines. A negative intercept is taken as 0.
HOST_TABLE: dict[str, HostCost] = {
    "fsdp": HostCost(0.00826, 0.00375),  # 5 runs
    "fsdp op": HostCost(0.01270, 0.01398),  # 5 runs
    "fsdp full": HostCost(0.01131, 0.00417),  # 4 runs
    "fsdp float8": HostCost(0.02334, 0.00876),  # 2 runs
    "fsdp float8 op": HostCost(0.04731, 0.00837),  # 2 runs
    "amp": HostCost(0.00383, 0.00495),  # 4 runs
    "amp full": HostCost(0.00692, 0.00551),  # 2 runs
    "lora": HostCost(0.00642, 0.00440),  # 4 runs
    "lora full": HostCost(0.01328, 0.00000),  # 2 runs
    "fsdp compile": HostCost(0.00436, 0.00528),  # 1 run
    "fsdp op compile": HostCost(0.00568, 0.00770),  # 1 run
    "fsdp float8 op compile": HostCost(0.00566, 0.01496),  # 1 run
}
HOST_SOURCE = "measured:bench/host_overhead.py(h200,2026-11-27)"


def variant_of(plan: ExecutionPlan) -> str:
    """The table's name for the plan's recipe (it may not be in the table)."""
    sharded = plan.zero_stage >= 3
    parts = ["fsdp lora" if sharded and plan.lora_rank else "fsdp" if sharded else "lora" if plan.lora_rank else "amp"]
    if plan.float8 != "none":
        parts.append("float8")
    if plan.checkpointing == "full":
        parts.append("full")
    elif plan.checkpointing != "none":  # torchtitan's per-op policy; selective is priced as it
        parts.append("op")
    if plan.compile:
        parts.append("compile")
    return " ".join(parts)


def _delta(with_: str, without: str, table: dict[str, HostCost]) -> float | None:
    a, b = table.get(with_), table.get(without)
    return None if a is None or b is None else a.per_layer_s - b.per_layer_s


def host_cost(plan: ExecutionPlan, table: dict[str, HostCost] | None = None) -> tuple[HostCost, str] | None:
    """The plan's measured host cost and how it was found ("measured VARIANT" or "composed ..."), or
    None where the table cannot price it. A composition takes each part's delta from the pair
    closest to the plan: Float8's from the op-checkpointed pair under op checkpointing (the two
    interact: the Python policy runs on every cast op), full checkpointing's from the plan's own
    kind (fsdp, amp or LoRA) first."""
    t = HOST_TABLE if table is None else table
    name = variant_of(plan)
    if name in t:
        return t[name], f"measured {name}"
    if plan.compile:
        return None  # a compiled graph's launches are not the eager ones'
    kind = "fsdp" if plan.zero_stage >= 3 else "lora" if plan.lora_rank else "amp"
    base = "fsdp" if kind == "fsdp" else "amp"
    cost = t.get(base)
    if cost is None:
        return None
    full = {"fsdp": ("fsdp", "amp", "lora"), "amp": ("amp", "lora", "fsdp"), "lora": ("lora", "amp", "fsdp")}[kind]
    float8 = (("fsdp float8", "fsdp"), ("fsdp float8 op", "fsdp op"))
    op = plan.checkpointing not in ("none", "full")
    steps: list[tuple[bool, tuple[tuple[str, str], ...]]] = [
        (plan.lora_rank > 0, (("lora", "amp"),)),
        (plan.float8 != "none", float8[::-1] if op else float8),
        (plan.checkpointing == "full", tuple((f"{k} full", k) for k in full)),
        (op, (("fsdp op", "fsdp"),)),
    ]
    per_layer, used = cost.per_layer_s, [base]
    for wanted, pairs in steps:
        if not wanted:
            continue
        for with_, without in pairs:
            d = _delta(with_, without, t)
            if d is not None:
                per_layer += d
                used.append(f"+({with_} - {without})")
                break
        else:
            return None
    return HostCost(per_layer, cost.fixed_s), "composed " + " ".join(used)


def host_seconds(plan: ExecutionPlan, layers_on_rank: int, checkpointed: int | None = None,
                 table: dict[str, HostCost] | None = None) -> tuple[float, str] | None:
    """Seconds the busiest rank's host needs to issue one step, and the source; None where unpriced.
    `checkpointed` of the rank's layers (all by default) take the checkpointed recipe's cost, the
    others the same recipe's without checkpointing (`checkpoint_every` > 1)."""
    found = host_cost(plan, table)
    if found is None:
        return None
    cost, how = found
    ckpt = layers_on_rank if checkpointed is None or plan.checkpointing == "none" else min(checkpointed, layers_on_rank)
    per_mb = ckpt * cost.per_layer_s
    if ckpt < layers_on_rank:
        plain = host_cost(plan.with_(checkpointing="none", checkpoint_every=1), table)
        if plain is None:
            return None
        per_mb += (layers_on_rank - ckpt) * plain[0].per_layer_s
        how += f", {layers_on_rank - ckpt} of {layers_on_rank} layers as {plain[1]}"
    seconds = plan.grad_accum * per_mb + cost.fixed_s
    return max(0.0, seconds), f"host:{how}" + (f";{HOST_SOURCE}" if HOST_SOURCE else "")


def extrapolation(family: str, plan: ExecutionPlan) -> str:
    """What the source adds where the plan lies outside what was measured (one rank of a dense
    decoder, no parallelism but FSDP2's): the floor is then the measured recipe's, carried over."""
    outside = [w for cond, w in ((family != "decoder", family), (plan.tp > 1, f"tp {plan.tp}"),
                                 (plan.cp > 1, f"cp {plan.cp}"), (plan.ep > 1, f"ep {plan.ep}"),
                                 (plan.pp > 1, f"pp {plan.pp}"), (plan.zero_stage in (1, 2), f"zero{plan.zero_stage}"))
               if cond]
    return f";host:extrapolated to {', '.join(outside)}" if outside else ""
