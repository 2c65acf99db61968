"""The attempt a relaunch goes above (controller/registry.attempt_floor): the stored one, raised by
what the nodes it will run on ran, by a bounded amount."""

from __future__ import annotations

from tessera.controller.registry import MAX_ATTEMPT_FLOOR, MAX_ATTEMPT_SKIP, LiveNode, attempt_floor
from tessera.v1 import agent_pb2, common_pb2


def node(marks: dict[str, int] | None = None, running: list[tuple[str, int]] = ()) -> LiveNode:  # type: ignore[assignment]
    return LiveNode("a", "10.0.0.1:7070", common_pb2.NodeInventory(), agent_pb2.NodeStatus(), 0.0, 0.0,
                    running={k: [] for k in running}, marks=marks or {})


def test_the_stored_attempt_when_no_node_ran_a_later_one() -> None:
    assert attempt_floor([node({"j": 2}, [("j", 3)])], "j", 5) == 5
    assert attempt_floor([node({"other": 9})], "j", 1) == 1
    assert attempt_floor([], "j", 4) == 4


def test_the_highest_of_marks_and_reported_workers() -> None:
    assert attempt_floor([node({"j": 4}), node(running=[("j", 6), ("k", 9)])], "j", 1) == 6
    assert attempt_floor([node({"j": 7}, [("j", 6)])], "j", 1) == 7


def test_a_node_cannot_push_it_more_than_the_bound() -> None:
    assert attempt_floor([node({"j": 2**31 - 1})], "j", 3) == 3 + MAX_ATTEMPT_SKIP
    # Relaunch after relaunch, it stops at MAX_ATTEMPT_FLOOR (a review: else past int32 after 214,727).
    assert attempt_floor([node({"j": 2**31 - 1})], "j", MAX_ATTEMPT_FLOOR - 5) == MAX_ATTEMPT_FLOOR
    assert attempt_floor([node({"j": 2**31 - 1})], "j", MAX_ATTEMPT_FLOOR) == MAX_ATTEMPT_FLOOR
    assert attempt_floor([node({"j": 2**31 - 1})], "j", MAX_ATTEMPT_FLOOR + 7) == MAX_ATTEMPT_FLOOR + 7


def test_a_register_carries_the_newest_jobs_of_both_tables() -> None:
    """A review: copying `launched` then appending the jobs only in `stopped` sent the oldest of
    those and none of the newest launched once a node had run more than the cap."""
    from types import SimpleNamespace

    from tessera.common.nodespec import MAX_ATTEMPT_MARKS
    from tessera.nodeagent.agent import Agent

    launched = {f"j{i:05d}": 1 for i in range(20_000)}
    stopped = {f"s{i:05d}": 2 for i in range(5_000)} | {"j19999": 3}
    sup = SimpleNamespace(export_state=lambda: {"workers": [], "launched": launched, "stopped": stopped})
    marks = {m.job_id: m.attempt for m in Agent.attempt_marks(SimpleNamespace(supervisor=sup))}  # type: ignore[arg-type]
    assert len(marks) <= MAX_ATTEMPT_MARKS and marks["j19999"] == 3 and "s04999" in marks
    assert "j00000" not in marks and "s00000" not in marks
