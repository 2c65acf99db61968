"""The invariants every chaos test checks after breaking something (docs/chaos.md).

Read from the outside, as an operator could: the controller over gRPC (jobs, events, nodes), the
worker processes in /proc (their TESSERA_JOB_ID / TESSERA_ATTEMPT), the steps and checkpoints the
chaos trainer (tests/chaos/steptrainer.py) logged with their times, and the checkpoint folders.

1. every submitted job exists exactly once, and ends at most once (one terminal event, the last);
2. nothing pending is forgotten: every job not finished is PENDING with a reason, or STARTING,
   RUNNING or MIGRATING with a placement;
3. every running worker process belongs to the current attempt of an active job the controller
   knows (a stale one may linger while it is being stopped: `settle` seconds);
4. no two attempts of a job train at once: the steps of an older attempt end before the first step
   of a newer one, give or take `overlap_bound` seconds (the fencing bound; the goal is zero);
5. no checkpoint was written by a stale attempt: none of attempt A after attempt B > A started (the
   PLACED/MIGRATED event of B), neither in the trainer's log nor in the folders (meta.json `attempt`
   and `time`); where the fencing part's FENCE file exists, no promoted checkpoint carries an attempt
   above it;
6. with the agents' logs: no (job, attempt) was launched twice on a node.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.clients.sdk import Client
from tessera.common.localcluster import Daemon
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2

TERMINAL = {P.JOB_STATE_SUCCEEDED, P.JOB_STATE_FAILED, P.JOB_STATE_CANCELLED}
PLACED_STATES = {P.JOB_STATE_STARTING, P.JOB_STATE_RUNNING, P.JOB_STATE_MIGRATING}
TERMINAL_EVENTS = {"SUCCEEDED", "FAILED", "CANCELLED"}
_ATTEMPT_START = re.compile(r"^attempt (\d+):")


class InvariantViolation(AssertionError):
    pass


@dataclass(frozen=True)
class WorkerProc:
    pid: int
    job_id: str
    attempt: int
    state: str  # /proc stat state: R, S, T (stopped), ...


def worker_processes(job_ids: Iterable[str]) -> list[WorkerProc]:
    """Live processes (not zombies) whose environment names one of these jobs (root reads every
    process's environ; another user's tests on this machine have other job ids)."""
    wanted = set(job_ids)
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            stat = (d / "stat").read_text()
        except OSError:
            continue
        kv = dict(e.split(b"=", 1) for e in env if b"=" in e)
        job = kv.get(b"TESSERA_JOB_ID", b"").decode(errors="replace")
        if job not in wanted:
            continue
        state = stat.rpartition(")")[2].split()[0]
        if state in ("Z", "X"):
            continue
        out.append(WorkerProc(int(d.name), job, int(kv.get(b"TESSERA_ATTEMPT", b"0") or 0), state))
    return out


@dataclass(frozen=True)
class StepLine:
    job: str
    attempt: int
    rank: int
    kind: str  # "step" | "checkpoint"
    iteration: int
    t: float


def step_lines(step_log: Path | None, job_id: str) -> list[StepLine]:
    if step_log is None:
        return []
    path = step_log / f"{job_id}.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            d = json.loads(line)
            out.append(StepLine(d["job"], int(d["attempt"]), int(d["rank"]), d["kind"], int(d["iteration"]),
                                float(d["t"])))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by a SIGKILL mid-write
    return out


def attempt_starts(job: controller_pb2.Job) -> dict[int, float]:
    """When the controller started each attempt: its PLACED or MIGRATED event ("attempt N: ...")."""
    out: dict[int, float] = {}
    for e in job.events:
        m = _ATTEMPT_START.match(e.message)
        if e.kind in ("PLACED", "MIGRATED") and m:
            out.setdefault(int(m.group(1)), e.time)
    return out


def overlap_seconds(lines: Sequence[StepLine]) -> float:
    """The longest time an older attempt kept stepping after a newer one's first step."""
    spans: dict[int, tuple[float, float]] = {}
    for s in lines:
        if s.kind != "step":
            continue
        lo, hi = spans.get(s.attempt, (s.t, s.t))
        spans[s.attempt] = (min(lo, s.t), max(hi, s.t))
    worst = 0.0
    for a, (_, end_a) in spans.items():
        for b, (start_b, _) in spans.items():
            if b > a:
                worst = max(worst, end_a - start_b)
    return worst


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    overlap: dict[str, float] = field(default_factory=dict)

    def add(self, why: str) -> None:
        self.violations.append(why)


@dataclass
class Checker:
    """What to check: the jobs the test submitted and where their traces are. `overlap_bound`:
    seconds two attempts may train at once (the fencing bound; 0 = none)."""

    # A connected client (Cluster.client: whatever credentials the cluster needs).
    client: Callable[[], Client]
    submitted: list[str]
    step_log: Path | None = None
    checkpoint_root: Path | None = None
    agents: Sequence[Daemon] = ()
    overlap_bound: float = 0.0

    def snapshot(self) -> Report:
        r = Report()
        with self.client() as c:
            listed = [j.id for j in c.list()]
            jobs = {i: c.get(i, with_events=True) for i in self.submitted}
        self._exist_once(r, listed, jobs)
        for job in jobs.values():
            self._not_forgotten(r, job)
            self._history(r, job)
        self._workers(r, jobs)
        self._folders(r, jobs)
        self._launches(r)
        return r

    def check(self, settle: float = 0.0) -> Report:
        """Raise InvariantViolation unless every invariant holds, polling for up to `settle`
        seconds (stale workers being stopped, a round in progress)."""
        deadline = time.monotonic() + settle
        while True:
            r = self.snapshot()
            if not r.violations or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if r.violations:
            raise InvariantViolation("\n".join(r.violations))
        return r

    # ------------------------------------------------------------------ the invariants

    def _exist_once(self, r: Report, listed: list[str], jobs: dict[str, controller_pb2.Job]) -> None:
        counts = Counter(listed)
        for i in self.submitted:
            if counts[i] != 1:
                r.add(f"job {i} listed {counts[i]} times")
            if jobs[i].id != i:
                r.add(f"job {i} answered as {jobs[i].id!r}")
        for j in jobs.values():
            kinds = [e.kind for e in j.events]
            terminal = [k for k in kinds if k in TERMINAL_EVENTS]
            if len(terminal) > 1:
                r.add(f"job {j.id} ended {len(terminal)} times: {kinds}")
            if terminal and j.state not in TERMINAL:
                r.add(f"job {j.id} is {P.JobState.Name(j.state)} after its {terminal[0]} event: {kinds}")

    def _not_forgotten(self, r: Report, job: controller_pb2.Job) -> None:
        if job.state in TERMINAL:
            return
        if job.state == P.JOB_STATE_PENDING:
            if not job.reason:
                r.add(f"job {job.id} PENDING without a reason")
        elif job.state in PLACED_STATES:
            if not job.placement.slices:
                r.add(f"job {job.id} {P.JobState.Name(job.state)} without a placement")
        else:
            r.add(f"job {job.id} in state {P.JobState.Name(job.state)}")

    def _history(self, r: Report, job: controller_pb2.Job) -> None:
        lines = step_lines(self.step_log, job.id)
        ov = overlap_seconds(lines)
        r.overlap[job.id] = ov
        if ov > self.overlap_bound:
            r.add(f"job {job.id}: an older attempt trained {ov:.2f}s after a newer one started "
                  f"(bound {self.overlap_bound:.2f}s)")
        starts = attempt_starts(job)
        for s in lines:
            if s.kind == "checkpoint":
                self._stale_checkpoint(r, job.id, s.attempt, s.t, starts, f"logged checkpoint step {s.iteration}")

    @staticmethod
    def _stale_checkpoint(r: Report, job_id: str, attempt: int, t: float, starts: dict[int, float],
                          what: str) -> None:
        newer = [b for b, tb in starts.items() if b > attempt and tb < t]
        if newer:
            r.add(f"job {job_id}: {what} written by attempt {attempt} {t - starts[min(newer)]:.2f}s after "
                  f"attempt {min(newer)} started")

    def _workers(self, r: Report, jobs: dict[str, controller_pb2.Job]) -> None:
        by_job: dict[str, set[int]] = defaultdict(set)
        for w in worker_processes(self.submitted):
            job = jobs.get(w.job_id)
            by_job[w.job_id].add(w.attempt)
            if job is None or job.state in TERMINAL or job.state == P.JOB_STATE_PENDING:
                r.add(f"worker pid {w.pid} of {w.job_id} attempt {w.attempt} runs while the job is "
                      f"{'unknown' if job is None else P.JobState.Name(job.state)}")
            elif w.attempt != job.attempt:
                r.add(f"worker pid {w.pid} of {w.job_id} attempt {w.attempt} runs; the current attempt is "
                      f"{job.attempt}")
        for job_id, attempts in by_job.items():
            if len(attempts) > 1:
                r.add(f"job {job_id}: workers of attempts {sorted(attempts)} alive at once")

    def _folders(self, r: Report, jobs: dict[str, controller_pb2.Job]) -> None:
        if self.checkpoint_root is None:
            return
        for job in jobs.values():
            root = self.checkpoint_root / job.id
            if not root.is_dir():
                continue
            fence = _read_int(root / "FENCE")
            starts = attempt_starts(job)
            for meta_path in root.glob("step-*/meta.json"):
                meta = _read_json(meta_path)
                if meta is None or "attempt" not in meta:
                    continue  # the reference trainer does not record its attempt
                attempt, t = int(meta["attempt"]), float(meta.get("time", 0.0))
                self._stale_checkpoint(r, job.id, attempt, t, starts, f"checkpoint {meta_path.parent.name}")
                if fence is not None and attempt > fence:
                    r.add(f"job {job.id}: {meta_path.parent.name} by attempt {attempt} above FENCE {fence}")
                if attempt > job.attempt:
                    r.add(f"job {job.id}: {meta_path.parent.name} by attempt {attempt}, the controller's "
                          f"is {job.attempt}")

    def _launches(self, r: Report) -> None:
        launches: Counter[tuple[str, int, str]] = Counter()
        for a in self.agents:
            for e in a.events():
                if e.get("event") == "attempt launched" and e.get("job_id") in self.submitted:
                    launches[(e["job_id"], int(e["attempt"]), a.name)] += 1
        for key, n in launches.items():
            if n > 1:
                r.add(f"{key[0]} attempt {key[1]} launched {n} times on {key[2]}")


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def step_log_dir(root: Path) -> Path:
    """A step-log folder every worker can write, whatever uid the agent runs it as."""
    d = root / "steps"
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o1777)
    return d
