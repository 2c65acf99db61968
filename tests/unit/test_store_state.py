"""The controller's SQLite state is checked before it is trusted: a corrupt, emptied, deleted or
replaced database is refused (StateError, one line from the daemon) instead of starting over at
epoch 1 with no jobs."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.controller.store import JobRecord, SqliteStore, StateError
from tessera.v1 import common_pb2 as P


def _job(i: int) -> JobRecord:
    spec = P.JobSpec(name=f"job{i}", tenant="t", model=P.ModelSpec(name="gpt2-small"), global_batch_size=8,
                     iterations=10, env={"PAD": "x" * 400})  # a few hundred jobs fill many pages
    return JobRecord(id=f"j-{i}", request_id=f"r-{i}", spec=spec, state=P.JOB_STATE_PENDING, reason="new",
                     submit_time=float(i))


def _filled(path: Path, jobs: int = 300) -> int:
    s = SqliteStore(path)
    epoch = s.next_epoch()
    for i in range(jobs):
        s.create_job(_job(i), ("SUBMITTED", ""))
    s._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything in the main file, as after a clean stop
    s.close()
    return epoch


def test_a_new_state_dir_gets_an_identity_and_reopens(tmp_path: Path) -> None:
    db = tmp_path / "controller.db"
    epoch = _filled(db, jobs=3)
    marker = tmp_path / "controller.db.id"
    assert len(marker.read_text().strip()) == 32
    s = SqliteStore(db)
    assert s.next_epoch() == epoch + 1 and s.get_job("j-2") is not None
    s.close()


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_an_emptied_or_deleted_database_is_refused(tmp_path: Path, damage: str) -> None:
    db = tmp_path / "controller.db"
    _filled(db, jobs=3)
    if damage == "truncated":
        db.write_bytes(b"")
    else:
        db.unlink()
    with pytest.raises(StateError, match="emptied, truncated or deleted"):
        SqliteStore(db)
    (tmp_path / "controller.db.id").unlink()  # the operator's explicit "start afresh"
    s = SqliteStore(db)
    assert s.list_jobs([], "") == [] and s.next_epoch() == 1
    s.close()


def test_a_replaced_database_is_refused(tmp_path: Path) -> None:
    ours, other = tmp_path / "a" / "controller.db", tmp_path / "b" / "controller.db"
    ours.parent.mkdir()
    other.parent.mkdir()
    _filled(ours, jobs=2)
    _filled(other, jobs=2)
    shutil.copy(other, ours)
    with pytest.raises(StateError, match="was replaced"):
        SqliteStore(ours)


def test_random_bytes_inside_the_database_are_found_at_open(tmp_path: Path) -> None:
    db = tmp_path / "controller.db"
    _filled(db)
    size = db.stat().st_size
    assert size > 64 * 1024
    data = bytearray(db.read_bytes())
    rng = random.Random(7)
    at = size // 2
    data[at:at + 16 * 1024] = bytes(rng.randrange(256) for _ in range(16 * 1024))
    db.write_bytes(bytes(data))
    with pytest.raises(StateError, match="corrupt|cannot be read"):
        SqliteStore(db)


def test_a_file_that_is_not_sqlite_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "controller.db"
    db.write_bytes(bytes(random.Random(1).randrange(256) for _ in range(8192)))
    with pytest.raises(StateError, match="cannot be read as a SQLite database"):
        SqliteStore(db)


def test_the_controller_exits_with_one_line_on_an_emptied_database(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    _filled(state / "controller.db", jobs=1)
    (state / "controller.db").write_bytes(b"")
    p = subprocess.run([sys.executable, "-m", "tessera.controller.main", "--listen", "127.0.0.1:0",
                        "--state-dir", str(state), "--insecure"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tessera-controller: error: ")
    assert "emptied, truncated or deleted" in lines[0]


@pytest.mark.timeout(30)  # the defect hung here
def test_a_write_that_finds_the_database_locked_fails_and_the_store_keeps_working(tmp_path: Path) -> None:
    """Another process holding the write lock past busy_timeout fails the write (an error, not a
    hang); once it lets go, reads and writes work again. Before, the failed BEGIN kept the store's
    lock and every later call blocked the controller's thread for good."""
    import sqlite3

    db = tmp_path / "controller.db"
    s = SqliteStore(db)
    s.create_job(_job(1), ("SUBMITTED", ""))
    s._db.execute("PRAGMA busy_timeout=50")
    other = sqlite3.connect(str(db), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # an operator's sqlite3, a backup tool, a second controller
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        s.create_job(_job(2), ("SUBMITTED", ""))
    other.execute("ROLLBACK")
    other.close()
    assert s.get_job("j-1") is not None and s.get_job("j-2") is None
    s.create_job(_job(3), ("SUBMITTED", ""))
    assert s.get_job("j-3") is not None
    s.close()


def test_a_second_controller_on_the_same_state_dir_exits_with_one_line(tmp_path: Path) -> None:
    """Two controllers on one --state-dir both served and fenced each other's launches: the second
    now stops at start, naming the holder."""
    import os

    from tessera.controller.statedir import StateDirLock

    state = tmp_path / "state"
    state.mkdir()
    held = StateDirLock(state)  # as a running controller holds it
    try:
        p = subprocess.run([sys.executable, "-m", "tessera.controller.main", "--listen", "127.0.0.1:0",
                            "--state-dir", str(state), "--insecure"],
                           capture_output=True, text=True, timeout=60, check=False)
    finally:
        held.release()
    assert p.returncode == 1
    want = (f"tessera-controller: error: {state} is in use by another tessera-controller (pid {os.getpid()}): "
            "one controller per --state-dir (for a standby, use --store etcd)")
    assert p.stderr.strip().splitlines() == [want]
    assert not (state / "controller.db").exists()  # refused before the database was opened
    again = StateDirLock(state)  # released: the next holder gets it
    again.release()


def test_deleting_the_pid_file_does_not_let_a_second_controller_in(tmp_path: Path) -> None:
    """controller.lock looks like a stale pid file; deleted, a second controller locked a new file
    of that name and both served (an audit saw epochs 2 and 3 at once). The lock is the folder's."""
    from tessera.controller.statedir import StateDirLock
    from tessera.controller.store import StateError

    state = tmp_path / "state"
    state.mkdir()
    held = StateDirLock(state)
    try:
        (state / "controller.lock").unlink()
        with pytest.raises(StateError, match="is in use by another tessera-controller"):
            StateDirLock(state)
    finally:
        held.release()


def test_a_state_dir_this_user_cannot_write_is_not_called_damaged(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's "unable to open database file" on a read-only folder was reported as a database that
    cannot be read, with the advice to start a new --state-dir (every job forgotten)."""
    import os

    db = tmp_path / "controller.db"
    _filled(db, jobs=2)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path else real(p, mode))
    with pytest.raises(StateError) as err:
        SqliteStore(db)
    assert "cannot write it or its folder" in str(err.value) and "new --state-dir" not in str(err.value)


def test_a_database_behind_its_state_dir_is_refused_until_its_epoch_is_raised(tmp_path: Path) -> None:
    """A controller killed with writes still in controller.db-wal, the -wal then lost: the database
    reopened at its last checkpoint, an older epoch and older jobs, silently. An older copy put back
    without raising its epoch (the documented restore's second step) started, and the agents refused
    every launch. The state dir now records the last epoch outside the database."""
    from tessera.controller.statedir import EPOCH_FILE, check_epoch

    db = tmp_path / "controller.db"
    check_epoch(tmp_path, _filled(db, jobs=2), db)  # epoch 1, checkpointed
    # a second run takes epoch 2 and is killed before any checkpoint: epoch 2 is only in the WAL
    code = ("import os, sys; from pathlib import Path; from tessera.controller.store import SqliteStore; "
            "from tessera.controller.statedir import check_epoch; p = Path(sys.argv[1]); s = SqliteStore(p / "
            "'controller.db'); check_epoch(p, s.next_epoch(), p / 'controller.db'); os._exit(0)")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True)
    assert (tmp_path / EPOCH_FILE).read_text() == "2\n"
    for lost in ("controller.db-wal", "controller.db-shm"):
        (tmp_path / lost).unlink(missing_ok=True)
    s = SqliteStore(db)
    with pytest.raises(StateError, match=r"is behind this state directory: its epoch \(1\) is below 2, the epoch it "
                                         r"last ran under .*raise its epoch to at least 2"):
        check_epoch(tmp_path, s.next_epoch(), db)
    # the restore's epoch raise (docs/operations.md) lets it start; so would removing the marker
    s._db.execute("UPDATE meta SET value='7' WHERE key='epoch'")
    check_epoch(tmp_path, s.next_epoch(), db)
    assert (tmp_path / EPOCH_FILE).read_text() == "8\n"
    s.close()
    (tmp_path / EPOCH_FILE).write_text("not a number\n")
    with pytest.raises(StateError, match=r"cannot read the last epoch .*remove it to skip the check once"):
        check_epoch(tmp_path, 9, db)
