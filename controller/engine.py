"""The controller's engine: turns submissions, heartbeats and rounds into stored state and agent calls.

Every state change is written to the store before the agent call that acts on it, so a controller
killed at any point restarts into a state it can reconcile: a job marked STARTING whose workers never
appeared is launched again under the same attempt number, which agents treat as a no-op if they had
already started it.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import structlog

from tessera.common.gpus import CATALOG
from tessera.common.rpc import host_of
from tessera.controller import metrics
from tessera.controller.agents import AgentClients
from tessera.controller.cell_estimates import CellEstimates, MeasuredKey
from tessera.controller.convert import placement_pb, plan_pb
from tessera.controller.core import frenzy, launchers
from tessera.controller.core.attempts import RankStatus, judge, stalled
from tessera.controller.core.policies import make_policy
from tessera.controller.core.policies.crius import CriusOptions, CriusPolicy
from tessera.controller.core.policies.frenzy import FrenzyPolicy
from tessera.controller.core.policy import CachedEstimates, CellEstimate, Policy, RoundConfig, plan_round
from tessera.controller.core.snapshot import (
    Cell,
    Decision,
    GpuView,
    JobView,
    NodeView,
    PlanChoice,
    RoundPlan,
    RunningView,
    Slice,
    Snapshot,
)
from tessera.controller.core.step_times import Learned, StepTimeConfig, StepTimes
from tessera.controller.core.validate import canonical_gpu_types, resolve_model
from tessera.controller.estimator_feed import EstimatorFeed, step_times_request
from tessera.controller.registry import LivenessConfig, LiveNode, index_workers, liveness_at
from tessera.controller.store import ACTIVE, TERMINAL, EventRecord, JobRecord, NodeRecord, Store
from tessera.v1 import agent_pb2, common_pb2

P = common_pb2
log = structlog.get_logger("controller")

@dataclass(frozen=True)
class EngineConfig:
    round_interval_s: float = 300.0
    inspect_interval_s: float = 20.0
    debounce_s: float = 1.0
    stop_grace_s: float = 30.0
    checkpoint_root: str = "/var/lib/tessera/checkpoints"
    policy: str = "crius"
    policy_mode: str = "paper"
    search_depth: int = 3
    round_budget_s: float = 10.0
    min_gain: float = 0.2
    start_timeout_s: float = 300.0
    progress_timeout_s: float = 900.0
    port_base: int = 29500
    port_count: int = 2000
    # Whose step times the estimates learn from: "nvml" (nodes whose GPUs were probed), "all"
    # (declared inventories too: only for demos and tests, where a CPU process stands in for the
    # declared GPU and its step times say nothing about that GPU), or "off".
    learn_step_times: str = "nvml"
    # host:port of a tessera-estimator that receives the step times too ("" = none).
    estimator: str = ""
    step_times: StepTimeConfig = field(default_factory=StepTimeConfig)
    liveness: LivenessConfig = field(default_factory=LivenessConfig)
    frenzy: frenzy.FrenzyConfig = field(default_factory=frenzy.FrenzyConfig)


@dataclass
class AttemptClock:
    attempt: int
    launched: float
    progress_at: float | None = None
    # Set on the attempt a migration started: when the stop was requested.
    migration_started: float | None = None


@dataclass(frozen=True)
class Move:
    decision: Decision
    requested: float  # monotonic


class JobNotFound(Exception):
    pass


class NodeNotFound(Exception):
    pass


class Engine:
    def __init__(self, store: Store, agents: AgentClients, cfg: EngineConfig, epoch: int,
                 wall: Callable[[], float] = time.time, mono: Callable[[], float] = time.monotonic) -> None:
        self.store, self.agents, self.cfg, self.epoch = store, agents, cfg, epoch
        self.wall, self.mono = wall, mono
        self.nodes: dict[str, LiveNode] = {}
        self.progress: dict[str, common_pb2.Progress] = {}
        # Launch and last-progress times of each active attempt (monotonic, in memory).
        self._clocks: dict[str, AttemptClock] = {}
        # Migrations under way: the round's decision, until the old attempt has stopped.
        self._moves: dict[str, Move] = {}
        self._estimates_cache: tuple[object, CachedEstimates] | None = None
        # Cells' measured iteration times (kept across estimate rebuilds; in memory: a restarted
        # controller learns them again from the next reports).
        self.step_times = StepTimes(cfg.step_times)
        self.measured: dict[MeasuredKey, float] = {}
        self.estimator_feed = EstimatorFeed(cfg.estimator) if cfg.estimator else None
        self.policy: Policy
        if cfg.policy == "frenzy":
            self.policy = FrenzyPolicy(cfg.frenzy)
        elif cfg.policy == "crius":
            # A restart costs real time on a live cluster: a running job moves only for a clear gain.
            self.policy = CriusPolicy(CriusOptions(mode=cfg.policy_mode, upgrade_min_gain=cfg.min_gain))
        else:
            self.policy = make_policy(cfg.policy, cfg.policy_mode)
        self._kick = asyncio.Event()
        self._changed = asyncio.Condition()
        self._round_lock = asyncio.Lock()
        self.started_mono = mono()
        self.rounds = 0
        self.records: dict[str, NodeRecord] = {r.id: r for r in store.list_nodes()}
        for rec in self.records.values():
            # Known from before a restart: unknown liveness until the agent registers again.
            self.nodes[rec.id] = LiveNode(rec.id, rec.address, rec.inventory, agent_pb2.NodeStatus(),
                                          last_seen=self.started_mono, last_seen_wall=0.0)

    # ---------------------------------------------------------------- notifications

    def kick(self) -> None:
        """Ask for a scheduling round soon (debounced)."""
        self._kick.set()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_changed(self, timeout: float) -> None:
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except TimeoutError:
                pass

    async def _save(self, job: JobRecord, events: list[tuple[str, str]]) -> list[EventRecord]:
        evs = self.store.save_job(job, self.wall(), events)
        if job.state not in ACTIVE:  # its record now holds the last progress
            self._clocks.pop(job.id, None)
            self.progress.pop(job.id, None)
            self.step_times.forget(job.id)
        for kind, msg in events:
            log.info("job_event", job_id=job.id, kind=kind, message=msg, attempt=job.attempt)
        await self._notify()
        return evs

    # ---------------------------------------------------------------- client API

    async def submit(self, spec: common_pb2.JobSpec, request_id: str) -> tuple[JobRecord, bool]:
        if not spec.tenant:
            spec.tenant = "default"
        job_id = "j-" + uuid.uuid4().hex[:12]
        rec = JobRecord(id=job_id, request_id=request_id, spec=spec, state=P.JOB_STATE_PENDING,
                        reason="waiting for the next scheduling round", submit_time=self.wall())
        stored, created = self.store.create_job(rec, ("SUBMITTED", f"submitted by tenant {spec.tenant}"))
        if created:
            log.info("job_submitted", job_id=job_id, name=spec.name, tenant=spec.tenant)
            metrics.JOBS_SUBMITTED.inc()
            await self._notify()
            self.kick()
        return stored, created

    def get(self, job_id: str) -> JobRecord:
        job = self.store.get_job(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job

    async def cancel(self, job_id: str) -> JobRecord:
        job = self.get(job_id)
        if job.state in TERMINAL:
            return job
        was_active = job.state in ACTIVE
        job = job.with_(state=P.JOB_STATE_CANCELLED, reason="cancelled by user", end_time=self.wall(),
                        stop_requested=True)
        await self._save(job, [("CANCELLED", "cancelled by user")])
        if was_active:
            await self._stop_attempt(job, "job cancelled")
        self.kick()
        return job

    async def drain(self, node_id: str, reason: str) -> NodeRecord:
        rec = self.records.get(node_id)
        if rec is None:
            raise NodeNotFound(node_id)
        rec = NodeRecord(rec.id, rec.address, rec.inventory, True, reason or "drained by admin")
        self._put_node(rec)
        log.info("node_drain", node_id=node_id, reason=rec.drain_reason)
        live = self.nodes.get(node_id)
        if live is not None and live.liveness == P.NODE_STATE_READY:
            await self.agents.drain(live.address, self.epoch, True)
        for job in self._jobs_on(node_id):
            if job.state != P.JOB_STATE_MIGRATING:
                await self._migrate_off(job, f"node {node_id} is draining: {rec.drain_reason}")
        await self._notify()
        return rec

    async def undrain(self, node_id: str) -> NodeRecord:
        rec = self.records.get(node_id)
        if rec is None:
            raise NodeNotFound(node_id)
        rec = NodeRecord(rec.id, rec.address, rec.inventory, False, "")
        self._put_node(rec)
        live = self.nodes.get(node_id)
        if live is not None and live.liveness == P.NODE_STATE_READY:
            await self.agents.drain(live.address, self.epoch, False)
        self.kick()
        await self._notify()
        return rec

    def _put_node(self, rec: NodeRecord) -> None:
        self.store.put_node(rec)
        self.records[rec.id] = rec

    def node_state(self, node_id: str) -> tuple[int, str]:
        """Admin state over liveness: DRAINING/DRAINED win while the node is alive."""
        rec = self.records.get(node_id)
        live = self.nodes.get(node_id)
        liveness = live.liveness if live else P.NODE_STATE_UNREACHABLE
        if liveness != P.NODE_STATE_READY:
            age = self.mono() - live.last_seen if live else 0.0
            why = "not registered since the controller started" if live and not live.registered \
                else f"no heartbeat for {age:.0f}s"
            return liveness, why
        if rec is not None and rec.drained:
            if self._jobs_on(node_id) or (live and self._running_gpus(live)):
                return P.NODE_STATE_DRAINING, rec.drain_reason
            return P.NODE_STATE_DRAINED, rec.drain_reason
        return P.NODE_STATE_READY, ""

    def busy_gpus(self, exclude: str = "") -> dict[str, set[int]]:
        """GPUs held per node: by active attempts' placements, by the targets of migrations under way,
        and by any worker an agent reports running (all but job `exclude`'s own)."""
        busy: dict[str, set[int]] = {n: self._running_gpus(live, exclude) for n, live in self.nodes.items()}
        for job in self.store.list_jobs(states=ACTIVE):
            if job.id == exclude:
                continue
            for s in job.placement.slices if job.placement else ():
                busy.setdefault(s.node_id, set()).update(s.gpu_indices)
        for job_id, move in self._moves.items():
            if job_id != exclude:
                for sl in move.decision.slices:
                    busy.setdefault(sl.node_id, set()).update(sl.gpu_indices)
        return busy

    @staticmethod
    def _running_gpus(live: LiveNode, exclude: str = "") -> set[int]:
        return {i for (job_id, _), ws in live.running.items() if job_id != exclude for w in ws
                if w.state != P.WORKER_STATE_EXITED for i in w.gpu_indices}

    # ---------------------------------------------------------------- agents

    async def register(self, status: agent_pb2.NodeStatus) -> None:
        node_id = status.node_id
        rec = self.records.get(node_id)
        if rec is None or rec.address != status.address or rec.inventory != status.inventory:
            drained = rec.drained if rec else False
            self._put_node(NodeRecord(node_id, status.address, status.inventory, drained,
                                      rec.drain_reason if rec else ""))
        now = self.mono()
        live = LiveNode(node_id, status.address, status.inventory, status, now, self.wall(), registered=True)
        old = self.nodes.get(node_id)
        self.nodes[node_id] = live
        log.info("node_registered", node_id=node_id, address=status.address, gpus=len(status.inventory.gpus),
                 source=P.InventorySource.Name(status.inventory.source), workers=len(status.workers),
                 returned=old is not None)
        if self.records[node_id].drained != status.draining:
            # The admin's word, kept by the controller, wins over what the agent remembers.
            await self.agents.drain(status.address, self.epoch, self.records[node_id].drained)
        await self._observe(live, status)
        await self._liveness_tick()
        self.kick()

    async def heartbeat(self, status: agent_pb2.NodeStatus, epoch: int) -> bool:
        """Record a heartbeat; False when the agent must register again."""
        live = self.nodes.get(status.node_id)
        if live is None or not live.registered or epoch != self.epoch or live.address != status.address:
            return False
        live.last_seen, live.last_seen_wall, live.status = self.mono(), self.wall(), status
        await self._observe(live, status)
        if live.liveness != P.NODE_STATE_READY:
            await self._liveness_tick()
        return True

    async def _observe(self, live: LiveNode, status: agent_pb2.NodeStatus) -> None:
        """Fold a node's reported workers into job states."""
        previous = live.running
        live.running = index_workers(status)
        touched = {k[0] for k in live.running} | {k[0] for k in previous}
        for job_id in touched:
            job = self.store.get_job(job_id)
            workers = live.running.get((job_id, job.attempt)) if job else None
            await self._stop_stale(live, job_id, job)
            if job is None or job.state not in ACTIVE:
                continue
            # Rank 0 of the current attempt speaks for the job (an attempt resumed from an older
            # checkpoint may report a lower iteration than the previous attempt's last report).
            r0 = [w for w in workers or () if w.rank == 0 and w.HasField("progress")]
            if r0:
                if r0[0].progress != self.progress.get(job_id):
                    clock = self._clocks.get(job_id)
                    if clock is not None and clock.attempt == job.attempt:
                        clock.progress_at = self.mono()
                        if clock.migration_started is not None:
                            total = clock.progress_at - clock.migration_started
                            first = clock.progress_at - clock.launched
                            clock.migration_started = None
                            metrics.MIGRATION_SECONDS.observe(total)
                            self.store.save_job(job, self.wall(), [(
                                "RESUMED", (f"first progress of attempt {job.attempt} {first:.1f}s after relaunch; "
                                           f"migration cost {total:.1f}s (stop + restart + first report)"))])
                    await self._learn(job, r0[0].progress)
                self.progress[job_id] = r0[0].progress
            await self._evaluate(job)

    async def _stop_stale(self, live: LiveNode, job_id: str, job: JobRecord | None) -> None:
        for (jid, attempt), ws in live.running.items():
            stale = job is None or job.state not in ACTIVE or attempt != job.attempt
            if jid == job_id and stale and any(w.state != P.WORKER_STATE_EXITED for w in ws):
                await self.agents.stop(live.address, self.epoch, job_id, attempt, self.cfg.stop_grace_s,
                                       "stale attempt: not the job's current attempt")

    def _rank_statuses(self, job: JobRecord) -> dict[int, RankStatus]:
        out: dict[int, RankStatus] = {}
        for s in job.placement.slices if job.placement else ():
            live = self.nodes.get(s.node_id)
            if live is None:
                continue
            for w in live.running.get((job.id, job.attempt), []):
                out[w.rank] = RankStatus(w.rank, w.state != P.WORKER_STATE_EXITED, w.exit_code, w.reason,
                                         w.progress.iteration if w.HasField("progress") else 0)
        return out

    async def _evaluate(self, job: JobRecord) -> None:
        if job.state not in ACTIVE or job.plan is None:
            return
        world = self._processes(job)
        verdict = judge(world, self._rank_statuses(job), job.spec.iterations, job.stop_requested)
        prog = self.progress.get(job.id, job.progress)
        if verdict.kind == "running" and job.state == P.JOB_STATE_STARTING:
            await self._save(job.with_(state=P.JOB_STATE_RUNNING, reason="training", progress=prog),
                             [("RUNNING", f"all {world} ranks running (attempt {job.attempt})")])
        elif verdict.kind == "succeeded":
            await self._save(job.with_(state=P.JOB_STATE_SUCCEEDED, reason=verdict.reason, end_time=self.wall(),
                                       progress=prog),
                             [("SUCCEEDED", verdict.reason)])
            metrics.JOBS_FINISHED.labels("succeeded").inc()
            self.kick()
        elif verdict.kind == "failed":
            reason = verdict.reason
            last = await self._last_log_line(job, verdict.rank)
            if last:
                reason += f"; last log line: {last}"
            await self._attempt_failed(job, reason)
        elif verdict.kind == "interrupted":
            await self._stop_attempt(job, "another rank was interrupted")
            await self._requeue(job, f"attempt {job.attempt} interrupted: {verdict.reason}", "REQUEUED")
        elif verdict.kind == "stopped":
            move = self._moves.pop(job.id, None)
            if move is not None and job.state == P.JOB_STATE_MIGRATING:
                d = move.decision
                stopped_in = self.mono() - move.requested
                if d.plan is not None and self._target_free(job, d.slices):
                    await self._start_attempt(
                        job.with_(restarts=job.restarts + 1), d.plan, d.slices,
                        f"{d.reason} (attempt {job.attempt} stopped in {stopped_in:.1f}s)", "MIGRATED")
                    self._clocks[job.id].migration_started = move.requested
                    metrics.MIGRATIONS.inc()
                    return
                await self._requeue(job, f"migration target no longer free after {stopped_in:.1f}s", "STOPPED")
                return
            if job.state == P.JOB_STATE_MIGRATING or job.stop_requested:
                await self._requeue(job, job.reason or "stopped for migration", "STOPPED")
            elif job.retries < job.spec.max_retries:
                await self._requeue(job, f"attempt {job.attempt} exited 0 before iteration {job.spec.iterations}",
                                    "ATTEMPT_FAILED", retry=True)
            else:
                why = f"program exited 0 before reaching {job.spec.iterations} iterations"
                await self._save(job.with_(state=P.JOB_STATE_FAILED, reason=why, end_time=self.wall(),
                                           progress=prog), [("FAILED", why)])
                self.kick()

    async def _attempt_failed(self, job: JobRecord, reason: str) -> None:
        """Stop what is left of the attempt; retry within max_retries, else fail the job."""
        await self._stop_attempt(job, "another rank failed")
        if job.retries < job.spec.max_retries:
            why = f"attempt {job.attempt} failed: {reason}; retry {job.retries + 1} of {job.spec.max_retries}"
            await self._requeue(job, why, "ATTEMPT_FAILED", retry=True)
            return
        why = f"attempt {job.attempt} failed: {reason}"
        if job.spec.max_retries:
            why += f" (after {job.retries} retries)"
        await self._save(job.with_(state=P.JOB_STATE_FAILED, reason=why, end_time=self.wall(),
                                   progress=self.progress.get(job.id, job.progress)), [("FAILED", why)])
        metrics.JOBS_FINISHED.labels("failed").inc()
        self.kick()

    async def _last_log_line(self, job: JobRecord, rank: int) -> str:
        """The last non-empty line of a rank's log (its error, usually); empty when unavailable."""
        if rank < 0 or job.placement is None:
            return ""
        per_node = launchers.template_of(job.spec.launcher).per_node
        first = 0
        for i, s in enumerate(job.placement.slices):
            n = 1 if per_node else len(s.gpu_indices)
            if (per_node and i == rank) or (not per_node and first <= rank < first + n):
                live = self.nodes.get(s.node_id)
                if live is None or live.liveness != P.NODE_STATE_READY:
                    return ""
                try:
                    resp = await self.agents.read_log(live.address, agent_pb2.ReadLogRequest(
                        controller_epoch=self.epoch, job_id=job.id, attempt=job.attempt, rank=rank,
                        tail_bytes=4096))
                except grpc.aio.AioRpcError:
                    return ""
                lines = [ln.strip() for ln in resp.data.decode(errors="replace").splitlines() if ln.strip()]
                return lines[-1][:300] if lines else ""
            first += n
        return ""

    async def _requeue(self, job: JobRecord, why: str, kind: str, retry: bool = False) -> None:
        job = job.with_(state=P.JOB_STATE_PENDING, reason=f"requeued: {why}", restarts=job.restarts + 1,
                        retries=job.retries + (1 if retry else 0), stop_requested=False,
                        progress=self.progress.get(job.id, job.progress))
        await self._save(job, [(kind, why)])
        metrics.REQUEUES.inc()
        self.kick()

    async def _stop_attempt(self, job: JobRecord, reason: str) -> None:
        for s in job.placement.slices if job.placement else ():
            live = self.nodes.get(s.node_id)
            if live is not None and live.liveness == P.NODE_STATE_READY:
                await self.agents.stop(live.address, self.epoch, job.id, job.attempt, self.cfg.stop_grace_s, reason)

    async def _migrate_off(self, job: JobRecord, why: str) -> None:
        job = job.with_(state=P.JOB_STATE_MIGRATING, reason=why, stop_requested=True)
        await self._save(job, [("MIGRATING", f"{why}: stopping attempt {job.attempt} with a checkpoint")])
        await self._stop_attempt(job, why)
        await self._evaluate(job)

    def _jobs_on(self, node_id: str) -> list[JobRecord]:
        return [j for j in self.store.list_jobs(states=ACTIVE)
                if j.placement and any(s.node_id == node_id for s in j.placement.slices)]

    # ---------------------------------------------------------------- liveness and inspection

    async def _liveness_tick(self) -> None:
        now = self.mono()
        for live in list(self.nodes.values()):
            new = liveness_at(live, now, self.cfg.liveness)
            if new != live.liveness:
                old, live.liveness = live.liveness, new
                log.info("node_liveness", node_id=live.id, old=P.NodeState.Name(old), new=P.NodeState.Name(new))
                if new == P.NODE_STATE_READY:
                    self.kick()
            if new == P.NODE_STATE_READY or now - live.last_seen <= self.cfg.liveness.lease_s:
                continue
            # Past its lease (or never back since a controller restart): its jobs are lost there.
            for job in self._jobs_on(live.id):
                await self._stop_attempt(job, f"node {live.id} lost")
                await self._requeue(job, f"node {live.id} is {P.NodeState.Name(new)[11:]} "
                                         f"(no heartbeat within the {self.cfg.liveness.lease_s:g}s lease)",
                                    "NODE_LOST")
        await self._notify()

    async def inspect(self) -> None:
        """Periodic pass over running jobs: persist progress, relaunch missing ranks, fail hung
        attempts, evaluate."""
        now = self.mono()
        for job in self.store.list_jobs(states=ACTIVE):
            prog = self.progress.get(job.id)
            if prog is not None and (job.progress is None or prog.iteration != job.progress.iteration):
                job = job.with_(progress=prog)
                self.store.save_job(job, self.wall())
            if job.state == P.JOB_STATE_STARTING:
                await self._launch(job, only_missing=True)
            # Unknown since a controller restart: the clock starts now, with a full timeout.
            clock = self._clocks.setdefault(job.id, AttemptClock(job.attempt, now))
            timeout = job.spec.progress_timeout_seconds or self.cfg.progress_timeout_s
            hung = None if job.stop_requested else stalled(
                now, clock.launched, clock.progress_at, job.state == P.JOB_STATE_STARTING,
                self.cfg.start_timeout_s, timeout)
            if hung:
                await self._attempt_failed(job, hung)
                continue
            await self._evaluate(job)

    # ---------------------------------------------------------------- rounds

    def _job_view(self, j: JobRecord) -> JobView:
        prog = self.progress.get(j.id, j.progress)
        return JobView(j.id, j.submit_time, resolve_model(j.spec.model), j.spec.global_batch_size,
                       j.spec.hint.gpus, canonical_gpu_types(j.spec), iterations=j.spec.iterations,
                       done_iterations=float(prog.iteration) if prog else 0.0, restarts=j.restarts)

    def snapshot(self) -> tuple[Snapshot, dict[str, JobRecord]]:
        nodes: list[NodeView] = []
        totals: dict[tuple[str, int], int] = {}
        busy = self.busy_gpus()
        gpu_type: dict[tuple[str, int], str] = {}
        for rec in sorted(self.records.values(), key=lambda r: r.id):
            for g in rec.inventory.gpus:
                totals[(g.model, g.memory_bytes)] = totals.get((g.model, g.memory_bytes), 0) + 1
            state, _ = self.node_state(rec.id)
            if state != P.NODE_STATE_READY:
                continue
            live = self.nodes[rec.id]
            gpus = tuple(GpuView(g.index, g.model, g.memory_bytes, g.foreign_used_bytes,
                                 island=0 if g.nvlink_peers else -1) for g in live.inventory.gpus)
            gpu_type.update(((rec.id, g.index), g.model) for g in live.inventory.gpus)
            nodes.append(NodeView(rec.id, gpus, frozenset(busy.get(rec.id, ()))))
        pending = self.store.list_jobs(states=[P.JOB_STATE_PENDING])
        views = tuple(self._job_view(j) for j in pending)
        running: list[RunningView] = []
        for j in self.store.list_jobs(states=[P.JOB_STATE_STARTING, P.JOB_STATE_RUNNING]):
            if j.plan is None or j.placement is None:
                continue
            types = {gpu_type.get((s.node_id, i)) for s in j.placement.slices for i in s.gpu_indices}
            if len(types) != 1 or None in types:
                continue  # on a node not READY, or a mixed-type gang: its GPUs stay busy, untouched
            (t,) = types
            slices = tuple(Slice(s.node_id, tuple(s.gpu_indices)) for s in j.placement.slices)
            p = j.plan
            choice = PlanChoice(p.dp, p.tp, p.pp, p.micro_batch, p.grad_accum, p.gpu_model,
                                p.memory_per_gpu_bytes, p.memory_source)
            running.append(RunningView(self._job_view(j), Cell(str(t), p.dp * p.tp * p.pp, p.pp), slices, choice,
                                       since=j.start_time))
        cluster = tuple(sorted((m, b, c) for (m, b), c in totals.items()))
        snap = Snapshot(tuple(nodes), views, cluster, running=tuple(running), now=self.wall())
        return snap, {j.id: j for j in pending}

    def _estimates(self) -> CachedEstimates:
        """Cell estimates over the registered GPU pools, memoised across rounds until the pools change."""
        pools: dict[str, tuple[int, int, bool]] = {}
        for rec in self.records.values():
            per: dict[str, int] = {}
            nvl: dict[str, bool] = {}
            for g in rec.inventory.gpus:
                per[g.model] = per.get(g.model, 0) + 1
                nvl[g.model] = nvl.get(g.model, False) or bool(g.nvlink_peers)
            for m, n in per.items():
                tot, most, nv = pools.get(m, (0, 0, False))
                pools[m] = (tot + n, max(most, n), nv or nvl[m])
        key = tuple(sorted(pools.items()))
        if self._estimates_cache is None or self._estimates_cache[0] != key:
            known = {m: v for m, v in pools.items() if m in CATALOG}
            self._estimates_cache = (key, CachedEstimates(CellEstimates(known, measured=self.measured)))
        return self._estimates_cache[1]

    def _learnable(self, job: JobRecord) -> tuple[str, list[int]] | None:
        """(GPU type, GPUs per node) of the job's placement when its step times may be learned from."""
        if self.cfg.learn_step_times == "off" or job.plan is None or job.placement is None:
            return None
        types: set[str] = set()
        per_node: list[int] = []
        for s in job.placement.slices:
            rec = self.records.get(s.node_id)
            if rec is None:
                return None
            if self.cfg.learn_step_times == "nvml" and rec.inventory.source != P.INVENTORY_SOURCE_NVML:
                return None  # a declared GPU: the worker's step time is not that GPU's
            by_index = {g.index: g.model for g in rec.inventory.gpus}
            types.update(by_index.get(i, "") for i in s.gpu_indices)
            per_node.append(len(s.gpu_indices))
        if len(types) != 1 or not (t := types.pop()) or t not in CATALOG:
            return None
        return t, per_node

    async def _learn(self, job: JobRecord, progress: common_pb2.Progress) -> None:
        """A new rank-0 report: the Cell's measured iteration time, for the next rounds' estimates
        and, with --estimator, for the estimator service's online refit."""
        where = self._learnable(job)
        if where is None:
            return
        learned = self.step_times.add(job.id, job.attempt, progress.iteration, progress.step_time_seconds,
                                      progress.time)
        if learned is None:
            return
        gpu_type, per_node = where
        assert job.plan is not None
        p = job.plan
        view = self._job_view(job)
        cell = Cell(gpu_type, p.dp * p.tp * p.pp, p.pp)
        estimates = self._estimates()
        # The estimate being replaced, for the event (a Cell computation: only the first time).
        before = ([c for c in estimates.cells(view, gpu_type, cell.gpus, len(per_node)) if c.cell == cell]
                  if learned.first else [])
        inner = estimates.inner
        assert isinstance(inner, CellEstimates)
        key = inner.record_measured(view, cell, learned.seconds)
        if key is not None:
            self.measured[key] = learned.seconds
            estimates.forget(view.key)
            metrics.MEASURED_CELLS.inc()
        current = self.store.get_job(job.id)  # as stored now: nothing else of the job may be overwritten
        if learned.first and current is not None and current.attempt == job.attempt:
            await self._save(current, [("MEASURED", self._measured_text(cell, learned, before))])
        if self.estimator_feed is not None:
            self.estimator_feed.send(step_times_request(job, view.model, gpu_type, per_node, learned, view.key))

    @staticmethod
    def _measured_text(cell: Cell, learned: Learned, before: list[CellEstimate]) -> str:
        text = f"Cell {cell}: measured {learned.seconds:.4g} s/iteration (median of {learned.samples} steps)"
        if before and before[0].source != "measured":
            est = before[0].iteration_s
            off = 100 * (est - learned.seconds) / learned.seconds
            text += f"; estimated {est:.4g} s ({before[0].source}), {abs(off):.0f}% too {'high' if off > 0 else 'low'}"
        return text + "; the next rounds use the measured time"

    async def run_round(self) -> None:
        async with self._round_lock:
            t0 = time.perf_counter()
            snap, pending = self.snapshot()
            rcfg = RoundConfig(search_depth=self.cfg.search_depth, interval_s=self.cfg.round_interval_s,
                               time_budget_s=self.cfg.round_budget_s, clock=time.monotonic)
            if snap.cluster_gpus:
                plan = plan_round(snap, self._estimates(), self.policy, rcfg)
            else:  # whatever the policy, nothing can be placed or estimated yet
                plan = RoundPlan(tuple(Decision(j.id, "pending", "waiting for nodes: no GPUs registered")
                                       for j in snap.pending), policy=self.policy.name)
            self.rounds += 1
            # New pending reasons of the whole round in one transaction (no await since the snapshot,
            # so the jobs are as the round saw them). A job the policy drops stays PENDING with the
            # reason: the user decides whether to cancel it.
            views = {j.id: j for j in snap.pending}
            reasons = []
            for d in plan.decisions:
                if d.action not in ("pending", "drop") or d.job_id not in pending:
                    continue
                why = d.reason
                if "fits nowhere" in why and plan.policy != "frenzy":
                    # Say what memory the job needs and what exists, whatever the policy.
                    marp = frenzy.memory_reason(views[d.job_id], snap, self.cfg.frenzy)
                    if marp.startswith("fits nowhere"):
                        why = f"{why}; {marp}"
                if pending[d.job_id].reason != why:
                    reasons.append((pending[d.job_id].with_(reason=why), [("PENDING", why)]))
            if reasons:
                self.store.save_jobs(reasons, self.wall())
                await self._notify()
            # Moves and suspensions first: they free GPUs that this round's starts may use.
            for d in plan.migrations() + plan.of("stop"):
                job = self.store.get_job(d.job_id)
                if job is None or job.state != P.JOB_STATE_RUNNING:
                    continue  # still starting, or changed meanwhile: next round decides again
                if d.action == "migrate":
                    await self._migrate(job, d)
                else:
                    await self._migrate_off(job, f"suspended by {plan.policy}: {d.reason}")
            for d in plan.starts():
                job = self.store.get_job(d.job_id)
                if job is None or job.state != P.JOB_STATE_PENDING:
                    continue  # changed while earlier launches of this round were awaited (e.g. cancelled)
                assert d.plan is not None
                if not self._target_free(job, d.slices):
                    # GPUs the policy counted on (e.g. of a job whose move was skipped) are held.
                    why = "placement conflict: its GPUs are still held; the next round decides again"
                    await self._save(job.with_(reason=why), [("PENDING", why)])
                    self.kick()
                    continue
                await self._start_attempt(job, d.plan, d.slices, d.reason, "PLACED")
            dt = time.perf_counter() - t0
            metrics.ROUND_SECONDS.observe(dt)
            log.info("round", round=self.rounds, policy=plan.policy, pending=len(pending),
                     started=len(plan.starts()), migrated=len(plan.migrations()), seconds=round(dt, 4))

    async def _start_attempt(self, job: JobRecord, plan: PlanChoice, slices: tuple[Slice, ...], reason: str,
                             kind: str) -> JobRecord:
        """Store the next attempt (plan, placement, rendezvous) as STARTING, then launch it."""
        attempt = job.attempt + 1
        rendezvous = f"{host_of(self.nodes[slices[0].node_id].address)}:{self._port(job.id, attempt, slices[0].node_id)}"
        job = job.with_(state=P.JOB_STATE_STARTING, reason=reason, attempt=attempt, plan=plan_pb(plan),
                        placement=placement_pb(slices, rendezvous), start_time=job.start_time or self.wall(),
                        stop_requested=False)
        await self._save(job, [(kind, f"attempt {attempt}: {reason}")])
        self._clocks[job.id] = AttemptClock(attempt, self.mono())
        await self._launch(job)
        return job

    async def _migrate(self, job: JobRecord, d: Decision) -> None:
        """Stop a running attempt with a checkpoint; when it has stopped, relaunch it on the
        decision's placement and plan (`_evaluate`, verdict "stopped")."""
        self._moves[job.id] = Move(d, self.mono())
        what = f"{d.change or 'move'} {d.previous or ''} -> {d.cell or ''}".replace("  ", " ")
        job = job.with_(state=P.JOB_STATE_MIGRATING, reason=f"migrating: {d.reason}", stop_requested=True)
        await self._save(job, [("MIGRATING", f"{what}: {d.reason}; stopping attempt {job.attempt} with a checkpoint")])
        await self._stop_attempt(job, f"migrating: {d.reason}")

    def _target_free(self, job: JobRecord, slices: tuple[Slice, ...]) -> bool:
        busy = self.busy_gpus(exclude=job.id)
        for s in slices:
            if self.node_state(s.node_id)[0] != P.NODE_STATE_READY or busy.get(s.node_id, set()) & set(s.gpu_indices):
                return False
        return True

    def _port(self, job_id: str, attempt: int, node_id: str) -> int:
        """A rendezvous port on rank 0's node that no other active attempt there holds."""
        used = set()
        for j in self.store.list_jobs(states=ACTIVE):
            if j.placement and j.placement.slices and j.placement.slices[0].node_id == node_id:
                used.add(int(j.placement.rendezvous.rpartition(":")[2]))
        start = int(hashlib.sha256(f"{job_id}/{attempt}".encode()).hexdigest(), 16) % self.cfg.port_count
        for i in range(self.cfg.port_count):
            port = self.cfg.port_base + (start + i) % self.cfg.port_count
            if port not in used:
                return port
        raise RuntimeError("no free rendezvous port")

    def _launch_requests(self, job: JobRecord) -> list[tuple[str, agent_pb2.LaunchRequest]]:
        """One Launch per node of the placement: its ranks (or one process, for a per-node
        launcher) and the argv of the job's launcher template with the plan substituted."""
        assert job.plan is not None and job.placement is not None
        spec, plan, slices = job.spec, job.plan, job.placement.slices
        tpl = launchers.template_of(spec.launcher)
        entry = list(spec.entrypoint) or list(tpl.default_entrypoint)
        world = plan.dp * plan.tp * plan.pp
        host, _, port = job.placement.rendezvous.rpartition(":")
        ckpt = f"{self.cfg.checkpoint_root}/{job.id}"
        values: dict[str, object] = {
            "nnodes": len(slices), "world_size": world, "master_addr": host, "master_port": port, "dp": plan.dp, "tp": plan.tp,
            "pp": plan.pp, "micro_batch": plan.micro_batch, "grad_accum": plan.grad_accum,
            "global_batch_size": spec.global_batch_size, "iterations": spec.iterations, "checkpoint_dir": ckpt,
            "world_info": launchers.world_info([(s.node_id, list(s.gpu_indices)) for s in slices])}
        out, rank = [], 0
        for node_rank, s in enumerate(slices):
            if tpl.per_node:
                ranks = [agent_pb2.RankAssignment(rank=node_rank, local_rank=0, gpu_indices=list(s.gpu_indices))]
            else:
                ranks = [agent_pb2.RankAssignment(rank=rank + i, local_rank=i, gpu_indices=[g])
                         for i, g in enumerate(s.gpu_indices)]
                rank += len(s.gpu_indices)
            argv = launchers.expand(tpl, entry, {**values, "node_rank": node_rank,
                                                 "nproc_per_node": len(s.gpu_indices)}, head=node_rank == 0)
            req = agent_pb2.LaunchRequest(
                request_id=f"{job.id}/{job.attempt}/{s.node_id}", controller_epoch=self.epoch, job_id=job.id,
                attempt=job.attempt, world_size=world, ranks=ranks, rendezvous=job.placement.rendezvous,
                plan=plan, argv=argv, env=dict(spec.env), checkpoint_dir=ckpt, iterations=spec.iterations,
                global_batch_size=spec.global_batch_size, model=_model_pb(job), checkpoint_every=spec.checkpoint_every)
            out.append((s.node_id, req))
        return out

    @staticmethod
    def _processes(job: JobRecord) -> int:
        """How many worker processes the agents run for the attempt."""
        assert job.plan is not None and job.placement is not None
        if launchers.template_of(job.spec.launcher).per_node:
            return len(job.placement.slices)
        return job.plan.dp * job.plan.tp * job.plan.pp

    async def _launch(self, job: JobRecord, only_missing: bool = False) -> None:
        for node_id, req in self._launch_requests(job):
            live = self.nodes.get(node_id)
            if live is None or live.liveness != P.NODE_STATE_READY:
                continue
            if only_missing and (job.id, job.attempt) in live.running:
                continue
            try:
                await self.agents.launch(live.address, req)
            except grpc.aio.AioRpcError as e:
                why = f"launch on {node_id} failed: {e.code().name}: {e.details()}"
                await self._stop_attempt(job, why)
                await self._requeue(job, why, "LAUNCH_FAILED")
                return

    # ---------------------------------------------------------------- loops

    async def round_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._kick.wait(), self.cfg.round_interval_s)
                await asyncio.sleep(self.cfg.debounce_s)  # gather a burst of arrivals into one round
            except TimeoutError:
                pass
            self._kick.clear()
            try:
                await self.run_round()
            except Exception:
                log.exception("round_failed")

    async def liveness_loop(self) -> None:
        period = max(0.2, min(1.0, self.cfg.liveness.lease_s / 4))
        while True:
            await asyncio.sleep(period)
            try:
                await self._liveness_tick()
                metrics.update_nodes(self)
            except Exception:
                log.exception("liveness_failed")

    async def inspect_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.inspect_interval_s)
            try:
                await self.inspect()
                metrics.update_jobs(self.store)
            except Exception:
                log.exception("inspect_failed")


def _model_pb(job: JobRecord) -> common_pb2.ModelSpec:
    m = resolve_model(job.spec.model)
    return common_pb2.ModelSpec(name=m.name, hidden_size=m.hidden_size, num_layers=m.num_layers,
                                num_heads=m.num_heads, vocab_size=m.vocab_size, seq_length=m.seq_length)
