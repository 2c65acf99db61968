"""Random sequences of what happens to a controller, against the real `Engine` over MemoryStore and
SqliteStore, with the in-memory agents of tests/fake_agent_calls.py (which refuse any agent call made
before the state it acts on is stored) and a fake clock.

Operations: submit, cancel, drain, undrain, heartbeat, progress reports and worker exits, rounds,
inspections, ticks (every live agent beats, then an inspection and a round), time passing (liveness), an agent crash (its workers die, it stays silent until it
registers again), a controller restart, and a controller killed while it sends a Launch.

After every operation:
- every submitted job exists exactly once, and a finished job stays finished, in the same state;
- no agent call was made before its state was stored, and none from an older epoch after a newer;
- no (job, attempt) was started twice and no attempt beyond the job's current one was started;
- no job has two active attempts: after a node's heartbeat is accepted, every worker still running
  there is the current attempt of an active job (stale ones were stopped);
- GPUs held by active jobs exist in the node's inventory and none is held twice;
- nothing pending is forgotten: a PENDING job has a reason, a placed one a placement.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path

import grpc
from hypothesis import given
from hypothesis import strategies as st

from tessera.controller.engine import Engine, EngineConfig, NodeNotFound
from tessera.controller.store import ACTIVE, TERMINAL, MemoryStore, SqliteStore, Store
from tessera.v1 import common_pb2 as P
from tests.fake_agent_calls import ControllerKilled, FakeAgents, inventory
from tests.property import profile

NODES = ("a", "b", "c")
GPUS_PER_NODE = 4


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def spec(gpus: int, iterations: int) -> P.JobSpec:
    return P.JobSpec(name="p", model=P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256,
                                                 seq_length=64),
                     global_batch_size=16, iterations=iterations, checkpoint_every=10,
                     hint=P.ResourceHint(gpus=gpus))


node = st.sampled_from(NODES)
index = st.integers(0, 7)
SUBMIT = st.tuples(st.just("submit"), st.sampled_from([0, 1, 2, 4]), st.integers(1, 50))
ROUND = st.tuples(st.just("round"))
HEARTBEAT = st.tuples(st.just("heartbeat"), node)
REPORT = st.tuples(st.just("report"), index, st.floats(0.0, 1.0))
EXIT = st.tuples(st.just("exit"), index, st.sampled_from([0, 0, 1, -9]))
# "tick": every live agent beats, then an inspection and a round, as the loops do.
TICK = st.tuples(st.just("tick"))
# The common events weigh more (listed again), so that jobs get placed, run and finish between faults.
OPS = st.one_of(
    TICK, TICK, TICK, SUBMIT, SUBMIT, ROUND, HEARTBEAT, HEARTBEAT, REPORT, EXIT, EXIT, EXIT,
    st.tuples(st.just("cancel"), index),
    st.tuples(st.just("drain"), node),
    st.tuples(st.just("undrain"), node),
    st.tuples(st.just("inspect")),
    st.tuples(st.just("advance"), st.sampled_from([1.0, 1.0, 5.0, 16.0, 400.0])),
    st.tuples(st.just("agent_crash"), node),
    st.tuples(st.just("agent_restart"), node),
    st.tuples(st.just("controller_restart")),
    st.tuples(st.just("controller_killed_launching"), index),
)


class World:
    def __init__(self, open_store: Callable[[], Store]) -> None:
        self.open_store = open_store
        self.store = open_store()
        self.agents = FakeAgents(self.store)
        for n in NODES:
            self.agents.add_node(n, inventory("A10-24GB", GPUS_PER_NODE, 24))
        self.clock = Clock()
        self.cfg = EngineConfig(policy="frenzy")
        self.engine = self._engine()
        self.submitted: list[str] = []
        self.ended: dict[str, int] = {}
        self.down: set[str] = set()

    def _engine(self) -> Engine:
        return Engine(self.store, self.agents, self.cfg, self.store.next_epoch(), wall=self.clock, mono=self.clock)

    def restart(self) -> None:
        """A new controller process on the same state (SQLite: the file is opened again)."""
        if isinstance(self.store, SqliteStore):
            self.store.close()
            self.store = self.open_store()
            self.agents.store = self.store
        self.engine = self._engine()

    def job_at(self, i: int) -> str | None:
        return self.submitted[i % len(self.submitted)] if self.submitted else None

    async def apply(self, op: tuple) -> None:  # type: ignore[type-arg]
        kind = op[0]
        if kind == "submit":
            self.clock.now += 1
            rec, created = await self.engine.submit(spec(op[1], op[2]), f"req-{len(self.submitted)}")
            assert created
            self.submitted.append(rec.id)
        elif kind == "cancel" and (jid := self.job_at(op[1])):
            await self.engine.cancel(jid)
        elif kind in ("drain", "undrain"):
            try:
                await (self.engine.drain(op[1], "prop") if kind == "drain" else self.engine.undrain(op[1]))
            except NodeNotFound:
                pass  # never registered: the API answers NOT_FOUND
        elif kind == "heartbeat" and op[1] not in self.down:
            await self.beat(op[1])
        elif kind in ("report", "exit") and (jid := self.job_at(op[1])):
            job = self.store.get_job(jid)
            assert job is not None
            if kind == "report":
                self.agents.report(jid, job.attempt, int(op[2] * job.spec.iterations))
            else:
                self.agents.report(jid, job.attempt, job.spec.iterations if op[2] == 0 else 1)
                self.agents.exit(jid, job.attempt, op[2])
        elif kind == "round":
            await self.engine.run_round()
        elif kind == "tick":
            self.clock.now += 0.5
            for n in NODES:
                if n not in self.down:
                    await self.beat(n)
            await self.engine.inspect()
            await self.engine.run_round()
        elif kind == "inspect":
            await self.engine.inspect()
        elif kind == "advance":
            self.clock.now += op[1]
            await self.engine.liveness_tick()
        elif kind == "agent_crash":
            self.agents.crash(op[1])
            self.down.add(op[1])
            self.agents.fail_launch[op[1]] = grpc.StatusCode.UNAVAILABLE
        elif kind == "agent_restart" and op[1] in self.down:
            self.down.discard(op[1])
            del self.agents.fail_launch[op[1]]
            await self.engine.register(self.agents.status(op[1]))
        elif kind == "controller_restart":
            self.restart()
        elif kind == "controller_killed_launching" and (jid := self.job_at(op[1])):
            self.agents.kill_on_launch.add(jid)
            try:
                await self.engine.run_round()
            except ControllerKilled:
                self.restart()
            self.agents.kill_on_launch.discard(jid)

    async def beat(self, n: str) -> None:
        status = self.agents.status(n)
        if not await self.engine.heartbeat(status, self.engine.epoch):
            await self.engine.register(status)  # what an agent does when told to register again
        # Stale workers on a node that was just heard from were stopped.
        for (jid, attempt, rank), w in self.agents.nodes[n].workers.items():
            if w.state == P.WORKER_STATE_EXITED:
                continue
            job = self.store.get_job(jid)
            assert job is not None and job.state in ACTIVE and job.attempt == attempt, \
                f"worker {jid}/{attempt}/{rank} still runs on {n} after its heartbeat: job is " \
                f"{P.JobState.Name(job.state) if job else 'unknown'} attempt {job.attempt if job else '-'}"

    def check(self) -> None:
        assert not self.agents.violations, self.agents.violations
        jobs = self.store.list_jobs()
        ids = [j.id for j in jobs]
        assert len(ids) == len(set(ids)) and sorted(ids) == sorted(self.submitted), "every job exactly once"
        by_id = {j.id: j for j in jobs}
        for jid, state in self.ended.items():
            assert by_id[jid].state == state, f"{jid} left its final state {P.JobState.Name(state)}"
        for (jid, attempt, _node) in self.agents.started:
            assert attempt <= by_id[jid].attempt, f"{jid}: attempt {attempt} started beyond the current one"
        held: dict[tuple[str, int], str] = {}
        for j in jobs:
            if j.state in TERMINAL:
                self.ended.setdefault(j.id, j.state)
            elif j.state == P.JOB_STATE_PENDING:
                assert j.reason, f"{j.id} pending without a reason"
            else:
                assert j.state in ACTIVE and j.placement is not None and j.placement.slices, f"{j.id} not placed"
                for s in j.placement.slices:
                    for g in s.gpu_indices:
                        assert 0 <= g < GPUS_PER_NODE and s.node_id in NODES, f"{j.id} holds {s.node_id}/{g}"
                        assert (s.node_id, g) not in held, f"GPU {s.node_id}/{g}: {held[(s.node_id, g)]} and {j.id}"
                        held[(s.node_id, g)] = j.id


async def run(open_store: Callable[[], Store], ops: list[tuple]) -> None:  # type: ignore[type-arg]
    w = World(open_store)
    for n in NODES:
        await w.engine.register(w.agents.status(n))
    for op in ops:
        await w.apply(op)
        w.check()
    w.store.close()


def check_sequence(backend: str, ops: list[tuple]) -> None:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as d:
        db = Path(d) / "controller.db"
        memory = MemoryStore()
        # A "restart" keeps the same memory; SQLite is opened again from its file.
        open_store: Callable[[], Store] = (lambda: memory) if backend == "memory" else (lambda: SqliteStore(db))
        asyncio.run(run(open_store, ops))


@profile(200)
@given(ops=st.lists(OPS, min_size=20, max_size=80))
def test_random_operations_keep_the_invariants_on_memory(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    check_sequence("memory", ops)


# Fewer: every write is a real SQLite transaction (fsync'd), and restarts reopen the file.
@profile(60)
@given(ops=st.lists(OPS, min_size=20, max_size=80))
def test_random_operations_keep_the_invariants_on_sqlite(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    check_sequence("sqlite", ops)
