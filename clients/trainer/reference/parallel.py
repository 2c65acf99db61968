"""The execution plan as torch: a (pp, dp, tp) DeviceMesh, the model cut, split and wrapped for it,
the optimizer, and one training step.

| plan                      | torch                                                                    |
|---------------------------|--------------------------------------------------------------------------|
| dp > 1, zero_stage 0      | DistributedDataParallel over the mesh's "dp" group; combined with tp or  |
|                           | pp, the gradients are all-reduced over "dp" by hand after the backward    |
|                           | pass instead (the same arithmetic): DDP cannot wrap DTensor parameters,  |
|                           | and a DDP-wrapped pipeline stage fails in torch 2.13 (reducer assertion  |
|                           | "rebuilt parameter indices size is not same as original model            |
|                           | parameters size" on the second micro-batch)                              |
| zero_stage 2 / 3          | FSDP2 `fully_shard` of every block and of the root over "dp",            |
|                           | reshard_after_forward False (ZeRO-2) / True (ZeRO-3)                     |
| offload (optimizer,       | FSDP2 `CPUOffloadPolicy`: sharded parameters, gradients and the          |
|   optimizer+params)       | optimizer state live in CPU memory; the optimizer steps on the CPU       |
| tp > 1                    | DTensor tensor parallelism over "tp": ColwiseParallel on attention       |
|                           | q/k/v and MLP fc (SwiGLU w1/w3, each expert's w1/w3), RowwiseParallel on |
|                           | attention proj and MLP out (w2); MoE routers replicated                  |
| pp > 1                    | torch.distributed.pipelining: PipelineStage over "pp", ScheduleGPipe or  |
|                           | Schedule1F1B with `grad_accum` micro-batches                             |
| activation_checkpointing  | torch.utils.checkpoint (non-reentrant) around every block ("full") or    |
|                           | around the attention core only ("selective")                             |
| grad_accum (pp = 1)       | `grad_accum` forward/backward passes per step, loss / grad_accum         |

Ranks are laid out pp-major, tp-minor: rank = (pp_rank * dp + dp_rank) * tp + tp_rank, so a tensor-
parallel group is made of neighbouring ranks (one node when possible).

A tied LM head is kept on a last pipeline stage that is not also the first as a copy of the embedding
(the Megatron way): the two copies start equal, their gradients are summed between the first and
last stage after every backward pass, so they take identical optimizer steps and stay equal.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tessera.clients.trainer.reference.config import TrainConfig
from tessera.clients.trainer.reference.model import GPT, Block, lm_loss, param_groups
from tessera.clients.trainer.reference.model_llama import Llama, LlamaBlock

GRAD_CLIP = 1.0


@dataclass(frozen=True)
class Coords:
    """Where a rank sits in the (pp, dp, tp) grid."""

    pp: int
    dp: int
    tp: int
    pp_rank: int
    dp_rank: int
    tp_rank: int

    @classmethod
    def of(cls, rank: int, pp: int, dp: int, tp: int) -> Coords:
        return cls(pp, dp, tp, rank // (dp * tp), (rank // tp) % dp, rank % tp)

    def rank_of(self, pp_rank: int, dp_rank: int, tp_rank: int) -> int:
        return (pp_rank * self.dp + dp_rank) * self.tp + tp_rank

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1


def build_model(cfg: TrainConfig, tied_head: bool) -> GPT | Llama:
    """The whole model of `cfg` (GPT-2 style, or LLaMA style / Mixtral MoE when the Arch is gated), from
    the current RNG state."""
    arch = cfg.structure
    if arch.gated:
        return Llama(cfg.model, arch, tied_head=tied_head, activation_checkpointing=cfg.activation_checkpointing,
                     flash_attention=cfg.flash_attention)
    return GPT(cfg.model, tied_head=tied_head, activation_checkpointing=cfg.activation_checkpointing,
               flash_attention=cfg.flash_attention)


def stage_layers(num_layers: int, pp: int, stage: int) -> range:
    """The contiguous blocks of pipeline stage `stage`: as even as possible, later stages take the
    remainder (the first stage also holds the embeddings)."""
    base, extra = divmod(num_layers, pp)
    start = stage * base + max(0, stage - (pp - extra))
    return range(start, start + base + (1 if stage >= pp - extra else 0))


class Engine:
    """The model of this rank for the plan, its optimizer, and the training step."""

    def __init__(self, cfg: TrainConfig, rank: int, device: torch.device, distributed: bool) -> None:
        self.cfg = cfg
        self.device = device
        self.distributed = distributed
        self.coords = Coords.of(rank, cfg.pp, cfg.dp, cfg.tp)
        c = self.coords
        opts = cfg.options

        self.mesh: Any = None
        if distributed:
            from torch.distributed.device_mesh import init_device_mesh

            self.mesh = init_device_mesh(device.type, (cfg.pp, cfg.dp, cfg.tp), mesh_dim_names=("pp", "dp", "tp"))

        # Every rank builds the whole model from the seed (identical initial weights everywhere), then
        # keeps its share.
        torch.manual_seed(opts.seed)
        self.arch = cfg.structure
        # --untied-head unties any model; a model with untied_embeddings is untied whatever the flag.
        self.tied = opts.tied_head and self.arch.tied_embeddings
        model = build_model(cfg, self.tied)
        self.total_params = sum(p.numel() for p in model.parameters())
        if isinstance(model, Llama):
            # The LM loss's gradient per micro-batch: divided here by the micro-batch count, or by the
            # pipeline schedule after the backward passes (scale_grads).
            model.set_aux_grad_scale(1.0 if cfg.pp > 1 else 1.0 / cfg.grad_accum)
        if cfg.pp > 1:
            layers = (range(*cfg.stage_ranges[c.pp_rank]) if cfg.stage_ranges
                      else stage_layers(cfg.model.num_layers, cfg.pp, c.pp_rank))
            model.keep_stage(layers, c.first_stage, c.last_stage)
        model.to(device)
        self.model = model
        # The tied head's copy on a last stage that is not the first (see the module docstring).
        self.head_copy = self.tied and cfg.pp > 1 and c.last_stage and not c.first_stage

        if cfg.tp > 1:
            self._tensor_parallel()
        self.ddp: nn.Module | None = None
        self._manual_dp = False
        if cfg.zero_stage >= 2:
            self._fully_shard()
        elif cfg.dp > 1:
            if cfg.tp > 1 or cfg.pp > 1:
                self._manual_dp = True
            else:
                from torch.nn.parallel import DistributedDataParallel

                self.ddp = DistributedDataParallel(
                    model, device_ids=[device.index] if device.type == "cuda" else None,
                    process_group=self.mesh["dp"].get_group())

        # foreach kernels do not mix DTensor and plain tensors (tensor parallelism leaves the
        # embeddings and LayerNorms plain).
        self.optimizer = torch.optim.AdamW(param_groups(model, opts.weight_decay), lr=opts.lr, betas=(0.9, 0.95),
                                           eps=1e-8, foreach=False if cfg.tp > 1 else None)

        self._tie_groups: dict[tuple[int, int], Any] = {}
        if self.tied and cfg.pp > 1:
            # Every rank creates every group, in the same order (torch requires it).
            for d in range(cfg.dp):
                for t in range(cfg.tp):
                    pair = [c.rank_of(0, d, t), c.rank_of(cfg.pp - 1, d, t)]
                    self._tie_groups[(d, t)] = dist.new_group(pair)

        self.schedule: Any = None
        if cfg.pp > 1:
            from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

            stage = PipelineStage(self.ddp if self.ddp is not None else model, c.pp_rank, cfg.pp, device,
                                  group=self.mesh["pp"].get_group())
            kind = Schedule1F1B if cfg.pp_schedule == "1f1b" else ScheduleGPipe
            self.schedule = kind(stage, n_microbatches=cfg.grad_accum, loss_fn=lm_loss)

    @property
    def local_params(self) -> int:
        """Parameter elements held by this rank (its shards, its stage); a tied head's copy counts."""
        return sum(_local(p).numel() for p in self.model.parameters())

    # ---- construction helpers

    def _tensor_parallel(self) -> None:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        tp_mesh = self.mesh["tp"]
        styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
        for block in self.model.blocks.values():
            assert isinstance(block, (Block, LlamaBlock))
            parallelize_module(block, tp_mesh, {name: styles[style]() for name, style in block.tp_plan().items()})

    def _fully_shard(self) -> None:
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        kwargs: dict[str, Any] = {
            "mesh": self.mesh["dp"],
            "reshard_after_forward": self.cfg.zero_stage >= 3,
            "offload_policy": CPUOffloadPolicy(pin_memory=self.device.type == "cuda")
            if self.cfg.offload != "none" else OffloadPolicy(),
        }
        for block in self.model.blocks.values():
            fully_shard(block, **kwargs)
        fully_shard(self.model, **kwargs)

    # ---- the step

    @property
    def holds_input(self) -> bool:
        return self.coords.first_stage

    @property
    def holds_target(self) -> bool:
        return self.coords.last_stage

    def forward_backward(self, batch: torch.Tensor | None) -> float:
        """Forward and backward passes of one step over this replica's batch (micro_batch x grad_accum
        samples of seq_length + 1 tokens; None on a pipeline stage that needs neither inputs nor
        targets). Leaves the step's gradients (averaged over data-parallel replicas, tied copies
        summed) in the parameters and returns this rank's share of the step's mean loss: the replica's
        mean loss / dp on the one rank per replica that reports it, else 0 (a sum over all ranks is
        the global mean loss)."""
        cfg = self.cfg
        loss = 0.0
        if self.schedule is not None:
            losses: list[torch.Tensor] = []
            inputs = batch[:, :-1] if batch is not None and self.holds_input else None
            target = batch[:, 1:] if batch is not None and self.holds_target else None
            if self.holds_input:
                self.schedule.step(inputs, target=target, losses=losses if target is not None else None)
            else:
                self.schedule.step(target=target, losses=losses if target is not None else None)
            if losses:
                loss = float(torch.stack([x.detach().float() for x in losses]).mean())
        else:
            assert batch is not None
            net = self.ddp if self.ddp is not None else self.model
            total = torch.zeros((), dtype=torch.float64, device=self.device)
            for micro in range(cfg.grad_accum):
                chunk = batch[micro * cfg.micro_batch:(micro + 1) * cfg.micro_batch]
                last = micro == cfg.grad_accum - 1
                sync = self.ddp.no_sync() if self.ddp is not None and not last else _null()  # type: ignore[operator]
                with sync:
                    micro_loss = lm_loss(net(chunk[:, :-1]), chunk[:, 1:])
                    (micro_loss / cfg.grad_accum).backward()
                total += micro_loss.detach().to(torch.float64)
            loss = float(total) / cfg.grad_accum
        if self._manual_dp:
            self._all_reduce_grads_over_dp()
        if self._tie_groups:
            self._sum_tied_grads()
        reports = self.coords.tp_rank == 0 and self.coords.last_stage
        return loss / cfg.dp if reports else 0.0

    def _local_grads(self) -> Iterator[torch.Tensor]:
        for p in self.model.parameters():
            if p.grad is not None:
                yield _local(p.grad)

    def _all_reduce_grads_over_dp(self) -> None:
        grads = list(self._local_grads())
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.mesh["dp"].get_group())
        flat /= self.cfg.dp
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def _tied_param(self) -> torch.Tensor | None:
        if self.coords.first_stage:
            assert self.model.tok_emb is not None
            return self.model.tok_emb.weight
        if self.head_copy:
            assert self.model.head is not None
            return self.model.head.weight
        return None

    def _sum_tied_grads(self) -> None:
        p = self._tied_param()
        if p is None or p.grad is None:
            return
        g = _local(p.grad)
        dist.all_reduce(g, group=self._tie_groups[(self.coords.dp_rank, self.coords.tp_rank)])

    def grad_norm_sq_share(self) -> float:
        """This rank's share of the squared global gradient norm: every element of every gradient is
        counted on exactly one rank (sharded parts where they live, replicated ones on coordinate 0 of
        the replicating mesh dimensions, the tied head's copy not at all), so a sum over all ranks is
        the squared norm of the whole model's gradient."""
        from torch.distributed.tensor import DTensor, Shard

        c = self.coords
        coord = {"dp": c.dp_rank, "tp": c.tp_rank}
        skip = self.model.head.weight if self.head_copy and self.model.head is not None else None
        total = 0.0
        for p in self.model.parameters():
            if p.grad is None or p is skip:
                continue
            g = p.grad
            sharded: set[str] = set()
            if isinstance(g, DTensor):
                names = g.device_mesh.mesh_dim_names or ()
                sharded = {n for n, pl in zip(names, g.placements, strict=True) if isinstance(pl, Shard)}
                g = g.to_local()
            if all(coord[n] == 0 for n in ("dp", "tp") if n not in sharded):
                total += float(torch.sum(g.detach().to(torch.float64) ** 2))
        return total

    def params_finite(self) -> bool:
        """Whether this rank's parameters are all finite (a NaN loaded from a checkpoint trains on as NaN)."""
        with torch.no_grad():
            return all(bool(torch.isfinite(_local(p)).all()) for p in self.model.parameters())

    def clip_and_step(self, grad_norm: float) -> None:
        """Scale the gradients to a global norm of at most GRAD_CLIP, then take the optimizer step."""
        coef = GRAD_CLIP / (grad_norm + 1e-6)
        if coef < 1.0 and math.isfinite(coef):
            for g in self._local_grads():
                g.mul_(coef)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor; a plain tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_exc: object) -> None:
        return None
