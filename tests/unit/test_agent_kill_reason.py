"""A worker that ignored its SIGTERM says so in its exit reason, with the grace it had, in words the
controller repeats in the job's STOPPED event (controller/core/attempts.py killed_after_grace). A live
audit read `"reason":""` in the rank's exit record and only the agent's own log said it."""

from __future__ import annotations

import signal
from pathlib import Path

from tessera.controller.core.attempts import killed_after_grace
from tessera.nodeagent.workers import Attempt, Worker, exit_reason


def test_the_kill_after_the_grace_is_said_with_the_grace() -> None:
    w = Worker("job-1", 1, 0, 0, (), Path("rank-0.log"), killed=True, grace=10.0)
    att = Attempt("job-1", 1, 1, [w], stop_requested=True, stop_reason="node a is draining: drained by admin")
    said = exit_reason(att, w, -signal.SIGKILL)
    assert said == ("stopped by controller (node a is draining: drained by admin); did not exit within the 10 s "
                    "grace after SIGTERM, killed by SIGKILL")
    assert killed_after_grace(said) == "did not exit within the 10 s grace after SIGTERM, killed by SIGKILL"
    # Not killed: nothing to say.
    assert killed_after_grace(exit_reason(att, Worker("job-1", 1, 1, 1, (), Path("r")), 0)) == ""
