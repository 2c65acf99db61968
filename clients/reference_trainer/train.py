"""The training loop: DDP (gloo on CPU, NCCL on GPU), gradient accumulation, checkpoint and resume.

One collective per step carries the step's loss and every rank's stop / checkpoint wishes, so all
ranks agree at each step boundary on whether to checkpoint and whether to stop (a SIGTERM may reach
the ranks at different moments; the agent's answers reach rank 0 only).
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from clients.reference_trainer import checkpoint
from clients.reference_trainer.config import TrainConfig
from clients.reference_trainer.data import MarkovData, rank_slice
from clients.reference_trainer.model import GPT, param_groups
from clients.trainer_sdk import TrainerContext

GRAD_CLIP = 1.0
FINAL_REPORT_TRIES = 3


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
    """The process group, or nothing at world size 1."""

    def __init__(self, ctx: TrainerContext, device: torch.device, timeout_s: float) -> None:
        self.world_size = ctx.world_size
        self.device = device
        self.enabled = ctx.world_size > 1
        if not self.enabled:
            return
        os.environ["MASTER_ADDR"] = ctx.master_addr
        os.environ["MASTER_PORT"] = str(ctx.master_port)
        os.environ["RANK"] = str(ctx.rank)
        os.environ["WORLD_SIZE"] = str(ctx.world_size)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, init_method="env://", rank=ctx.rank,
                                world_size=ctx.world_size, timeout=timedelta(seconds=timeout_s))

    def agree(self, loss: float, stop: bool, ckpt: bool) -> tuple[float, bool, bool]:
        """(mean loss over ranks, any rank wants to stop, any rank wants a checkpoint)."""
        if not self.enabled:
            return loss, stop, ckpt
        t = torch.tensor([loss, float(stop), float(ckpt)], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return float(t[0]) / self.world_size, bool(t[1] > 0), bool(t[2] > 0)

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
    group = Dist(ctx, device, opts.dist_timeout_s)
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
             f"v{dims.vocab_size}-s{dims.seq_length} global_batch={cfg.global_batch} dp={cfg.plan.dp} "
             f"micro_batch={cfg.micro_batch} grad_accum={cfg.grad_accum} iterations={cfg.iterations} "
             f"checkpoint_every={cfg.checkpoint_every} checkpoint_dir={ctx.checkpoint_dir}")

    torch.manual_seed(opts.seed)
    random.seed(opts.seed)
    model = GPT(dims, tied_head=opts.tied_head).to(device)
    optimizer = torch.optim.AdamW(param_groups(model, opts.weight_decay), lr=opts.lr, betas=(0.9, 0.95),
                                  eps=1e-8)
    data = MarkovData(dims.vocab_size, dims.seq_length, opts.seed)

    start = 0
    last_loss = float("nan")
    last_ckpt = -1
    ref = ctx.latest_checkpoint()
    if ref is not None:
        snap = checkpoint.load(ref, dims, opts.seed, map_location=device)
        model.load_state_dict(snap.model_state)
        optimizer.load_state_dict(dict(snap.optimizer_state))
        checkpoint.restore_rng(snap.rng)
        start, last_loss, last_ckpt = snap.iteration, snap.loss, snap.iteration
        if snap.data_position != start * cfg.global_batch:
            raise checkpoint.IncompatibleCheckpoint(
                f"{ref.path}: data position {snap.data_position} is not iteration {start} x global batch "
                f"{cfg.global_batch}; the global batch must not change within a job")
        say(ctx, f"resumed from step {start} ({ref.path}, written at world size {snap.meta['world_size']})")
    else:
        say(ctx, "fresh start")

    ddp: torch.nn.Module = model
    if group.enabled:
        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    dp_rank = ctx.rank  # tp == pp == 1: every rank is a data-parallel replica
    it = start
    loss_avg = last_loss
    step_time = 0.0
    _, stop, want_ckpt = group.agree(0.0, ctx.stop_requested, ctx.checkpoint_requested)
    while True:
        done = it >= cfg.iterations
        periodic = it % cfg.checkpoint_every == 0
        if it > 0 and it != last_ckpt and (done or stop or want_ckpt or periodic):
            t0 = time.perf_counter()
            group.barrier()  # every rank finished step `it` before rank 0 saves
            if ctx.is_rank0:
                path = checkpoint.save(
                    ctx.checkpoint_dir, it, model=model, optimizer=optimizer,
                    data_position=it * cfg.global_batch, loss=loss_avg, world_size=ctx.world_size,
                    plan=cfg.plan, dims=dims, seed=opts.seed, keep=opts.keep_checkpoints)
                say(ctx, f"checkpoint iteration={it} path={path} seconds={time.perf_counter() - t0:.3f}")
            group.barrier()  # nobody moves on (or exits) before the checkpoint is complete
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
        first, count = rank_slice(it, cfg.global_batch, cfg.plan.dp, dp_rank)
        batch = torch.tensor(data.samples(first, count), dtype=torch.long, device=device)
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        for micro in range(cfg.grad_accum):
            chunk = batch[micro * cfg.micro_batch:(micro + 1) * cfg.micro_batch]
            sync = contextlib.nullcontext() if (micro == cfg.grad_accum - 1 or not group.enabled) \
                else ddp.no_sync()  # type: ignore[operator]
            with sync:
                _, loss = ddp(chunk[:, :-1], chunk[:, 1:])
                assert loss is not None
                (loss / cfg.grad_accum).backward()
            loss_sum += loss.detach().to(torch.float64)
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_avg, stop, want_ckpt = group.agree(float(loss_sum) / cfg.grad_accum, ctx.stop_requested,
                                                ctx.checkpoint_requested)
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
