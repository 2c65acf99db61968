"""Which checkpoint the ranks resume from: one they all load, chosen by rank 0.

Every rank must resume from the same step. Rank 0 names the newest complete checkpoint it sees;
each rank checks and loads it; the ranks agree (an all-reduce) after each phase. A checkpoint
that fails to load anywhere (a truncated shard, an unreadable `.metadata`, `trainer.pt` or
`meta.json`, a state that is not finite) is given up on and the next older one tried. Rank 0
renames a checkpoint it failed to read itself out of the way (`set_aside`: `step-N.damaged-A`),
so the next attempt does not trip on it again. It leaves one that only another rank failed to
read, since that rank's view of a shared file system may lag and the files may be sound. With
none left after a failure, `NoReadableCheckpoint`: a fresh start would silently throw the
training away. A checkpoint of another model, seed or global batch (`IncompatibleCheckpoint`) is
no damage: it stops the job.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from tessera.clients.trainer import CheckpointRef, ModelDims, TrainerContext, list_checkpoints, set_aside
from tessera.clients.trainer.checkpoints import checkpoint_path
from tessera.clients.trainer.reference import checkpoint
from tessera.clients.trainer.reference.checkpoint import IncompatibleCheckpoint, Restored
from tessera.clients.trainer.reference.parallel import Engine

OK, DAMAGED, INCOMPATIBLE = 0, 1, 2


class NoReadableCheckpoint(RuntimeError):
    """Complete checkpoints exist, and none of them could be loaded."""


def resume(ctx: TrainerContext, engine: Engine, dims: ModelDims, seed: int, global_batch: int,
           say: Callable[[str], None]) -> tuple[Restored, CheckpointRef] | None:
    """Load the newest checkpoint every rank can load into the engine (a collective) and restore the
    RNG; None for a fresh start (there is no complete checkpoint)."""
    ctx.claim_checkpoints()
    below: int | None = None
    given_up: list[str] = []
    while True:
        pick = -1
        if ctx.is_rank0:
            older = [c for c in list_checkpoints(ctx.checkpoint_dir) if below is None or c.iteration < below]
            pick = older[-1].iteration if older else -1
        pick = _from_rank0(engine, pick)
        if pick < 0:
            if given_up:
                raise NoReadableCheckpoint(f"no checkpoint in {ctx.checkpoint_dir} could be loaded: "
                                           + "; ".join(given_up))
            return None
        ref = CheckpointRef(pick, checkpoint_path(ctx.checkpoint_dir, pick))
        mine, why, meta, rng = OK, "", None, None
        try:
            meta = checkpoint.check_compatible(ref, dims, seed, global_batch, engine.tied, engine.arch)
        except IncompatibleCheckpoint as e:
            mine, why = INCOMPATIBLE, str(e)
        except Exception as e:  # noqa: BLE001 - unreadable or missing here: damaged for this rank
            mine, why = DAMAGED, _short(e)
        worst = _worst(engine, mine)
        if worst == INCOMPATIBLE:
            raise IncompatibleCheckpoint(why or f"{ref.path}: another rank found it incompatible")
        if worst == OK:
            assert meta is not None
            try:  # a collective: DCP hands a read error on any rank to every rank
                checkpoint.load_state(ref, meta, engine, dims)
                rng = checkpoint.read_rng(ref, meta)
                if not engine.params_finite():
                    raise ValueError("the loaded parameters are not all finite")
            except (Exception, CheckpointException) as e:  # noqa: BLE001 - damaged: the next older one
                # (DCP's CheckpointException derives from BaseException, not Exception.)
                mine, why = DAMAGED, _short(e)
            worst = _worst(engine, mine)
        if worst == OK:
            assert meta is not None and rng is not None
            checkpoint.restore_rng(rng)
            return Restored(iteration=int(meta["iteration"]), loss=float(meta["loss"]), meta=meta), ref
        given_up.append(f"step {pick}: {why or 'another rank could not load it'}")
        say(f"cannot resume from step {pick} ({ref.path}): {why or 'another rank could not load it'}; "
            "trying the next older checkpoint")
        if ctx.is_rank0 and mine == DAMAGED:
            aside = set_aside(ctx.checkpoint_dir, pick, attempt=ctx.attempt)
            if aside is not None:
                say(f"set aside damaged checkpoint {ref.path} as {aside.name}")
        below = pick


def _short(e: BaseException) -> str:
    if isinstance(e, CheckpointException) and e.failures:  # DCP's wrapper: the first rank's own error
        e = next(iter(e.failures.values()))[0]
    text = f"{type(e).__name__}: {e}".splitlines()[0]
    return text[:300]


def _from_rank0(engine: Engine, value: int) -> int:
    if not engine.distributed:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=engine.device)
    dist.broadcast(t, src=0)
    return int(t[0])


def _worst(engine: Engine, mine: int) -> int:
    if not engine.distributed:
        return mine
    t = torch.tensor([mine], dtype=torch.int64, device=engine.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t[0])
