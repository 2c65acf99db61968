"""Traced mode on real model code: one rank's training step of the model users run, on fake tensors.

`trace_real(model, plan, stack=..., stage=...)` builds the real model code for one rank's shard of
`plan` (torchtitan's Llama 3, or a Hugging Face transformers model built from its config, never
downloaded), applies the recipe through the real APIs (FSDP2 `fully_shard` over a fake process group,
torchtitan's activation-checkpointing wrappers, PEFT LoRA, torchao Float8), runs one step (forward,
loss, backward, AdamW step) under FakeTensorMode and returns the per-category peak bytes that torch's
FSDP2 memory tracker saw (RealTrace). docs/estimator-memory.md, "Traced on real model code", lists
what each recipe runs through and what is approximated.

Stacks: "torchtitan" (LLaMA-style decoders), "transformers" (Llama, Mistral, Mixtral, Qwen2, Gemma 2,
GPT-2, T5/mT5), "auto" (torchtitan where it can express the model and plan, transformers otherwise).
Imports without torch; torch and the stacks load when a trace runs.
"""

from __future__ import annotations

from tessera.estimator.memory_terms import DEFAULT_OTHER_BYTES, MemoryBreakdown, gpu_capacity
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError
from tessera.estimator.torch.realtrace.result import RealTrace

STACKS = ("auto", "torchtitan", "transformers")

__all__ = ["STACKS", "RealTrace", "pick_stack", "real_memory", "trace_real", "trace_real_peak"]


def pick_stack(model: ModelDims, plan: ExecutionPlan, stack: str = "auto") -> str:
    """The stack `auto` resolves to: torchtitan when its Llama 3 expresses the model and plan."""
    if stack not in STACKS:
        raise PlanInputError("stack", f"{stack!r} is not one of {', '.join(STACKS)}")
    if stack != "auto":
        return stack
    from tessera.estimator.torch.realtrace import titan

    try:
        titan.check_dims(model, plan)
    except PlanInputError:
        return "transformers"
    return "torchtitan"


def trace_real(model: ModelDims, plan: ExecutionPlan, *, stack: str = "auto", stage: int = 0) -> RealTrace:
    """The peak of one rank of pipeline stage `stage` of `plan`, traced on `stack`'s model code.

    PlanInputError naming the field for a model or plan the stack cannot express, and for a stage
    outside 0..pp-1.
    """
    model.validate()
    model.require_transformer("the real-code trace")
    plan.check(model=model)
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < plan.pp:
        raise PlanInputError("stage", f"must be a pipeline stage in 0..{plan.pp - 1}, got {stage!r}")
    chosen = pick_stack(model, plan, stack)
    if chosen == "torchtitan":
        from tessera.estimator.torch.realtrace import titan

        return titan.trace(model, plan, stage)
    from tessera.estimator.torch.realtrace.hf import trace as trace_hf

    return trace_hf(model, plan, stage)


def trace_real_peak(model: ModelDims, plan: ExecutionPlan, *, stack: str = "auto") -> RealTrace:
    """The most loaded rank: the first and the last pipeline stage traced, the larger peak kept
    (the stages between hold the first stage's layers and fewer micro-batches in flight)."""
    best: RealTrace | None = None
    for st in sorted({0, plan.pp - 1}):
        tr = trace_real(model, plan, stack=stack, stage=st)
        if best is None or tr.peak > best.peak:
            best = tr
    assert best is not None
    return best


def real_memory(model: ModelDims, plan: ExecutionPlan, *, stack: str = "auto", gpu: str | None = None,
                num_gpus: int | None = None, other_bytes: int = DEFAULT_OTHER_BYTES) -> MemoryBreakdown:
    """The real-code trace as a MemoryBreakdown, the traced counterpart of estimate_memory (source
    "traced:<stack>"): the most loaded stage's categories, FSDP2's communication buffers counted
    with the activations (transient tensors), and `other` the stated reserve no tracker sees."""
    plan.check(num_gpus=num_gpus, model=model)
    capacity = gpu_capacity(gpu)
    tr = trace_real_peak(model, plan, stack=stack)
    notes = ((f"traced on {tr.stack}'s model code ({tr.detail.get('model')}), stage {tr.detail.get('stage')} "
             f"of {plan.pp}, in {tr.detail.get('seconds')} s (FakeTensorMode + FSDPMemTracker)"),
             f"peak by tracker category: {tr.detail.get('tracker_peak')}",
             *(f"approximated: {a}" for a in tr.detail.get("approximations", [])),
             f"other = {other_bytes} B reserve (not a tensor)")
    return MemoryBreakdown(tr.parameters, tr.gradients, tr.optimizer, tr.activations + tr.other, other_bytes,
                           f"traced:{tr.stack}", int(tr.detail.get("stage", 0)), 0, capacity, notes)
