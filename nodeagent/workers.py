"""The records the supervisor keeps: one Worker per rank, one Attempt per (job_id, attempt).

Plain data and their status messages, apart from the process handling in supervisor.py, so the
table (and what agent-state.json holds of it) can be read without the lifecycle around it.
"""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass, field
from pathlib import Path

from tessera.common.contract import FENCED_REASON
from tessera.common.nodespec import report_text
from tessera.v1 import agent_pb2, common_pb2

RUNNING: int = common_pb2.WORKER_STATE_RUNNING
STOPPING: int = common_pb2.WORKER_STATE_STOPPING
EXITED: int = common_pb2.WORKER_STATE_EXITED
EXIT_UNKNOWN = -1000  # the worker was not our child when it ended: its exit status is lost

# A reported reason's characters: a heartbeat carries up to 2,000 exited workers
# (supervisor.MAX_EXITED_RECORDS), and at nodespec's 4,096 characters of two-byte text theirs made a
# 16.6 MB message, over the controller's 8 MiB (controller/main.py API_MESSAGE_BYTES): one tenant's
# worker writing such reasons would cost its node every heartbeat. At 512, even of four-byte
# characters, such a message is under 4.5 MB. The agent's own record of the worker (its state
# file) keeps the whole reason.
MAX_REPORTED_REASON = 512


@dataclass(eq=False)
class Worker:
    job_id: str
    attempt: int
    rank: int
    local_rank: int
    gpu_indices: tuple[int, ...]
    log_path: Path
    state: int = RUNNING
    pid: int = 0
    started: int | None = None  # /proc start time of pid, guards against pid reuse
    exit_code: int = 0
    reason: str = ""
    progress: common_pb2.Progress | None = None
    exited_at: float | None = None  # wall clock, so retention survives an agent restart
    killed: bool = False  # the stop escalated to SIGKILL
    grace: float | None = None  # the grace after SIGTERM it was killed after (None: not known)
    adopted: bool = False  # re-adopted after an agent restart: not our child
    exited: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def active(self) -> bool:
        return self.state != EXITED

    def status(self, stop_requested: bool = False) -> agent_pb2.WorkerStatus:
        """`stop_requested`: its attempt's (a controller's Stop asked it to end)."""
        st = agent_pb2.WorkerStatus(
            job_id=self.job_id,
            attempt=self.attempt,
            rank=self.rank,
            state=self.state,
            pid=self.pid,
            exit_code=self.exit_code,
            log_path=report_text(str(self.log_path)),
            reason=report_text(self.reason, MAX_REPORTED_REASON),
            gpu_indices=list(self.gpu_indices),
            stop_requested=stop_requested,
        )
        if self.progress is not None:
            st.progress.CopyFrom(self.progress)
        return st


@dataclass(eq=False)
class Attempt:
    job_id: str
    attempt: int
    world_size: int
    workers: list[Worker]
    spawned: asyncio.Event = field(default_factory=asyncio.Event)
    stop_requested: bool = False
    stop_reason: str = ""
    stop_deadline: float | None = None  # wall clock of the pending SIGKILL
    # checkpoint_iteration seen when a checkpoint was asked for; None = nothing asked.
    checkpoint_floor: int | None = None
    # The Launch's checkpoint folder ("" = the job's default one, under its folder here).
    checkpoint_dir: str = ""
    # Why the agent itself killed the workers (diskuse.evictions); "" = it did not.
    evicted: str = ""

    @property
    def key(self) -> tuple[str, int]:
        return (self.job_id, self.attempt)

    @property
    def active(self) -> bool:
        return any(w.active for w in self.workers)

    def last_exit(self) -> float:
        return max((w.exited_at or 0.0) for w in self.workers)


def describe_exit(code: int) -> str:
    """How a worker ended, for its status's reason: "exit code 1", "killed by SIGKILL"."""
    if code == EXIT_UNKNOWN:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def stop_prefix(att: Attempt, w: Worker) -> str:
    """"stopped by controller (R)", and for a worker that ignored its SIGTERM "; did not exit within
    the 10 s grace after SIGTERM" (the controller repeats it from "did not exit within" on:
    controller/core/attempts.py killed_after_grace), which the exit's "killed by SIGKILL" follows."""
    prefix = "stopped by controller" + (f" ({att.stop_reason})" if att.stop_reason else "")
    if not w.killed:
        return prefix
    grace = f"{w.grace:g} s grace" if w.grace is not None else "grace period"
    return f"{prefix}; did not exit within the {grace} after SIGTERM"


def exit_reason(att: Attempt, w: Worker, code: int, why: str = "") -> str:
    """A worker status's reason; `why`: what the keeper recorded beyond the code ("fenced: ...").

    A keeper's fence comes first even when the controller also asked for a stop: the fence is how the
    worker died, and a stop request that lands while the agent was frozen (SIGSTOP, a stalled host)
    reaches it only after the worker had already fenced itself.
    """
    text = f"{why}, {describe_exit(code)}" if why else describe_exit(code)
    if att.evicted:  # the agent's own kill comes first: the controller may have asked for a stop after it
        return f"{att.evicted}, {text}"
    if not att.stop_requested:
        return text
    if why.split(":", 1)[0] == FENCED_REASON:
        return f"{text} (the controller had also asked it to stop: {att.stop_reason or 'no reason given'})"
    return f"{stop_prefix(att, w)}, {text}"
