"""Checkpoint pruning that keeps failing (the agents make job folders as the workers' users, mode
0700, which the shipped unit's controller may not remove): one warning per folder, not one per
folder at every sweep (controller/retention.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from tessera.controller import retention
from tessera.controller.retention import DAY, Retention, RetentionConfig
from tessera.controller.store import MemoryStore

LOCKED = "j-0000000000aa"  # an orphan folder (no job in the store) the controller may not remove
FREE = "j-0000000000bb"


def _orphan(root: Path, name: str) -> Path:
    path = root / name
    (path / "step-10").mkdir(parents=True)
    stale = time.time() - 10 * DAY
    os.utime(path, (stale, stale))
    return path


def _failures(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "checkpoint_prune_failed"]


def test_a_lasting_prune_failure_is_logged_once_per_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    locked = _orphan(tmp_path, LOCKED)
    real_rmtree = retention.shutil.rmtree
    denied = {locked}

    def rmtree(path: Path) -> None:
        if path in denied:  # as root, a chmod would not stop the test: refuse as the kernel does
            raise PermissionError(13, "Permission denied", str(path))
        real_rmtree(path)

    monkeypatch.setattr(retention.shutil, "rmtree", rmtree)
    ret = Retention(MemoryStore(), str(tmp_path), RetentionConfig(checkpoint_ttl_s=1 * DAY))

    with capture_logs() as first:
        assert ret.sweep_checkpoints() == []
    (warning,) = _failures(first)
    assert warning["path"] == str(locked) and warning["log_level"] == "warning"
    assert "CAP_DAC_OVERRIDE" in warning["hint"] and "--checkpoint-ttl 0" in warning["hint"]

    free = _orphan(tmp_path, FREE)
    with capture_logs() as later:
        for _ in range(3):
            ret.sweep_checkpoints()
    assert _failures(later) == [], "a failure already logged is not logged at every sweep"
    assert not free.exists() and locked.exists()

    # Removed by hand meanwhile, then back and failing again: logged again.
    denied.clear()
    assert ret.sweep_checkpoints() == [locked]
    locked = _orphan(tmp_path, LOCKED)
    denied.add(locked)
    with capture_logs() as again:
        ret.sweep_checkpoints()
    assert [e["path"] for e in _failures(again)] == [str(locked)]


def test_another_error_is_logged_without_the_permission_hint(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _orphan(tmp_path, LOCKED)

    def rmtree(path: Path) -> None:
        raise OSError(5, "Input/output error", str(path))

    monkeypatch.setattr(retention.shutil, "rmtree", rmtree)
    ret = Retention(MemoryStore(), str(tmp_path), RetentionConfig(checkpoint_ttl_s=1 * DAY))
    with capture_logs() as logs:
        ret.sweep_checkpoints()
    (warning,) = _failures(logs)
    assert "Input/output error" in warning["error"] and "hint" not in warning
