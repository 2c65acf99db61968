"""Traced mode: one training step of the rank's torch module under fake tensors, measured by MemTracker.

`traced_memory(model, plan)` builds, for the first and the last pipeline stage of the plan, the
module one rank holds (tessera.estimator.torch.torch_models: per-rank shard shapes for TP/SP, E/ep experts, the
stage's layers), allocates the recipe's resident state (parameters, gradient buffers, optimizer
state, sharded over dp as the ZeRO stage says), and runs under torch's FakeTensorMode (no real
memory, no compute) with torch.distributed._tools.mem_tracker.MemTracker:
1. the forwards of the micro-batches the stage holds in flight (1F1B: min(m, pp - stage)),
2. their backwards (the last stage from its loss, the others from a gradient of their output),
3. the optimizer step (Adam written out per tensor, so that each recipe's state and temporaries are
   exactly those of docs/estimator-memory.md; ZeRO-2 reduces each gradient into its shard as soon as
   it is accumulated, as DeepSpeed and Megatron's distributed optimizer do).
The peak is MemTracker's global peak; parameters, gradients and optimizer are the resident state
measured before the step; activations = peak - resident. Further micro-batches (m > pp) and further
steps do not raise the peak, so they are not run. Fake tensors live on the CPU device (a CPU build of
torch cannot run autograd on fake CUDA tensors, docs/reference/estimation.md 2.3); MemTracker's 512-byte
rounding applies to CUDA only, so the bytes are exact tensor bytes.

Not simulated (PlanInputError on plan.<field>): ZeRO-3/FSDP parameter gathering, interleaved pipelines.
`run_step(..., fake=False)` runs the same step on real CPU tensors (for the traced-vs-real check).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Any

from tessera.estimator.memory_terms import (
    DEFAULT_OTHER_BYTES,
    RECIPES,
    MemoryBreakdown,
    Recipe,
    gpu_capacity,
    stage_layers,
    state_bytes,
)
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError


@dataclass(frozen=True)
class StepTrace:
    """What one traced (or real) step of one stage measured, in bytes."""

    stage: int
    peak: int
    parameters: int
    gradients: int
    optimizer: int
    peak_by_category: dict[str, int]
    seconds: float

    @property
    def resident(self) -> int:
        return self.parameters + self.gradients + self.optimizer


def traced_memory(model: ModelDims, plan: ExecutionPlan, *, gpu: str | None = None, num_gpus: int | None = None,
                  other_bytes: int = DEFAULT_OTHER_BYTES) -> MemoryBreakdown:
    """The traced peak on the most loaded rank (first or last pipeline stage) as a MemoryBreakdown.

    The traced counterpart of tessera.estimator.memory.estimate_memory, with its arguments: `gpu` (a
    catalog name) sets capacity_bytes and fits; `num_gpus`, when given, must equal dp*tp*pp.
    """
    model.validate()
    model.require_transformer("the traced mode")
    plan.check(num_gpus=num_gpus, model=model)
    capacity = gpu_capacity(gpu)
    best: StepTrace | None = None
    for st in sorted({0, plan.pp - 1}):
        tr = run_step(model, plan, st, fake=True)
        if best is None or tr.peak > best.peak:
            best = tr
    assert best is not None
    acts = best.peak - best.resident
    notes = (f"traced stage {best.stage} of {plan.pp} in {best.seconds:.2f} s (FakeTensorMode + MemTracker)",
             f"peak by MemTracker category: {best.peak_by_category}",
             f"other = {other_bytes} B reserve (not a tensor)")
    return MemoryBreakdown(best.parameters, best.gradients, best.optimizer, acts, other_bytes, "traced",
                           best.stage, _cpu_bytes(model, plan), capacity, notes)


def _cpu_bytes(model: ModelDims, plan: ExecutionPlan) -> int:
    if plan.offload == "none":
        return 0
    return state_bytes(model, plan, 0)[3]


# GPipe keeps every micro-batch of a step in flight, and the trace runs each one: 1,024 took 155 s
# and 290 MB on a two-layer model, and a request for 1,048,576 would have run for days under the
# service's one traced lane. The formula needs no such bound.
MAX_TRACED_GPIPE_MICROBATCHES = 64


def _check_supported(plan: ExecutionPlan) -> None:
    if plan.schedule == "gpipe" and plan.grad_accum > MAX_TRACED_GPIPE_MICROBATCHES:
        raise PlanInputError("plan.grad_accum", (f"traced mode runs each of GPipe's {plan.grad_accum} in-flight "
                                                 f"micro-batches; at most {MAX_TRACED_GPIPE_MICROBATCHES}: use mode "
                                                 "'formula', or schedule 1f1b"))
    if plan.zero_stage >= 3:
        raise PlanInputError("plan.sharding", "traced mode does not simulate ZeRO-3/FSDP parameter gathering; "
                                              "use mode 'formula'")
    if plan.virtual_stages > 1:
        raise PlanInputError("plan.virtual_stages", "traced mode does not simulate interleaved pipelines")


def run_step(model: ModelDims, plan: ExecutionPlan, stage: int = 0, *, fake: bool = True) -> StepTrace:
    """Run one step of pipeline stage `stage` of `plan` under MemTracker; fake tensors unless fake=False."""
    model.require_transformer("the traced mode")
    _check_supported(plan)
    import contextlib

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from tessera.estimator.torch.torch_models import RankShape, Stage

    recipe = RECIPES[plan.precision]
    dtype = {4: torch.float32, 2: torch.bfloat16}[recipe.param]
    layers = stage_layers(model, plan)[stage]
    shape = RankShape(model=model, layers=layers, first=stage == 0, last=stage == plan.pp - 1, tp=plan.tp,
                      sp=plan.sequence_parallel, ep=plan.ep, flash=plan.flash_attention,
                      checkpointing=plan.checkpointing, micro_batch=plan.micro_batch, dtype=dtype)
    t0 = time.perf_counter()
    ctx: Any = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    with ctx:
        mod = _Microbatches(Stage(shape))
        mod.train()
        opt = _SimAdam(mod, plan, recipe)
        mt = _peak_tracker_class(MemTracker)()
        mt.track_external(mod, opt, *opt.main_grads)
        before = mt.get_tracker_snapshot("current")
        dev = next(iter(before))
        snap = before[dev]
        params = snap.get("Parameter", 0) + snap.get("Buffer", 0)
        grads = snap.get("Gradient", 0) + snap.get("Other", 0)
        optimizer = snap.get("Optstate", 0)
        with mt, warnings.catch_warnings():
            # MemTracker warns about the None targets of non-last stages among the module inputs
            warnings.filterwarnings("ignore", message="Expected a tensor or a traceable wrapper-subclass")
            _step(mod, opt, plan, shape, stage, recipe, torch)
        peak_snap = mt.get_tracker_snapshot("peak")
    peak_dev = peak_snap.get(dev, {})
    by_cat = {str(getattr(k, "value", k)): int(v) for k, v in peak_dev.items() if v}
    return StepTrace(stage, int(peak_dev.get("Total", 0)), params, grads, optimizer, by_cat,
                     time.perf_counter() - t0)


def _step(mod: Any, opt: Any, plan: ExecutionPlan, shape: Any, stage: int, recipe: Recipe, torch: Any) -> None:
    m = shape.model
    b, s, h = plan.micro_batch, m.seq_length, m.hidden_size
    inflight = plan.grad_accum if plan.schedule == "gpipe" else min(plan.grad_accum, plan.pp - stage)
    s_local = s // plan.tp if plan.sequence_parallel and plan.tp > 1 else s
    ins: list[tuple[Any, Any]] = []
    for _ in range(inflight):
        if shape.first:
            inp = torch.zeros(b, s, dtype=torch.long)
        else:  # the activation received from the previous stage (the residual stream's dtype)
            inp = torch.zeros(b, s_local, h, dtype=shape.dtype, requires_grad=True)
        ins.append((inp, torch.zeros(b, s, dtype=torch.long) if shape.last else None))
    # One root call runs the in-flight forwards (MemTracker refuses a second root forward per
    # iteration); with AMP each micro-batch's forward is its own autocast region, as in a schedule.
    outs = mod(ins, recipe.name == "amp")
    if not shape.last:  # Megatron frees a sent output's data at once (deallocate_output_tensor)
        for out in outs:
            out.untyped_storage().resize_(0)
    engine = torch.autograd.Variable._execution_engine
    for out in outs:
        if shape.last:
            out.backward()
        else:  # the gradient received from the next stage
            engine.run_backward((out,), (torch.ones(out.shape, dtype=out.dtype),), False, False, (),
                                allow_unreachable=True, accumulate_grad=True)
    del outs
    opt.step()


def _sim_adam_class() -> Any:
    import torch

    class SimAdam(torch.optim.Optimizer):
        """Adam written out per tensor with the recipe's state, sharded over dp as ZeRO says.

        State per parameter (in `self.state`, so MemTracker counts it as optimizer state): fp32 master
        shard (recipes with 2-byte params), fp32 main-grad copy (megatron-fp16), m and v. Gradient
        buffers: `param.grad` kept allocated (DDP's buckets), or fp32 `main_grads` filled by a
        post-accumulate hook (megatron-bf16), sharded with ZeRO-2.
        """

        def __init__(self, mod: torch.nn.Module, plan: ExecutionPlan, recipe: Recipe) -> None:
            params = [p for p in mod.parameters()]
            super().__init__(params, {"lr": 1e-4})
            self.plan, self.recipe = plan, recipe
            self.main_grads: list[torch.Tensor] = []
            self._grad_of: dict[int, torch.Tensor] = {}
            z = plan.zero_stage
            offload = plan.offload != "none"
            gdtype = torch.float32 if recipe.grad == 4 else torch.bfloat16
            experts = _expert_params(mod)
            for p in params:
                dp = plan.dp // plan.ep if id(p) in experts else plan.dp
                n = p.numel()
                shard = math.ceil(n / dp) if z >= 1 else n
                gshard = math.ceil(n / dp) if z >= 2 else n
                separate = recipe.grad != recipe.param or z >= 2  # a gradient buffer apart from p.grad
                if offload and z >= 2:
                    p.register_post_accumulate_grad_hook(_drop_grad)  # type: ignore[no-untyped-call]
                elif separate:
                    buf = torch.zeros(gshard, dtype=gdtype)
                    self.main_grads.append(buf)
                    self._grad_of[id(p)] = buf
                    p.register_post_accumulate_grad_hook(_accumulate_into(buf))  # type: ignore[no-untyped-call]
                else:
                    p.grad = torch.zeros_like(p)
                if offload:
                    continue
                st: dict[str, torch.Tensor] = {}
                sdtype = torch.bfloat16 if recipe.name == "bf16" else torch.float32
                if recipe.param == 2 and recipe.name != "bf16":
                    st["master"] = torch.zeros(shard, dtype=torch.float32)
                if recipe.name == "megatron-fp16":
                    st["main_grad_fp32"] = torch.zeros(shard, dtype=torch.float32)
                if recipe.name == "mixed-adafactor":  # factored second moment, no momentum
                    rows = p.numel() // p.shape[-1] if p.dim() >= 2 else shard
                    cols = p.numel() // p.shape[-2] if p.dim() >= 2 else 0
                    st["v_row"] = torch.zeros(math.ceil(rows / dp) if z >= 1 else rows, dtype=torch.float32)
                    if cols:
                        st["v_col"] = torch.zeros(cols, dtype=torch.float32)
                else:
                    st["exp_avg"] = torch.zeros(shard, dtype=sdtype)
                    st["exp_avg_sq"] = torch.zeros(shard, dtype=sdtype)
                self.state[p] = st

        @torch.no_grad()
        def step(self, closure: Any = None) -> None:  # type: ignore[override]
            if self.plan.offload != "none":
                return  # the step runs on the host
            for group in self.param_groups:
                for p in group["params"]:
                    st = self.state[p]
                    k = st["master"].numel() if "master" in st else st["exp_avg"].numel()
                    g = self._grad_of.get(id(p))
                    if g is None:
                        assert p.grad is not None
                        g = p.grad
                    g = g.reshape(-1)[:k]
                    if "main_grad_fp32" in st:
                        st["main_grad_fp32"].copy_(g)
                        g = st["main_grad_fp32"]
                    elif self.recipe.cast_grad:
                        g = g.float()
                    if "exp_avg" in st:
                        m, v = st["exp_avg"], st["exp_avg_sq"]
                        m.mul_(0.9).add_(g, alpha=0.1)
                        v.mul_(0.999).addcmul_(g, g, value=0.001)
                        denom = v.sqrt().add_(1e-8)
                    else:  # Adafactor: an update-sized temporary from the factored moments
                        m = g
                        denom = g.abs().add_(1e-30)
                    target = st.get("master", p.view(-1)[:k])
                    target.addcdiv_(m, denom, value=-group["lr"])
                    if "master" in st:
                        p.view(-1)[:k].copy_(target)
                    del denom

    return SimAdam


def _peak_tracker_class(base: Any) -> Any:
    """MemTracker keeping only the global peak: its per-op update of every module's local peak is
    O(modules) per op (30 s of a 7B step); the global peak and snapshot it keeps are the same."""

    class PeakTracker(base):  # type: ignore[misc]
        def _update_peak_stats(self, peak_state: Any) -> None:
            for dev, dev_snap in self._curr_mem_snap.items():
                total = dev_snap["Total"]
                if self._peak_mem.get(dev, 0) < total:
                    self._peak_mem[dev] = total
                    self._peak_mem_snap[dev] = dict(dev_snap)

    return PeakTracker


def _Microbatches(stage: Any) -> Any:
    import torch

    class Microbatches(torch.nn.Module):
        """Runs the stage on each in-flight micro-batch in one root call."""

        def __init__(self, stage: torch.nn.Module) -> None:
            super().__init__()
            self.stage = stage

        def forward(self, ins: list[tuple[Any, Any]], amp: bool = False) -> list[Any]:
            outs = []
            for i, t in ins:
                if amp:
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        outs.append(self.stage(i, t))
                else:
                    outs.append(self.stage(i, t))
            return outs

    return Microbatches(stage)


def _SimAdam(mod: Any, plan: ExecutionPlan, recipe: Recipe) -> Any:
    return _sim_adam_class()(mod, plan, recipe)


def _expert_params(mod: Any) -> set[int]:
    from tessera.estimator.torch.torch_models import MoE

    ids: set[int] = set()
    for sub in mod.modules():
        if isinstance(sub, MoE):
            ids.update(id(p) for p in (sub.w1, sub.b1, sub.w2, sub.b2))
    return ids


def _drop_grad(p: Any) -> None:
    p.grad = None


def _accumulate_into(buf: Any) -> Any:
    def hook(p: Any) -> None:
        g = p.grad.reshape(-1)
        buf.add_(g[: buf.numel()])
        p.grad = None

    return hook


# ---------------------------------------------------------------------------------------------------
# The same step on real CPU tensors, measured by the operating system (traced-vs-real check)


def real_cpu_peak(model: ModelDims, plan: ExecutionPlan, stage: int = 0, timeout_s: float = 300) -> dict[str, Any]:
    """Run the step on real CPU tensors in a fresh process and measure its peak from the OS.

    The child builds the stage and its resident state, runs one step (which loads the kernels' code
    pages), reads its resident set size (RSS), resets the high-water mark (/proc/self/clear_refs),
    runs a second step without any tracker, and reads the high-water mark (VmHWM). glibc's malloc is told to serve
    every allocation above 64 KiB by mmap (MALLOC_MMAP_THRESHOLD_), so freed tensors go back to the
    OS at once and RSS follows the live tensors. Returns rss_before, rss_peak, resident (tensor bytes
    of the state, counted), and peak = resident + (rss_peak - rss_before): the step's peak tensor
    bytes as the OS saw them (page-rounded; includes small non-tensor allocations of the step).
    """
    import json
    import os
    import subprocess
    import sys

    arg = json.dumps({"model": model.__dict__, "plan": plan.to_dict(), "stage": stage})
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "tessera.estimator.torch.traced", arg], capture_output=True, text=True,
                         env=env, timeout=timeout_s, check=True)
    res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return res


def _real_child(arg: str) -> None:
    import json
    import resource

    import torch

    from tessera.estimator.torch.torch_models import RankShape, Stage

    d = json.loads(arg)
    model, plan, stage = ModelDims(**d["model"]), ExecutionPlan(**d["plan"]), int(d["stage"])
    torch.set_num_threads(1)
    recipe = RECIPES[plan.precision]
    dtype = {4: torch.float32, 2: torch.bfloat16}[recipe.param]
    shape = RankShape(model=model, layers=stage_layers(model, plan)[stage], first=stage == 0,
                      last=stage == plan.pp - 1, tp=plan.tp, sp=plan.sequence_parallel, ep=plan.ep,
                      flash=plan.flash_attention, checkpointing=plan.checkpointing,
                      micro_batch=plan.micro_batch, dtype=dtype)
    mod = _Microbatches(Stage(shape))
    mod.train()
    opt = _SimAdam(mod, plan, recipe)
    tensors = [*mod.parameters(), *opt.main_grads, *(p.grad for p in mod.parameters() if p.grad is not None),
               *(t for st in opt.state.values() for t in st.values())]
    resident = sum(t.untyped_storage().nbytes() for t in tensors)

    def status(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise KeyError(key)

    # A first step loads the kernels' code pages (file-backed RSS); the second one is measured, with
    # the high-water mark reset (Linux clear_refs 5) when the kernel allows it.
    _step(mod, opt, plan, shape, stage, recipe, torch)
    before = status("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:
        reset = False
    _step(mod, opt, plan, shape, stage, recipe, torch)
    peak = status("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"rss_before": before, "rss_peak": peak, "resident": resident, "hwm_reset": reset,
                      "peak": resident + peak - before}))


if __name__ == "__main__":
    import sys

    _real_child(sys.argv[1])
