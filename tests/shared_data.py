"""The seed data the replay and accuracy tests read, and the one guard every such test goes through.

The data (traces and measurements from the Crius, Morphling and Espresso artifacts; what each file is
and where it comes from: docs/reference/data.md) is not in the repository: it sits in the project's
shared folder beside the clone, `<repo>/../shared/data` (or beside a folder above it, as for a git
worktree under the project), or wherever `$TESSERA_DATA_DIR` points.

A plain clone has none of it, so there a test that needs it is skipped. Under CI (the environment
variable `CI` set to anything but "", "0" or "false", as CI services set it) the data is expected
beside the clone, and a missing file fails the test instead: the bit-for-bit replays cannot pass by
not running.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    """`$TESSERA_DATA_DIR` when set; else the nearest `shared/data` folder beside the repository or
    beside a folder above it; else `<repo>/../shared/data` (missing: the guard below says so)."""
    env = os.environ.get("TESSERA_DATA_DIR")
    if env:
        return Path(env)
    for base in REPO.parents:
        cand = base / "shared" / "data"
        if cand.is_dir():
            return cand
    return REPO.parent / "shared" / "data"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def require_shared_data(path: str | Path) -> Path:
    """The seed data file or folder `path` (relative to data_dir(), or absolute) if it exists.

    Missing: `pytest.fail` under CI, `pytest.skip` otherwise. Call it from the test (or a fixture of
    the test), not at import time, so that the failure is reported against the test that needs it.
    """
    full = data_dir() / path
    if full.exists():
        return full
    why = (f"seed data not found: {full} (put the project's shared/ folder beside the repository or set "
           f"TESSERA_DATA_DIR; see docs/reference/data.md)")
    if in_ci():
        pytest.fail(f"{why}; CI is set, so a test that needs it fails instead of skipping", pytrace=False)
    pytest.skip(why)
