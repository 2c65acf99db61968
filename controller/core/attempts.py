"""What the reported worker statuses of one attempt mean for its job."""

from __future__ import annotations

import signal
from dataclasses import dataclass

from tessera.common.contract import EVICTED_REASON, FENCED_REASON

# Reported by an agent for a worker that ended while the agent was not running (exit code unknown).
EXIT_UNKNOWN = -1000


@dataclass(frozen=True)
class RankStatus:
    rank: int
    running: bool
    exit_code: int = 0
    reason: str = ""
    iteration: int = 0
    # The agent's word that a controller asked the attempt to stop (WorkerStatus.stop_requested).
    stop_requested: bool = False


@dataclass(frozen=True)
class Verdict:
    # "starting" | "running" | "succeeded" | "failed" | "interrupted" | "stopped"
    kind: str
    reason: str = ""
    # The rank whose exit decided a "failed" or "interrupted" verdict.
    rank: int = -1
    # Of a "stopped" verdict: the ranks the agent SIGKILLed after the stop's grace (a program that
    # ignores SIGTERM), each with the agent's words from "did not exit within ..." on.
    killed: tuple[tuple[int, str], ...] = ()
    # Of a "failed" verdict decided by a rank's exit: its exit status.
    exit_code: int | None = None


# How the keeper's reason for a worker it could not start begins (nodeagent/keeper.py).
SPAWN_FAILED = "spawn failed: "


# How an agent's reason says that its stop's SIGKILL came after the grace (nodeagent/workers.py
# stop_prefix), and an agent's before it said so.
KILLED_AFTER_GRACE = "did not exit within the "
_KILLED_BEFORE = ", SIGKILL after the grace period"


def killed_after_grace(reason: str) -> str:
    """From an exit reason, what the agent said of a SIGKILL after the stop's grace ("did not exit
    within the 10 s grace after SIGTERM, killed by SIGKILL"); "" when it did not kill."""
    if (at := reason.rfind(KILLED_AFTER_GRACE)) >= 0:
        return reason[at:]
    if (at := reason.rfind(_KILLED_BEFORE)) >= 0:
        return f"{KILLED_AFTER_GRACE}grace period after SIGTERM{reason[at + len(_KILLED_BEFORE):]}"
    return ""


def ranks_text(n: int) -> str:
    """"its 1 rank", "all 4 ranks": how a verdict counts an attempt's processes (controller/judging.py
    words them as launchers where a per-node launcher starts the ranks)."""
    return "its 1 rank" if n == 1 else f"all {n} ranks"


def exit_words(code: int) -> str:
    """How an exit is said without a hint: "exit code 1", "killed by SIGKILL", as the agent says
    it (nodeagent/workers.py describe_exit)."""
    if code == EXIT_UNKNOWN:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def describe_exit(code: int) -> str:
    """`exit_words` with what the code most likely means."""
    if code == EXIT_UNKNOWN:
        return f"{exit_words(code)} (worker ended while its agent was down)"
    if code == -signal.SIGKILL:
        return f"{exit_words(code)} (out of memory? the kernel OOM killer sends SIGKILL)"
    if code == 127:
        return f"{exit_words(code)} (program not found or not executable)"
    return exit_words(code)


def judge(world_size: int, ranks: dict[int, RankStatus], iterations: int, stop_requested: bool) -> Verdict:
    """Verdict for an attempt from the latest status of each rank.

    - a rank its keeper fenced (the agent lost its lease) interrupts the attempt, whatever its exit
      code (the reference trainer exits 0 after a checkpoint, and the job resumes from it) and
      whatever the other ranks' codes: a rank whose peer was fenced fails in its collective;
    - any rank that ended badly fails the attempt at once ("failed", user code) unless the controller
      had asked the attempt to stop, or the agent could not observe the exit ("interrupted");
    - all ranks exited 0: "succeeded" when rank 0 reached the job's iterations, else "stopped"
      (a cooperative stop after a checkpoint);
    - otherwise "running" once every rank is running, else "starting".
    """
    ended = [r for r in ranks.values() if not r.running]
    if not stop_requested and ended and all(r.stop_requested for r in ended):
        # A stop this controller's record does not know of (a restore from an older copy): the
        # attempt was ended on request, as after any stop, not by its program.
        r = min(ended, key=lambda x: x.rank)
        return Verdict("interrupted", f"rank {r.rank}: {r.reason or 'stopped'} (a stop this state does not record)",
                       r.rank)
    for r in sorted(ranks.values(), key=lambda x: x.rank):
        if not r.running and not stop_requested and r.reason.split(":", 1)[0] == FENCED_REASON:
            return Verdict("interrupted", f"rank {r.rank}: {r.reason}", r.rank)
    for r in sorted(ranks.values(), key=lambda x: x.rank):
        if r.running or r.exit_code == 0 or stop_requested:
            continue
        if r.exit_code == EXIT_UNKNOWN:  # the agent's account, when it has one, says why
            return Verdict("interrupted", f"rank {r.rank}: {r.reason or describe_exit(r.exit_code)}", r.rank)
        # The keeper's or the agent's own account says more than a guess from the code.
        if r.reason.startswith((SPAWN_FAILED, EVICTED_REASON)):
            return Verdict("failed", f"rank {r.rank}: {r.reason}", r.rank)
        # The agent's reason is the code's words when it knows no more: said once (a live audit read
        # "killed by SIGKILL (out of memory? ...); killed by SIGKILL").
        said = (describe_exit(r.exit_code), exit_words(r.exit_code))
        detail = f"; {r.reason}" if r.reason and r.reason not in said else ""
        return Verdict("failed", f"rank {r.rank}: {describe_exit(r.exit_code)}{detail}", r.rank, exit_code=r.exit_code)
    if len(ranks) == world_size and all(not r.running for r in ranks.values()):
        r0 = ranks.get(0)
        if not stop_requested and r0 is not None and r0.exit_code == 0 and r0.iteration >= iterations:
            who = ranks_text(world_size)
            # A job that counts no iterations and reported none (an opaque script): no count to give.
            after = f" after {r0.iteration} iteration{'' if r0.iteration == 1 else 's'}" if r0.iteration > 0 else ""
            return Verdict("succeeded", f"{who} exited 0{after}")
        killed = tuple((r.rank, k) for r in sorted(ranks.values(), key=lambda x: x.rank)
                       if (k := killed_after_grace(r.reason)))
        return Verdict("stopped", "all ranks stopped" + (" on request" if stop_requested else " before the end"),
                       killed=killed)
    if len(ranks) == world_size and all(r.running for r in ranks.values()):
        return Verdict("running")
    return Verdict("starting")


def stalled(now: float, launched_at: float, last_progress_at: float | None, starting: bool,
            start_timeout: float, progress_timeout: float) -> str | None:
    """Why an attempt counts as hung at `now`, or None.

    Not every rank running `start_timeout` seconds after launch: the launch hangs. Rank 0 silent for
    `progress_timeout` seconds since launch or its last report (<= 0: never checked): the training
    hangs (a stuck rendezvous or collective looks like this).
    """
    if starting:
        if now - launched_at > start_timeout:
            return f"not every rank was running {start_timeout:g}s after launch"
        return None
    if progress_timeout <= 0:
        return None
    since = max(launched_at, last_progress_at or launched_at)
    if now - since > progress_timeout:
        what = "since launch" if last_progress_at is None else "since its last report"
        return f"no progress from rank 0 for {progress_timeout:g}s {what} (hung?)"
    return None
