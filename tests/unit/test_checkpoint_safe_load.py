"""A DCP checkpoint is read as data: `.metadata` and the non-tensor entries through allowlists
(clients/trainer/reference/safe_load.py). Each planted payload would run with DCP's own reader and
planner; the test shows that first, so it cannot pass for a payload that does nothing."""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from tessera.clients.trainer.reference.safe_load import (
    SafePlanner,
    SafeReader,
    UnsafeCheckpoint,
    read_metadata,
)

_FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


class MkdirPayload:
    """Unpickling it creates a directory: the stand-in for an attacker's code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.path),))


def _state() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt, options=_FLAT)}


def _save(state: dict[str, Any], path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... single process"
        dcp.save(state, checkpoint_id=str(path), no_dist=True)


def _load(path: Path, *, safe: bool) -> dict[str, Any]:
    state = _state()
    for v in state["model"].values():
        v.zero_()
    kw: dict[str, Any] = ({"storage_reader": SafeReader(str(path)), "planner": SafePlanner()} if safe
                          else {"checkpoint_id": str(path)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, no_dist=True, **kw)
    return state


def test_a_checkpoint_dcp_wrote_loads_whole(tmp_path: Path) -> None:
    written = _state()
    _save(written, tmp_path / "ck")
    loaded = _load(tmp_path / "ck", safe=True)
    for name, tensor in written["model"].items():
        assert torch.equal(loaded["model"][name], tensor)
    assert loaded["optim"]["param_groups.0.weight.betas"] == (0.9, 0.95)
    assert loaded["optim"]["param_groups.0.weight.lr"] == 1e-3
    assert torch.equal(loaded["optim"]["state.0.weight.exp_avg"], written["optim"]["state.0.weight.exp_avg"])


def test_a_planted_metadata_runs_nothing(tmp_path: Path) -> None:
    _save(_state(), tmp_path / "ck")
    marker = tmp_path / "ran"
    (tmp_path / "ck" / ".metadata").write_bytes(pickle.dumps(MkdirPayload(marker)))
    with pytest.raises(CheckpointException, match=r"\.metadata asks for (posix|os)\.mkdir"):
        _load(tmp_path / "ck", safe=True)
    assert not marker.exists()
    with pytest.raises(CheckpointException):  # DCP's own reader runs the payload, then fails on its result
        _load(tmp_path / "ck", safe=False)
    assert marker.is_dir()


def test_a_planted_non_tensor_entry_runs_nothing(tmp_path: Path) -> None:
    state = _state()
    marker = tmp_path / "ran"
    state["optim"]["param_groups.0.weight.lr"] = MkdirPayload(marker)
    _save(state, tmp_path / "ck")
    assert not marker.exists()
    with pytest.raises(CheckpointException, match=r"param_groups.0.weight.lr is not plain data: .*GLOBAL posix.mkdir"):
        _load(tmp_path / "ck", safe=True)
    assert not marker.exists()
    _load(tmp_path / "ck", safe=False)
    assert marker.is_dir()


def test_an_enum_member_pickled_by_name_loads() -> None:
    """Python 3.12+ pickles DCP's memory-format enum as getattr(_MEM_FORMAT_ENCODING, "NAME"): the
    workers' Python wrote such checkpoints, and the first allowlist refused every one of them."""
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING, Metadata

    class ByName(pickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, _MEM_FORMAT_ENCODING):
                return getattr, (type(obj), obj.name)
            return NotImplemented

    written = _state()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import io

        buf = io.BytesIO()
        from torch.distributed.checkpoint.metadata import TensorProperties

        ByName(buf).dump(Metadata(state_dict_metadata={}, planner_data=TensorProperties.create_from_tensor(
            written["model"]["0.weight"])))
    assert b"getattr" in buf.getvalue()
    got = read_metadata(buf.getvalue())
    assert got.planner_data.memory_format == torch.contiguous_format


def test_getattr_reaches_nothing_but_dcp_enum_members() -> None:
    """A getattr on anything else is how a pickle reaches a method (PosixPath(p).write_text) to call."""
    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return getattr, (Path("/tmp/x"), "write_text")

    with pytest.raises(UnsafeCheckpoint, match="not a member of one of DCP's enums"):
        read_metadata(pickle.dumps(Evil()))


@pytest.mark.parametrize("data, reason", [
    (b"", "not a DCP metadata record"),
    (b"\x80\x05garbage", "not a DCP metadata record"),
    (pickle.dumps({"state_dict_metadata": {}}), "holds a dict"),
    (pickle.dumps(Path("/etc/passwd").read_text), "not a member of one of DCP's enums"),
])
def test_anything_but_dcp_metadata_is_refused_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(UnsafeCheckpoint, match=reason):
        read_metadata(data)
