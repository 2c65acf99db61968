"""The reference trainer's checkpoints: one torch.save state dict inside the SDK's atomic layout.

    <checkpoint_dir>/step-<N>/state.pt    model, optimizer, iteration, RNG states, data position, ...
    <checkpoint_dir>/step-<N>/meta.json   the same facts without tensors (written last = complete)
    <checkpoint_dir>/latest               "step-<N>"

Data-parallel replicas are identical, so rank 0 saves the unwrapped model's state dict and any
data-parallel world size can load it.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from clients.trainer_sdk import CheckpointRef, ModelDims, Plan, checkpoint_writer

STATE_FILE = "state.pt"
FORMAT = "tessera-reference-trainer/1"


@dataclass(frozen=True)
class Snapshot:
    """What a loaded checkpoint holds."""

    iteration: int
    data_position: int
    loss: float
    model_state: Mapping[str, Any]
    optimizer_state: Mapping[str, Any]
    rng: Mapping[str, Any]
    meta: Mapping[str, Any]


def save(
    checkpoint_dir: Path,
    iteration: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    data_position: int,
    loss: float,
    world_size: int,
    plan: Plan,
    dims: ModelDims,
    seed: int,
    keep: int,
) -> Path:
    """Write the checkpoint of `iteration` atomically (rank 0 only) and return its directory."""
    rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    meta = {
        "format": FORMAT,
        "data_position": data_position,
        "loss": loss,
        "world_size": world_size,
        "plan": plan.to_dict(),
        "model": dims.to_dict(),
        "seed": seed,
    }
    state = {
        **meta,
        "iteration": iteration,
        "model_state": model.state_dict(),
        "optimizer_state": optimizer.state_dict(),
        "rng": rng,
    }
    with checkpoint_writer(checkpoint_dir, iteration, meta, keep=keep) as tmp:
        torch.save(state, tmp / STATE_FILE)
        final = tmp.with_name(tmp.name.removesuffix(".tmp"))
    return final


class IncompatibleCheckpoint(Exception):
    """The checkpoint was written for a different model or data seed than this job runs."""


def load(ref: CheckpointRef, dims: ModelDims, seed: int, map_location: torch.device) -> Snapshot:
    """Load a checkpoint; IncompatibleCheckpoint if it is for other model dimensions or another seed."""
    state = torch.load(ref.path / STATE_FILE, map_location=map_location, weights_only=True)
    if state.get("format") != FORMAT:
        raise IncompatibleCheckpoint(f"{ref.path}: unknown checkpoint format {state.get('format')!r}")
    saved = ModelDims.from_dict(state["model"])
    if (saved.hidden_size, saved.num_layers, saved.num_heads, saved.vocab_size, saved.seq_length) != (
            dims.hidden_size, dims.num_layers, dims.num_heads, dims.vocab_size, dims.seq_length):
        raise IncompatibleCheckpoint(f"{ref.path} was written for model {saved.to_dict()}, this job runs "
                                     f"{dims.to_dict()}")
    if state["seed"] != seed:
        raise IncompatibleCheckpoint(f"{ref.path} was written with seed {state['seed']}, this run uses {seed}")
    return Snapshot(
        iteration=int(state["iteration"]),
        data_position=int(state["data_position"]),
        loss=float(state["loss"]),
        model_state=state["model_state"],
        optimizer_state=state["optimizer_state"],
        rng=state["rng"],
        meta={k: state[k] for k in ("world_size", "plan", "model", "seed")},
    )


def restore_rng(rng: Mapping[str, Any]) -> None:
    torch.set_rng_state(rng["torch"].cpu())
    py = rng["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in rng["cuda"]])
