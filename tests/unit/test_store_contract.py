"""One contract suite for every Store backend: SQLite, memory, and etcd (a real `etcd` process,
tests/etcd_server.py; each test on a prefix of its own, as the leader of that prefix)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.controller.store import (
    JobRecord,
    MemoryStore,
    NodeRecord,
    RequestConflict,
    SqliteStore,
    StaleWrite,
    Store,
)
from tessera.v1 import common_pb2
from tests.etcd_server import etcd_endpoint, leading_store

P = common_pb2
__all__ = ["etcd_endpoint"]  # the module-scoped etcd, a fixture


@pytest.fixture(params=["sqlite", "memory", "etcd"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "etcd":
        with leading_store(request.getfixturevalue("etcd_endpoint"), f"/t-{uuid.uuid4().hex[:8]}/") as es:
            yield es
        return
    s: Store = SqliteStore(tmp_path / "state.db") if request.param == "sqlite" else MemoryStore()
    yield s
    s.close()


def _job(i: int, req: str | None = None, tenant: str = "t") -> JobRecord:
    spec = P.JobSpec(name=f"job{i}", tenant=tenant, model=P.ModelSpec(name="gpt2-small"),
                     global_batch_size=8, iterations=10)
    return JobRecord(id=f"j-{i}", request_id=req or f"r-{i}", spec=spec, state=P.JOB_STATE_PENDING,
                     reason="new", submit_time=float(i))


def test_epoch_grows(store: Store) -> None:
    a, b = store.next_epoch(), store.next_epoch()
    assert b == a + 1


def test_a_meta_document_is_kept_apart_from_the_epoch(store: Store) -> None:
    assert store.get_meta("churn") is None
    epoch = store.next_epoch()
    store.put_meta("churn", '{"demoted":[]}')
    store.put_meta("churn", '{"demoted":["j-1"]}')
    assert store.get_meta("churn") == '{"demoted":["j-1"]}' and store.get_meta("epoch") is None
    assert store.next_epoch() == epoch + 1


def test_create_is_idempotent_on_request_id(store: Store) -> None:
    _j, created = store.create_job(_job(1), ("SUBMITTED", "x"))
    assert created
    again = _job(1).with_(id="j-other")
    j2, created2 = store.create_job(again, ("SUBMITTED", "x"))
    assert not created2 and j2.id == "j-1"
    assert [j.id for j in store.list_jobs()] == ["j-1"]
    assert len(store.events("j-1")) == 1


def test_request_id_reuse_with_other_spec_conflicts(store: Store) -> None:
    store.create_job(_job(1), ("SUBMITTED", "x"))
    other = _job(2, req="r-1")
    with pytest.raises(RequestConflict):
        store.create_job(other, ("SUBMITTED", "x"))
    assert store.get_job("j-2") is None
    stored = store.get_job("j-1")
    assert stored is not None and stored.spec.name == "job1"


def test_save_roundtrip_and_events(store: Store) -> None:
    store.create_job(_job(1), ("SUBMITTED", "x"))
    job = store.get_job("j-1")
    assert job is not None
    plan = P.Plan(dp=2, tp=1, pp=1, micro_batch=4, grad_accum=1, gpu_model="A10-24GB")
    placement = P.Placement(slices=[P.NodeSlice(node_id="n1", gpu_indices=[0, 1])], rendezvous="h:1")
    evs = store.save_job(job.with_(state=P.JOB_STATE_STARTING, attempt=1, plan=plan, placement=placement,
                                   progress=P.Progress(iteration=3, loss=1.5), stop_requested=True),
                         5.0, [("PLACED", "on n1"), ("STARTED", "go")])
    assert [e.kind for e in evs] == ["PLACED", "STARTED"]
    got = store.get_job("j-1")
    assert got is not None
    assert got.state == P.JOB_STATE_STARTING and got.attempt == 1 and got.stop_requested
    assert got.plan == plan and got.placement == placement and got.progress is not None
    assert got.progress.iteration == 3
    kinds = [e.kind for e in store.events("j-1")]
    assert kinds == ["SUBMITTED", "PLACED", "STARTED"]
    first = store.events("j-1")[0].seq
    assert [e.kind for e in store.events("j-1", after_seq=first)] == ["PLACED", "STARTED"]
    seqs = [e.seq for e in store.events("j-1")]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3


def test_save_unknown_job_raises(store: Store) -> None:
    with pytest.raises(KeyError):
        store.save_job(_job(9), 1.0)
    with pytest.raises(KeyError):
        store.save_current(_job(9), 1.0)


def test_save_current_refuses_writes_decided_from_an_older_read(store: Store) -> None:
    store.create_job(_job(1), ("SUBMITTED", "x"))
    read = store.get_job("j-1")
    assert read is not None
    store.save_current(read.with_(state=P.JOB_STATE_STARTING, attempt=2), 1.0, [("PLACED", "a2")])
    # From attempt 1 (read before attempt 2 was stored): refused, nothing stored, no event.
    with pytest.raises(StaleWrite) as e:
        store.save_current(read.with_(state=P.JOB_STATE_RUNNING, attempt=1), 2.0, [("RUNNING", "a1")])
    assert (e.value.stored_state, e.value.stored_attempt) == (P.JOB_STATE_STARTING, 2)
    now = store.get_job("j-1")
    assert now is not None and now.state == P.JOB_STATE_STARTING and now.attempt == 2
    # A cancel, then a write of another state from before it: refused; the same terminal state again
    # (a reason updated) is not.
    store.save_current(now.with_(state=P.JOB_STATE_CANCELLED), 3.0, [("CANCELLED", "by user")])
    with pytest.raises(StaleWrite):
        store.save_current(now.with_(state=P.JOB_STATE_PENDING, reason="requeued"), 4.0, [("REQUEUED", "x")])
    store.save_current(now.with_(state=P.JOB_STATE_CANCELLED, reason="cancelled, stopped"), 5.0)
    got = store.get_job("j-1")
    assert got is not None and got.state == P.JOB_STATE_CANCELLED and got.reason == "cancelled, stopped"
    assert [e.kind for e in store.events("j-1")] == ["SUBMITTED", "PLACED", "CANCELLED"]
    # save_job itself stays unconditional (recovery and the round's batch write through it).
    store.save_job(got.with_(state=P.JOB_STATE_PENDING, attempt=0), 6.0)
    back = store.get_job("j-1")
    assert back is not None and back.state == P.JOB_STATE_PENDING and back.attempt == 0


def test_list_filters(store: Store) -> None:
    store.create_job(_job(1, tenant="a"), ("SUBMITTED", ""))
    store.create_job(_job(2, tenant="b"), ("SUBMITTED", ""))
    j2 = store.get_job("j-2")
    assert j2 is not None
    store.save_job(j2.with_(state=P.JOB_STATE_RUNNING), 3.0)
    assert [j.id for j in store.list_jobs(states=[P.JOB_STATE_RUNNING])] == ["j-2"]
    assert [j.id for j in store.list_jobs(tenant="a")] == ["j-1"]
    assert [j.id for j in store.list_jobs()] == ["j-1", "j-2"]


def test_count_jobs_is_the_length_of_the_list_and_request_ids_are_known(store: Store) -> None:
    """SubmitJob's cap (controller/unended.py): count_jobs counts what list_jobs would list;
    has_request is True for the request ids create_job would answer with a stored job."""
    for i, tenant in ((1, "a"), (2, "a"), (3, "a"), (4, "b")):
        store.create_job(_job(i, req=f"{tenant}/r-{i}", tenant=tenant), ("SUBMITTED", ""))
    running, ended = store.get_job("j-2"), store.get_job("j-3")
    assert running is not None and ended is not None
    store.save_job(running.with_(state=P.JOB_STATE_RUNNING, attempt=1), 2.0)
    store.save_job(ended.with_(state=P.JOB_STATE_CANCELLED, end_time=3.0), 3.0)
    unended = (P.JOB_STATE_PENDING, P.JOB_STATE_STARTING, P.JOB_STATE_RUNNING, P.JOB_STATE_MIGRATING)
    for states, tenant in (((), ""), (unended, "a"), (unended, "b"), (unended, ""), (unended, "zz"),
                           ((P.JOB_STATE_CANCELLED,), "a"), ((), "a"), ((P.JOB_STATE_PENDING, P.JOB_STATE_CANCELLED), "a")):
        assert store.count_jobs(states, tenant) == len(store.list_jobs(states, tenant)), (states, tenant)
    assert store.count_jobs(unended, "a") == 2 and store.count_jobs(unended, "b") == 1
    assert store.has_request("a/r-1") and store.has_request("a/r-3")  # an ended job's too
    assert not store.has_request("b/r-1") and not store.has_request("r-1")
    assert store.delete_finished_jobs(ended_before=50.0, limit=10) == ["j-3"]
    assert not store.has_request("a/r-3")  # removed with its job: a new submit may take it


def test_nodes(store: Store) -> None:
    inv = P.NodeInventory(source=P.INVENTORY_SOURCE_DECLARED, gpus=[P.Gpu(index=0, model="A10-24GB")])
    store.put_node(NodeRecord("n1", "127.0.0.1:1", inv))
    store.put_node(NodeRecord("n0", "127.0.0.1:2", inv, drained=True, drain_reason="maint"))
    assert [n.id for n in store.list_nodes()] == ["n0", "n1"]
    n0 = store.get_node("n0")
    assert n0 is not None and n0.drained and n0.drain_reason == "maint" and n0.inventory == inv
    assert store.get_node("nx") is None


def test_sqlite_survives_reopen(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "state.db")
    e1 = s.next_epoch()
    s.create_job(_job(1), ("SUBMITTED", ""))
    s.close()
    s2 = SqliteStore(tmp_path / "state.db")
    assert s2.next_epoch() == e1 + 1
    assert s2.get_job("j-1") is not None
    mode = s2._db.execute("PRAGMA journal_mode").fetchone()[0]
    sync = s2._db.execute("PRAGMA synchronous").fetchone()[0]
    assert mode == "wal" and sync == 2  # 2 = FULL
    s2.close()


def test_save_jobs_is_all_or_nothing(store: Store) -> None:
    store.create_job(_job(1), ("SUBMITTED", ""))
    store.create_job(_job(2), ("SUBMITTED", ""))
    j1, j2 = store.get_job("j-1"), store.get_job("j-2")
    assert j1 is not None and j2 is not None
    store.save_jobs([(j1.with_(reason="a"), [("PENDING", "a")]), (j2.with_(reason="b"), [])], 7.0)
    assert [store.get_job(i).reason for i in ("j-1", "j-2")] == ["a", "b"]  # type: ignore[union-attr]
    with pytest.raises(KeyError):
        store.save_jobs([(j1.with_(reason="x"), [("PENDING", "x")]), (_job(9), [])], 8.0)
    assert store.get_job("j-1").reason == "a"  # type: ignore[union-attr]
    assert [e.kind for e in store.events("j-1")] == ["SUBMITTED", "PENDING"]


def test_launch_backoff_fields_roundtrip(store: Store) -> None:
    store.create_job(_job(1), ("SUBMITTED", "x"))
    job = store.get_job("j-1")
    assert job is not None and job.launch_failures == 0 and job.next_launch_time == 0.0
    store.save_job(job.with_(launch_failures=3, next_launch_time=1234.5), 2.0)
    again = store.get_job("j-1")
    assert again is not None and (again.launch_failures, again.next_launch_time) == (3, 1234.5)
    store.put_node(NodeRecord("n1", "127.0.0.1:1", launch_failures=4, unhealthy_until=99.5))
    node = store.get_node("n1")
    assert node is not None and (node.launch_failures, node.unhealthy_until) == (4, 99.5)
    assert store.list_nodes()[0] == node


def test_sqlite_migrates_a_version_1_database(tmp_path: Path) -> None:
    """A state directory written before the launch-backoff columns opens, keeps its jobs and nodes,
    and reads them with no failures counted."""
    import sqlite3

    path = tmp_path / "state.db"
    s = SqliteStore(path)
    s.create_job(_job(1), ("SUBMITTED", "x"))
    s.put_node(NodeRecord("n1", "127.0.0.1:1", drained=True, drain_reason="maint"))
    s.close()
    db = sqlite3.connect(path, isolation_level=None)  # as version 1 laid it out
    for table, cols in (("jobs", ("launch_failures", "next_launch_time")),
                        ("nodes", ("launch_failures", "unhealthy_until"))):
        for col in cols:
            db.execute(f"ALTER TABLE {table} DROP COLUMN {col}")
    db.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
    db.close()

    s = SqliteStore(path)
    job, node = s.get_job("j-1"), s.get_node("n1")
    assert job is not None and job.spec.name == "job1" and job.launch_failures == 0
    assert node is not None and node.drained and node.drain_reason == "maint" and node.unhealthy_until == 0
    s.put_node(node.with_(launch_failures=1))
    s.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("2",)
    db.close()


def test_pages_follow_submit_time_then_id(store: Store) -> None:
    for i in (3, 1, 2, 5, 4):
        store.create_job(_job(i, tenant="a" if i % 2 else "b"), ("SUBMITTED", ""))
    # two jobs with the same submit time: the id breaks the tie
    store.create_job(JobRecord(**{**_job(6).__dict__, "id": "j-0", "request_id": "r-x", "submit_time": 2.0}),
                     ("SUBMITTED", ""))
    keys = [(j.submit_time, j.id) for j in store.list_jobs()]
    assert keys == sorted(keys)
    pages, after = [], None
    while True:
        page = store.list_jobs_page(after=after, limit=2)
        if not page:
            break
        pages.append([j.id for j in page])
        after = (page[-1].submit_time, page[-1].id)
    assert pages == [["j-1", "j-0"], ["j-2", "j-3"], ["j-4", "j-5"]]
    assert [j.id for j in store.list_jobs_page(tenant="a", after=(1.0, "j-1"), limit=10)] == ["j-3", "j-5"]
    assert [j.id for j in store.list_jobs_page(states=[P.JOB_STATE_RUNNING], limit=10)] == []


def test_delete_finished_jobs_takes_their_events(store: Store) -> None:
    for i in range(1, 5):
        store.create_job(_job(i), ("SUBMITTED", ""))
    old = store.get_job("j-1")
    assert old is not None
    store.save_job(old.with_(state=P.JOB_STATE_SUCCEEDED, end_time=10.0), 10.0, [("SUCCEEDED", "")])
    recent = store.get_job("j-2")
    assert recent is not None
    store.save_job(recent.with_(state=P.JOB_STATE_CANCELLED, end_time=100.0), 100.0, [("CANCELLED", "")])
    assert store.delete_finished_jobs(ended_before=50.0, limit=10) == ["j-1"]
    assert store.get_job("j-1") is None and store.events("j-1") == []
    assert [e.kind for e in store.events("j-2")] == ["SUBMITTED", "CANCELLED"]
    assert store.delete_finished_jobs(ended_before=50.0, limit=10) == []
    # pending jobs are never removed, however old
    assert {j.id for j in store.list_jobs()} == {"j-2", "j-3", "j-4"}
    ev = store.save_job(store.get_job("j-3"), 200.0, [("X", "")])  # type: ignore[arg-type]
    assert ev[0].seq > max(e.seq for e in store.events("j-2"))  # sequence numbers are never reused


def test_remove_node_is_idempotent_by_request_id(store: Store) -> None:
    store.put_node(NodeRecord("n1", "h:1"))
    store.put_node(NodeRecord("n2", "h:2"))
    assert store.remove_node("n1", "rm-1", 5.0)
    assert store.get_node("n1") is None
    assert store.remove_node("n1", "rm-1", 6.0)  # a retry
    assert not store.remove_node("n1", "rm-2", 6.0)  # a new request: nothing to remove
    with pytest.raises(RequestConflict):
        store.remove_node("n2", "rm-1", 7.0)
    assert [n.id for n in store.list_nodes()] == ["n2"]


def test_save_jobs_of_a_large_round(store: Store) -> None:
    """More jobs than one etcd transaction holds (etcd's default --max-txn-ops is 128)."""
    for i in range(150):
        store.create_job(_job(i), ("SUBMITTED", ""))
    jobs = store.list_jobs()
    store.save_jobs([(j.with_(reason=f"r{j.id}"), [("PENDING", j.id)]) for j in jobs], 9.0)
    assert all(j.reason == f"r{j.id}" for j in store.list_jobs())
    assert [e.kind for e in store.events("j-149")] == ["SUBMITTED", "PENDING"]
    seqs = [e.seq for j in jobs for e in store.events(j.id)]
    assert len(set(seqs)) == len(seqs) == 300
