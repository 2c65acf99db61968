"""Each daemon, started as the tests and the demo start it under umask 022 (no systemd UMask=),
keeps its state private: files 0600, folders 0700, or 0711 where the workers' users must pass them
(docs/security.md, "Files on disk"). Before, the databases with their -wal and -shm, the store's
`.id`, `controller.epoch` and the state folders were world-readable."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.common.localcluster import start_estimator
from tests.procs import REPO, start_agent, start_controller
from tests.workerenv import worker_python

pytestmark = pytest.mark.slow


def modes(root: Path) -> dict[str, int]:
    """Every path below `root` (and `root` itself, as "."), with its mode."""
    out = {".": stat.S_IMODE(root.lstat().st_mode)}
    for p in root.rglob("*"):
        out[str(p.relative_to(root))] = stat.S_IMODE(p.lstat().st_mode)
    return out


@pytest.fixture(autouse=True)
def umask022() -> Iterator[None]:
    old = os.umask(0o022)  # the daemons inherit it
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize("own_checkpoint_root", [False, True])
def test_the_controller_state_dir_is_private(tmp_path: Path, own_checkpoint_root: bool) -> None:
    state = tmp_path / "state"
    extra = ("--checkpoint-root", str(tmp_path / "ckpt")) if own_checkpoint_root else ()
    ctl = start_controller(state, *extra)
    try:
        got = modes(state)  # while it runs: the WAL and its index are there
    finally:
        ctl.stop()
    files = {n: m for n, m in got.items() if n not in (".", "checkpoints")}
    assert {"controller.db", "controller.db-wal", "controller.db-shm", "controller.db.id", "controller.epoch",
            "controller.lock", "page-token.key"} <= set(files)
    assert {n: oct(m) for n, m in files.items()} == {n: oct(0o600) for n in files}
    if own_checkpoint_root:
        assert got["."] == 0o700 and "checkpoints" not in got
        assert stat.S_IMODE((tmp_path / "ckpt").stat().st_mode) == 0o711
    else:  # the default checkpoint root is below it: the workers' users pass it, but may not list it
        assert (got["."], got["checkpoints"]) == (0o711, 0o711)


def test_the_estimator_state_dir_is_private(tmp_path: Path) -> None:
    est = start_estimator(tmp_path / "estimator.log", "--state-dir", str(tmp_path / "est"))
    try:
        got = modes(tmp_path / "est")
    finally:
        est.stop()
    assert {n: oct(m) for n, m in got.items()} == {".": oct(0o700), "estimator.db": oct(0o600),
                                                   "estimator.db-wal": oct(0o600), "estimator.db-shm": oct(0o600)}


def test_the_agent_work_dir_is_passable_and_its_files_private(worker_dir: Path) -> None:
    ctl = start_controller(worker_dir / "state")
    try:
        work = worker_dir / "n1"
        agent = start_agent(ctl, "n1", REPO / "examples/inventories/a10-node.yaml", work,
                            "--worker-python", worker_python())
        try:
            got = modes(work)
        finally:
            agent.stop()
    finally:
        ctl.stop()
    # 0711: the workers' users (another uid when the agent is root) pass it to their attempt folders
    # and to agent.sock, which any of them may connect to (each call carries the attempt's secret).
    assert (got.pop("."), got.pop("agent.sock")) == (0o711, 0o666)
    assert "worker-secret" in got
    assert {n: oct(m) for n, m in got.items()} == {n: oct(0o600) for n in got}
