"""GPUs being freed (NodeView.releasing: a job checkpointing to stop, a move's old place) are free to
the policy: a job it started on them waits for the checkpoint, and later rounds place it there
again instead of freeing more GPUs for it (a live audit: crius halved a second running job for a
job already waiting on the first one's scale-down, and the first one's GPUs then sat idle). The
engine harness of test_engine.py (fake agents, fake clock)."""

from __future__ import annotations

from tessera.v1 import common_pb2 as P
from tests.unit.test_engine import Harness, run_to_running, tiny


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
