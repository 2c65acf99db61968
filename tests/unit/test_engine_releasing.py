"""GPUs being freed (NodeView.releasing: a job checkpointing to stop, a move's old place) are free to
the policy: a job it started on them waits for the checkpoint, and later rounds place it there
again instead of freeing more GPUs for it (a live audit: crius halved a second running job for a
job already waiting on the first one's scale-down, and the first one's GPUs then sat idle). The
engine harness of test_engine.py (fake agents, fake clock)."""

from __future__ import annotations

from tessera.controller.core.snapshot import Slice
from tessera.v1 import common_pb2 as P
from tests.unit.test_engine import Harness, ScriptedMoves, run_to_running, tiny


def medium(name: str, gpus: int) -> P.JobSpec:
    """A model whose estimates gain from more GPUs (the tiny one's do not past 2)."""
    s = tiny(name, iterations=400, gpus=gpus)
    s.model.CopyFrom(P.ModelSpec(hidden_size=2048, num_layers=16, num_heads=16, vocab_size=32000, seq_length=1024))
    s.global_batch_size = 64
    return s


async def test_a_job_waiting_on_a_scale_down_is_not_given_a_second_one() -> None:
    h = Harness(policy="crius", nodes=("a", "b"))
    await h.register("a", "b")
    big = [await h.submit(medium(f"big-{i}", 4)) for i in (1, 2)]
    await h.round()
    for j in big:
        await run_to_running(h, j)
    first, other = big
    small = await h.submit(medium("small", 2))
    await h.round()
    assert h.state(first) == "MIGRATING" and "scaled down to make room for " + small in h.job(first).reason
    assert h.job(small).reason == f"waiting for {first} to checkpoint and stop: it starts on their GPUs once they are free"
    for _ in range(3):  # rounds before it has stopped: nobody else is scaled down for the small job
        await h.round()
        assert (h.state(first), h.state(other), h.state(small)) == ("MIGRATING", "RUNNING", "PENDING")
        assert first in h.job(small).reason
    await h.heartbeat("a", "b")  # stopped with its checkpoint: relaunched on the half it keeps
    assert h.state(first) == "STARTING" and h.job(first).attempt == 2
    await h.round()
    assert h.state(small) == "STARTING" and h.nodes_of(small) == h.nodes_of(first) == ["a"]
    assert h.state(other) == "RUNNING" and h.job(other).attempt == 1


async def test_a_move_onto_gpus_being_freed_waits_for_them_instead_of_requeueing() -> None:
    """Policies place on GPUs being freed, moves too: a job whose old attempt stops before the
    target's holder has checkpointed waits for it (it was requeued, losing its target)."""
    h = Harness(scripted=True, nodes=("a", "b", "c"))
    for n in ("a", "b", "c"):  # one GPU each
        del h.agents.nodes[n].inventory.gpus[1:]
    await h.register("a", "b", "c")
    r, m = [await h.submit(tiny(name, gpus=1)) for name in ("r", "m")]
    await h.round()
    for j in (r, m):
        await run_to_running(h, j)
    (r_node,), (m_node,) = h.nodes_of(r), h.nodes_of(m)
    (free,) = {"a", "b", "c"} - {r_node, m_node}
    assert isinstance(h.policy, ScriptedMoves)
    h.policy.move = {r: (Slice(free, (0,)),), m: (Slice(r_node, (0,)),)}
    await h.round()
    assert h.state(r) == h.state(m) == "MIGRATING"
    await h.heartbeat(m_node)  # m has stopped; r, on the GPU m moves to, has not
    assert h.state(m) == "MIGRATING" and "STOPPED" not in h.kinds(m)
    await h.heartbeat(r_node)  # r has stopped: relaunched on its target
    assert h.state(r) == "STARTING" and h.nodes_of(r) == [free]
    await h.inspect()  # m's next look: its target is free
    assert h.state(m) == "STARTING" and h.nodes_of(m) == [r_node] and h.job(m).attempt == 2
    assert h.kinds(m)[-2:] == ["MIGRATING", "MIGRATED"]
