"""A record the store cannot read is left out, and every other job is served (controller/badrecords.py).

An audit put garbage into one record: one SQLite row's protobuf kept the controller from starting;
one JSON document under the etcd prefix (or a key someone else wrote there) made every controller
of an HA cluster take the lead, die reading its jobs, and hand the lead to the next, which died the
same way. Real SQLite files and a real etcd (tests/etcd_server.py)."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest
from aetcd import rpc as etcdrpc

from tessera.controller.store import NodeRecord, SqliteStore, StateError
from tessera.v1 import common_pb2 as P
from tests.etcd_server import etcd_endpoint, leading_store
from tests.integration.test_etcd_store import _job

__all__ = ["etcd_endpoint"]

GARBLED = bytes.fromhex("0affffffff0f")  # a length-delimited field longer than the data


def test_sqlite_rows_that_do_not_parse_are_left_out(tmp_path: Path) -> None:
    db = tmp_path / "controller.db"
    s = SqliteStore(db)
    for i in (1, 2, 3):
        s.create_job(_job(i), ("SUBMITTED", ""))
    s.put_node(NodeRecord("n1", "127.0.0.1:1"))
    s.put_node(NodeRecord("n2", "127.0.0.1:2"))
    s.close()
    raw = sqlite3.connect(db)
    raw.execute("UPDATE jobs SET spec=? WHERE id='j-2'", (GARBLED,))
    raw.execute("UPDATE jobs SET state='RUNNING' WHERE id='j-3'")  # text in a number column
    raw.execute("UPDATE nodes SET inventory=? WHERE id='n2'", (GARBLED,))
    raw.commit()
    raw.close()
    s = SqliteStore(db)  # opens: it used to fail here, on the first list of the jobs
    assert [j.id for j in s.list_jobs()] == ["j-1"]
    assert [j.id for j in s.list_jobs([P.JOB_STATE_PENDING])] == ["j-1"]
    assert s.get_job("j-2") is None and s.get_job("j-1") is not None
    assert [n.id for n in s.list_nodes()] == ["n1"] and s.get_node("n2") is None
    s.close()


def test_etcd_records_no_tessera_wrote_are_left_out(etcd_endpoint: str) -> None:
    prefix = f"/t-{uuid.uuid4().hex[:8]}/"
    with leading_store(etcd_endpoint, prefix) as s:
        for i in (1, 2, 3):
            s.create_job(_job(i), ("SUBMITTED", ""))
        s.put_node(NodeRecord("n1", "127.0.0.1:1"))

        def put(key: str, value: bytes) -> None:
            s.c.call(s.c.rpc(lambda: s.c.kv.Put(etcdrpc.PutRequest(key=s._k(key), value=value), timeout=5)))

        put("job/j-2", b"not json")
        put("job/zzz-foreign", b"hello")
        put("job/j-3", b'{"id": "j-3"}')  # a document without the fields
        put("node/x", b"{}")
        put("ev/j-1/zzz", b"hi")
    with leading_store(etcd_endpoint, prefix, "b:1") as b:  # the next leader: it used to die here
        assert [j.id for j in b.list_jobs()] == ["j-1"]
        assert [j.id for j in b.list_jobs([P.JOB_STATE_PENDING])] == ["j-1"]
        assert [j.id for j in b.list_jobs_page()] == ["j-1"]
        assert b.get_job("j-2") is None and b.get_job("j-1") is not None
        assert [n.id for n in b.list_nodes()] == ["n1"]
        assert [e.kind for e in b.events("j-1")] == ["SUBMITTED"]
        b.save_job(b.get_job("j-1").with_(reason="still served"), 9.0, [("PENDING", "x")])  # type: ignore[union-attr]


def test_an_epoch_no_tessera_wrote_is_one_line_not_a_crash_loop(etcd_endpoint: str) -> None:
    prefix = f"/t-{uuid.uuid4().hex[:8]}/"
    with leading_store(etcd_endpoint, prefix) as s:
        s.c.call(s.c.rpc(lambda: s.c.kv.Put(etcdrpc.PutRequest(key=s._k("meta", "epoch"), value=b"abc"),
                                            timeout=5)))
        with pytest.raises(StateError, match="not an epoch: not written by Tessera"):
            s.next_epoch()


@pytest.mark.parametrize("key, value, reason", [
    ("schema_version", "abc", "meta schema_version is 'abc', not a number"),
    ("schema_version", "99", "state of schema 99; this Tessera reads 1..2"),
    ("schema_version", "0", "state of schema 0; this Tessera reads 1..2"),
])
def test_sqlite_meta_no_tessera_wrote_is_one_line(tmp_path: Path, key: str, value: str, reason: str) -> None:
    """These were a ValueError or KeyError traceback at start."""
    db = tmp_path / "controller.db"
    SqliteStore(db).close()
    raw = sqlite3.connect(db)
    raw.execute("UPDATE meta SET value=? WHERE key=?", (value, key))
    raw.commit()
    raw.close()
    with pytest.raises(StateError, match=reason):
        SqliteStore(db)


def test_sqlite_epoch_and_id_file_no_tessera_wrote(tmp_path: Path) -> None:
    db = tmp_path / "controller.db"
    s = SqliteStore(db)
    s.next_epoch()
    s.close()
    raw = sqlite3.connect(db)
    raw.execute("UPDATE meta SET value='x' WHERE key='epoch'")
    raw.commit()
    raw.close()
    with pytest.raises(StateError, match="meta epoch is 'x', not a number"):
        SqliteStore(db).next_epoch()
    (tmp_path / "controller.db.id").write_bytes(b"\xff\xfe")  # was a UnicodeDecodeError traceback
    with pytest.raises(StateError, match="the database\nwas replaced|was replaced"):
        SqliteStore(db)


def test_a_locked_database_is_not_called_damaged(tmp_path: Path) -> None:
    """Its advice (restore, or a new --state-dir) would throw a healthy database away."""
    db = tmp_path / "controller.db"
    SqliteStore(db).close()
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StateError, match="another process holds it") as err:
            SqliteStore(db)
        assert "new --state-dir" not in str(err.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_leader_key_without_a_lease_is_said(etcd_endpoint: str) -> None:
    """A key no controller wrote (every controller's has its lease) never expires: the standbys used
    to wait in silence. It is logged once as leader_key_without_lease."""
    from structlog.testing import capture_logs

    from tessera.controller.election import Leadership
    from tessera.controller.etcd import EtcdClient, EtcdConfig

    prefix = f"/t-{uuid.uuid4().hex[:8]}/"
    client = EtcdClient(EtcdConfig((etcd_endpoint,), prefix=prefix))
    try:
        lead = Leadership(client, "b:1", ttl_s=2)
        client.call(client.rpc(lambda: client.kv.Put(etcdrpc.PutRequest(key=lead.leader_key, value=b"{}"),
                                                     timeout=5)))
        with capture_logs() as logs:
            client.call(lead._wait_leader_gone(), 30)
            client.call(lead._wait_leader_gone(), 30)
        said = [e for e in logs if e["event"] == "leader_key_without_lease"]
        assert len(said) == 1 and "etcdctl del" in said[0]["detail"]
    finally:
        client.close()
