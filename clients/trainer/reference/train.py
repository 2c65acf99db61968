"""The training loop: every plan of tessera.clients.trainer.reference.parallel, checkpoint and resume.

One collective per step carries the step's loss, the squared gradient norm (for clipping) and every
rank's stop / checkpoint wishes, so all ranks agree at each step boundary on whether to checkpoint and
whether to stop (a SIGTERM may reach the ranks at different moments; the agent's answers reach rank 0
only).
"""

from __future__ import annotations

import math
import os
import random
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from tessera.clients.trainer import TrainerContext
from tessera.clients.trainer.checkpoints import damaged_checkpoints
from tessera.clients.trainer.reference import checkpoint
from tessera.clients.trainer.reference.config import TrainConfig
from tessera.clients.trainer.reference.data import MarkovData, rank_slice
from tessera.clients.trainer.reference.parallel import Engine
from tessera.clients.trainer.reference.rendezvous import init_process_group
from tessera.clients.trainer.reference.resume import resume

FINAL_REPORT_TRIES = 3


class Diverged(RuntimeError):
    """The step's loss or gradient norm is not finite (agreed by every rank): the job stops unstepped."""


def say(ctx: TrainerContext, msg: str) -> None:
    prefix = f"[rank {ctx.rank}] " if ctx.world_size > 1 else ""
    print(prefix + msg, flush=True)


def pick_device(ctx: TrainerContext) -> torch.device:
    """CUDA when torch sees a GPU and the agent gave this rank one; else CPU."""
    if ctx.gpu_allowed and torch.cuda.is_available():
        count = torch.cuda.device_count()
        # One GPU visible per rank (the agent's way) -> cuda:0; all of a node's GPUs visible
        # (torchrun by hand) -> cuda:<local rank>.
        index = ctx.local_rank if count > 1 and ctx.local_rank < count else 0
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


class Dist:
    """The process group, or nothing at world size 1 (unless FSDP2 needs one: ZeRO-Offload on one GPU)."""

    def __init__(self, ctx: TrainerContext, device: torch.device, timeout_s: float, force: bool = False) -> None:
        self.world_size = ctx.world_size
        self.device = device
        self.enabled = ctx.world_size > 1 or force
        if not self.enabled:
            return
        os.environ["MASTER_ADDR"] = ctx.master_addr
        os.environ["MASTER_PORT"] = str(ctx.master_port)
        os.environ["RANK"] = str(ctx.rank)
        os.environ["WORLD_SIZE"] = str(ctx.world_size)
        backend = "nccl" if device.type == "cuda" else "gloo"
        init_process_group(ctx, backend, timedelta(seconds=timeout_s))

    def agree(self, loss_share: float, norm_sq_share: float, stop: bool, ckpt: bool) -> tuple[float, float, bool, bool]:
        """Sum over ranks of (loss share, squared-norm share), any rank wants to stop, any rank wants a
        checkpoint: the step's one all-reduce."""
        if not self.enabled:
            return loss_share, norm_sq_share, stop, ckpt
        t = torch.tensor([loss_share, norm_sq_share, float(stop), float(ckpt)], dtype=torch.float64,
                         device=self.device)
        dist.all_reduce(t)
        return float(t[0]), float(t[1]), bool(t[2] > 0), bool(t[3] > 0)

    def barrier(self) -> None:
        if not self.enabled:
            return
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index or 0])
        else:
            dist.barrier()

    def close(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()


def run(ctx: TrainerContext, cfg: TrainConfig) -> int:
    """Train to cfg.iterations or to a cooperative stop (checkpointed). Returns the exit code (0)."""
    opts = cfg.options
    torch.set_num_threads(opts.torch_threads)
    device = pick_device(ctx)
    group = Dist(ctx, device, opts.dist_timeout_s, force=cfg.zero_stage >= 2)
    try:
        return _train(ctx, cfg, device, group)
    finally:
        group.close()


def _train(ctx: TrainerContext, cfg: TrainConfig, device: torch.device, group: Dist) -> int:
    opts = cfg.options
    dims = cfg.model
    for note in cfg.notes:
        say(ctx, f"note: {note}")
    say(ctx, f"reference trainer: job={ctx.job_id} attempt={ctx.attempt} rank={ctx.rank}/{ctx.world_size} "
             f"device={device} model=h{dims.hidden_size}-l{dims.num_layers}-a{dims.num_heads}-"
             f"v{dims.vocab_size}-s{dims.seq_length} arch={cfg.structure.describe()} global_batch={cfg.global_batch} "
             f"plan={cfg.describe()} "
             f"micro_batch={cfg.micro_batch} grad_accum={cfg.grad_accum} iterations={cfg.iterations} "
             f"checkpoint_every={cfg.checkpoint_every} checkpoint_dir={ctx.checkpoint_dir}")

    random.seed(opts.seed)
    engine = Engine(cfg, ctx.rank, device, group.enabled)
    data = MarkovData(dims.vocab_size, dims.seq_length, opts.seed)
    c = engine.coords
    say(ctx, f"parallel: pp_rank={c.pp_rank} dp_rank={c.dp_rank} tp_rank={c.tp_rank} "
             f"parameters local={engine.local_params} total={engine.total_params}"
             + (f" rendezvous={'sealed' if ctx.rendezvous_key else 'plain'}" if group.enabled else ""))

    start = 0
    last_loss = float("nan")
    last_ckpt = -1
    t0 = time.perf_counter()
    found = resume(ctx, engine, dims, opts.seed, cfg.global_batch, lambda line: say(ctx, line))
    if found is not None:
        restored, ref = found
        start, last_loss, last_ckpt = restored.iteration, restored.loss, restored.iteration
        say(ctx, f"resumed from step {start} ({ref.path}, {checkpoint.describe(ref)}) "
                 f"load_seconds={time.perf_counter() - t0:.3f}")
    else:
        aside = [p.name for p in damaged_checkpoints(ctx.checkpoint_dir)]
        say(ctx, f"fresh start (set aside as damaged: {', '.join(aside)})" if aside else "fresh start")

    needs_data = engine.holds_input or engine.holds_target
    it = start
    loss_avg = last_loss
    step_time = 0.0
    _, _, stop, want_ckpt = group.agree(0.0, 0.0, ctx.stop_requested, ctx.checkpoint_requested)
    while True:
        done = it >= cfg.iterations
        periodic = it % cfg.checkpoint_every == 0
        if it > 0 and it != last_ckpt and (done or stop or want_ckpt or periodic):
            t0 = time.perf_counter()
            path = checkpoint.save(
                ctx.checkpoint_dir, it, engine=engine, is_rank0=ctx.is_rank0,
                data_position=it * cfg.global_batch, loss=loss_avg, world_size=ctx.world_size,
                plan=cfg.plan, dims=dims, seed=opts.seed, global_batch=cfg.global_batch,
                keep=opts.keep_checkpoints, attempt=ctx.attempt)
            if ctx.is_rank0:
                say(ctx, f"checkpoint iteration={it} path={path} seconds={time.perf_counter() - t0:.3f}")
            last_ckpt = it
            ctx.checkpoint_requested = False
            if ctx.is_rank0 and not (done or stop):
                ctx.report(it, loss_avg, _sps(cfg, step_time), step_time, _peak_memory(device), last_ckpt,
                           force=True)
        elif want_ckpt and it == last_ckpt:
            ctx.checkpoint_requested = False  # this boundary already has a checkpoint
        if done or stop:
            break

        t0 = time.perf_counter()
        batch = None
        if needs_data:
            first, count = rank_slice(it, cfg.global_batch, cfg.dp, engine.coords.dp_rank)
            batch = torch.tensor(data.samples(first, count), dtype=torch.long, device=device)
        loss_share = engine.forward_backward(batch)
        loss_avg, norm_sq, stop, want_ckpt = group.agree(loss_share, engine.grad_norm_sq_share(),
                                                         ctx.stop_requested, ctx.checkpoint_requested)
        if not (math.isfinite(loss_avg) and math.isfinite(norm_sq)):
            # Every rank sees the same sums: all stop here, before the step writes NaN into the
            # parameters and the next checkpoint publishes them (and prunes the good ones).
            kept = f"the last checkpoint (iteration {last_ckpt}) is kept" if last_ckpt > 0 else "no checkpoint yet"
            raise Diverged(f"training diverged at iteration {it + 1}: loss {loss_avg:.7g}, gradient norm "
                           f"{math.sqrt(norm_sq) if norm_sq >= 0 else norm_sq:.7g}; {kept}; nothing from this "
                           "step was applied")
        engine.clip_and_step(math.sqrt(norm_sq))
        it += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_time = time.perf_counter() - t0
        if step_time < opts.min_step_seconds:
            time.sleep(opts.min_step_seconds - step_time)
            step_time = time.perf_counter() - t0
        say(ctx, f"step iteration={it}/{cfg.iterations} loss={loss_avg:.7g} step_time={step_time:.4f} "
                 f"samples_per_second={_sps(cfg, step_time):.1f}")
        if ctx.is_rank0:
            ctx.report(it, loss_avg, _sps(cfg, step_time), step_time, _peak_memory(device), last_ckpt)

    if ctx.is_rank0:
        # The last report decides "done" versus "stopped" for the controller: try it a few times.
        for _ in range(FINAL_REPORT_TRIES):
            if ctx.report(it, loss_avg, _sps(cfg, step_time), step_time, _peak_memory(device), last_ckpt,
                          force=True) or not ctx.agent_addr:
                break
    if it >= cfg.iterations:
        say(ctx, f"done iteration={it} loss={loss_avg:.7g} checkpoint_iteration={last_ckpt}")
    else:
        say(ctx, f"stopped iteration={it} loss={loss_avg:.7g} checkpoint_iteration={last_ckpt} "
                 f"reason={ctx.stop_reason or 'peer'}")
    sys.stdout.flush()
    return 0


def _sps(cfg: TrainConfig, step_time: float) -> float:
    return cfg.global_batch / step_time if step_time > 0 else 0.0


def _peak_memory(device: torch.device) -> int:
    """Peak GPU memory allocated by torch on this rank; 0 on CPU (host RSS would not be comparable)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return 0
