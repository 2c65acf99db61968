"""The communication profiler with real torch.distributed processes (gloo on CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.estimator.comm import COLLECTIVES, CommModel, CommTable, Link

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gloo_profile_two_processes_writes_a_table(tmp_path: Path) -> None:
    out = tmp_path / "gloo.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tessera.estimator.torch.comm_profile", "--backend", "gloo", "--world", "2", "--out", str(out),
         "--sizes", "1KiB,256KiB", "--iters", "2", "--warmup", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "wrote" in proc.stderr
    raw = json.loads(out.read_text())
    assert raw["backend"] == "gloo" and raw["world"] == 2 and raw["link"] == "loopback"
    measured = {e["op"] for e in raw["entries"]}
    skipped = {u.split(":")[0] for u in raw["unsupported"]}
    assert measured | skipped == set(COLLECTIVES)
    assert {"all_reduce", "p2p"} <= measured
    assert all(e["seconds"] > 0 and e["world"] == 2 for e in raw["entries"])

    table = CommTable.from_json(out.read_text())
    small = table.lookup("all_reduce", "loopback", 2, 1024)
    big = table.lookup("all_reduce", "loopback", 2, 256 * 1024)
    mid = table.lookup("all_reduce", "loopback", 2, 128 * 1024)
    assert small is not None and big is not None and mid is not None
    assert min(small, big) <= mid <= max(small, big)  # interpolated between the two profiled sizes
    est = CommModel(table).time("all_reduce", 64 * 1024, 2, Link("loopback", 1.0))
    assert est.source == "profiled:loopback-gloo-w2" and est.seconds > 0


def test_cli_rejects_bad_arguments(tmp_path: Path) -> None:
    for args, field in ((["--ops", "broadcast"], "--ops"), (["--sizes", "x"], "--sizes"),
                        (["--link", "smoke"], "--link")):
        proc = subprocess.run(
            [sys.executable, "-m", "tessera.estimator.torch.comm_profile", "--out", str(tmp_path / "t.json"), *args],
            cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
        )
        assert proc.returncode == 2 and field in proc.stderr
