"""The agent's pruning of exited attempts' folders and logs (nodeagent/retention.py)."""

from __future__ import annotations

import os
from pathlib import Path

from tessera.nodeagent import contract
from tessera.nodeagent.main import parse_config
from tessera.nodeagent.retention import expired_attempts, prune_attempts

NOW = 1_800_000_000.0
DAY = 86400.0


def attempt(work: Path, job: str, n: int, age_s: float, log_age_s: float | None = None) -> Path:
    log = contract.log_path(work, job, n, 0)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("step 1\n")
    t = NOW - (age_s if log_age_s is None else log_age_s)
    os.utime(log, (t, t))
    os.utime(log.parent, (NOW - age_s, NOW - age_s))
    return log.parent


def test_prunes_old_unkept_attempts_only(tmp_path: Path) -> None:
    old = attempt(tmp_path, "j-1", 1, 8 * DAY)
    recent_log = attempt(tmp_path, "j-1", 2, 8 * DAY, log_age_s=60)  # its log was written a minute ago
    kept = attempt(tmp_path, "j-2", 1, 30 * DAY)  # still reported by the supervisor
    alone = attempt(tmp_path, "j-3", 4, 9 * DAY)
    ckpt = contract.default_checkpoint_dir(tmp_path, "j-1")
    ckpt.mkdir(parents=True)
    os.utime(ckpt, (NOW - 99 * DAY, NOW - 99 * DAY))
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "x").write_text("keep")
    os.symlink(outside, tmp_path / "jobs" / "j-1" / "attempt-9")

    keep = {("j-2", 1)}
    assert sorted(expired_attempts(tmp_path, 7 * DAY, keep, NOW)) == sorted([old, alone])
    assert sorted(prune_attempts(tmp_path, 7 * DAY, keep, NOW)) == sorted([old, alone])
    assert not old.exists() and not alone.exists() and not alone.parent.exists()  # empty job folder too
    assert recent_log.exists() and kept.exists() and ckpt.exists() and (outside / "x").exists()
    assert prune_attempts(tmp_path, 0, set(), NOW + 365 * DAY) == []  # 0 = keep forever
    assert recent_log.exists()


def test_flag(tmp_path: Path) -> None:
    config, _ = parse_config(["--controller", "127.0.0.1:1", "--node-id", "n1", "--work-dir", str(tmp_path),
                              "--attempt-ttl", "3600", "--insecure"])
    assert config.attempt_ttl_seconds == 3600
