"""The worker supervisor: launches, watches, stops and remembers the worker processes of this node.

One Attempt per (job_id, attempt), one Worker per rank. Launch is idempotent per attempt; stop is
SIGTERM to each worker's process group, then SIGKILL after the grace. Exited workers stay listed
for a retention period so the controller learns every outcome, even across its own restarts, and
the whole table can be exported to (and re-adopted from) <work-dir>/agent-state.json so that
workers also survive an agent restart.

Each worker runs under a keeper (tessera.nodeagent.keeper, started through
tessera.nodeagent.keeping): the pid the supervisor records, signals and re-adopts is the keeper's,
and the keeper writes the worker's exit status where a restarted agent can read it.

Everything runs on the agent's event loop; the only blocking calls are the fork/exec of a keeper,
directory creation and small file reads and writes. The records it keeps (Worker, Attempt) are in
tessera.nodeagent.workers.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import structlog

from tessera.common.progress import sanitized
from tessera.nodeagent import contract, keeperfiles, process, workers, worklogs
from tessera.nodeagent.errors import FailedPrecondition, NotFound
from tessera.nodeagent.keeping import Keepers
from tessera.nodeagent.selffence import SelfFence
from tessera.nodeagent.workers import EXIT_UNKNOWN, EXITED, RUNNING, STOPPING, Attempt, Worker
from tessera.v1 import agent_pb2, common_pb2

log = structlog.get_logger("tessera.nodeagent.supervisor")

RETENTION_SECONDS = 3600.0
MAX_EXITED_RECORDS = 2000
# How many jobs' "highest attempt launched/stopped" marks are kept (they fence late duplicates).
MAX_JOB_MARKS = 10_000
EXIT_SPAWN_FAILED = 127  # what a shell reports for "command not found"
REASON_DOWN = "exited while the agent was down"
KILL_WAIT_SECONDS = 5.0


class Supervisor:
    """Owns the workers of this node. All public methods run on the event loop."""

    def __init__(
        self,
        work_dir: Path,
        gpu_indices: Iterable[int],
        *,
        declared: bool,
        agent_addr: str = "",
        on_change: Callable[[], None] | None = None,
        persist: Callable[[], None] | None = None,
        base_env: Mapping[str, str] | None = None,
        omp_threads: int | None = None,
        clock: Callable[[], float] = time.time,
        retention_seconds: float = RETENTION_SECONDS,
        max_exited: int = MAX_EXITED_RECORDS,
        poll_interval: float = 1.0,
        keepers: Keepers | None = None,
        worker_python: str = sys.executable,
        allowed_env: frozenset[str] = frozenset(),
        fence: SelfFence | None = None,
    ) -> None:
        self.work_dir = work_dir
        self.keepers = keepers or Keepers(work_dir / keeperfiles.FENCE_FILE)
        # What `{python}` in a job's argv runs: an interpreter the workers' users can execute.
        self.worker_python = worker_python
        self.allowed_env = allowed_env
        self.fence = fence
        self.gpu_indices = frozenset(gpu_indices)
        self.declared = declared
        # Where workers report progress (unix:<work-dir>/agent.sock), known once the server is bound.
        self.agent_addr = agent_addr
        # (job_id, attempt) -> the attempt's secret for ReportProgress (server.WorkerTokens).
        self.worker_token: Callable[[str, int], str] | None = None
        self._on_change = on_change or (lambda: None)
        self._persist = persist or (lambda: None)
        self._base_env = base_env
        # None: this node's usable CPUs shared by its GPUs (contract.cpu_threads_per_gpu).
        self.omp_threads = omp_threads or contract.cpu_threads_per_gpu(
            process.usable_cpus(), len(self.gpu_indices)
        )
        self._clock = clock
        self.retention_seconds = retention_seconds
        self.max_exited = max_exited
        self.poll_interval = poll_interval
        self._attempts: dict[tuple[str, int], Attempt] = {}
        # Highest attempt launched / stopped per job: a late duplicate of an older attempt is refused.
        self._launched: dict[str, int] = {}
        self._stopped: dict[str, int] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False

    # --- queries ------------------------------------------------------------------------------------

    def statuses(self) -> list[agent_pb2.WorkerStatus]:
        """Every retained worker (running, stopping, exited within retention), by job, attempt, rank."""
        self.prune()
        return [w.status(att.stop_requested) for att in self._sorted_attempts() for w in att.workers]

    def statuses_of(self, job_id: str, attempt: int) -> list[agent_pb2.WorkerStatus] | None:
        """The statuses of one attempt, None when this node has no record of it."""
        att = self._attempts.get((job_id, attempt))
        return None if att is None else [w.status(att.stop_requested) for w in att.workers]

    def running_count(self) -> int:
        return sum(1 for att in self._attempts.values() for w in att.workers if w.active)

    def own_pids(self) -> set[int]:
        """Session leaders of live workers: anything in their sessions is the agent's, not foreign."""
        return {w.pid for att in self._attempts.values() for w in att.workers if w.active and w.pid > 0}

    def held_gpus(self) -> dict[int, tuple[str, int]]:
        """GPU index -> (job_id, attempt) of the live worker holding it."""
        held: dict[int, tuple[str, int]] = {}
        for att in self._attempts.values():
            for w in att.workers:
                if w.active:
                    for g in w.gpu_indices:
                        held[g] = att.key
        return held

    def _sorted_attempts(self) -> list[Attempt]:
        return [self._attempts[k] for k in sorted(self._attempts)]

    # --- launch -------------------------------------------------------------------------------------

    async def launch(self, req: agent_pb2.LaunchRequest) -> tuple[bool, list[agent_pb2.WorkerStatus]]:
        """Start one worker per rank of (job_id, attempt); (started, statuses).

        A second launch of the same attempt starts nothing and returns (False, its statuses).
        InvalidArgument for a malformed request; FailedPrecondition when a GPU is held by another
        live attempt, or the attempt is older than (or as old as) one already launched or stopped.
        """
        contract.validate_launch(req, self.gpu_indices, self.allowed_env)
        self.keepers.user_for(req.tenant)  # a refused tenant is refused here, not at each rank's spawn
        existing = self._attempts.get((req.job_id, req.attempt))
        if existing is not None:
            await existing.spawned.wait()
            return False, [w.status() for w in existing.workers]
        if self._closing:
            raise FailedPrecondition("the agent is shutting down")
        if self.fence is not None and self.fence.expired():
            # The keeper would stop the worker at once: the controller retries once we renewed.
            raise FailedPrecondition("this node's lease was not renewed in time: it is fenced until "
                                     "the controller acknowledges a heartbeat")
        stopped = self._stopped.get(req.job_id, 0)
        if req.attempt <= stopped:
            raise FailedPrecondition(
                f"attempt {req.attempt} of job {req.job_id} was already stopped on this node"
            )
        launched = self._launched.get(req.job_id, 0)
        if req.attempt <= launched:
            raise FailedPrecondition(
                f"attempt {req.attempt} of job {req.job_id} is not newer than attempt {launched} "
                "already launched on this node"
            )
        held = self.held_gpus()
        for r in req.ranks:
            for g in r.gpu_indices:
                if g in held:
                    job, att_n = held[g]
                    raise FailedPrecondition(f"GPU {g} is held by job {job} attempt {att_n}")

        # Registered before the first await, so a concurrent launch sees these GPUs as held and a
        # concurrent duplicate waits on `spawned` instead of starting anything.
        att = Attempt(
            job_id=req.job_id,
            attempt=req.attempt,
            world_size=req.world_size,
            checkpoint_dir=req.checkpoint_dir,
            workers=[
                Worker(
                    job_id=req.job_id,
                    attempt=req.attempt,
                    rank=r.rank,
                    local_rank=r.local_rank,
                    gpu_indices=tuple(r.gpu_indices),
                    log_path=contract.log_path(self.work_dir, req.job_id, req.attempt, r.rank),
                )
                for r in sorted(req.ranks, key=lambda r: r.rank)
            ],
        )
        self._attempts[att.key] = att
        self._mark(self._launched, req.job_id, req.attempt)
        try:
            by_rank = {r.rank: r for r in req.ranks}
            for w in att.workers:
                self._spawn(att, w, req, by_rank[w.rank])
        finally:
            att.spawned.set()
        log.info(
            "attempt launched",
            job_id=req.job_id,
            attempt=req.attempt,
            ranks=[w.rank for w in att.workers],
            pids=[w.pid for w in att.workers],
        )
        self._changed()
        return True, [w.status() for w in att.workers]

    def _spawn(
        self, att: Attempt, w: Worker, req: agent_pb2.LaunchRequest, rank: agent_pb2.RankAssignment
    ) -> None:
        """Start one worker's keeper; a failure to start becomes an EXITED worker with exit code 127."""
        cwd = contract.attempt_dir(self.work_dir, req.job_id, req.attempt)
        if req.checkpoint_dir:
            ckpt = req.checkpoint_dir
        else:
            ckpt = str(contract.default_checkpoint_dir(self.work_dir, req.job_id))
        base = os.environ if self._base_env is None else self._base_env
        user = self.keepers.user_for(req.tenant)
        env = contract.worker_env(
            base,
            req,
            rank,
            agent_addr=self.agent_addr,
            declared=self.declared,
            checkpoint_dir=ckpt,
            omp_threads=self.omp_threads,
            user=user.name, confined=self.keepers.gpu_minors is not None,
            home=str(cwd / "home"),
            tmpdir=str(cwd / "tmp"),
        )
        if self.worker_token is not None:
            env["TESSERA_WORKER_TOKEN"] = self.worker_token(req.job_id, req.attempt)
        try:
            # The job's own directory (JobSpec.workdir) is checked by the keeper, as the worker's
            # user: a check here, as root, told any tenant whether any path exists on the node.
            notes = self.keepers.prepare(cwd, Path(ckpt), user)
            fd = worklogs.open_for_append(w.log_path)
            with open(fd, "ab") as log_file:
                log_file.writelines(f"tessera-agent: {note}\n".encode() for note in notes)
                log_file.flush()
                proc = self.keepers.start(
                    job_id=req.job_id, attempt=req.attempt, rank=w.rank, attempt_dir=cwd,
                    argv=contract.worker_argv(req.argv, self.worker_python), env=env,
                    keeper_env={k: v for k, v in base.items() if k not in contract.NOT_INHERITED},
                    user=user, log_file=log_file, workdir=req.workdir, gpus=contract.node_gpus(req),
                )
        except Exception as exc:  # noqa: BLE001 (any failure: the rank ends EXITED, not half-started)
            reason = f"spawn failed: {exc}"
            worklogs.append(w.log_path, f"tessera-agent: {reason}\n")
            log.warning(
                "worker spawn failed", job_id=w.job_id, attempt=w.attempt, rank=w.rank, error=str(exc)
            )
            self._exited(att, w, EXIT_SPAWN_FAILED, reason, notify=False)
            return
        w.pid = proc.pid
        w.started = process.start_time(proc.pid)
        self._track(self._watch_child(att, w, proc))

    # --- watching -----------------------------------------------------------------------------------

    def _track(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("supervisor task failed", error=repr(task.exception()))

    async def _watch_child(self, att: Attempt, w: Worker, proc: subprocess.Popen[bytes]) -> None:
        code = await process.wait_child(proc, self.poll_interval)
        # The keeper killed what the worker left in its process group; anything left in the keeper's
        # own group (it was killed itself) goes too. The group id cannot be reused while any member lives.
        if process.signal_group(w.pid, signal.SIGKILL):
            log.info("killed leftover processes of a keeper", job_id=w.job_id, attempt=w.attempt, rank=w.rank)
        recorded = self._recorded_exit(w)
        if recorded is None:
            self._exited(att, w, code, workers.exit_reason(att, w, code, "keeper left no exit status"))
        else:
            self._exited(att, w, recorded[0], workers.exit_reason(att, w, *recorded))

    async def _watch_adopted(self, att: Attempt, w: Worker) -> None:
        await process.wait_gone(w.pid, w.started, self.poll_interval)
        recorded = self._recorded_exit(w)
        if recorded is not None:
            self._exited(att, w, recorded[0], workers.exit_reason(att, w, *recorded))
            return
        reason = "exited after the agent restarted; exit status unknown (not a child of this agent)"
        if att.stop_requested:
            reason = workers.stop_prefix(att, w) + ", " + reason
        self._exited(att, w, EXIT_UNKNOWN, reason)

    def _recorded_exit(self, w: Worker) -> tuple[int, str] | None:
        return self.keepers.result(w.log_path.parent, w.rank)

    def _exited(self, att: Attempt, w: Worker, code: int, reason: str, notify: bool = True) -> None:
        w.state = EXITED
        w.exit_code = code
        w.reason = reason
        w.exited_at = self._clock()
        w.exited.set()
        log.info(
            "worker exited",
            job_id=w.job_id,
            attempt=w.attempt,
            rank=w.rank,
            pid=w.pid,
            exit_code=code,
            reason=reason,
        )
        if notify:
            self._changed()

    def _changed(self) -> None:
        self._persist()
        self._on_change()

    # --- stop ---------------------------------------------------------------------------------------

    async def stop(
        self, job_id: str, attempt: int, grace: float, reason: str = "", *, wait: bool = False
    ) -> list[agent_pb2.WorkerStatus]:
        """Stop one attempt (attempt 0: every attempt of the job); idempotent.

        SIGTERM goes to each live worker's process group once; SIGKILL follows `grace` seconds later
        from a background task. Returns the statuses right after SIGTERM (STOPPING or EXITED), so
        callers learn the exits from later statuses; wait=True waits for the exits instead.
        An unknown job or attempt is not an error: nothing runs, so the stop holds.
        """
        contract.validate_stop(job_id, attempt, grace)
        atts = [a for a in self._sorted_attempts() if a.job_id == job_id and attempt in (0, a.attempt)]
        # Fence a Launch of this attempt (or of any attempt so far) that arrives after the Stop.
        upto = attempt if attempt else max([a.attempt for a in atts] + [self._launched.get(job_id, 0)])
        if upto:
            self._mark(self._stopped, job_id, upto)
        escalations = []
        for att in atts:
            await att.spawned.wait()
            if not att.stop_requested:
                att.stop_requested = True
                att.stop_reason = reason
            for w in att.workers:
                if w.state == RUNNING:
                    w.state = STOPPING
                    process.signal_group(w.pid, signal.SIGTERM)
            if att.active:
                deadline = self._clock() + grace
                # A later stop may shorten the grace, never lengthen it.
                if att.stop_deadline is None or deadline < att.stop_deadline:
                    att.stop_deadline = deadline
                    escalations.append(self._track(self._escalate(att, grace)))
        if atts:
            log.info("stop requested", job_id=job_id, attempt=attempt, grace=grace, reason=reason)
        self._changed()
        if wait:
            for att in atts:
                await self._wait_exited(att, grace + KILL_WAIT_SECONDS)
        return [w.status() for att in atts for w in att.workers]

    def evict(self, job_id: str, reason: str) -> None:
        """Kill the job's live workers now for a reason of the agent's own (its disk limits): no
        SIGTERM (a trainer would answer it with a checkpoint); `reason` leads their exit reasons."""
        for att in [a for a in self._attempts.values() if a.job_id == job_id and a.active]:
            att.evicted = att.evicted or reason
            log.warning("evicting workers", job_id=job_id, attempt=att.attempt, reason=reason)
            self._track(self._escalate(att, 0.0))
            self._changed()

    def live_jobs(self) -> dict[str, set[str]]:
        """Job -> the checkpoint folders its live attempts' Launches named ("" for none)."""
        out: dict[str, set[str]] = {}
        for a in self._attempts.values():
            if a.active:
                out.setdefault(a.job_id, set()).add(a.checkpoint_dir)
        return out

    async def wait_exited(self, job_id: str, attempt: int, timeout: float) -> bool:
        """Wait until every worker of the attempt has exited; False on timeout or unknown attempt."""
        att = self._attempts.get((job_id, attempt))
        if att is None:
            return False
        await att.spawned.wait()
        return await self._wait_exited(att, timeout)

    async def _wait_exited(self, att: Attempt, timeout: float) -> bool:
        waits = [w.exited.wait() for w in att.workers if w.active]
        if not waits:
            return True
        try:
            await asyncio.wait_for(asyncio.gather(*waits), timeout)
            return True
        except TimeoutError:
            return False

    async def _escalate(self, att: Attempt, grace: float) -> None:
        if await self._wait_exited(att, grace):
            return
        for w in att.workers:
            if w.active:
                w.killed, w.grace = True, grace
                log.warning(
                    "killing worker", job_id=w.job_id, attempt=w.attempt, rank=w.rank, grace=grace
                )
                # The keeper SIGKILLs the worker's group and still records the exit.
                process.signal_group(w.pid, keeperfiles.KILL_NOW)
        if await self._wait_exited(att, KILL_WAIT_SECONDS):
            return
        for w in att.workers:
            if w.active:  # a keeper that does not answer: killing it kills its worker (parent-death signal)
                process.signal_group(w.pid, signal.SIGKILL)

    # --- progress, checkpoints, logs ------------------------------------------------------------------

    def report_progress(
        self, job_id: str, attempt: int, rank: int, progress: common_pb2.Progress | None
    ) -> tuple[bool, bool]:
        """Record a worker's progress (None: just ask); returns (checkpoint_requested, stop_requested)."""
        att = self._attempts.get((job_id, attempt))
        w = next((w for w in att.workers if w.rank == rank), None) if att else None
        if att is None or w is None:
            raise NotFound(f"no worker for job {job_id} attempt {attempt} rank {rank} on this node")
        if progress is None:
            return att.checkpoint_floor is not None, att.stop_requested
        w.progress = common_pb2.Progress()
        w.progress.CopyFrom(sanitized(progress))
        if att.checkpoint_floor is not None and w.progress.checkpoint_iteration > att.checkpoint_floor:
            att.checkpoint_floor = None  # a newer checkpoint, at most the reported iteration: served
        return att.checkpoint_floor is not None, att.stop_requested

    def request_checkpoint(self, job_id: str, attempt: int) -> bool:
        """Ask an attempt's workers for a checkpoint (answered through ReportProgress).

        No RPC carries this yet (see docs/agent.md); False when the attempt is not running here.
        """
        att = self._attempts.get((job_id, attempt))
        if att is None or not att.active:
            return False
        if att.checkpoint_floor is None:
            att.checkpoint_floor = max(
                (w.progress.checkpoint_iteration for w in att.workers if w.progress is not None), default=-1
            )
        return True

    def read_log(self, job_id: str, attempt: int, rank: int, tail_bytes: int) -> tuple[str, bytes]:
        """The last `tail_bytes` (default 64 KiB, at most 4 MiB) of a rank's log; attempt 0 = latest."""
        known = [a.attempt for a in self._attempts.values() if a.job_id == job_id]
        return worklogs.read_tail(self.work_dir, job_id, attempt, rank, tail_bytes, known)

    def read_log_chunk(self, job_id: str, attempt: int, rank: int, max_bytes: int,
                       offset: int | None) -> tuple[str, bytes, int, int]:
        """read_log with where the data starts and the log's size; `offset`: read from there on."""
        known = [a.attempt for a in self._attempts.values() if a.job_id == job_id]
        return worklogs.read_chunk(self.work_dir, job_id, attempt, rank, max_bytes, known, offset)

    # --- retention ----------------------------------------------------------------------------------

    def prune(self, now: float | None = None) -> int:
        """Forget finished attempts older than the retention period, and the oldest finished ones
        beyond `max_exited` worker records. Live workers are never forgotten. Returns attempts dropped."""
        now = self._clock() if now is None else now
        finished = sorted((a for a in self._attempts.values() if not a.active), key=Attempt.last_exit)
        drop = [a for a in finished if a.last_exit() < now - self.retention_seconds]
        records = sum(len(a.workers) for a in finished) - sum(len(a.workers) for a in drop)
        for a in finished[len(drop) :]:
            if records <= self.max_exited:
                break
            drop.append(a)
            records -= len(a.workers)
        for a in drop:
            del self._attempts[a.key]
        if drop:
            self._persist()
        return len(drop)

    @staticmethod
    def _mark(marks: dict[str, int], job_id: str, attempt: int) -> None:
        marks[job_id] = max(attempt, marks.pop(job_id, 0))  # re-insert: newest jobs last
        while len(marks) > MAX_JOB_MARKS:
            del marks[next(iter(marks))]

    # --- persistence and re-adoption ----------------------------------------------------------------

    def export_state(self) -> dict[str, Any]:
        """The supervisor's part of agent-state.json."""
        records = []
        for att in self._sorted_attempts():
            for w in att.workers:
                records.append(
                    {
                        "job_id": w.job_id,
                        "attempt": w.attempt,
                        "world_size": att.world_size,
                        "rank": w.rank,
                        "local_rank": w.local_rank,
                        "gpu_indices": list(w.gpu_indices),
                        "log_path": str(w.log_path),
                        "state": int(w.state),
                        "pid": w.pid,
                        "started": w.started,
                        "exit_code": w.exit_code,
                        "reason": w.reason,
                        "exited_at": w.exited_at,
                        "killed": w.killed,
                        "stop_requested": att.stop_requested,
                        "stop_reason": att.stop_reason,
                        "stop_deadline": att.stop_deadline,
                        "checkpoint_dir": att.checkpoint_dir,
                        "evicted": att.evicted,
                    }
                )
        return {"workers": records, "launched": dict(self._launched), "stopped": dict(self._stopped)}

    def restore(self, state: Mapping[str, Any]) -> int:
        """Rebuild the table from export_state() output of a previous agent; call on the event loop
        before serving. Live workers are re-adopted (watched by pid, since they are no longer our
        children); the ones that died meanwhile are reported with exit code -1000. Returns the
        number of re-adopted workers."""
        adopted = 0
        now = self._clock()
        for job, n in dict(state.get("launched", {})).items():
            self._mark(self._launched, str(job), int(n))
        for job, n in dict(state.get("stopped", {})).items():
            self._mark(self._stopped, str(job), int(n))
        for rec in state.get("workers", []):
            try:
                key = (str(rec["job_id"]), int(rec["attempt"]))
                att = self._attempts.get(key)
                if att is None:
                    att = Attempt(
                        job_id=key[0], attempt=key[1], world_size=int(rec.get("world_size", 1)), workers=[]
                    )
                    att.stop_requested = bool(rec.get("stop_requested", False))
                    att.stop_reason = str(rec.get("stop_reason", ""))
                    att.checkpoint_dir = str(rec.get("checkpoint_dir", ""))
                    att.evicted = str(rec.get("evicted", ""))
                    deadline = rec.get("stop_deadline")
                    att.stop_deadline = float(deadline) if deadline is not None else None
                    att.spawned.set()
                    self._attempts[key] = att
                w = Worker(
                    job_id=key[0],
                    attempt=key[1],
                    rank=int(rec["rank"]),
                    local_rank=int(rec.get("local_rank", 0)),
                    gpu_indices=tuple(int(g) for g in rec.get("gpu_indices", [])),
                    log_path=Path(rec["log_path"]),
                    state=int(rec["state"]),
                    pid=int(rec.get("pid", 0)),
                    started=None if rec.get("started") is None else int(rec["started"]),
                    exit_code=int(rec.get("exit_code", 0)),
                    reason=str(rec.get("reason", "")),
                    exited_at=None if rec.get("exited_at") is None else float(rec["exited_at"]),
                    killed=bool(rec.get("killed", False)),
                )
            except (KeyError, TypeError, ValueError) as exc:
                log.error("skipping an unreadable worker record in agent state", error=str(exc))
                continue
            att.workers.append(w)
            if w.state == EXITED:
                w.exited.set()
            elif process.is_alive(w.pid, w.started):
                w.adopted = True
                adopted += 1
                log.info("re-adopted worker", job_id=w.job_id, attempt=w.attempt, rank=w.rank, pid=w.pid)
                self._track(self._watch_adopted(att, w))
            elif (recorded := self._recorded_exit(w)) is not None:  # its keeper said how it ended
                self._exited(att, w, recorded[0], workers.exit_reason(att, w, *recorded), notify=False)
            else:
                self._exited(att, w, EXIT_UNKNOWN, REASON_DOWN, notify=False)
        # A stop that was waiting out its grace when the last agent went down still gets its SIGKILL.
        for att in self._attempts.values():
            if att.active and att.stop_deadline is not None:
                self._track(self._escalate(att, max(0.0, att.stop_deadline - now)))
        self.prune()
        self._changed()
        return adopted

    # --- shutdown -----------------------------------------------------------------------------------

    async def shutdown(self, kill_workers: bool = False, grace: float = 10.0) -> None:
        """Called when the agent exits. By default workers keep running (systemd KillMode=process
        style): the state file lets the next agent re-adopt them, and the controller reconciles.
        kill_workers=True stops every live attempt (SIGTERM, grace, SIGKILL) and waits for the exits."""
        self._closing = True
        if kill_workers:
            jobs = sorted({a.job_id for a in self._attempts.values() if a.active})
            await asyncio.gather(
                *(self.stop(job, 0, grace, "agent shutting down", wait=True) for job in jobs)
            )
        self._persist()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
