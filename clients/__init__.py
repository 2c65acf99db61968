"""Tessera's clients: the Python SDK, tessctl, and the trainer SDK with the reference trainer.

The public surface is `__all__`:

    from tessera.clients import Client, load_job_file, TesseraError

    with Client("127.0.0.1:50051") as client:
        job = client.submit(load_job_file("examples/jobs/tiny.yaml"))

`Client` and its errors (`RpcError`, a failed call, and `ControllerUnreachable`, an RpcError) come
from `tessera.clients.sdk`; `AsyncClient`, its asyncio twin, from `tessera.clients.aio`, returning the
typed results of `tessera.clients.results` (`JobInfo`, `NodeInfo`, states as `JobState`/`NodeState`); `TesseraError` (tessera.common.errors) is the root of every error
Tessera raises on purpose, these included; `load_job_file` and `JobFileError` from
`tessera.clients.jobfile`; `TrainerContext` and `ContractError` from the trainer SDK,
`tessera.clients.trainer`.

The names load on first use (module `__getattr__`): every training process imports this package on
its way to `tessera.clients.trainer`, and must not pay for grpc, YAML and the estimator's tables
that the controller's SDK and the job-file parser import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tessera.clients.aio import AsyncClient
    from tessera.clients.jobfile import JobFileError, load_job_file
    from tessera.clients.results import JobInfo, JobState, NodeInfo, NodeState
    from tessera.clients.sdk import Client, ControllerUnreachable, RpcError
    from tessera.clients.trainer import ContractError, TrainerContext
    from tessera.common.errors import TesseraError

__all__ = [
    "AsyncClient",
    "Client",
    "ContractError",
    "ControllerUnreachable",
    "JobFileError",
    "JobInfo",
    "JobState",
    "NodeInfo",
    "NodeState",
    "RpcError",
    "TesseraError",
    "TrainerContext",
    "load_job_file",
]

_HOME = {
    "Client": "tessera.clients.sdk",
    "AsyncClient": "tessera.clients.aio",
    "JobInfo": "tessera.clients.results",
    "JobState": "tessera.clients.results",
    "NodeInfo": "tessera.clients.results",
    "NodeState": "tessera.clients.results",
    "TesseraError": "tessera.common.errors",
    "RpcError": "tessera.clients.sdk",
    "ControllerUnreachable": "tessera.clients.sdk",
    "load_job_file": "tessera.clients.jobfile",
    "JobFileError": "tessera.clients.jobfile",
    "TrainerContext": "tessera.clients.trainer",
    "ContractError": "tessera.clients.trainer",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
