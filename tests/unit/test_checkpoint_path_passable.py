"""A state dir made by hand with mode 0700 holding the default checkpoint root: the workers' users
could not pass it and every attempt of every job failed with "Permission denied" on its checkpoint
folder until its retries were spent, with nothing said at start. The controller now makes what it
owns between the state dir and the checkpoint root passable (mode | 0o011, still not listable),
saying so in its log, and refuses to start (exit 2, one line) on such a folder it does not own
(docs/operations.md, `--state-dir`)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tessera.common.passable import NotPassable, Widened, closed_above, open_for_workers, verdict
from tessera.controller.main import check_checkpoint_ancestors, open_checkpoint_path, warn_closed_above
from tests.procs import BIN

ME = os.geteuid()
OTHER = ME + 1 if ME != 65534 else 65533


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def made(path: Path, m: int) -> Path:
    path.mkdir()
    path.chmod(m)
    return path


@pytest.mark.parametrize(("m", "owner", "want"), [
    (0o700, ME, "widen"), (0o750, ME, "widen"), (0o701, ME, "widen"), (0o711, ME, "ok"), (0o755, ME, "ok"),
    (0o700, OTHER, "blocked"), (0o750, OTHER, "blocked"), (0o701, OTHER, "ok"), (0o711, OTHER, "ok"),
])
def test_the_verdict_on_a_folders_mode_and_owner(m: int, owner: int, want: str) -> None:
    assert verdict(m, owner, ME) == want


def test_an_owned_state_dir_and_checkpoint_root_get_the_search_bits(tmp_path: Path) -> None:
    state = made(tmp_path / "state", 0o700)
    ckpt = made(state / "checkpoints", 0o750)
    assert open_for_workers(state, ckpt) == [Widened(state, 0o700, 0o711), Widened(ckpt, 0o750, 0o751)]
    assert (mode(state), mode(ckpt)) == (0o711, 0o751)
    assert open_for_workers(state, ckpt) == []  # already passable: nothing to say at the next start


def test_a_folder_between_them_is_widened_and_a_missing_one_ends_the_walk(tmp_path: Path) -> None:
    state = made(tmp_path / "state", 0o711)
    mid = made(state / "shared", 0o700)
    assert open_for_workers(state, mid / "ckpt" / "deeper") == [Widened(mid, 0o700, 0o711)]


def test_a_folder_of_another_owner_that_others_cannot_pass_is_refused_unchanged(tmp_path: Path) -> None:
    state = made(tmp_path / "state", 0o700)
    ckpt = state / "checkpoints"
    with pytest.raises(NotPassable) as exc:
        open_for_workers(state, ckpt, me=OTHER)
    assert mode(state) == 0o700
    text = str(exc.value)
    assert "\n" not in text and f"{state} (mode 0700, owner uid {ME})" in text
    assert f"chmod o+x {state}: mode 0701" in text and str(ckpt) in text
    state.chmod(0o701)  # others may pass it: its group's bits are its owner's business
    assert open_for_workers(state, ckpt, me=OTHER) == [] and mode(state) == 0o701


def test_the_controller_logs_what_it_widened(tmp_path: Path) -> None:
    state = made(tmp_path / "state", 0o700)
    ckpt = made(state / "checkpoints", 0o700)
    with capture_logs() as logs:
        open_checkpoint_path(state, ckpt)
    said = [(e["log_level"], e["event"], e["path"], e["old_mode"], e["new_mode"]) for e in logs]
    assert said == [("warning", "folder_made_passable", str(state), "0700", "0711"),
                    ("warning", "folder_made_passable", str(ckpt), "0700", "0711")]


@pytest.mark.skipif(ME != 0, reason="needs root to give the state dir another owner")
def test_a_state_dir_of_another_owner_is_a_start_error_exit_2(tmp_path: Path) -> None:
    state = made(tmp_path / "state", 0o700)
    os.chown(state, 65534, 65534)
    argv = [str(BIN / "tessera-controller"), "--insecure", "--listen", "127.0.0.1:0", "--agent-listen",
            "127.0.0.1:0", "--state-dir", str(state)]
    # Before: it started (and would have served until stopped); every job then failed.
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert cp.returncode == 2, cp.stderr
    (line,) = cp.stderr.splitlines()[-1:]
    assert line.startswith(f"tessera-controller: error: {state} (mode 0700, owner uid 65534)")
    assert f"chmod o+x {state}: mode 0701" in line
    assert mode(state) == 0o700 and list(state.iterdir()) == []  # nothing made in it


def test_the_folders_above_are_listed_when_others_cannot_pass_them(tmp_path: Path) -> None:
    top = made(tmp_path / "top", 0o711)
    shut = made(top / "shut", 0o750)
    state = made(shut / "state", 0o700)
    above = [p for p, _, _ in closed_above(state / "checkpoints")]
    assert above[-2:] == [shut, state] and top not in above
    # Below the state dir the folders are open_for_workers's: the walk stops at it.
    assert [p for p, _, _ in closed_above(state / "checkpoints", state)][-1:] == [shut]
    assert (shut, 0o750, ME) in closed_above(state, state)


def test_a_checkpoint_root_below_a_closed_folder_of_roots_is_a_start_error(tmp_path: Path) -> None:
    # The systemd unit's default: DynamicUser's state dir lies below /var/lib/private, root's 0700.
    private = made(tmp_path / "private", 0o700)
    state = private / "tessera" / "controller"
    if os.stat(private).st_uid != 0:
        pytest.skip("needs a folder of root's")
    with pytest.raises(NotPassable) as exc:
        check_checkpoint_ancestors(state / "checkpoints", state, me=OTHER)
    # The first such folder from / down (pytest's own may come first): one line naming it.
    assert exc.value.owner == 0 and exc.value.path in (private, *private.parents)
    assert "choose a --checkpoint-root outside it" in str(exc.value) and "\n" not in str(exc.value)
    private.chmod(0o701)
    tmp_path.chmod(0o711)
    closed = [p for p, _, _ in closed_above(state / "checkpoints", state)]
    assert private not in closed and tmp_path not in closed
    # run as root, root's own folders are only a warning (returned)
    assert check_checkpoint_ancestors(state / "checkpoints", state, me=0) == closed_above(state / "checkpoints", state)


def test_a_closed_folder_of_another_user_above_the_root_is_a_warning(tmp_path: Path) -> None:
    shut = made(tmp_path / "shut", 0o700)
    ckpt = shut / "ckpt"
    closed = check_checkpoint_ancestors(ckpt, None, me=ME)  # its owner's workers may pass it: no error
    with capture_logs() as logs:
        warn_closed_above(closed, ckpt)
    said = [(e["event"], e["path"], e["mode"]) for e in logs if e["path"] == str(shut)]
    assert said == [("checkpoint_root_not_passable", str(shut), "0700")]
    assert mode(shut) == 0o700  # not the controller's to change
    shut.chmod(0o701)
    assert all(p != shut for p, _, _ in check_checkpoint_ancestors(ckpt, None, me=ME))
