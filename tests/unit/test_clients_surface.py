"""tessera.clients' public surface: what `__all__` names resolves to the documented objects, and
importing the package (which every training process does) loads none of them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import tessera.clients
from tessera.clients import aio, jobfile, results, sdk, trainer
from tessera.common import errors

EXPECTED = {
    "Client": sdk.Client,
    "AsyncClient": aio.AsyncClient,
    "JobInfo": results.JobInfo,
    "JobState": results.JobState,
    "NodeInfo": results.NodeInfo,
    "NodeState": results.NodeState,
    "TesseraError": errors.TesseraError,
    "RpcError": sdk.RpcError,
    "ControllerUnreachable": sdk.ControllerUnreachable,
    "load_job_file": jobfile.load_job_file,
    "JobFileError": jobfile.JobFileError,
    "TrainerContext": trainer.TrainerContext,
    "ContractError": trainer.ContractError,
}


def test_all_names_the_public_surface() -> None:
    assert sorted(tessera.clients.__all__) == sorted(EXPECTED)
    for name, obj in EXPECTED.items():
        assert getattr(tessera.clients, name) is obj, name
    assert set(EXPECTED) <= set(dir(tessera.clients))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = tessera.clients.Nope  # type: ignore[attr-defined]


def test_the_error_types_are_exceptions_users_can_catch() -> None:
    for name in ("TesseraError", "RpcError", "ControllerUnreachable", "JobFileError", "ContractError"):
        assert issubclass(EXPECTED[name], errors.TesseraError), name  # type: ignore[arg-type]
    assert issubclass(sdk.ControllerUnreachable, sdk.RpcError)


def _modules_after(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return json.loads(out.splitlines()[-1])  # type: ignore[no-any-return]


def _loaded(modules: list[str], *roots: str) -> list[str]:
    return [m for m in modules if m in roots or m.startswith(tuple(f"{r}." for r in roots))]


def test_importing_the_package_loads_nothing_behind_it() -> None:
    modules = _modules_after("import tessera.clients")
    assert "tessera.clients" in modules
    assert _loaded(modules, "torch", "grpc", "yaml", "numpy", "tessera.controller", "tessera.nodeagent",
                   "tessera.estimator", "tessera.clients.sdk", "tessera.clients.jobfile",
                   "tessera.clients.trainer") == []


def test_a_name_loads_its_own_module_only() -> None:
    # What a trainer imports: the trainer SDK, without the controller's SDK, grpc or torch.
    modules = _modules_after("from tessera.clients import TrainerContext")
    assert "tessera.clients.trainer.context" in modules
    assert _loaded(modules, "torch", "grpc", "yaml", "tessera.clients.sdk", "tessera.clients.jobfile",
                   "tessera.controller", "tessera.nodeagent") == []
    # The controller's SDK: grpc, but no server side of Tessera and no torch.
    modules = _modules_after("from tessera.clients import Client, load_job_file")
    assert "tessera.clients.sdk" in modules and "grpc" in modules
    assert _loaded(modules, "torch", "tessera.controller", "tessera.nodeagent") == []
