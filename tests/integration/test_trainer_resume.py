"""Resuming from damaged checkpoints and stopping a diverged run, as real processes on CPU with gloo.

The ranks agree on the checkpoint to resume from (rank 0 names it) and fall back to an older one
when the newest does not load; a step whose loss or gradient norm is not finite stops the job
before it is applied, so NaN weights are never published and the good checkpoints are not pruned
(clients/trainer/reference/resume.py, train.py; docs/trainer.md, "Damaged checkpoints").
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest

from tessera.clients.trainer import list_checkpoints
from tessera.clients.trainer.reference.local import (
    RankResult,
    launch,
    plan_envs,
    start_ranks,
    warm_forkserver,
)
from tests.integration.test_trainer_plans import GLOBAL_BATCH, MODEL, TIMEOUT, losses
from tests.unit.test_checkpoint_safe_load import MkdirPayload

pytestmark = pytest.mark.slow

DP2 = {"dp": 2, "micro_batch": 4}
STEPS = 6


def run(ckpt: Path, iterations: int, attempt: int = 1, argv: tuple[str, ...] = (),
        plan: dict[str, Any] = DP2, every: int = 1000) -> list[RankResult]:
    return launch(plan, model=MODEL, checkpoint_dir=ckpt, iterations=iterations, global_batch=GLOBAL_BATCH,
                  mode="fork", timeout=TIMEOUT, cwd=ckpt.parent, argv=argv, attempt=attempt, checkpoint_every=every)


def ok(results: list[RankResult]) -> list[RankResult]:
    for r in results:
        assert r.rc == 0, f"rank {r.rank} exited {r.rc}:\n{r.out[-2000:]}\n{r.err[-4000:]}"
    return results


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    warm_forkserver()
    tmp = tmp_path_factory.mktemp("uninterrupted")
    return losses(ok(run(tmp / "ckpt", STEPS))[0].out)


def steps(ckpt: Path) -> list[int]:
    return [c.iteration for c in list_checkpoints(ckpt)]


def test_a_damaged_newest_checkpoint_is_set_aside_and_the_older_one_resumes(uninterrupted: dict[int, float],
                                                                          tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ok(run(ckpt, 4, every=2))
    assert steps(ckpt) == [2, 4]
    shard = ckpt / "step-4" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])  # a truncated shard: every retry used to fail on it
    results = ok(run(ckpt, STEPS, attempt=2))
    out = results[0].out
    assert "cannot resume from step 4" in out and "resumed from step 2 " in out
    assert (ckpt / "step-4.damaged-2").is_dir()
    curve = losses(out)
    assert sorted(curve) == [3, 4, 5, 6]
    for it in curve:
        assert curve[it] == pytest.approx(uninterrupted[it], rel=1e-4)


def test_a_planted_metadata_is_set_aside_without_running(uninterrupted: dict[int, float], tmp_path: Path) -> None:
    """The newest checkpoint's `.metadata` is a pickle that would create a directory when unpickled
    (DCP's own reader unpickles it: tests/unit/test_checkpoint_safe_load.py). Nothing runs, it is
    set aside with the reason, and the older checkpoint resumes on the uninterrupted curve."""
    ckpt = tmp_path / "ckpt"
    ok(run(ckpt, 4, every=2))
    marker = tmp_path / "ran"
    (ckpt / "step-4" / ".metadata").write_bytes(pickle.dumps(MkdirPayload(marker)))
    out = ok(run(ckpt, STEPS, attempt=2))[0].out
    assert not marker.exists()
    assert "cannot resume from step 4" in out and ".metadata asks for" in out and "resumed from step 2 " in out
    assert (ckpt / "step-4.damaged-2").is_dir()
    curve = losses(out)
    for it in range(3, STEPS + 1):
        assert curve[it] == pytest.approx(uninterrupted[it], rel=1e-4)


def test_the_ranks_resume_from_the_step_rank_0_sees(uninterrupted: dict[int, float], tmp_path: Path) -> None:
    """Rank 1's view of the directory lags (it lacks step 4, as a shared file system's cache may):
    both ranks resume from step 2 rather than each from its own newest, and the curve holds. Rank 0's
    files are sound, so nothing is set aside."""
    ckpt = tmp_path / "ckpt"
    ok(run(ckpt, 4, every=2))
    lagging = tmp_path / "lagging"
    shutil.copytree(ckpt, lagging)
    shutil.rmtree(lagging / "step-4")
    envs = plan_envs(DP2, model=MODEL, checkpoint_dir=ckpt, iterations=STEPS, global_batch=GLOBAL_BATCH,
                     attempt=2, checkpoint_every=1000)
    envs[1]["TESSERA_CHECKPOINT_DIR"] = str(lagging)
    results = ok(start_ranks(envs, mode="fork", cwd=str(tmp_path)).wait(TIMEOUT))
    assert all("resumed from step 2 " in r.out for r in results)
    assert not list(ckpt.glob("*.damaged-*"))
    curve = losses(results[0].out)
    for it in range(3, STEPS + 1):
        assert curve[it] == pytest.approx(uninterrupted[it], rel=1e-4)


def test_no_loadable_checkpoint_fails_in_one_line(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ok(run(ckpt, 2))
    (ckpt / "step-2" / "trainer.pt").write_bytes(b"")
    results = run(ckpt, STEPS, attempt=2)
    assert [r.rc for r in results] == [1, 1]
    last = results[0].err.strip().splitlines()[-1]
    assert last.startswith("no checkpoint in ") and "step 2: " in last, last
    # Set aside: the next attempt starts afresh and says why.
    retry = ok(run(ckpt, 2, attempt=3))
    assert "fresh start (set aside as damaged: step-2.damaged-2)" in retry[0].out


def test_a_diverged_step_stops_before_it_is_applied(tmp_path: Path) -> None:
    """A learning rate of 1e6 makes the loss NaN at step 2 (seen: 4.15 at step 1). The run stops
    there in one line, exit 1, instead of training on NaN, checkpointing it and pruning the good
    checkpoints; the checkpoint of step 1 stays the newest."""
    ckpt = tmp_path / "ckpt"
    results = run(ckpt, 10, argv=("--lr", "1e6"), every=1, plan={"dp": 1, "micro_batch": 8})
    (r,) = results
    assert r.rc == 1
    last = r.err.strip().splitlines()[-1]
    assert last.startswith("training diverged at iteration 2: loss nan"), last
    assert "the last checkpoint (iteration 1) is kept" in last
    assert steps(ckpt) == [1]
