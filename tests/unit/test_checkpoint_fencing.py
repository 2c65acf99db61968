"""Checkpoint fencing (issue 13, finding 4): two attempts of one job writing its checkpoint directory
at once, as after a stalled agent. Real files, one process; the interleavings are driven by hand
(a stale writer's block is open while the new attempt claims, resumes, promotes and prunes)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tessera.clients.trainer import StaleAttempt, TrainerContext, checkpoint_writer, latest_checkpoint
from tessera.clients.trainer.checkpoints import (
    FENCE_FILE,
    _locked,
    claim,
    prune_checkpoints,
    read_fence,
    set_aside,
    staging_dir,
)


def ctx(root: Path, attempt: int) -> TrainerContext:
    return TrainerContext.from_env({"TESSERA_JOB_ID": "j-1", "TESSERA_ATTEMPT": str(attempt),
                                    "TESSERA_CHECKPOINT_DIR": str(root)})


def write(c: TrainerContext, step: int, state: str, keep: int = 2) -> None:
    with c.checkpoint_writer(step, keep=keep) as d:
        (d / "state").write_text(state)


def state_of(root: Path, step: int) -> str:
    return (root / f"step-{step}" / "state").read_text()


def test_new_attempt_resumes_from_the_old_ones_last_promoted_checkpoint(tmp_path: Path) -> None:
    old = ctx(tmp_path, 1)
    assert old.latest_checkpoint() is None and read_fence(tmp_path) == 1
    write(old, 10, "a1@10")
    write(old, 20, "a1@20")
    new = ctx(tmp_path, 2)
    ref = new.latest_checkpoint()  # claims first
    assert read_fence(tmp_path) == 2 and (tmp_path / FENCE_FILE).read_text() == "2\n"
    assert ref is not None and ref.iteration == 20 and (ref.path / "state").read_text() == "a1@20"
    assert ref.meta()["attempt"] == 1


def test_a_stale_attempt_cannot_promote_after_the_fence_was_raised(tmp_path: Path) -> None:
    old, new = ctx(tmp_path, 1), ctx(tmp_path, 2)
    old.latest_checkpoint()
    write(old, 10, "a1@10")
    # the old attempt is mid-write of step 20 when the new one starts and claims
    with pytest.raises(StaleAttempt) as exc, old.checkpoint_writer(20) as d:
        (d / "state").write_text("a1@20")
        ref = new.latest_checkpoint()
        assert ref is not None and ref.iteration == 10
    assert "attempt 1 is stale: attempt 2 has claimed the checkpoints" in str(exc.value)
    assert not (tmp_path / "step-20").exists()  # never promoted
    assert latest_checkpoint(tmp_path).iteration == 10  # type: ignore[union-attr]
    assert (tmp_path / "latest").read_text() == "step-10\n"
    assert not list(staging_dir(tmp_path, 1).iterdir())  # it removed its own staged copy only
    # and it cannot even start another one
    with pytest.raises(StaleAttempt), old.checkpoint_writer(30):
        pytest.fail("a stale attempt's writer must not open")
    with pytest.raises(StaleAttempt):
        old.latest_checkpoint()  # a stale attempt that (re)starts is told at once


def test_a_stale_attempt_cannot_overwrite_the_same_step_nor_prune(tmp_path: Path) -> None:
    old, new = ctx(tmp_path, 1), ctx(tmp_path, 2)
    old.latest_checkpoint()
    for step in (10, 20):
        write(old, step, f"a1@{step}")
    new.latest_checkpoint()
    for step in (30, 40):
        write(new, step, f"a2@{step}")  # keep=2: prunes 10 and 20
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-30", "step-40"]
    # the old attempt, still training, reaches step 40 too: the new attempt's step-40 stays
    with pytest.raises(StaleAttempt):
        write(old, 40, "a1@40", keep=1)
    assert state_of(tmp_path, 40) == "a2@40" and state_of(tmp_path, 30) == "a2@30"
    with pytest.raises(StaleAttempt):
        prune_checkpoints(tmp_path, keep=1, attempt=1)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-30", "step-40"]


def test_the_new_attempt_never_prunes_the_old_ones_staging(tmp_path: Path) -> None:
    """Finding 4's crash: the new attempt deleted the temporary folder the old one was writing."""
    old, new = ctx(tmp_path, 1), ctx(tmp_path, 2)
    old.latest_checkpoint()
    write(old, 10, "a1@10")
    with pytest.raises(StaleAttempt), old.checkpoint_writer(20) as d:
        new.latest_checkpoint()
        for step in (20, 30, 40):
            write(new, step, f"a2@{step}", keep=1)
        (d / "state").write_text("a1@20")  # its folder is still there: the write itself succeeds
        assert d.is_dir() and (d / "state").read_text() == "a1@20"
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-40"]
    assert state_of(tmp_path, 40) == "a2@40"


def test_claims_only_ever_raise_the_fence(tmp_path: Path) -> None:
    assert claim(tmp_path, 3) == 3
    assert claim(tmp_path, 3) == 3  # the same attempt again (another rank, a relaunch): fine
    with pytest.raises(StaleAttempt):
        claim(tmp_path, 2)
    assert read_fence(tmp_path) == 3
    claim(tmp_path, 5)
    assert read_fence(tmp_path) == 5
    with pytest.raises(ValueError):
        claim(tmp_path, 0)


def test_a_corrupt_fence_is_refused_not_guessed(tmp_path: Path) -> None:
    (tmp_path / FENCE_FILE).write_text("two\n")
    with pytest.raises(ValueError, match="not an attempt number"):
        claim(tmp_path, 9)
    with pytest.raises(ValueError), checkpoint_writer(tmp_path, 10, attempt=9):
        pass
    assert not list(tmp_path.glob("step-*"))


def test_promotion_waits_for_the_lock_and_then_sees_the_new_fence(tmp_path: Path) -> None:
    """The other interleaving: the new attempt holds the lock (claiming) while the old one tries to
    promote; the old one blocks on the flock, then finds the raised fence and gives up."""
    old = ctx(tmp_path, 1)
    old.latest_checkpoint()
    outcome: list[str] = []
    staged = threading.Event()

    def old_writer() -> None:
        try:
            with old.checkpoint_writer(10) as d:
                (d / "state").write_text("a1@10")
                staged.set()
                gate.wait(10)
            outcome.append("promoted")
        except StaleAttempt:
            outcome.append("stale")

    gate = threading.Event()
    t = threading.Thread(target=old_writer)
    t.start()
    assert staged.wait(10)
    with _locked(tmp_path):  # the new attempt's claim, done by hand to hold the lock across the race
        gate.set()
        t.join(0.5)
        assert t.is_alive() and not outcome  # the old writer is blocked on the lock
        (tmp_path / FENCE_FILE).write_text("2\n")
    t.join(10)
    assert outcome == ["stale"] and not (tmp_path / "step-10").exists()


def test_the_lock_is_released_when_its_holder_dies(tmp_path: Path) -> None:
    pid = os.fork()
    if pid == 0:  # a writer killed while holding the lock
        with _locked(tmp_path):
            os._exit(0)
    os.waitpid(pid, 0)
    assert claim(tmp_path, 1) == 1  # would block forever if the lock outlived its process


def test_set_aside_renames_a_damaged_checkpoint_only_for_the_fence_holder(tmp_path: Path) -> None:
    c2 = ctx(tmp_path, 2)
    write(c2, 5, "a")
    write(c2, 10, "b")
    claim(tmp_path, 3)
    # A stale attempt must not rename what the current one may be reading.
    with pytest.raises(StaleAttempt):
        set_aside(tmp_path, 10, attempt=2)
    assert latest_checkpoint(tmp_path).iteration == 10  # type: ignore[union-attr]
    aside = set_aside(tmp_path, 10, attempt=3)
    assert aside == tmp_path / "step-10.damaged-3" and (aside / "state").read_text() == "b"
    assert latest_checkpoint(tmp_path).iteration == 5  # type: ignore[union-attr]
    assert (tmp_path / "latest").read_text() == "step-5\n"
    assert set_aside(tmp_path, 10, attempt=3) is None  # gone already
    # Never pruned with the complete ones.
    write(ctx(tmp_path, 3), 15, "c", keep=1)
    assert aside.is_dir() and not (tmp_path / "step-5").exists()
