"""What every real-code trace shares: a fake process group, the precision recipe as FSDP2 runs it,
and one measured training step under FakeTensorMode with torch's FSDP2 memory tracker.

The process group is torch's "fake" backend (torch.testing._internal.distributed.fake_pg: every
collective returns at once without touching data), so `fully_shard` and DTensor shard the model
exactly as on `world` ranks while one process plays rank 0. The device mesh is built outside the
fake mode (DeviceMesh reads its rank list with .tolist(), which a fake tensor cannot answer).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tessera.estimator.memory_terms import RECIPES
from tessera.estimator.plans import ExecutionPlan, PlanInputError
from tessera.estimator.torch.realtrace.result import RealTrace


def quiet() -> None:
    """Silence the import-time chatter of torchao (missing CUDA kernels, pytree Enum registrations),
    torchtitan's info logs and transformers' offline notices; and never let transformers reach the hub."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in ("torch.utils._pytree", "torchao", "torchtitan", "root", "transformers", "peft",
                 "torch.distributed", "torch.distributed.fsdp"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"torchao\..*")
    warnings.filterwarnings("ignore", message=r".*is an Enum subclass.*")
    warnings.filterwarnings("ignore", message=r".*Expected a tensor or a traceable wrapper-subclass.*")
    warnings.filterwarnings("ignore", message=r".*torch.utils.checkpoint.*")
    warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing.*")
    warnings.filterwarnings("ignore", message=r".*returned a view tensor.*")
    warnings.filterwarnings("ignore", message=r".*script_method.*")


@dataclass(frozen=True)
class Precision:
    """How FSDP2 runs a precision recipe: the dtype the (sharded) parameters and AdamW's states are
    stored in, and MixedPrecisionPolicy's compute (param) and gradient-reduce dtypes."""

    storage: Any
    compute: Any
    reduce: Any
    note: str


# How `precision: amp` runs without FSDP2 (memory_recipes.uses_autocast): torchtitan's maybe_enable_amp
# and transformers' Trainer wrap the forward and the loss, not the backward, in torch.autocast.
AUTOCAST = "amp without FSDP2: torch.autocast (bf16) over fp32 params, grads and AdamW states"


def precision_of(plan: ExecutionPlan) -> Precision:
    """FSDP2 keeps one copy of each parameter, sharded: the fp32 sharded parameter is the master copy
    and MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) all-gathers a bf16 compute copy, as
    torchtitan's defaults (training.mixed_precision_param bf16, mixed_precision_reduce fp32) do. So the
    recipes with 2-byte parameters and an fp32 master (mixed, megatron-bf16, megatron-fp16) and amp all
    run as 4 B sharded params + 4 B sharded fp32 grads + 8 B AdamW states, with bf16 compute; the
    separate 2 B copy and fp32 main-grad of Megatron's recipes do not exist under FSDP2."""
    import torch

    r = RECIPES[plan.precision]
    if r.name == "mixed-adafactor":
        raise PlanInputError("plan.precision", "the real-code trace runs AdamW (torchtitan, transformers); "
                                               "Adafactor is not traced")
    if r.name == "fp32":
        return Precision(torch.float32, torch.float32, torch.float32, "fp32 params, grads, AdamW states")
    if r.name == "bf16":
        return Precision(torch.bfloat16, torch.bfloat16, torch.bfloat16,
                         "bf16 params, grads and AdamW states (no fp32 master)")
    return Precision(torch.float32, torch.bfloat16, torch.float32,
                     f"{r.name} as FSDP2 runs it: fp32 sharded params (the master) and AdamW states, "
                     "bf16 all-gathered compute params, fp32 gradient reduce")


@contextlib.contextmanager
def fake_world(world: int) -> Iterator[None]:
    """A fake process group of `world` ranks with this process as rank 0, destroyed on exit."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def fsdp_world(plan: ExecutionPlan) -> int:
    """The ranks FSDP2 shards over: dp*cp under fsdp/zero3 (torchtitan folds the cp ranks into the
    FSDP mesh, 'dp_shard_cp'); without sharding cp (torchtitan shards over the cp ranks even without
    data parallelism; each data-parallel rank a full replica, the bytes of HSDP's replicate dim)."""
    if plan.sharding in ("fsdp", "zero3"):
        return plan.dp * plan.cp
    if plan.sharding in ("zero1", "zero2"):
        raise PlanInputError("plan.sharding", f"{plan.sharding!r} (ZeRO-1/2) is DeepSpeed's/Megatron's; the "
                                              "real-code trace runs FSDP2 (fsdp/zero3) or no sharding")
    return plan.cp


def check_common(plan: ExecutionPlan) -> None:
    """Plan fields no stack here traces, refused by name."""
    if plan.loss == "fused":
        raise PlanInputError("plan.loss", "'fused' is Megatron's vocab-parallel fused cross-entropy; "
                                          "torchtitan and transformers compute 'fp32' (or torchtitan's "
                                          "'chunked'): trace one of those")
    if plan.offload != "none":
        raise PlanInputError("plan.offload", f"CPU offload ({plan.offload!r}) is not traced on real code")
    if plan.virtual_stages > 1:
        raise PlanInputError("plan.virtual_stages", "interleaved pipelines are not traced on real code")
    if plan.schedule == "gpipe" and plan.pp > 1:
        raise PlanInputError("plan.schedule", "the real-code trace follows torchtitan's 1F1B schedule")
    if plan.compile:
        raise PlanInputError("plan.compile", "torch.compile cannot run on fake CPU tensors here; "
                                             "trace with compile: false")
    if plan.async_tp:
        raise PlanInputError("plan.async_tp", "async TP is a compiler pass; not traced")
    if plan.ep > 1:
        raise PlanInputError("plan.ep", "expert parallelism is not traced on real code")


def inflight(plan: ExecutionPlan, stage: int) -> int:
    """Micro-batches a 1F1B stage holds in flight: min(m, pp - stage) (one without PP)."""
    return 1 if plan.pp == 1 else min(plan.grad_accum, plan.pp - stage)


def accumulated(plan: ExecutionPlan) -> int:
    """Sequential (forward, loss, backward) micro-batches one step runs without PP: two when
    plan.grad_accum > 1, one otherwise. A trainer with gradient accumulation (torchtitan's
    gradient_accumulation_steps, transformers' Trainer) keeps the gradients between micro-batches
    (FSDP2 accumulates the reduce-scattered shards in param.grad), so the second micro-batch runs
    beside the first one's gradients; a third and later ones repeat the second's memory."""
    return 1 if plan.pp > 1 else min(plan.grad_accum, 2)


def _peak_tracker(model: Any, opt: Any) -> Any:
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed._tools.mod_tracker import ModTracker
    from torch.distributed.fsdp import FSDPModule

    from tessera.estimator.torch.traced import _peak_tracker_class

    if isinstance(model, FSDPModule):
        tracker = _propagation_blind(_peak_tracker_class(FSDPMemTracker))(model, opt)
    else:
        tracker = _propagation_blind(_peak_tracker_class(MemTracker))()

    class StepModTracker(ModTracker):
        """The tracker takes an FSDP module's forward with no parent module but the global one for the
        next iteration, and refuses it (it keeps per-module statistics per iteration). Within one
        step such calls are legitimate: a backward run inside a forward (torchtitan's chunked loss
        backpropagates each chunk at once) resets the module stack, and the output head is then
        called again. Only the global peak is read here, so a permanent parent lifts the check."""

        @property
        def parents(self) -> set[str]:
            return self._parents

        @parents.setter
        def parents(self, value: set[str]) -> None:
            self._parents = set(value) | {"realtrace step"}

        def _get_pop_fn(self, w_mod: Any, name: str, is_bw: bool) -> Any:
            pop = super()._get_pop_fn(w_mod, name, is_bw)  # type: ignore[no-untyped-call]

            def fn(*args: Any) -> None:
                if is_bw or name in self._parents:  # else a backward inside its forward reset the stack
                    pop(*args)

            return fn

    mod_tracker = tracker._mod_tracker
    current = mod_tracker.__dict__.pop("parents")
    mod_tracker.__class__ = StepModTracker
    mod_tracker.parents = current
    return tracker


_PROPAGATING = [False]


def _propagation_blind(base: Any) -> Any:
    """The tracker, not counting DTensor's sharding propagation.

    DTensor infers an op's output metadata by running the op on fake tensors of the GLOBAL shape
    (ShardingPropagator._propagate_tensor_meta_non_cached). The tracker skips those ops only when they
    run under another fake mode than its own; here the whole step runs under one fake mode, which the
    propagation reuses, so the tracker would count global-sized tensors (e.g. a TP output layer's whole
    (V, h) weight gradient) that no GPU allocates. While propagating, its ops are passed through."""
    from torch.distributed.tensor import DTensor

    class Blind(base):  # type: ignore[misc]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if _PROPAGATING[0] and not any(t == DTensor for t in types):
                return func(*args, **(kwargs or {}))
            return super().__torch_dispatch__(func, types, args, kwargs)

    return Blind


@contextlib.contextmanager
def _propagation_marked() -> Iterator[None]:
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    orig = ShardingPropagator._propagate_tensor_meta_non_cached

    def marked(self: Any, *args: Any, **kwargs: Any) -> Any:
        outer = _PROPAGATING[0]
        _PROPAGATING[0] = True
        try:
            return orig(self, *args, **kwargs)
        finally:
            _PROPAGATING[0] = outer

    ShardingPropagator._propagate_tensor_meta_non_cached = marked  # type: ignore[method-assign]
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = orig  # type: ignore[method-assign]


def measure(model: Any, opt: Any, step: Callable[[], None], *, stack: str, detail: dict[str, Any]) -> RealTrace:
    """Run `step` (forwards, loss, backwards) and the optimizer step under the tracker.

    AdamW creates its states lazily at its first step; every step after the first of a real run holds
    them, so they are created first by an optimizer step on zero gradients (no forward needed).
    Gradients are set to None after each step (torchtitan's and HF's zero_grad). The peak is the
    tracker's global peak over the measured step.
    """
    import torch

    t0 = time.perf_counter()
    with torch.no_grad():
        for group in opt.param_groups:
            for p in group["params"]:
                p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    tracker = _peak_tracker(model, opt)
    tracker.track_external(model, opt)
    with tracker, _propagation_marked():
        step()
        opt.step()
        opt.zero_grad(set_to_none=True)
    peak = tracker.get_tracker_snapshot("peak")
    dev = next(iter(peak))
    snap = {str(getattr(k, "value", k)): int(v) for k, v in peak[dev].items()}
    return RealTrace.from_snapshot(snap, stack, {**detail, "seconds": round(time.perf_counter() - t0, 3)})


def microbatches(model: Any) -> Any:
    """A plain module running `model` on each in-flight micro-batch in one call: the memory tracker
    takes a second call of the FSDP root in one iteration for the next iteration (and refuses it);
    under this parent it is one pipeline stage's forwards, as a 1F1B schedule runs them."""
    import torch

    class Microbatches(torch.nn.Module):
        def __init__(self, stage: torch.nn.Module) -> None:
            super().__init__()
            self.stage = stage

        def forward(self, inputs: list[Any]) -> list[Any]:
            return [self.stage(x) for x in inputs]

    return Microbatches(model)


def under_parent(fn: Callable[..., Any]) -> Any:
    """`fn` called as the forward of a plain module: torchtitan's ChunkedLossWrapper calls the FSDP
    output head once per chunk, which the memory tracker accepts only below a parent module."""
    import torch

    class Call(torch.nn.Module):
        def forward(self, *args: Any) -> Any:
            return fn(*args)

    return Call()


def fake_mode() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)
