"""The reference trainer's checkpoints: torch.distributed.checkpoint (DCP) inside the SDK's atomic layout.

    <checkpoint_dir>/step-<N>/.metadata, __<rank>_0.distcp   DCP: {"model": ..., "optim": ...}
    <checkpoint_dir>/step-<N>/trainer.pt                     RNG states (rank 0, torch.save)
    <checkpoint_dir>/step-<N>/meta.json                      iteration, data position, loss, plan, model,
                                                             seed, ... (written last = complete)
    <checkpoint_dir>/latest                                  "step-<N>"

Every rank writes its own shards of the model and optimizer state (`get_model_state_dict` /
`get_optimizer_state_dict` with flattened optimizer keys, so that state is addressed by parameter
name, not by position), replicated tensors once. Loading asks DCP for exactly the pieces this rank
holds under its plan, so a checkpoint written under one plan and world size loads under any other
(DP, FSDP, TP, PP and their combinations): that is the resharding.

A tied LM head is stored once under `tok_emb.weight` in the optimizer state (torch's own choice for
shared parameters); a last pipeline stage holding the head's copy reads the embedding's state for it.
The model state also carries `head.weight` (torch lists both names of a tied parameter).

Checkpoints of the previous format (`state.pt`, `tessera-reference-trainer/1`: plain torch.save by
rank 0, fused qkv) are still read, onto any plan.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from tessera.clients.trainer import CheckpointRef, ModelDims, Plan, checkpoint_writer
from tessera.clients.trainer.checkpoints import CHECKPOINT_META
from tessera.clients.trainer.reference.architecture import Arch
from tessera.clients.trainer.reference.parallel import Engine
from tessera.clients.trainer.reference.safe_load import SafePlanner, SafeReader

FORMAT = "tessera-reference-trainer/2"
LEGACY_FORMAT = "tessera-reference-trainer/1"
LEGACY_STATE_FILE = "state.pt"
TRAINER_FILE = "trainer.pt"
_FLAT = StateDictOptions(flatten_optimizer_state_dict=True)
_TIED = "tok_emb.weight"
_HEAD = "head.weight"


class IncompatibleCheckpoint(Exception):
    """The checkpoint was written for a different model, data seed or global batch than this job runs."""


@dataclass(frozen=True)
class Restored:
    iteration: int
    loss: float
    meta: Mapping[str, Any]


# ------------------------------------------------------------------------------------------- save


def save(
    checkpoint_dir: Path,
    iteration: int,
    *,
    engine: Engine,
    is_rank0: bool,
    data_position: int,
    loss: float,
    world_size: int,
    plan: Plan,
    dims: ModelDims,
    seed: int,
    global_batch: int,
    keep: int,
    attempt: int = 1,
) -> Path:
    """Write the checkpoint of `iteration` (a collective: every rank calls it) and return its path.

    Rank 0 opens the SDK's fenced writer (`staging/attempt-<A>/step-<N>/`) and tells the others its
    name; every rank writes its DCP shards there; rank 0 adds trainer.pt, then meta.json last, and
    publishes the directory by renaming it to `step-<N>/` once all ranks are done, unless a later
    attempt holds the fence (StaleAttempt: nothing is published).
    """
    meta = {
        "format": FORMAT,
        "data_position": data_position,
        "loss": loss,
        "world_size": world_size,
        "plan": plan.to_dict(),
        "model": dims.to_dict(),
        "seed": seed,
        "global_batch": global_batch,
        "tied_head": engine.tied,
        "arch": engine.arch.to_dict(),
    }
    final = Path(checkpoint_dir) / f"step-{iteration}"
    state = _state_to_save(engine)
    if is_rank0:
        with checkpoint_writer(checkpoint_dir, iteration, meta, keep=keep, attempt=attempt) as tmp:
            _broadcast_path(engine, str(tmp))
            _dcp_save(engine, state, tmp)
            torch.save({"iteration": iteration, "rng": _rng_state(), "time": time.time()}, tmp / TRAINER_FILE)
    else:
        tmp = Path(_broadcast_path(engine, None))
        _dcp_save(engine, state, tmp)
    if engine.distributed:
        dist.barrier()  # nobody moves on (or exits) before the checkpoint is published
    return final


def _broadcast_path(engine: Engine, path: str | None) -> str:
    if not engine.distributed:
        assert path is not None
        return path
    box = [path]
    dist.broadcast_object_list(box, src=0)
    assert box[0] is not None
    return box[0]


def _dcp_save(engine: Engine, state: dict[str, Any], path: Path) -> None:
    try:
        dcp.save(state, checkpoint_id=str(path), no_dist=not engine.distributed)
    finally:
        if engine.distributed:
            # Every rank's files are in place before rank 0 writes meta.json and renames.
            dist.barrier()


def _state_to_save(engine: Engine) -> dict[str, Any]:
    model_sd = get_model_state_dict(engine.model)
    optim_sd = get_optimizer_state_dict(engine.model, engine.optimizer, options=_FLAT)
    if engine.head_copy:
        # The first stage saves the tied weight's optimizer state (as tok_emb.weight); this copy's is equal.
        optim_sd = {k: v for k, v in optim_sd.items() if not _names_param(k, _HEAD)}
    return {"model": model_sd, "optim": optim_sd}


def _names_param(flat_key: str, fqn: str) -> bool:
    """True for a flattened optimizer key ('state.<fqn>.<name>' / 'param_groups.<fqn>.<name>') of `fqn`."""
    return flat_key.startswith((f"state.{fqn}.", f"param_groups.{fqn}."))


def _rename_param(flat: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in flat.items():
        if _names_param(k, old):
            head, _, rest = k.partition(f".{old}.")
            k = f"{head}.{new}.{rest}"
        out[k] = v
    return out


def _rng_state() -> dict[str, Any]:
    rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: Mapping[str, Any]) -> None:
    torch.set_rng_state(rng["torch"].cpu())
    py = rng["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in rng and torch.cuda.is_available():
        states = [s.cpu() for s in rng["cuda"]]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)


# ------------------------------------------------------------------------------------------- load


def check_compatible(ref: CheckpointRef, dims: ModelDims, seed: int, global_batch: int, tied_head: bool,
                     arch: Arch | None = None) -> dict[str, Any]:
    """meta.json of `ref` if this job can resume from it, else IncompatibleCheckpoint with the reason.
    `arch` None: GPT-2 style, as is every checkpoint written without an "arch" (before gated models)."""
    meta = ref.meta()
    fmt = meta.get("format")
    if fmt not in (FORMAT, LEGACY_FORMAT):
        raise IncompatibleCheckpoint(f"{ref.path}: unknown checkpoint format {fmt!r}")
    saved = ModelDims.from_dict(meta.get("model", {}))
    if (saved.hidden_size, saved.num_layers, saved.num_heads, saved.vocab_size, saved.seq_length) != (
            dims.hidden_size, dims.num_layers, dims.num_heads, dims.vocab_size, dims.seq_length):
        raise IncompatibleCheckpoint(f"{ref.path} was written for model {saved.to_dict()}, this job runs "
                                     f"{dims.to_dict()}")
    mine = (arch or Arch.gpt2(dims)).to_dict()
    theirs = Arch.from_dict(meta["arch"]).to_dict() if "arch" in meta else Arch.gpt2(saved).to_dict()
    theirs["tied_embeddings"] = mine["tied_embeddings"]  # the effective tying is checked below, as tied_head
    if theirs != mine:
        raise IncompatibleCheckpoint(f"{ref.path} was written for a model built as {theirs}, this job builds "
                                     f"{mine}")
    if meta.get("seed") != seed:
        raise IncompatibleCheckpoint(f"{ref.path} was written with seed {meta.get('seed')}, this run uses {seed}")
    if meta.get("tied_head", True) != tied_head:
        raise IncompatibleCheckpoint(f"{ref.path} was written with tied_head={meta.get('tied_head')}, this run "
                                     f"uses {tied_head}")
    iteration = int(meta["iteration"])
    if int(meta["data_position"]) != iteration * global_batch:
        raise IncompatibleCheckpoint(
            f"{ref.path}: data position {meta['data_position']} is not iteration {iteration} x global batch "
            f"{global_batch}; the global batch must not change within a job")
    return meta


def read_rng(ref: CheckpointRef, meta: Mapping[str, Any]) -> Mapping[str, Any]:
    name = LEGACY_STATE_FILE if meta["format"] == LEGACY_FORMAT else TRAINER_FILE
    rng: Mapping[str, Any] = torch.load(ref.path / name, map_location="cpu", weights_only=True)["rng"]
    return rng


def load_state(ref: CheckpointRef, meta: Mapping[str, Any], engine: Engine, dims: ModelDims) -> None:
    """The model and optimizer state of `ref` into this rank's parts (a collective)."""
    if meta["format"] == LEGACY_FORMAT:
        # Rank 0 rewrites the old file as a (private, unpublished) DCP checkpoint of the whole model;
        # every rank then reads its part of it like any other checkpoint.
        mine: str | None = None
        failed: Exception | None = None
        if _is_rank0():
            try:
                mine = str(_convert_legacy(ref.path, dims, engine.tied))
            except Exception as e:  # noqa: BLE001 - every rank must hear of it, not wait in the broadcast
                mine, failed = "", e
        converted = _broadcast_path(engine, mine)
        if not converted:
            raise failed or RuntimeError(f"{ref.path}: rank 0 could not read {LEGACY_STATE_FILE}")
        try:
            _load_dcp(Path(converted), engine)
        finally:
            if engine.distributed:
                dist.barrier()
            if _is_rank0():
                shutil.rmtree(converted, ignore_errors=True)
    else:
        _load_dcp(ref.path, engine)


def _is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _load_dcp(path: Path, engine: Engine) -> None:
    model_sd = get_model_state_dict(engine.model)
    optim_sd = get_optimizer_state_dict(engine.model, engine.optimizer, options=_FLAT)
    if engine.head_copy:
        optim_sd = _rename_param(optim_sd, _HEAD, _TIED)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, storage_reader=SafeReader(str(path)), planner=SafePlanner(),
             no_dist=not engine.distributed)
    optim_sd = state["optim"]
    if engine.head_copy:
        optim_sd = _rename_param(optim_sd, _TIED, _HEAD)
    set_model_state_dict(engine.model, state["model"])
    set_optimizer_state_dict(engine.model, engine.optimizer, optim_sd, options=_FLAT)


# ------------------------------------------------------------------ the previous format (state.pt)


def _legacy_param_order(dims: ModelDims, tied: bool) -> list[str]:
    """Parameter names of the format-1 model in `model.parameters()` order (fused qkv)."""
    names = ["tok_emb.weight", "pos_emb.weight"]
    for i in range(dims.num_layers):
        for sub in ("ln1", "attn.qkv", "attn.proj", "ln2", "fc", "out"):
            names += [f"blocks.{i}.{sub}.weight", f"blocks.{i}.{sub}.bias"]
    names += ["ln_f.weight", "ln_f.bias"]
    if not tied:
        names.append("head.weight")
    return names


def _legacy_split(name: str, value: Any) -> list[tuple[str, Any]]:
    """A format-1 entry under the current names: the fused qkv becomes q, k, v (tensors chunked along
    their first dimension, anything else repeated)."""
    if ".attn.qkv." not in name:
        return [(name, value)]
    names = [name.replace(".attn.qkv.", f".attn.{part}.") for part in ("q", "k", "v")]
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        return [(n, c.contiguous()) for n, c in zip(names, value.chunk(3, dim=0), strict=True)]
    return [(n, value) for n in names]


def _convert_legacy(path: Path, dims: ModelDims, tied: bool) -> Path:
    """Write the format-1 checkpoint in `path` as a DCP checkpoint of the whole model under the current
    names (fused qkv split into q, k, v, with its Adam moments; the positional optimizer state keyed
    by parameter name) into a temporary sibling directory, and return that directory."""
    state = torch.load(path / LEGACY_STATE_FILE, map_location="cpu", weights_only=True)
    model_sd: dict[str, Any] = {}
    for name, value in state["model_state"].items():
        model_sd.update(_legacy_split(name, value))
    if tied:
        model_sd[_HEAD] = model_sd[_TIED]
    old = state["optimizer_state"]
    order = _legacy_param_order(dims, tied)
    positional = [n for n in order if _legacy_is_matrix(n)] + [n for n in order if not _legacy_is_matrix(n)]
    flat: dict[str, Any] = {}
    for group in old["param_groups"]:
        for idx in group["params"]:
            name = positional[idx]
            for k, v in group.items():
                if k != "params":
                    flat.update((f"param_groups.{n}.{k}", x) for n, x in _legacy_split(name, v))
            for k, v in old["state"].get(idx, {}).items():
                flat.update((f"state.{n}.{k}", x) for n, x in _legacy_split(name, v))
    out = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    shutil.rmtree(out, ignore_errors=True)
    dcp.save({"model": model_sd, "optim": flat}, checkpoint_id=str(out), no_dist=True)
    return out


def _legacy_is_matrix(name: str) -> bool:
    return name.endswith("weight") and not name.split(".")[-2].startswith("ln")


def describe(ref: CheckpointRef) -> str:
    """`written at world size N under plan ...` for the resume line."""
    meta = json.loads((ref.path / CHECKPOINT_META).read_text())
    plan = Plan.from_dict(meta.get("plan", {}))
    return (f"written at world size {meta.get('world_size')}, plan dp={plan.dp} tp={plan.tp} pp={plan.pp} "
            f"zero_stage={plan.zero_stage}")
