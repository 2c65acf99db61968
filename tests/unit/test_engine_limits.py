"""Node removal and retention on the engine (MemoryStore, in-memory agents, a fake clock), with the
invariants of tests/unit/test_engine.py checked after every step."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tessera.common.errors import FailedPrecondition
from tessera.controller.engine import NodeNotFound
from tessera.controller.retention import DAY, Retention, RetentionConfig
from tessera.v1 import common_pb2 as P
from tests.unit.test_engine import Harness, run_to_running, tiny


async def test_remove_node_on_a_node_still_draining_says_to_wait() -> None:
    """Drained, its attempt still stopping: the refusal says to wait, not to drain (an operator
    audit read `drain it first` after draining)."""
    h = Harness()
    await h.register("a", "b")
    jid = await h.submit(tiny())
    await h.round()
    await run_to_running(h, jid)
    await h.engine.drain(h.nodes_of(jid)[0], "maintenance")
    node = h.nodes_of(jid)[0]
    with pytest.raises(FailedPrecondition, match=f"^node {node} is draining: 1 attempt\\(s\\) on it have not "
                                                 f"stopped yet \\({jid}\\); wait until it is DRAINED"):
        await h.engine.remove_node(node, False, "rm-1")


async def test_remove_node_refused_while_it_runs_work_then_forced() -> None:
    h = Harness()
    await h.register("a", "b")
    jid = await h.submit(tiny())
    await h.round()
    await run_to_running(h, jid)
    assert h.nodes_of(jid) == ["a"]

    with pytest.raises(FailedPrecondition, match=f"node a holds 1 running attempt.*{jid}"):
        await h.engine.remove_node("a", False, "rm-1")
    assert h.engine.view.node("a").state == P.NODE_STATE_READY and h.state(jid) == "RUNNING"

    stops = len(h.agents.stops())
    assert await h.engine.remove_node("a", True, "rm-2")
    h.check()
    # requeued as for a lost node, its workers told to stop, the node gone from store and registry
    assert h.state(jid) == "PENDING" and h.kinds(jid)[-1] == "NODE_LOST" and "removed" in h.job(jid).reason
    assert len(h.agents.stops()) == stops + 1
    assert h.store.get_node("a") is None and "a" not in h.engine.view.node_ids()
    with pytest.raises(NodeNotFound):
        h.engine.view.node("a")
    assert await h.engine.remove_node("a", True, "rm-2")  # a retry of the same request
    with pytest.raises(NodeNotFound):
        await h.engine.remove_node("a", True, "rm-3")
    with pytest.raises(NodeNotFound):
        await h.engine.remove_node("zz", False, "rm-4")

    # the job goes elsewhere; the removed agent's next heartbeat is told to register, and it comes back
    await h.round()
    assert h.nodes_of(jid) == ["b"]
    assert not await h.engine.heartbeat(h.agents.status("a"), h.engine.epoch)
    await h.register("a")
    assert h.engine.view.node("a").state == P.NODE_STATE_READY
    assert await h.engine.remove_node("a", True, "rm-2")  # a late retry leaves the returned node alone
    assert h.engine.view.node("a").state == P.NODE_STATE_READY and h.store.get_node("a") is not None


async def test_a_node_drained_before_removal_stays_drained_when_it_returns() -> None:
    h = Harness()
    await h.register("a", "b")
    await h.engine.drain("a", "retire")
    assert h.agents.status("a").draining
    assert await h.engine.remove_node("a", False, "rm-1")
    await h.register("a")
    node = h.engine.view.node("a")
    assert node.state == P.NODE_STATE_DRAINED and node.reason
    jid = await h.submit(tiny())
    await h.round()
    assert h.nodes_of(jid) == ["b"]


async def test_retention_removes_finished_jobs_and_their_checkpoints(tmp_path: Path) -> None:
    h = Harness()
    h.clock.now = time.time()  # folders' times are the disk's: the fake clock starts at the real one
    await h.register("a", "b")
    old = await h.submit(tiny("old"))
    await h.engine.cancel(old)
    for jid in (old,):
        (tmp_path / jid / "step-10").mkdir(parents=True)
    h.clock.advance(2 * DAY)
    recent = await h.submit(tiny("recent"))
    await h.engine.cancel(recent)
    pending = await h.submit(tiny("pending", gpus=64))  # fits nowhere: stays PENDING for ever
    await h.round()
    for jid in (recent, pending):
        (tmp_path / jid / "step-10").mkdir(parents=True)
    stale = h.clock.now - 10 * DAY
    for jid in (recent, pending):
        os.utime(tmp_path / jid, (stale, stale))  # old folders: only the job's state may keep them
    orphan = tmp_path / "j-0123456789ab"  # of a job the store does not have, written long ago
    orphan.mkdir()
    (tmp_path / "not-a-job!").mkdir()
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    os.symlink(outside, tmp_path / "j-feedfacecafe")
    for p in (orphan, tmp_path / "not-a-job!"):
        os.utime(p, (stale, stale))

    ret = Retention(h.store, str(tmp_path), RetentionConfig(job_ttl_s=1 * DAY, checkpoint_ttl_s=1.5 * DAY,
                                                            batch=1), wall=h.clock)
    assert ret.sweep_jobs() == [old]  # ended 2 days ago; recent just now; pending never
    h.submitted.remove(old)
    h.check()
    assert h.store.get_job(old) is None and h.store.events(old) == []
    assert {j.id for j in h.store.list_jobs()} == {recent, pending}
    # old's folder (job gone, written 2 days ago) and the orphan go; recent ended too lately, pending
    # is not finished, the odd name and the symbolic link are not job folders of this root
    assert sorted(ret.sweep_checkpoints()) == sorted([tmp_path / old, orphan])
    assert (tmp_path / recent).exists() and (tmp_path / pending / "step-10").exists()
    assert (tmp_path / "not-a-job!").exists() and (outside / "keep").exists()
    assert (tmp_path / "j-feedfacecafe").is_symlink()

    h.clock.advance(2 * DAY)
    assert ret.sweep_jobs() == [recent]
    h.submitted.remove(recent)
    h.check()
    assert ret.sweep_checkpoints() == [tmp_path / recent]
    assert (tmp_path / pending / "step-10").exists(), "a job not finished keeps its checkpoints"
    assert h.state(pending) == "PENDING"


async def test_ttl_zero_keeps_forever(tmp_path: Path) -> None:
    h = Harness()
    jid = await h.submit(tiny())
    await h.engine.cancel(jid)
    (tmp_path / jid).mkdir()
    h.clock.advance(10_000 * DAY)
    ret = Retention(h.store, str(tmp_path), RetentionConfig(job_ttl_s=0, checkpoint_ttl_s=0), wall=h.clock)
    assert ret.sweep_jobs() == [] and ret.sweep_checkpoints() == []
    assert h.state(jid) == "CANCELLED" and (tmp_path / jid).exists()


async def test_the_async_sweep_deletes_in_batches(tmp_path: Path) -> None:
    h = Harness()
    ids = [await h.submit(tiny(f"j{i}")) for i in range(7)]
    for jid in ids:
        await h.engine.cancel(jid)
    h.clock.advance(8 * DAY)
    ret = Retention(h.store, str(tmp_path), RetentionConfig(batch=3), wall=h.clock)
    jobs, folders = await ret.sweep()
    assert sorted(jobs) == sorted(ids) and folders == [] and h.store.list_jobs() == []


def test_controller_flags_and_page_key(tmp_path: Path) -> None:
    from tessera.controller.main import page_key, parse_args

    args = parse_args(["--insecure", "--state-dir", str(tmp_path), "--job-ttl", "0", "--checkpoint-ttl", "86400"])
    assert (args.job_ttl, args.checkpoint_ttl, args.retention_interval) == (0, 86400, 600)
    assert parse_args(["--insecure", "--state-dir", str(tmp_path)]).job_ttl == 7 * DAY
    with pytest.raises(SystemExit):
        parse_args(["--insecure", "--state-dir", str(tmp_path), "--job-ttl", "-1"])
    key = page_key(tmp_path / "page-token.key")
    assert len(key) == 32 and page_key(tmp_path / "page-token.key") == key  # kept across restarts
    assert (tmp_path / "page-token.key").stat().st_mode & 0o777 == 0o600
