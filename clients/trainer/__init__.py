"""The trainer SDK: what a training process imports to speak the worker contract.

A training script calls `TrainerContext.from_env()` to read what the node agent gave it (see
docs/worker-contract.md), `ctx.install_signal_handlers()` so that SIGTERM becomes "checkpoint at the
next step boundary and exit 0", `ctx.report(...)` after each step to send progress to the agent, and the
checkpoint helpers (`checkpoint_writer`, `latest_checkpoint`) to write and find atomic checkpoints.

Outside Tessera (no TESSERA_* variables) the same script runs by hand: one process, no agent, a small
default model and plan, checkpoints under ./checkpoints.

Three modules, one per part of the contract: `plan` (TESSERA_PLAN and TESSERA_MODEL as values),
`checkpoints` (the on-disk layout), `context` (the variables, signals and progress reports). The
reference trainer, a torch program built on them, is the subpackage `reference`; nothing here
imports torch.
"""

from tessera.clients.trainer.checkpoints import (
    CheckpointRef,
    StaleAttempt,
    checkpoint_writer,
    latest_checkpoint,
    list_checkpoints,
    prune_checkpoints,
    set_aside,
)
from tessera.clients.trainer.context import TrainerContext
from tessera.clients.trainer.plan import DEFAULT_MODEL, ContractError, ModelDims, Plan

__all__ = [
    "DEFAULT_MODEL",
    "CheckpointRef",
    "ContractError",
    "ModelDims",
    "Plan",
    "StaleAttempt",
    "TrainerContext",
    "checkpoint_writer",
    "latest_checkpoint",
    "list_checkpoints",
    "prune_checkpoints",
    "set_aside",
]
