"""What a worker launched from a Cell runs, as the Cell estimator (cells.py) must count it: the
plan's recipe fields, and the layer splits it may run the stages on.

**The plan's recipe** (`recipe_plan_fields`, for cells.execution_plan): the CellModel's recipe fields
(cell_recipe.py put them there) back in the shared plan vocabulary, so that the plan a Cell answers
with is the plan its memory and time were estimated for, and tessera.estimator.memory gives the same
recipe's breakdown (a live audit: a LoRA r16 job's Cells answered lora_rank 0, loss fused, and the
memory formula then counted a full fine-tune). What the CellModel does not hold is not carried:
`sequence_parallel` (the Cells estimate without it, cell_recipe.py warns) and `async_tp` (refused
there). LoRA's frozen base bytes say which of `base_quant` / `offload: frozen` the recipe set (0 bytes
on the GPU = offloaded).

**The layer splits** (`worker_op_ranges`, for cells.CellEstimator.stage_costs). A Cell's stages come
from its own partition (partition.py: balanced by FLOPs, so the head's large logits usually leave the
last stage a layer short and the embedding stage a layer long or short). The live controller launches
the Cell's plan with `pp` stages and no layer ranges (the `stages` list is only for a pipeline over
mixed GPU types, docs/worker-contract.md), so the worker splits the layers itself, evenly:

- the reference trainer (clients/trainer/reference/parallel.py `stage_layers`): L // pp layers each,
  the last L % pp stages one more;
- tessera.estimator.memory (memory_terms.stage_layers), and Megatron-style even splits: L // pp
  each, the first L % pp stages one more.

Both put the embedding on the first stage and the head on the last. A Cell that fits on its own
partition but not on these would be launched and run out of memory (a live audit: llama3.1-70b on
32 A100s in 32 stages, 62.9 GB by the Cells' split, 88 GB by the formula's). So a pipelined Cell's
stage memory is the largest over its own range and the stage's range in each even split; its time
stays the partition's.

Pure: numbers in, numbers out; no import of cells.py (it imports this module).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

from tessera.estimator.cell_types import StageCost

# cell_recipe.QUANT_BYTES inverted: the frozen bytes per base parameter that QLoRA's NF4 and
# LLM.int8 give (a test keeps the two the same; cell_recipe imports cells, which imports this).
BASE_QUANT_OF_FROZEN_BYTES = {0.5: "nf4", 1.0: "int8"}

# ---------------------------------------------------------------------------------------------------
# The plan's recipe


class RecipeModel(Protocol):
    """What `recipe_plan_fields` reads of a cells.CellModel."""

    @property
    def recompute(self) -> bool: ...
    @property
    def op_checkpoint(self) -> bool: ...
    @property
    def checkpoint_every(self) -> int: ...
    @property
    def flash_attention(self) -> bool: ...
    @property
    def lora_rank(self) -> int: ...
    @property
    def lora_targets(self) -> str: ...
    @property
    def frozen_bytes(self) -> float: ...
    @property
    def float8(self) -> str: ...
    @property
    def compiled(self) -> bool: ...
    @property
    def reshard(self) -> str: ...
    @property
    def loss(self) -> str: ...


def recipe_plan_fields(m: RecipeModel, sharding: str) -> dict[str, Any]:
    """ExecutionPlan keyword arguments for the model's recipe under the plan's `sharding`."""
    out: dict[str, Any] = {
        "checkpointing": ("op" if m.op_checkpoint else "full") if m.recompute else "none",
        "checkpoint_every": m.checkpoint_every if m.recompute else 1,
        "flash_attention": m.flash_attention,
        "loss": m.loss,
        "float8": m.float8,
        "compile": m.compiled,
    }
    if sharding == "fsdp":
        out["reshard_after_forward"] = m.reshard
    if m.lora_rank:
        out.update(lora_rank=m.lora_rank, lora_targets=m.lora_targets)
        quant = BASE_QUANT_OF_FROZEN_BYTES.get(m.frozen_bytes)
        if m.frozen_bytes == 0:
            out["offload"] = "frozen"
        elif quant is not None:
            out["base_quant"] = quant
    return out


# ---------------------------------------------------------------------------------------------------
# The layer splits


def even_layer_ranges(num_layers: int, stages: int, remainder_first: bool) -> tuple[tuple[int, int], ...]:
    """[start, end) layers per stage, L // stages each and the L % stages extra layers on the first
    (remainder_first) or the last stages."""
    base, extra = divmod(num_layers, stages)
    out, start = [], 0
    for s in range(stages):
        more = s < extra if remainder_first else s >= stages - extra
        end = start + base + (1 if more else 0)
        out.append((start, end))
        start = end
    return tuple(out)


def worker_op_ranges(num_ops: int, num_layers: int, stages: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Per stage, the operator ranges [start, end) that stage holds under each even split, for a chain
    of embedding, `num_layers` layers and head (num_ops = num_layers + 2; () for any other chain, a
    Wide-ResNet's: no worker runs it). Stage 0 starts at the embedding, the last ends at the head."""
    if stages < 2 or num_ops != num_layers + 2 or stages > num_layers:
        return ()
    splits = [even_layer_ranges(num_layers, stages, first) for first in (True, False)]
    out = []
    for s in range(stages):
        ranges = []
        for split in splits:
            a, z = split[s]
            r = (0 if s == 0 else 1 + a, num_ops if s == stages - 1 else 1 + z)
            if r not in ranges:
                ranges.append(r)
        out.append(tuple(ranges))
    return tuple(out)


def with_memory_of(cost: StageCost, others: list[float], usable_bytes: float) -> StageCost:
    """`cost` with the largest memory of itself and `others` (the same stage layout's bytes on the
    workers' layer ranges), and its fit by that memory against `usable_bytes`; its times unchanged."""
    worst = max(others, default=0.0)
    if worst <= cost.memory_bytes:
        return cost
    return replace(cost, memory_bytes=worst, fits=worst <= usable_bytes)
