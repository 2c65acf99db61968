"""State files and folders are private whatever the umask: outside systemd (no UMask=) the usual
umask 022 made the controller's and the estimator's databases, their -wal and -shm, the store's
`.id` marker and `controller.epoch` 0644, and their folders 0755 (tests/security/
test_daemon_state_modes.py checks the daemons themselves)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.common.privatefile import make_dir, private_database
from tessera.controller.statedir import check_epoch
from tessera.controller.store import SqliteStore
from tessera.estimator.service.state import EstimatorState


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


@pytest.fixture
def umask022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_make_dir_gives_exactly_its_mode_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)  # a unit's UMask=0027 took the x that lets the workers pass 0711
    try:
        make_dir(tmp_path / "a" / "work", 0o711)
        os.umask(0o000)
        make_dir(tmp_path / "state")
    finally:
        os.umask(old)
    assert mode(tmp_path / "a" / "work") == 0o711
    assert mode(tmp_path / "a") == 0o711  # a new parent too: 0750 kept the workers out (a review)
    assert mode(tmp_path / "state") == 0o700
    (tmp_path / "mine").mkdir(mode=0o755)
    make_dir(tmp_path / "mine")  # the operator's, as they made it
    assert mode(tmp_path / "mine") == 0o755
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError):
        make_dir(tmp_path / "file")


def test_private_database_is_made_0600_and_an_old_open_one_is_closed_to_others(tmp_path: Path) -> None:
    old = os.umask(0o000)
    try:
        private_database(tmp_path / "new.db")
    finally:
        os.umask(old)
    assert mode(tmp_path / "new.db") == 0o600 and (tmp_path / "new.db").stat().st_size == 0
    for name, m in (("old.db", 0o644), ("old.db-wal", 0o666), ("old.db-shm", 0o640)):
        (tmp_path / name).write_bytes(b"x")
        (tmp_path / name).chmod(m)
    private_database(tmp_path / "old.db")
    # Others lose their access; the group's is the operator's choice (a unit's UMask=0027 gives 0640).
    assert [mode(tmp_path / n) for n in ("old.db", "old.db-wal", "old.db-shm")] == [0o640, 0o660, 0o640]
    assert (tmp_path / "old.db").read_bytes() == b"x"


def test_the_controller_store_and_its_markers_are_0600_under_umask_022(tmp_path: Path, umask022: None) -> None:
    store = SqliteStore(tmp_path / "controller.db")
    try:
        epoch = store.next_epoch()  # a write: the WAL and its index exist while the store is open
        check_epoch(tmp_path, epoch, store.path)
        names = ["controller.db", "controller.db-wal", "controller.db-shm", "controller.db.id", "controller.epoch"]
        assert {n: oct(mode(tmp_path / n)) for n in names} == {n: oct(0o600) for n in names}
    finally:
        store.close()
    assert sorted(p.name for p in tmp_path.iterdir() if mode(p) != 0o600) == []


def test_the_estimator_database_is_0600_under_umask_022(tmp_path: Path, umask022: None) -> None:
    state = EstimatorState(tmp_path / "estimator.db")
    try:
        state.put_measured(("sig", "A100", 1, 1), 0.5)
        names = ["estimator.db", "estimator.db-wal", "estimator.db-shm"]
        assert {n: oct(mode(tmp_path / n)) for n in names} == {n: oct(0o600) for n in names}
    finally:
        state.close()


def test_a_database_path_that_is_a_dangling_symlink_makes_its_target_private(tmp_path: Path, umask022: None) -> None:
    """A review: SQLite followed the link and made the target, and its -wal and -shm, 0644."""
    (tmp_path / "disk").mkdir()
    (tmp_path / "controller.db").symlink_to(tmp_path / "disk" / "controller.db")
    store = SqliteStore(tmp_path / "controller.db")
    try:
        store.next_epoch()
        names = ["controller.db", "controller.db-wal", "controller.db-shm"]
        assert {n: oct(mode(tmp_path / "disk" / n)) for n in names} == {n: oct(0o600) for n in names}
    finally:
        store.close()
