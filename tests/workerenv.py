"""Where tests put workers that run as another user (see tessera.common.workerusers).

Tests run as root (here and in CI), so the agents they start run workers as `nobody`: `worker_dir`
gives a fresh folder under the system temporary directory that every user can traverse (0755),
removed afterwards; `worker_python()` an interpreter `nobody` can run.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.common.workerusers import worker_python

__all__ = ["worker_dir", "worker_python"]


@pytest.fixture
def worker_dir() -> Iterator[Path]:
    """A fresh folder every user can traverse (tmp_path is 0700 under /tmp/pytest-of-root)."""
    d = Path(tempfile.mkdtemp(prefix="tessera-test-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        from tessera.common.localcluster import kill_strays

        kill_strays(d)
        shutil.rmtree(d, ignore_errors=True)
