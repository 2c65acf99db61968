"""The controller's engine: turns submissions, heartbeats and rounds into stored state and agent calls.

Every state change is written to the store before the agent call that acts on it (a Launch goes out
once its attempt is stored as STARTING, a Stop once the job's next state is stored: cancelled,
migrating, requeued or failed), so a controller killed at any point restarts into a state it can
reconcile: a job marked STARTING whose workers never appeared is launched again under the same
attempt number, which agents treat as a no-op if they had already started it; workers of a job no
longer active are stopped as stale when their agent reports them. The engine is the composition
root: the decisions are pure functions in their own modules, carried out in order (store, then agents).
- controller/snapshots.py: the round's Snapshot and the GPUs held;
- controller/rounds.py: the policy, the round's pending reasons and its steps in order;
- controller/transitions.py: each job state change as a record and its events;
- controller/judging.py (with core/attempts.py): what an attempt's workers mean, what to do next;
- controller/launches.py: the Launch requests of an attempt and its rendezvous port;
- controller/registry.py: node liveness; controller/learning.py: step-time learning;
- controller/nodeops.py: what happens to a node (drain, undrain, removal, register, heartbeat, liveness);
- controller/view.py: the in-memory state, the read-only `EngineView`; controller/changes.py: the watches' counts.
- controller/engine_config.py: `EngineConfig`, the settings `tessera-controller`'s flags set.
`run_round`, `liveness_tick` and `inspect` are the steps of the three loops: tests call them
directly with fake clocks (tests/unit/test_engine.py).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable

import grpc
import structlog

from tessera.common.crashpoints import crash_point
from tessera.common.progress import sanitized
from tessera.common.tokens import ANONYMOUS, Principal
from tessera.controller import launches, limits, metrics, nodeops, registry, rounds, transitions, warming
from tessera.controller.agents import AgentCalls, last_log_line, peer_details
from tessera.controller.churnguard import ChurnGuard
from tessera.controller.concurrently import each_job
from tessera.controller.core.attempts import judge, stalled
from tessera.controller.core.backoff import healthy, may_launch
from tessera.controller.core.forecast import ForecastConfig
from tessera.controller.core.launchers import LaunchTooLarge
from tessera.controller.core.opaque import OpaqueAware
from tessera.controller.core.policy import Estimates, Policy, RoundConfig, plan_round
from tessera.controller.core.snapshot import Decision, PlanChoice, Slice, Snapshot
from tessera.controller.engine_config import EngineConfig
from tessera.controller.errors import JobNotFound, NodeNotFound
from tessera.controller.estimator_feed import EstimatorFeed, step_times_request
from tessera.controller.forecasting import Forecaster, step_seconds
from tessera.controller.judging import processes, rank_statuses, settle, silent_peer
from tessera.controller.launches import launch_requests, placed_on, rank_node, rendezvous, rendezvous_port
from tessera.controller.learning import StepLearner
from tessera.controller.registry import LiveNode, attempt_floor, replace_workers, requeue_after
from tessera.controller.snapshots import Admissions, RoundCursor, build_snapshot, gpu_pools, job_view
from tessera.controller.store import ACTIVE, TERMINAL, JobRecord, NodeRecord, StaleWrite, Store, still
from tessera.controller.tenants import TenantsSource
from tessera.controller.view import AttemptClock, LiveState, LiveView, Move
from tessera.v1 import agent_pb2, common_pb2

__all__ = ["Engine", "EngineConfig", "JobNotFound", "NodeNotFound"]

P = common_pb2
log = structlog.get_logger("controller")


class Engine:
    """Wires the pure parts to the store, the agents and the clocks; `policy` overrides the one the
    config names (tests script decisions with it)."""

    def __init__(self, store: Store, agents: AgentCalls, cfg: EngineConfig, epoch: int,
                 wall: Callable[[], float] = time.time, mono: Callable[[], float] = time.monotonic,
                 policy: Policy | None = None) -> None:
        self.agents, self.cfg, self.epoch, self.wall, self.mono = agents, cfg, epoch, wall, mono
        self._live = LiveState()
        self.view = LiveView(store, self._live, epoch, mono, wall)
        self.store = self.view.store  # `store`, its job writes counted for the watches (controller/changes.py)
        self.learner = StepLearner(cfg.step_times, cfg.learn_step_times)
        self.estimator_feed = EstimatorFeed(cfg.estimator, tls=cfg.tls) if cfg.estimator else None
        self.policy = policy or rounds.policy_from_config(cfg)
        self.forecaster = Forecaster(cfg.forecast or ForecastConfig(), enabled=cfg.forecast is not None)
        self.admissions, self.cursor = Admissions(), RoundCursor()  # SLA clocks; arrivals and departures
        self.churn = ChurnGuard(cfg.churn, self.store)  # tenants' quick preempting ends, stored (docs/tenants.md)
        # Not strict: the file was checked at start (controller/main.py); one gone bad since (a standby
        # taking the lead) refuses submissions instead of stopping the controller.
        self.tenants = TenantsSource(cfg.tenants_file, wall, strict=False)
        self._kick = asyncio.Event()
        self._round_lock = asyncio.Lock()
        self._deferred: list[JobRecord] | None = None  # a round's started attempts, launched at its end
        self.warmer = warming.Warmer(self.learner.least_need)  # new jobs' first Cells, within a budget
        self._removals: dict[str, str] = {}  # recent RemoveNode request ids (the store keeps them too)
        self.started_mono, self.rounds = mono(), 0
        self.gpu_seconds = metrics.GpuSeconds()
        for rec in store.list_nodes():
            self._live.records[rec.id] = rec
            # Known from before a restart: unknown liveness until the agent registers again.
            self._live.nodes[rec.id] = LiveNode(rec.id, rec.address, rec.inventory, agent_pb2.NodeStatus(),
                                                last_seen=self.started_mono, last_seen_wall=0.0)
            self._live.wake_at(rec.unhealthy_until)
        for job in store.list_jobs(states=[P.JOB_STATE_PENDING]):
            self._live.wake_at(job.next_launch_time)

    # ---------------------------------------------------------------- notifications

    def kick(self) -> None:
        """Ask for a scheduling round soon (debounced)."""
        self._kick.set()

    async def round_due(self) -> None:
        """Until a kick (debounced: a burst of arrivals makes one round) or the round interval."""
        try:
            await asyncio.wait_for(self._kick.wait(), self.cfg.round_interval_s)
            await asyncio.sleep(self.cfg.debounce_s)
        except TimeoutError:
            pass
        self._kick.clear()

    @property
    def round_requested(self) -> bool:
        return self._kick.is_set()

    async def _save(self, job: JobRecord, events: list[tuple[str, str]]) -> bool:
        """Store the job and its events; False (nothing stored) over a terminal record or a later attempt."""
        try:
            self.store.save_current(job, self.wall(), events)
        except StaleWrite as e:
            log.warning("stale_job_write_dropped", job_id=job.id, stored=P.JobState.Name(e.stored_state),
                        stored_attempt=e.stored_attempt, write=P.JobState.Name(job.state), write_attempt=job.attempt,
                        events=[k for k, _ in events])
            return False
        if job.state not in ACTIVE:  # its record now holds the last progress
            if job.state in TERMINAL:  # every end counted once, cancels and give-ups included (a live audit)
                metrics.JOBS_FINISHED.labels(P.JobState.Name(job.state).removeprefix("JOB_STATE_").lower()).inc()
            self._live.clocks.pop(job.id, None)
            self._live.progress.pop(job.id, None)
            self._live.moves.pop(job.id, None)  # a migration it was in (cancelled while MIGRATING)
            self.learner.forget(job.id)
        for kind, msg in events:
            log.info("job_event", job_id=job.id, kind=kind, message=msg, attempt=job.attempt)
        await self.view.notify()
        return True

    def _progress(self, job: JobRecord) -> common_pb2.Progress | None:
        return self._live.progress.get(job.id, job.progress)

    # ---------------------------------------------------------------- client API

    async def submit(self, spec: common_pb2.JobSpec, request_id: str,
                     by: Principal = ANONYMOUS) -> tuple[JobRecord, bool]:
        """Store a new job, or return the one this tenant's `request_id` created before.

        Idempotency keys are per tenant: the store's key is "tenant/request_id" (a tenant never
        holds a "/"), so one tenant's retry never returns, or collides with, another tenant's job.
        """
        if not spec.tenant:
            spec.tenant = "default"
        key = transitions.request_key(spec.tenant, request_id)
        rec, event = transitions.submitted("j-" + uuid.uuid4().hex[:12], key, spec, self.wall())
        stored, created = self.store.create_job(rec, event)
        if created:
            log.info("job_submitted", job_id=rec.id, name=spec.name, tenant=spec.tenant, principal=by.name)
            metrics.JOBS_SUBMITTED.inc()
            await self.view.notify()
            self.kick()
        return stored, created

    async def cancel(self, job_id: str, by: str = "user") -> JobRecord:
        job = self.view.get(job_id)
        if job.state in TERMINAL:
            return job
        was_active = job.state in ACTIVE
        job, events = transitions.cancelled(job, self.wall(), by)
        await self._save(job, events)
        if was_active:
            await self._stop_attempt(job, "job cancelled")
        self.kick()
        return job

    async def drain(self, node_id: str, reason: str) -> tuple[NodeRecord, str]:
        return await nodeops.drain(self, node_id, reason)

    async def undrain(self, node_id: str) -> tuple[NodeRecord, str]:
        return await nodeops.undrain(self, node_id)

    async def remove_node(self, node_id: str, force: bool, request_id: str) -> bool:
        return await nodeops.remove_node(self, node_id, force, request_id)

    def _put_node(self, rec: NodeRecord) -> None:
        self.store.put_node(rec)
        self._live.records[rec.id] = rec

    # ---------------------------------------------------------------- agents

    async def register(self, status: agent_pb2.NodeStatus) -> None:
        await nodeops.register(self, status)

    async def heartbeat(self, status: agent_pb2.NodeStatus, epoch: int) -> bool:
        """Record a heartbeat; False when the agent must register again."""
        return await nodeops.heartbeat(self, status, epoch)

    async def _observe(self, live: LiveNode, status: agent_pb2.NodeStatus) -> None:
        """Fold a node's reported workers into job states (GPUs they freed ask for a round)."""
        previous, freed = replace_workers(live, status)
        if freed:
            self.kick()
        mine = registry.by_job(live.running)
        for job_id in registry.to_look_at(previous, mine, {*self._live.clocks, *self._live.moves}):
            job = self.store.get_job(job_id)
            if await self._stop_stale(live, job_id, job, mine.get(job_id, ())):
                job = self.store.get_job(job_id)  # as stored after the Stop calls (a cancel may have come)
            workers = live.running.get((job_id, job.attempt)) if job else None
            if job is None or job.state not in ACTIVE:
                continue
            # Rank 0 of the current attempt speaks for the job (an attempt resumed from an older
            # checkpoint may report a lower iteration than the previous attempt's last report).
            # ... as reported by the node that runs it: another node's report of it is not the job's.
            r0 = [w for w in workers or () if w.rank == 0 and w.HasField("progress")] \
                if rank_node(job, 0) == live.id else []
            if r0:
                prog = sanitized(r0[0].progress)  # the job's own numbers: inf and NaN cleared
                if prog != self._live.progress.get(job_id):
                    self._first_progress(job)
                    if await self._learn(job, prog):
                        job = self.store.get_job(job_id)  # as stored after the MEASURED event's save
                self.view.set_progress(job_id, prog)  # counted: the next liveness pass wakes the watches
                if job is None:
                    continue
            await self._evaluate(job)

    def _first_progress(self, job: JobRecord) -> None:
        """A new report: the attempt's clock moves; the first one after a migration closes it."""
        clock = self._live.clocks.get(job.id)
        if clock is None or clock.attempt != job.attempt:
            return
        clock.progress_at = self.mono()
        if clock.migration_started is None:
            return
        total = clock.progress_at - clock.migration_started
        first = clock.progress_at - clock.launched
        clock.migration_started = None
        metrics.MIGRATION_SECONDS.observe(total)
        self.store.save_job(job, self.wall(), [("RESUMED", transitions.resumed_text(job.attempt, first, total))])

    async def _stop_stale(self, live: LiveNode, job_id: str, job: JobRecord | None,
                          reported: Iterable[tuple[int, list[agent_pb2.WorkerStatus]]]) -> bool:
        called = False  # whether it sent a Stop (an await); `reported`: the node's (attempt, workers) of the job
        for attempt, ws in reported:
            stale = job is None or job.state not in ACTIVE or attempt != job.attempt or live.id not in placed_on(job)
            if stale and any(w.state != P.WORKER_STATE_EXITED for w in ws):
                await self.agents.stop(live.id, live.address, self.epoch, job_id, attempt, self.cfg.stop_grace_s,
                                       "stale attempt: not the job's current attempt on this node")
                called = True
        return called

    async def _evaluate(self, job: JobRecord) -> None:
        if job.state not in ACTIVE or job.plan is None:
            return
        world = processes(job)
        verdict = judge(world, rank_statuses(job, self._live.nodes), job.spec.iterations, job.stop_requested)
        prog = self._progress(job)
        move = self._live.moves.pop(job.id, None) if verdict.kind == "stopped" else None
        step, why = settle(job, verdict, move is not None,
                           silent_peer(job, self._live.nodes, verdict, self.mono(), self.cfg.liveness))
        if step == "running":
            await self._save(*transitions.running(job, world, prog))
        elif step == "succeeded":
            await self._save(*transitions.succeeded(job, why, prog, self.wall()))
            self.kick()
        elif step == "failed":
            last = await last_log_line(self.agents, self._live.nodes, self.epoch, job, verdict.rank)
            now = still(self.store.get_job(job.id), job)  # the log call awaited an agent: a cancel may have come
            if now is None:
                return  # the next report judges the job as it is now
            said = last.split("]: ", 1)[-1] if last.startswith("tessera-keeper[") else last  # said already?
            await self._attempt_failed(now, f"{why}; last log line: {last}" if said not in why else why, verdict.exit_code)
        elif step == "interrupted":
            await self._requeue(job, why, "REQUEUED", stop="another rank was interrupted")
        elif step == "relaunch":
            assert move is not None
            crash_point("migrate.old_stopped")
            await self._relaunch(job, move, why)
        elif step == "requeue":
            await self._requeue(job, why, "STOPPED")
        elif step == "retry":
            await self._requeue(job, why, "ATTEMPT_FAILED", retry=True)
        elif step == "give_up":
            await self._save(*transitions.failed(job, why, prog, self.wall()))
            self.kick()

    async def _relaunch(self, job: JobRecord, move: Move, killed: str) -> None:
        """A migration's old attempt has stopped (`killed`: "; ..." of ranks SIGKILLed after the grace):
        start the new one on the round's target if it is free; wait while jobs checkpointing to stop
        hold it (policies place on such GPUs); else requeue."""
        d = move.decision
        stopped_in = self.mono() - move.requested
        if d.plan is not None and self.view.target_free(job.id, d.slices, self.wall()):
            await self._start_attempt(job.with_(restarts=job.restarts + 1), d.plan, d.slices,
                                      f"{d.reason} (attempt {job.attempt} stopped in {stopped_in:.1f}s{killed})", "MIGRATED",
                                      migration_started=move.requested, opportunistic=d.opportunistic)
            metrics.MIGRATIONS.inc()
        elif d.plan is not None and self.view.stopping_on(job.id, d.slices):
            self._live.moves[job.id] = move  # tried again at the job's next report, as a start waits
        else:
            await self._requeue(job, f"migration target no longer free after {stopped_in:.1f}s{killed}", "STOPPED")

    async def _attempt_failed(self, job: JobRecord, reason: str, exit_code: int | None = None) -> None:
        """Retry within max_retries, else fail the job; then stop what is left of the attempt."""
        after, events = transitions.attempt_failed(job, reason, self._progress(job), self.wall(), exit_code)
        await self._save(after, events)
        await self._stop_attempt(job, "another rank failed")
        if after.state == P.JOB_STATE_PENDING:
            metrics.REQUEUES.inc()
        self.kick()

    async def _fail_now(self, job: JobRecord, why: str) -> None:
        """Fail the job without a retry (time limit out, launch cannot be built), then stop its attempt."""
        await self._save(*transitions.failed(job, why, self._progress(job), self.wall()))
        await self._stop_attempt(job, why)
        self.kick()

    async def _requeue(self, job: JobRecord, why: str, kind: str, retry: bool = False, stop: str = "") -> None:
        """Back to PENDING; with `stop`, then stop what is left of the attempt for that reason."""
        await self._save(*transitions.requeued(job, why, kind, retry, self._progress(job)))
        if stop:
            await self._stop_attempt(job, stop)
        metrics.REQUEUES.inc()
        self.kick()

    async def _stop_attempt(self, job: JobRecord, reason: str) -> None:
        for s in job.placement.slices if job.placement else ():
            live = self._live.nodes.get(s.node_id)
            if live is not None and live.liveness == P.NODE_STATE_READY:
                await self.agents.stop(live.id, live.address, self.epoch, job.id, job.attempt, self.cfg.stop_grace_s,
                                       reason)

    async def _migrate_off(self, job: JobRecord, why: str) -> None:
        job, events = transitions.migrating_off(job, why)
        await self._save(job, events)
        await self._stop_attempt(job, why)
        await self._evaluate(job)

    # ---------------------------------------------------------------- liveness and inspection

    async def liveness_tick(self) -> None:
        """Move each node to the liveness its last heartbeat allows; requeue the jobs of nodes past
        their lease; wake the watches if something changed (controller/nodeops.py)."""
        await nodeops.liveness_tick(self)

    async def inspect(self) -> None:
        """Periodic pass over running jobs: persist progress, relaunch missing ranks, fail hung
        attempts, evaluate. One job's failure is logged and the pass goes on with the others."""
        now, active = self.mono(), self.store.list_jobs(states=ACTIVE)
        await each_job(((job.id, self._inspect_job(job.id, now)) for job in active), "inspect_job_failed")
        await nodeops.requeue_on_unknown_nodes(self, active, now)

    async def _inspect_job(self, job_id: str, now: float) -> None:
        # As stored now, not as the pass listed it: a heartbeat handled meanwhile may have moved the job
        # on, and its old record written back (progress, below) made a RUNNING job STARTING again.
        job = self.store.get_job(job_id)
        if job is None or job.state not in ACTIVE:
            return
        prog = self._live.progress.get(job.id)
        if prog is not None and (job.progress is None or prog.iteration != job.progress.iteration):
            job = transitions.progressed(job, prog)
            self.store.save_job(job, self.wall())
        if job.state == P.JOB_STATE_STARTING:
            await self._launch(job, only_missing=True)
            job = self.store.get_job(job_id) or job  # (the launch awaited agents)
        # Unknown since a controller restart: the clock starts now, with a full timeout.
        clock = self._live.clocks.setdefault(job.id, AttemptClock(job.attempt, now))
        over = None if job.stop_requested else limits.over_runtime(job.spec, now - clock.launched)
        if over:
            return await self._fail_now(job, over)
        timeout = limits.progress_timeout(job.spec, self.cfg.progress_timeout_s, clock.progress_at is not None)
        hung = None if job.stop_requested else stalled(
            now, clock.launched, clock.progress_at, job.state == P.JOB_STATE_STARTING,
            self.cfg.start_timeout_s, timeout)
        if hung:
            return await self._attempt_failed(job, hung)
        await self._evaluate(job)

    # ---------------------------------------------------------------- rounds

    async def _learn(self, job: JobRecord, progress: common_pb2.Progress) -> bool:
        """A new rank-0 report: the Cell's measured iteration time, for the next rounds' estimates
        and, with --estimator, for the estimator service's online refit. True when it stored an event."""
        lesson = self.learner.observe(job, progress, job_view(job, self._live.progress.get(job.id)),
                                      self._live.records)
        if lesson is None:
            return False
        if lesson.replaced:
            metrics.MEASURED_CELLS.inc()
        stored = False
        current = self.store.get_job(job.id)  # as stored now: nothing else of the job may be overwritten
        if lesson.event is not None and current is not None and current.attempt == job.attempt:
            stored = await self._save(current, [("MEASURED", lesson.event)])
        if lesson.refused:
            log.warning("step_times_refused", job_id=job.id, why=lesson.refused)
            return stored  # nor is the estimator service told
        if self.estimator_feed is not None:
            self.estimator_feed.send(step_times_request(job, lesson.view.model, lesson.gpu_type, lesson.per_node,
                                                        lesson.learned, lesson.view.key))
        return stored

    def snapshot(self) -> tuple[Snapshot, dict[str, JobRecord]]:
        """The round's input, and the PENDING jobs it lists by id; reads only (the churn ledger is fed
        by run_round, so a look at the snapshot changes no state)."""
        states = {node_id: self.view.node_state(node_id)[0] for node_id in self._live.records}
        now = self.wall()
        pending = [j for j in self.store.list_jobs(states=[P.JOB_STATE_PENDING])
                   if may_launch(j.next_launch_time, now)]  # the others back off after failed launches
        active = self.store.list_jobs(states=ACTIVE)  # a MIGRATING job still holds its CPUs
        placed = [j for j in active if j.state in (P.JOB_STATE_STARTING, P.JOB_STATE_RUNNING)]
        config = self.tenants.config
        ready = self.warmer.ready(pending, lambda j: job_view(j, self._live.progress.get(j.id)))
        snap = build_snapshot(self._live.records, self._live.nodes, states, self.view.busy_gpus(),
                              ready, placed, self._live.progress, now,
                              dict(self.cfg.prices), config.tenants if config else (), holding=active,
                              releasing=self.view.releasing_gpus(active))
        return self.admissions.apply(snap), {j.id: j for j in pending}

    async def run_round(self) -> None:
        async with self._round_lock:
            t0 = time.perf_counter()
            self.tenants.refresh()  # a changed tenants file counts from this round on
            pools = gpu_pools(self._live.records.values())
            self.tenants.warnings({m: n for m, (n, _, _) in pools.items()})
            await self._warm_estimates(list(pools))
            snap, pending = self.snapshot()
            seen = {i: self.view.changes.of_job(i) for i in pending}  # each job as the round saw it
            snap = self.churn.apply(self.cursor.mark(snap, self.store.get_job), self.store.get_job)
            rcfg = RoundConfig(search_depth=self.cfg.search_depth, interval_s=self.cfg.round_interval_s,
                               time_budget_s=self.cfg.round_budget_s, clock=time.monotonic, min_run_s=self.cfg.min_run_s)
            if snap.cluster_gpus:
                estimates = OpaqueAware(self.learner.estimates(self._live.records.values()))
                plan = await asyncio.to_thread(plan_round, snap, estimates, self.policy, rcfg)  # (rounds.py: why)
                self.admissions.record(plan.admitted, snap)
                plan = self.churn.after_round(plan, snap, self._live.wake_at)  # a cool-off's end asks a round
                for t in plan.wakes:  # a minimum run time's end (controller/core/minrun.py)
                    self._live.wake_at(t)
                self._forecast(snap, estimates, rcfg)
            else:
                plan = rounds.waiting_for_nodes(snap, self.policy.name)
            self.rounds += 1
            if rounds.steps(plan):  # a round that decided to act, not an idle one
                crash_point("round.planned")
            # New pending reasons in one transaction, of jobs no one wrote since the snapshot (one cancelled keeps its end).
            sick = [r.id for r in self._live.records.values() if not healthy(r.unhealthy_until, self.wall())]
            updates = await asyncio.to_thread(rounds.pending_updates, plan, pending, snap, self.cfg.frenzy, sick,
                                              self.warmer.cold, self.learner.least_need)
            updates = [u for u in updates if self.view.changes.of_job(u[0].id) == seen[u[0].id]]
            if updates := updates + rounds.kept_notes(plan, snap, self.store.get_job):
                self.store.save_jobs(updates, self.wall())
                await self.view.notify()
            self._deferred = []
            for step in rounds.steps(plan):
                job = self.store.get_job(step.decision.job_id)
                if job is None or not rounds.applies(step, job):
                    continue
                try:  # one job's failure must not drop the round's other steps
                    await self._step(job, step, plan.policy)
                except Exception:
                    log.exception("round_step_failed", job_id=job.id, kind=step.kind)
            started, self._deferred = self._deferred, None
            await each_job(((j.id, self._launch(j, deferred=True)) for j in started), "round_launch_failed")
            dt = time.perf_counter() - t0
            metrics.ROUND_SECONDS.observe(dt)
            log.info("round", round=self.rounds, policy=plan.policy, pending=len(pending),
                     started=len(plan.starts()), migrated=len(plan.migrations()), seconds=round(dt, 4))

    async def _step(self, job: JobRecord, step: rounds.RoundStep, policy: str) -> None:
        d = step.decision
        if step.kind == "migrate":
            await self._migrate(job, d)
        elif step.kind == "suspend":
            await self._migrate_off(job, f"suspended by {policy}: {d.reason.removeprefix(f'{policy}: ')}")
        else:
            await self._place(job, d)
            crash_point("round.between_launches")

    async def _warm_estimates(self, gpu_types: list[str]) -> None:
        """New jobs' Cells in a thread before the round's snapshot (a large model's take seconds), within
        --estimate-budget (controller/warming.py); the jobs left ask for the next round at once."""
        pending = self.store.list_jobs(states=[P.JOB_STATE_PENDING]) if gpu_types else []
        cache = self.learner.estimates(self._live.records.values())
        if await asyncio.to_thread(self.warmer.warm, OpaqueAware(cache), cache.known,
                                   [job_view(j, self._live.progress.get(j.id)) for j in pending],
                                   gpu_types, self.cfg.estimate_budget_s, time.monotonic):
            self.kick()

    def _forecast(self, snap: Snapshot, estimates: Estimates, rcfg: RoundConfig) -> None:
        """Start the forecast of the round's snapshot (in a thread: the round does not wait)."""
        placed = {j.id: j for j in self.store.list_jobs(states=[P.JOB_STATE_STARTING, P.JOB_STATE_RUNNING])}
        self.forecaster.after_round(snap, estimates, self.policy, rcfg, step_seconds(self._live.progress, placed),
                                    {k: r.start_time for k, r in placed.items() if r.start_time})

    async def _place(self, job: JobRecord, d: Decision) -> None:
        assert d.plan is not None
        grace = self.started_mono + requeue_after(self.cfg.liveness) - self.mono()
        if job.attempt > 0 and grace > 0 and (unheard := self.view.unheard()):
            # After a (re)start, a node not yet back may run an attempt the store does not know of
            # (a restore from an older copy): the number is chosen once every node has spoken.
            await self._save(*transitions.pending(job, transitions.unheard_text(unheard)))
            self._live.wake_at(self.wall() + grace)
            return
        if not self.view.target_free(job.id, d.slices, self.wall()):
            # GPUs the policy counted on (e.g. of a job whose move was skipped) are held; or given to a
            # guaranteed job while their preempted holder checkpoints: their exit asks for the round.
            stopping = self.view.stopping_on(job.id, d.slices)
            await self._save(*transitions.pending(job, transitions.held_text(stopping)))
            if not stopping:
                self.kick()
            return
        await self._start_attempt(job, d.plan, d.slices, d.reason, "PLACED", opportunistic=d.opportunistic)

    async def _start_attempt(self, job: JobRecord, plan: PlanChoice, slices: tuple[Slice, ...], reason: str,
                             kind: str, migration_started: float | None = None, opportunistic: bool = False) -> JobRecord:
        """Store the next attempt (plan, placement, rendezvous) as STARTING, then launch it."""
        head = slices[0].node_id
        # Restored from an older copy: never reuse an attempt number of its targets' or last placement's agents.
        on, last = [self._live.nodes[n] for n in {s.node_id for s in slices} if n in self._live.nodes], placed_on(job)
        floor = attempt_floor(on, job.id, job.attempt, [n for n in self._live.nodes.values() if n.id in last])
        metrics.job_started(job, self.wall())
        port = rendezvous_port(job.id, floor + 1, head, self.store.list_jobs(states=ACTIVE),
                               self.cfg.port_base, self.cfg.port_count)
        job, events = transitions.started(job, plan, slices, rendezvous(self._live.nodes[head].address, port),
                                          reason, kind, self.wall(), floor, opportunistic)
        if not await self._save(job, events):
            return job  # cancelled meanwhile: nothing to launch
        self._live.clocks[job.id] = AttemptClock(job.attempt, self.mono(), migration_started=migration_started)
        crash_point("round.placed" if migration_started is None else "migrate.before_launch")
        if self._deferred is not None:  # in a round: its starts are launched together at its end
            self._deferred.append(job)
        else:
            await self._launch(job)
        return job

    async def _migrate(self, job: JobRecord, d: Decision) -> None:
        """Stop a running attempt with a checkpoint; when it has stopped, relaunch it on the
        decision's placement and plan (`_evaluate`, step "relaunch")."""
        self._live.moves[job.id] = Move(d, self.mono())
        job, events = transitions.migrating(job, d)
        if not await self._save(job, events):
            self._live.moves.pop(job.id, None)
            return
        await self._stop_attempt(job, f"migrating: {d.reason}")
        crash_point("migrate.checkpoint_requested")

    async def _launch(self, job: JobRecord, only_missing: bool = False, deferred: bool = False) -> None:
        if deferred and still(self.store.get_job(job.id), job) is None:  # a round's: it may have moved on meanwhile
            return
        try:
            on = {n: self._live.nodes[n].status.features for n in placed_on(job) if n in self._live.nodes}
            key = launches.sealing_key(self.cfg.rendezvous_key, placed_on(job), on)  # old agents' workers do not seal
            requests = launch_requests(job, self.epoch, self.cfg.checkpoint_root, key)
        except LaunchTooLarge as e:  # the job's own doing, on every node: no retry, no node blamed
            return await self._fail_now(job, str(e))
        for node_id, req in requests:
            live = self._live.nodes.get(node_id)
            if live is None or live.liveness != P.NODE_STATE_READY:
                continue
            if only_missing and (job.id, job.attempt) in live.running:
                continue
            try:
                await self.agents.launch(node_id, live.address, req)
                crash_point("launch.answered")
            except grpc.aio.AioRpcError as e:
                why = f"launch on {node_id} failed: {e.code().name}: {peer_details(e)}"
                # INVALID_ARGUMENT: the node answered, refusing this job's request (its env policy, say):
                # the job backs off, the node is not blamed, else one job could sideline every node
                await self._launch_failed(job, node_id, why, e.code() != grpc.StatusCode.INVALID_ARGUMENT)
                return
            self._node_launched(node_id, ok=True)
        current = self.store.get_job(job.id)  # heartbeats may have moved it on during the calls
        if current is not None and current.attempt == job.attempt and current.launch_failures:
            await self._save(transitions.launch_succeeded(current), [])

    def _node_launched(self, node_id: str, ok: bool) -> None:
        rec = self._live.records[node_id]
        if (after := transitions.node_launched(rec, ok, self.wall(), self.cfg.backoff)) != rec:
            self._put_node(after)
        if after.unhealthy_until > rec.unhealthy_until:
            log.warning("node_unhealthy", node_id=node_id, launch_failures=after.launch_failures,
                        until=after.unhealthy_until)
            self._live.wake_at(after.unhealthy_until)

    async def _launch_failed(self, job: JobRecord, node_id: str, why: str, blame_node: bool = True) -> None:
        """Requeue with a backoff (no PLACED -> LAUNCH_FAILED loop), count it against the node unless
        told otherwise, stop whatever ranks did start; nothing when a concurrent launch of the attempt
        (the round's, the inspection's re-send) failed it first (the node was blamed twice)."""
        if still(self.store.get_job(job.id), job) is None:
            return
        if blame_node:
            self._node_launched(node_id, ok=False)
        after, events = transitions.launch_failed(job, why, self._progress(job), self.wall(), self.cfg.backoff)
        await self._save(after, events)
        self._live.wake_at(after.next_launch_time)
        await self._stop_attempt(job, why)
        metrics.REQUEUES.inc()
        self.kick()
