"""The etcd store's fencing and identity, on a real etcd (tests/etcd_server.py)."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tessera.common.errors import Unavailable
from tessera.controller.election import Leadership, NotLeader
from tessera.controller.etcd import EtcdClient, EtcdConfig
from tessera.controller.etcdstore import EtcdStore
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
