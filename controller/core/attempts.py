"""What the reported worker statuses of one attempt mean for its job."""

from __future__ import annotations

import signal
from dataclasses import dataclass

# Reported by an agent for a worker that ended while the agent was not running (exit code unknown).
EXIT_UNKNOWN = -1000


@dataclass(frozen=True)
class RankStatus:
    rank: int
    running: bool
    exit_code: int = 0
    reason: str = ""
    iteration: int = 0


@dataclass(frozen=True)
class Verdict:
    # "starting" | "running" | "succeeded" | "failed" | "interrupted" | "stopped"
    kind: str
    reason: str = ""


def describe_exit(code: int) -> str:
    if code == EXIT_UNKNOWN:
        return "exit status unknown (worker ended while its agent was down)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        extra = " (out of memory? the kernel OOM killer sends SIGKILL)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{extra}"
    if code == 127:
        return "exit code 127 (program not found or not executable)"
    return f"exit code {code}"


def judge(world_size: int, ranks: dict[int, RankStatus], iterations: int, stop_requested: bool) -> Verdict:
    """Verdict for an attempt from the latest status of each rank.

    - any rank that ended badly fails the attempt at once ("failed", user code) unless the controller
      had asked the attempt to stop, or the agent could not observe the exit ("interrupted");
    - all ranks exited 0: "succeeded" when rank 0 reached the job's iterations, else "stopped"
      (a cooperative stop after a checkpoint);
    - otherwise "running" once every rank is running, else "starting".
    """
    for r in sorted(ranks.values(), key=lambda x: x.rank):
        if r.running or r.exit_code == 0:
            continue
        if stop_requested:
            continue
        if r.exit_code == EXIT_UNKNOWN:
            return Verdict("interrupted", f"rank {r.rank}: {describe_exit(r.exit_code)}")
        detail = f"; {r.reason}" if r.reason else ""
        return Verdict("failed", f"rank {r.rank}: {describe_exit(r.exit_code)}{detail}")
    if len(ranks) == world_size and all(not r.running for r in ranks.values()):
        r0 = ranks.get(0)
        if not stop_requested and r0 is not None and r0.exit_code == 0 and r0.iteration >= iterations:
            return Verdict("succeeded", f"all {world_size} ranks exited 0 after {r0.iteration} iterations")
        return Verdict("stopped", "all ranks stopped" + (" on request" if stop_requested else " before the end"))
    if len(ranks) == world_size and all(r.running for r in ranks.values()):
        return Verdict("running")
    return Verdict("starting")
