"""The engine's pure parts on literal inputs: judging (controller/judging.py), round steps
(controller/rounds.py), transitions, liveness (controller/registry.py), occupancy
(controller/snapshots.py) and rendezvous ports (controller/launches.py)."""

from __future__ import annotations

import pytest

from tessera.controller import rounds, transitions
from tessera.controller.core.attempts import Verdict
from tessera.controller.core.frenzy import FrenzyConfig
from tessera.controller.core.snapshot import Cell, Decision, PlanChoice, RoundPlan, Slice, Snapshot
from tessera.controller.judging import settle
from tessera.controller.launches import rank_node, rendezvous_port
from tessera.controller.registry import LivenessConfig, LiveNode, lease_lost, liveness_at, node_state
from tessera.controller.snapshots import busy_gpus
from tessera.controller.store import JobRecord
from tessera.v1 import agent_pb2
from tessera.v1 import common_pb2 as P


def job(state: int = P.JOB_STATE_RUNNING, retries: int = 0, max_retries: int = 0, stop: bool = False,
        node: str = "a", gpus: tuple[int, ...] = (0,), port: int = 29500, job_id: str = "j-1",
        model: P.ModelSpec | None = None) -> JobRecord:
    spec = P.JobSpec(iterations=10, max_retries=max_retries, model=model)
    return JobRecord(id=job_id, request_id="r", spec=spec, state=state,
                     reason="why", submit_time=1.0, attempt=1, plan=P.Plan(dp=len(gpus), tp=1, pp=1),
                     placement=P.Placement(slices=[P.NodeSlice(node_id=node, gpu_indices=list(gpus))],
                                           rendezvous=f"10.0.0.1:{port}"),
                     retries=retries, stop_requested=stop)


@pytest.mark.parametrize(("rec", "verdict", "move", "want"), [
    (job(P.JOB_STATE_STARTING), "running", False, "running"),
    (job(), "running", False, "wait"),
    (job(), "starting", False, "wait"),
    (job(), "succeeded", False, "succeeded"),
    (job(), "failed", False, "failed"),
    (job(), "interrupted", False, "interrupted"),
    (job(P.JOB_STATE_MIGRATING, stop=True), "stopped", True, "relaunch"),
    (job(P.JOB_STATE_MIGRATING, stop=True), "stopped", False, "requeue"),
    (job(stop=True), "stopped", False, "requeue"),
    (job(max_retries=1), "stopped", False, "retry"),
    (job(retries=1, max_retries=1), "stopped", False, "give_up"),
])
def test_settle(rec: JobRecord, verdict: str, move: bool, want: str) -> None:
    assert settle(rec, Verdict(verdict, "rank 0: exit code 1"), move)[0] == want


def test_round_steps_free_gpus_before_starts_and_skip_jobs_that_changed() -> None:
    plan = RoundPlan((Decision("s", "start", ""), Decision("k", "keep", ""), Decision("m", "migrate", ""),
                      Decision("p", "pending", ""), Decision("x", "stop", "")))
    steps = rounds.steps(plan)
    assert [(s.kind, s.decision.job_id) for s in steps] == [("migrate", "m"), ("suspend", "x"), ("start", "s")]
    assert rounds.applies(steps[0], job()) and not rounds.applies(steps[0], job(P.JOB_STATE_STARTING))
    assert rounds.applies(steps[2], job(P.JOB_STATE_PENDING)) and not rounds.applies(steps[2], job(P.JOB_STATE_CANCELLED))
    assert not rounds.applies(steps[2], None)


def test_pending_updates_write_only_changed_reasons() -> None:
    waiting = job(P.JOB_STATE_PENDING)
    other = job(P.JOB_STATE_PENDING, job_id="j-2")
    plan = RoundPlan((Decision(waiting.id, "pending", "why"), Decision(other.id, "drop", "too late")), policy="fcfs")
    updates = rounds.pending_updates(plan, {waiting.id: waiting, other.id: other}, Snapshot((), ()),
                                     FrenzyConfig())
    assert [(r.id, r.reason, ev) for r, ev in updates] == [("j-2", "too late", [("PENDING", "too late")])]


def test_a_suspended_jobs_later_reasons_keep_what_suspended_it() -> None:
    # Before, the round after the suspension replaced it with the policy's "waiting" reason, and only
    # the STOPPED event named the job that took the GPUs.
    waiting = job(P.JOB_STATE_PENDING)
    first = waiting.with_(reason="requeued: suspended by crius: suspended (opportunistic execution): its GPUs "
                                 "went to j-9, queued before it")
    plan = RoundPlan((Decision(waiting.id, "pending", "crius: waiting: no room now"),), policy="crius")
    (after, _), = rounds.pending_updates(plan, {waiting.id: first}, Snapshot((), ()), FrenzyConfig())
    assert after.reason == ("crius: waiting: no room now; waiting since it was suspended by crius: suspended "
                            "(opportunistic execution): its GPUs went to j-9, queued before it")
    # Carried round after round, written only when the policy's own words change.
    assert rounds.pending_updates(plan, {waiting.id: after}, Snapshot((), ()), FrenzyConfig()) == []
    plan2 = RoundPlan((Decision(waiting.id, "pending", "crius: waiting behind j-3"),), policy="crius")
    (again, _), = rounds.pending_updates(plan2, {waiting.id: after}, Snapshot((), ()), FrenzyConfig())
    assert again.reason.startswith("crius: waiting behind j-3; waiting since it was suspended by crius: ")
    assert again.reason.endswith("its GPUs went to j-9, queued before it")
    # A job requeued for another cause carries nothing.
    other = waiting.with_(reason="requeued: node a lost its lease")
    (plain, _), = rounds.pending_updates(plan, {waiting.id: other}, Snapshot((), ()), FrenzyConfig())
    assert plain.reason == "crius: waiting: no room now"


def test_attempt_failed_retries_within_max_retries_then_fails() -> None:
    rec, ev = transitions.attempt_failed(job(max_retries=2, retries=1), "rank 0: exit code 1", None, 5.0)
    assert rec.state == P.JOB_STATE_PENDING and rec.retries == 2 and rec.restarts == 1
    assert ev == [("ATTEMPT_FAILED", "attempt 1 failed: rank 0: exit code 1; retry 2 of 2")]
    rec, ev = transitions.attempt_failed(job(max_retries=2, retries=2), "rank 0: exit code 1", None, 5.0)
    assert rec.state == P.JOB_STATE_FAILED and rec.end_time == 5.0
    assert ev == [("FAILED", "attempt 1 failed: rank 0: exit code 1 (after 2 retries)")]
    _, ev = transitions.attempt_failed(job(max_retries=1, retries=1), "rank 0: exit code 1", None, 5.0)
    assert ev == [("FAILED", "attempt 1 failed: rank 0: exit code 1 (after 1 retry)")]  # was "1 retries"


def test_running_counts_its_ranks() -> None:
    assert transitions.running(job(), 1, None)[1] == [("RUNNING", "its 1 rank running (attempt 1)")]
    assert transitions.running(job(), 4, None)[1] == [("RUNNING", "all 4 ranks running (attempt 1)")]


def test_started_and_migrating_records() -> None:
    plan = PlanChoice(1, 1, 1, 16, 1, "A10-24GB", 1 << 30, "analytic")
    rec, ev = transitions.started(job(P.JOB_STATE_PENDING), plan, (Slice("b", (2,)),), "10.0.0.2:29600", "placed",
                                  "PLACED", 9.0)
    assert (rec.state, rec.attempt, rec.start_time, rec.stop_requested) == (P.JOB_STATE_STARTING, 2, 9.0, False)
    assert rec.placement is not None and rec.placement.rendezvous == "10.0.0.2:29600"
    assert ev == [("PLACED", "attempt 2: placed")]
    # Where attempt 1 ran is kept for its logs (its node, GPUs and processes), the last 32 attempts.
    assert [(e.attempt, [x.node_id for x in e.slices], list(e.slices[0].gpu_indices), e.world_size)
            for e in rec.placement.earlier] == [(1, ["a"], [0], 1)]
    for _ in range(40):
        rec, _ = transitions.started(rec, plan, (Slice("b", (2,)),), "10.0.0.2:29600", "placed", "PLACED", 9.0)
    assert [e.attempt for e in rec.placement.earlier] == list(range(10, 42)) and rec.attempt == 42
    d = Decision("j-1", "migrate", "faster", plan, (Slice("b", (2,)),), Cell("A10-24GB", 1), Cell("A10-24GB", 1), "move")
    rec, ev = transitions.migrating(job(model=P.ModelSpec(name="gpt2-small")), d)
    assert rec.state == P.JOB_STATE_MIGRATING and rec.stop_requested
    assert ev == [("MIGRATING", "move 1 x A10-24GB -> 1 x A10-24GB: faster; stopping attempt 1 with a checkpoint")]


def test_an_opaque_jobs_stop_promises_no_checkpoint() -> None:
    """Tessera takes no checkpoint of an opaque job: its program gets SIGTERM and may save itself."""
    d = Decision("j-1", "migrate", "faster", None, (Slice("b", (2,)),), Cell("A10-24GB", 1), Cell("A10-24GB", 1),
                 "move")
    sigterm = "stopping attempt 1 (SIGTERM; its program may save to $TESSERA_CHECKPOINT_DIR)"
    assert transitions.migrating(job(), d)[1] == [("MIGRATING", f"move 1 x A10-24GB -> 1 x A10-24GB: faster; {sigterm}")]
    assert transitions.migrating_off(job(), "node a drained")[1] == [("MIGRATING", f"node a drained: {sigterm}")]
    aware = transitions.migrating_off(job(model=P.ModelSpec(name="gpt2-small")), "node a drained")[1]
    assert aware == [("MIGRATING", "node a drained: stopping attempt 1 with a checkpoint")]
    own = job(model=P.ModelSpec(name="gpt2-small"))
    own.spec.entrypoint.extend(["{python}", "my_train.py"])  # its own program: its checkpoints are its own
    assert transitions.migrating_off(own, "node a drained")[1] == [("MIGRATING", f"node a drained: {sigterm}")]


def live(last_seen: float, registered: bool = True, liveness: int = P.NODE_STATE_READY,
         workers: tuple[tuple[str, int, int], ...] = ()) -> LiveNode:
    n = LiveNode("a", "10.0.0.1:7070", P.NodeInventory(), agent_pb2.NodeStatus(), last_seen, 0.0, registered, liveness)
    for job_id, state, gpu in workers:
        n.running.setdefault((job_id, 1), []).append(agent_pb2.WorkerStatus(job_id=job_id, attempt=1, state=state,
                                                                             gpu_indices=[gpu]))
    return n


def test_liveness_and_node_state() -> None:
    cfg = LivenessConfig(lease_s=15, down_after_s=120)
    assert liveness_at(live(100), 115, cfg) == P.NODE_STATE_READY
    assert liveness_at(live(100), 116, cfg) == P.NODE_STATE_UNREACHABLE
    assert liveness_at(live(100, registered=False), 101, cfg) == P.NODE_STATE_UNREACHABLE
    assert liveness_at(live(100), 221, cfg) == P.NODE_STATE_DOWN
    # the jobs of a silent node are lost only once its agent's fence has killed the workers:
    # receipt + lease 15 + fence grace 10 + margin 1
    assert not lease_lost(live(100), P.NODE_STATE_UNREACHABLE, 126, cfg)
    assert lease_lost(live(100), P.NODE_STATE_UNREACHABLE, 126.01, cfg)
    assert node_state(False, "", None, 0, lambda: False) == (P.NODE_STATE_UNREACHABLE, "no heartbeat for 0s")
    assert node_state(False, "", live(100, liveness=P.NODE_STATE_UNREACHABLE), 130, lambda: False) == (
        P.NODE_STATE_UNREACHABLE, "no heartbeat for 30s")
    assert node_state(True, "fan", live(100), 101, lambda: True) == (P.NODE_STATE_DRAINING, "fan")
    assert node_state(True, "fan", live(100), 101, lambda: False) == (P.NODE_STATE_DRAINED, "fan")
    assert node_state(False, "", live(100), 101, lambda: True) == (P.NODE_STATE_READY, "")


def test_busy_gpus_counts_placements_move_targets_and_reported_workers() -> None:
    nodes = {"a": live(0, workers=(("j-9", P.WORKER_STATE_RUNNING, 3), ("j-8", P.WORKER_STATE_EXITED, 2)))}
    active = [job(gpus=(0, 1)), job(job_id="j-2", node="b", gpus=(0,))]
    targets = {"j-1": (Slice("b", (1,)),)}
    assert busy_gpus(nodes, active, targets) == {"a": {0, 1, 3}, "b": {0, 1}}
    assert busy_gpus(nodes, active, targets, exclude="j-1") == {"a": {3}, "b": {0}}


def test_rendezvous_port_skips_ports_held_on_the_same_node() -> None:
    first = rendezvous_port("j-1", 1, "a", [], 29500, 4)
    assert 29500 <= first < 29504 and rendezvous_port("j-1", 1, "a", [], 29500, 4) == first
    held = [job(job_id=f"j-{p}", port=p) for p in range(29500, 29504) if p != 29502]
    assert rendezvous_port("j-1", 1, "a", held, 29500, 4) == 29502
    assert rendezvous_port("j-1", 1, "b", held, 29500, 4) == first  # other nodes' ports do not count
    with pytest.raises(RuntimeError):
        rendezvous_port("j-1", 1, "a", held + [job(job_id="j-x", port=29502)], 29500, 4)


def test_rank_node_counts_ranks_per_gpu_or_per_node() -> None:
    rec = job(gpus=(0, 1)).with_(placement=P.Placement(slices=[P.NodeSlice(node_id="a", gpu_indices=[0, 1]),
                                                               P.NodeSlice(node_id="b", gpu_indices=[3, 4])]))
    assert [rank_node(rec, r) for r in (-1, 0, 1, 2, 3, 4)] == [None, "a", "a", "b", "b", None]
    torchrun = rec.with_(spec=P.JobSpec(launcher=P.Launcher(name="torchrun")))
    assert [rank_node(torchrun, r) for r in (0, 1, 2)] == ["a", "b", None]


def test_the_reference_trainers_refusal_fails_the_job_without_a_retry() -> None:
    # A model or plan option it does not build (exit 3, named in its last line): each retry was placed,
    # launched and refused the same way (a live audit: three launches of a GShard MoE).
    why = "rank 0: exit code 3; last log line: model.family=moe without model.gated"
    trainer = job(max_retries=2, model=P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=64,
                                                   seq_length=16))
    rec, ev = transitions.attempt_failed(trainer, why, None, 5.0, exit_code=3)
    assert rec.state == P.JOB_STATE_FAILED and ev[0][0] == "FAILED" and "no retry" in ev[0][1]
    # A program of its own (an entrypoint) decides what its 3 means: retried as any failure.
    own = trainer.with_(spec=P.JobSpec(entrypoint=["/bin/false"], max_retries=2))
    assert transitions.attempt_failed(own, why, None, 5.0, exit_code=3)[0].state == P.JOB_STATE_PENDING
    assert transitions.attempt_failed(trainer, why, None, 5.0, exit_code=1)[0].state == P.JOB_STATE_PENDING
