"""common/crashpoints.py: a point kills the process only at the hit TESSERA_CRASH_AT names."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tessera.common import crashpoints

SCRIPT = """
from tessera.common.crashpoints import crash_point
for i in range(3):
    crash_point("round.placed")
    crash_point("round.planned")
    print("passed", i, flush=True)
"""


def run(env_value: str | None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"}
    if env_value is not None:
        env["TESSERA_CRASH_AT"] = env_value
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=60,
                          check=False)


def test_unarmed_points_do_nothing() -> None:
    cp = run(None)
    assert cp.returncode == 0 and cp.stdout.split("\n")[:3] == ["passed 0", "passed 1", "passed 2"]


def test_the_named_hit_is_a_sigkill_with_one_line_first() -> None:
    cp = run("round.planned:2")
    assert cp.returncode == -signal.SIGKILL
    assert cp.stdout.splitlines() == ["passed 0"]  # died at the second hit, before the second print
    assert '"point": "round.planned", "hit": 2' in cp.stderr


def test_an_unknown_point_or_count_is_refused() -> None:
    for bad in ("round.nope", "round.planned:0", "round.planned:x"):
        with pytest.raises(ValueError, match="TESSERA_CRASH_AT"):
            crashpoints.arm(bad)
    crashpoints.arm("")
    crashpoints.crash_point("round.planned")  # disarmed again: returns
    assert run("round.nope").returncode == 1
