"""agent-state.json as the agent reads it at start (nodeagent/state.py): what it did not write is set
aside, and the agent starts without it, rather than crash-loop or act on a misread value."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tessera.nodeagent.state import STATE_VERSION, StateFile


def _state(**fields: object) -> dict[str, object]:
    return {"version": STATE_VERSION, "controller_epoch": 3, "draining": False, "launched": {"j": 2},
            "stopped": {}, "workers": [], **fields}


def test_what_the_agent_writes_reads_back(tmp_path: Path) -> None:
    f = StateFile(tmp_path / "agent-state.json")
    f.write({k: v for k, v in _state().items() if k != "version"})
    assert f.load() == _state()


@pytest.mark.parametrize("content", [
    b"\xff\xfe not utf-8",
    json.dumps(_state(controller_epoch="abc")).encode(),
    json.dumps(_state(controller_epoch=[1])).encode(),
    json.dumps(_state(controller_epoch=1e30)).encode(),
    json.dumps(_state(controller_epoch=10**30)).encode(),
    json.dumps(_state(draining="no")).encode(),  # bool("no") is True: the node drained
    json.dumps(_state(launched=[1])).encode(),
    json.dumps(_state(launched={"j": "x"})).encode(),
    json.dumps(_state(workers=5)).encode(),
    b"[" * 5000 + b"]" * 5000,
])
def test_a_file_the_agent_did_not_write_is_set_aside(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "agent-state.json"
    path.write_bytes(content)
    assert StateFile(path).load() == {}
    assert not path.exists() and (tmp_path / "agent-state.json.corrupt").read_bytes() == content


def test_a_link_to_a_device_does_not_hang_the_start(tmp_path: Path) -> None:
    path = tmp_path / "agent-state.json"
    os.symlink("/dev/zero", path)
    assert StateFile(path).load() == {}
