"""The etcd store's fencing and identity, on a real etcd (tests/etcd_server.py)."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aetcd import rpc as etcdrpc

from tessera.common.errors import Unavailable
from tessera.controller import etcdstore
from tessera.controller.election import Leadership, NotLeader
from tessera.controller.etcd import EtcdClient, EtcdConfig
from tessera.controller.etcdstore import EtcdStore, sortable_time
from tessera.controller.store import JobRecord, NodeRecord, StateError
from tessera.v1 import common_pb2 as P
from tests.etcd_server import etcd_endpoint, etcd_server, leading_store
from tests.procs import wait_for

__all__ = ["etcd_endpoint"]


def _job(i: int) -> JobRecord:
    spec = P.JobSpec(name=f"job{i}", tenant="t", model=P.ModelSpec(name="gpt2-small"), global_batch_size=8,
                     iterations=10)
    return JobRecord(id=f"j-{i}", request_id=f"r-{i}", spec=spec, state=P.JOB_STATE_PENDING, reason="new",
                     submit_time=float(i))


def _prefix() -> str:
    return f"/t-{uuid.uuid4().hex[:8]}/"


def test_a_deposed_leader_cannot_write(etcd_endpoint: str) -> None:
    prefix = _prefix()
    with leading_store(etcd_endpoint, prefix, "a:1", ttl_s=2) as a:
        a.create_job(_job(1), ("SUBMITTED", ""))
        lead_a = a.lead
        # A stalls (its keep-alive stops) past its lease; B, waiting, takes over with a higher epoch.
        a.c.loop.call_soon_threadsafe(lead_a._keepalive.cancel)  # type: ignore[union-attr]
        t0 = time.monotonic()
        with leading_store(etcd_endpoint, prefix, "b:1", ttl_s=2) as b:
            took = time.monotonic() - t0
            assert b.lead.epoch > lead_a.epoch
            assert took < 2 + 1.5, f"B led {took:.1f}s after A's last keep-alive with a 2s lease"
            assert not lead_a.is_leader()
            # Even a process that still believes it leads (it passed its own check just before the
            # stall) is refused by etcd: the fence compares the leader key's create revision.
            lead_a.is_leader = lambda: True  # type: ignore[method-assign]
            job = a.get_job("j-1")
            assert job is not None
            with pytest.raises(NotLeader):
                a.save_job(job.with_(state=P.JOB_STATE_CANCELLED), 5.0, [("CANCELLED", "by the old leader")])
            with pytest.raises(NotLeader):
                a.create_job(_job(2), ("SUBMITTED", ""))
            with pytest.raises(NotLeader):
                a.put_node(NodeRecord("n1", "127.0.0.1:1"))
            with pytest.raises(NotLeader):
                a.next_epoch()
            with pytest.raises(NotLeader):
                a.put_meta("churn", "{}")
            # Nothing of it landed; the new leader reads and writes the same state.
            got = b.get_job("j-1")
            assert got is not None and got.state == P.JOB_STATE_PENDING
            assert [e.kind for e in b.events("j-1")] == ["SUBMITTED"]
            assert b.get_job("j-2") is None and b.get_node("n1") is None
            b.save_job(got.with_(reason="b"), 6.0, [("PENDING", "b")])


def test_a_leader_that_lost_its_lease_refuses_writes_itself(etcd_endpoint: str) -> None:
    with leading_store(etcd_endpoint, _prefix(), ttl_s=2) as s:
        lost: list[str] = []
        s.lead.on_lost = lost.append
        s.c.loop.call_soon_threadsafe(s.lead._keepalive.cancel)  # type: ignore[union-attr]
        wait_for(lambda: not s.lead.is_leader(), 5, "the local lease deadline to pass")
        with pytest.raises(NotLeader):
            s.create_job(_job(1), ("SUBMITTED", ""))


def test_on_lost_fires_when_etcd_expires_the_lease(etcd_endpoint: str) -> None:
    client = EtcdClient(EtcdConfig((etcd_endpoint,), prefix=_prefix()))
    try:
        lead = Leadership(client, "x:1", ttl_s=2)
        client.call(lead.campaign(), 30)
        lost: list[str] = []
        lead.on_lost = lost.append
        client.call(lead._revoke(lead.lease_id))  # as if etcd expired it (or an operator revoked it)
        wait_for(lambda: lost, 5, "on_lost after the lease is gone")
        assert not lead.is_leader()
    finally:
        client.close()


def test_epochs_grow_across_leaders(etcd_endpoint: str) -> None:
    prefix = _prefix()
    epochs = []
    for name in ("a:1", "b:1", "c:1"):
        with leading_store(etcd_endpoint, prefix, name) as s:
            epochs.append(s.lead.epoch)
            epochs.append(s.next_epoch())
    assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs)


def test_the_churn_ledger_document_outlives_its_leader(etcd_endpoint: str) -> None:
    prefix = _prefix()
    with leading_store(etcd_endpoint, prefix, "a:1") as a:
        assert a.get_meta("churn") is None
        a.put_meta("churn", '{"demoted":["j-1"]}')
    with leading_store(etcd_endpoint, prefix, "b:1") as b:
        assert b.get_meta("churn") == '{"demoted":["j-1"]}'


def test_an_emptied_or_replaced_prefix_is_refused(etcd_endpoint: str, tmp_path: Path) -> None:
    marker = tmp_path / "controller.etcd.id"
    prefix = _prefix()
    with leading_store(etcd_endpoint, prefix, marker=marker) as s:
        s.create_job(_job(1), ("SUBMITTED", ""))
        first = s.store_id
    assert marker.read_text().strip() == first
    with leading_store(etcd_endpoint, prefix, marker=marker) as s:  # reopens: same store
        assert s.get_job("j-1") is not None
    # A prefix with nothing in it (etcd's data lost)
    with pytest.raises(StateError, match="emptied"), leading_store(etcd_endpoint, _prefix(), marker=marker):
        pass
    other = _prefix()
    with leading_store(etcd_endpoint, other):
        pass
    with pytest.raises(StateError, match="replaced"), leading_store(etcd_endpoint, other, marker=marker):
        pass


def test_the_store_opened_by_a_leader_only(etcd_endpoint: str) -> None:
    client = EtcdClient(EtcdConfig((etcd_endpoint,), prefix=_prefix()))
    try:
        with pytest.raises(NotLeader):
            EtcdStore(client, Leadership(client, "x:1"))  # never campaigned: cannot even write its identity
    finally:
        client.close()


def _keys(s: EtcdStore, *parts: str) -> list[str]:
    return [bytes(kv.key)[len(s.p):].decode() for kv in s._range(s._k(*parts), prefix=True, keys_only=True)]


def test_the_page_index_sorts_as_the_floats_do() -> None:
    times = [-1e300, -2.5, -1.0, -1e-300, 0.0, 5e-324, 1e-9, 1.0, 1.0000000000000002, 2.0, 1764130000.123456,
             1764130000.1234562, 1e300, float("inf")]
    assert sorted(times, key=sortable_time) == times
    assert sortable_time(-0.0) == sortable_time(0.0)
    assert all(len(sortable_time(t)) == 16 for t in times)


def test_pages_across_index_batches_and_deletion_takes_every_key(etcd_endpoint: str) -> None:
    """More jobs than one batch of index keys, filtered pages, and no key of a deleted job left."""
    with leading_store(etcd_endpoint, _prefix()) as s:
        n = etcdstore.MAX_TXN_OPS + 30
        for i in range(n):
            job = _job(i).with_(submit_time=1764130000.0 + i / 7)
            s.create_job(job if i % 3 else job.with_(spec=P.JobSpec(**{**_spec_fields(job), "tenant": "u"})),
                         ("SUBMITTED", ""))
        everyone = [j.id for j in s.list_jobs()]
        for tenant, limit in (("", 7), ("u", 5), ("t", 50)):
            got, after = [], None
            while page := s.list_jobs_page(tenant=tenant, after=after, limit=limit):
                assert len(page) <= limit
                got += [j.id for j in page]
                after = (page[-1].submit_time, page[-1].id)
            assert got == [j for j in everyone if not tenant or s.get_job(j).spec.tenant == tenant]  # type: ignore[union-attr]
        assert [j.id for j in s.list_jobs_page(limit=-1)] == everyone
        done = s.get_job("j-4")
        assert done is not None
        s.save_job(done.with_(state=P.JOB_STATE_FAILED, end_time=10.0), 10.0, [("FAILED", "")])
        assert s.delete_finished_jobs(ended_before=time.time() + 100, limit=10) == ["j-4"]
        keys = [key for k in ("job", "spec", "req", "ev", "jobidx") for key in _keys(s, k, "")]
        assert [k for k in keys if k.endswith("/j-4") or "/j-4/" in k or k == "req/r-4"] == []
        assert len(keys) == 5 * (n - 1)  # each of the others: record, spec, request id, index, one event
        assert "j-4" not in [j.id for j in s.list_jobs_page(limit=-1)]


def test_whole_prefix_reads_come_in_pages_of_one_snapshot(etcd_endpoint: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole-prefix read is paged (one Range of every job outgrew the 16 MiB message limit and
    took the cluster down): with pages of 3 keys, 70 jobs (more than MAX_TXN_OPS / 2, so the specs
    come by prefix too) all come back, specs included, and a deletion sweep sees them all."""
    monkeypatch.setattr(etcdstore, "RANGE_PAGE", 3)
    with leading_store(etcd_endpoint, _prefix()) as s:
        n = etcdstore.MAX_TXN_OPS // 2 + 10
        for i in range(n):
            s.create_job(_job(i), ("SUBMITTED", ""))
        limits: list[int] = []
        real = s.c.kv.Range

        def counted(req: object, timeout: float) -> object:
            limits.append(req.limit)  # type: ignore[attr-defined]
            return real(req, timeout=timeout)

        s.c.kv.Range = counted
        jobs = s.list_jobs()
        s.c.kv.Range = real
        assert len(limits) >= 2 * n // 3 and set(limits) == {3}  # records and specs, 3 keys a call
        assert [j.id for j in jobs] == [f"j-{i}" for i in range(n)]
        assert {j.spec.name for j in jobs} == {f"job{i}" for i in range(n)}
        assert len(s.list_jobs(states=[P.JOB_STATE_PENDING])) == n
        s.save_jobs([(j.with_(reason="waiting"), []) for j in jobs], 5.0)  # reads every key, paged
        for j in jobs[:4]:
            s.save_job(j.with_(state=P.JOB_STATE_FAILED, end_time=1.0), 1.0, [])
        assert sorted(s.delete_finished_jobs(ended_before=time.time() + 100, limit=100)) == \
            sorted(f"j-{i}" for i in range(4))
        assert len(s.list_jobs()) == n - 4


def test_listing_by_state_reads_only_the_matching_records(etcd_endpoint: str) -> None:
    """The leader keeps an index of job states with its own writes, and the records of the jobs not
    ended: list_jobs of active or pending jobs reads nothing from etcd, of ended ones only the
    matching records by key, never the whole prefix (every liveness tick, ListNodes and round asked
    for the active jobs, and reading every record cost an idle leader 0.28 cores at 3,000 jobs). A
    write that raises leaves the index unknown, and the next listing reads everything again."""
    with leading_store(etcd_endpoint, _prefix()) as s:
        for i in range(30):
            s.create_job(_job(i), ("SUBMITTED", ""))
        run = s.get_job("j-3")
        assert run is not None
        s.save_job(run.with_(state=P.JOB_STATE_RUNNING), 1.0)
        s.save_jobs([(j.with_(state=P.JOB_STATE_STARTING), []) for j in (s.get_job("j-5"), s.get_job("j-6")) if j], 2.0)
        done = s.get_job("j-7")
        assert done is not None
        s.save_job(done.with_(state=P.JOB_STATE_FAILED, end_time=1.0), 1.0)
        assert s.delete_finished_jobs(ended_before=time.time() + 100, limit=10) == ["j-7"]
        late = s.get_job("j-8")
        assert late is not None
        s.save_job(late.with_(state=P.JOB_STATE_FAILED, end_time=time.time() + 10_000), 1.0)
        calls: list[object] = []
        real_range, real_txn = s.c.kv.Range, s.c.kv.Txn

        def counted(real: Any) -> Any:
            def call(req: object, timeout: float) -> object:
                calls.append(req)
                return real(req, timeout=timeout)
            return call

        s.c.kv.Range, s.c.kv.Txn = counted(real_range), counted(real_txn)
        active = [j.id for j in s.list_jobs(states=[P.JOB_STATE_STARTING, P.JOB_STATE_RUNNING])]
        pending = s.list_jobs(states=[P.JOB_STATE_PENDING], tenant="t")
        one = s.get_job("j-3")
        assert active == ["j-3", "j-5", "j-6"] and calls == []  # from memory
        assert len(pending) == 25 and one is not None and one.state == P.JOB_STATE_RUNNING
        ended = s.list_jobs(states=[P.JOB_STATE_FAILED])
        s.c.kv.Range, s.c.kv.Txn = real_range, real_txn
        assert [j.id for j in ended] == ["j-8"] and calls and not any(isinstance(c, etcdrpc.RangeRequest) for c in calls)
        # What a caller does to a record it was given stays with it until it is written.
        one.spec.name = "changed"
        kept = s.get_job("j-3")
        assert kept is not None and kept.spec.name == "job3"
        every = {j.id: j.state for j in s.list_jobs()}
        for state in (P.JOB_STATE_PENDING, P.JOB_STATE_RUNNING, P.JOB_STATE_FAILED):
            assert [j.id for j in s.list_jobs(states=[state])] == sorted(
                (i for i, st in every.items() if st == state), key=lambda i: int(i[2:]))
        # A write that fails (here: not the leader any more) forgets the index; the next read rebuilds it.
        s.lead.is_leader = lambda: False  # type: ignore[method-assign]
        with pytest.raises(NotLeader):
            s.save_job(run.with_(state=P.JOB_STATE_PENDING), 3.0)
        assert s._states is None
        assert [j.id for j in s.list_jobs(states=[P.JOB_STATE_RUNNING])] == ["j-3"]


def _spec_fields(job: JobRecord) -> dict[str, object]:
    return {"name": job.spec.name, "model": job.spec.model, "global_batch_size": 8, "iterations": 10}


def test_a_store_without_the_page_index_gets_it_at_open(etcd_endpoint: str) -> None:
    prefix = _prefix()
    with leading_store(etcd_endpoint, prefix) as s:
        for i in (3, 1, 2):
            s.create_job(_job(i), ("SUBMITTED", ""))
        # As the first etcd store laid it out: no index keys, no marker.
        s._txn([], [etcdstore._delete(s._k("jobidx", ""), prefix=True), etcdstore._delete(s._k("meta", "jobidx"))])
        assert s.list_jobs_page(limit=10) == []
    with leading_store(etcd_endpoint, prefix) as s:
        assert [j.id for j in s.list_jobs_page(limit=10)] == ["j-1", "j-2", "j-3"]
        assert s._value(s._k("meta", "jobidx")) == b"1"


def test_node_removal_keeps_the_newest_request_ids(etcd_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(etcdstore, "MAX_REMOVALS", 3)
    with leading_store(etcd_endpoint, _prefix()) as s:
        for i in range(5):
            s.put_node(NodeRecord(f"n{i}", f"h:{i}"))
            assert s.remove_node(f"n{i}", f"rm-{i}", float(i))
        assert _keys(s, "rmreq", "") == ["rmreq/rm-2", "rmreq/rm-3", "rmreq/rm-4"]
        assert s.remove_node("n4", "rm-4", 9.0)  # a kept id: still a retry


def test_the_page_key_is_made_once_and_shared_by_every_leader(etcd_endpoint: str) -> None:
    prefix = _prefix()
    with leading_store(etcd_endpoint, prefix, "a:1") as a:
        key = a.shared_key("page_key")
        assert len(key) == 32 and a.shared_key("page_key") == key
    with leading_store(etcd_endpoint, prefix, "b:1") as b:
        assert b.shared_key("page_key") == key
    with leading_store(etcd_endpoint, _prefix(), "c:1") as c:  # another cluster: another key
        assert c.shared_key("page_key") != key


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _sign(d: Path, name: str, ext: str) -> tuple[Path, Path]:
    key, csr, pem, extfile = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.pem", d / f"{name}.ext"
    extfile.write_text(ext + "\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
             "-out", str(csr), "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
             "-CAcreateserial", "-out", str(pem), "-days", "1", "-extfile", str(extfile))
    return pem, key


def test_etcd_over_tls_with_a_client_certificate(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not found: cannot make the test certificates")
    d = tmp_path / "pki"
    d.mkdir()
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"), "-days", "1", "-subj", "/CN=test-etcd-ca")
    server = _sign(d, "etcd", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth")
    client = _sign(d, "controller", "extendedKeyUsage=clientAuth")
    with etcd_server(tmp_path, tls=(d / "ca.pem", *server)) as etcd:
        cfg = EtcdConfig((f"https://{etcd.address}",), prefix=_prefix(), ca=str(d / "ca.pem"),
                         cert=str(client[0]), key=str(client[1]), timeout_s=3)
        with leading_store(etcd.address, cfg.prefix, cfg=cfg) as s:
            s.create_job(_job(1), ("SUBMITTED", ""))
            assert s.get_job("j-1") is not None and s.lead.is_leader()
        # Without a client certificate etcd refuses the connection.
        anonymous = EtcdClient(EtcdConfig((etcd.address,), prefix=cfg.prefix, ca=str(d / "ca.pem"), timeout_s=3))
        try:
            with pytest.raises(Unavailable):
                Leadership(anonymous, "x:1").current_leader()
        finally:
            anonymous.close()
