"""bench/worker_threads.py with real torch processes: the thread count the agent gives a worker is the
one torch runs with (the figures themselves are the bench's, not asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.nodeagent.contract import cpu_threads_per_gpu
from tessera.nodeagent.process import usable_cpus

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_workers_run_with_the_agents_thread_share(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "bench/worker_threads.py", "--workers", "1,2", "--steps", "2", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "worker_threads.json").read_text())["rows"]
    assert [r["workers"] for r in rows] == [1, 2]
    for r in rows:
        share = cpu_threads_per_gpu(usable_cpus(), r["workers"])
        assert r["agent_share"]["omp_num_threads"] == r["agent_share"]["torch_threads"] == share
        assert r["torch_default"]["omp_num_threads"] == "unset" and r["torch_default"]["torch_threads"] >= 1
        assert r["agent_share"]["step_ms_median"] > 0 and r["torch_default"]["step_ms_median"] > 0


def test_bad_worker_counts_are_refused(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "bench/worker_threads.py", "--workers", "2,x", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 2 and "--workers: '2,x' is not a comma-separated list" in proc.stderr
