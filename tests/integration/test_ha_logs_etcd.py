"""What a controller on etcd says of itself, as one on SQLite does (a live audit of 2026-11-29): how
its transport is secured (`tls_enabled`, the certificate's expiry gauge; `insecure_transport` and
the insecure gauge with --insecure), and the `epoch` on every line once it leads, those of its gRPC
handlers included (its server was started while it was a standby, before the epoch was bound)."""

from __future__ import annotations

import urllib.request
import uuid
from pathlib import Path

from tessera.clients.sdk import Client
from tessera.common.localcluster import free_port, start_controller
from tessera.v1 import common_pb2
from tests.etcd_server import cluster_tokens, etcd_endpoint

__all__ = ["etcd_endpoint"]


def _gauges(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith(("tessera_transport_insecure", "tessera_certificate_expiry_timestamp_seconds"))}


def test_a_leader_on_etcd_announces_its_transport_and_logs_its_epoch(etcd_endpoint: str, tmp_path: Path) -> None:
    auth, admin = cluster_tokens(tmp_path)
    metrics = free_port()
    ctl = start_controller(tmp_path / "c", "--store", "etcd", "--etcd-endpoints", etcd_endpoint, "--etcd-prefix",
                           f"/t-{uuid.uuid4().hex[:8]}", "--checkpoint-root", str(tmp_path / "ckpt"),
                           "--metrics-listen", f"127.0.0.1:{metrics}", *auth)
    try:
        epoch = ctl.wait_event("controller_leading", 60)["epoch"]
        assert ctl.wait_event("tls_enabled", 5)["daemon"] == "tessera-controller"  # before: never said
        gauges = _gauges(metrics)
        assert gauges["tessera_transport_insecure"] == 0 and gauges["tessera_certificate_expiry_timestamp_seconds"] > 0
        with Client(ctl.address, token=admin) as c:
            job = c.submit(common_pb2.JobSpec(name="t", entrypoint=["/bin/true"],
                                              hint=common_pb2.ResourceHint(gpus=1)))
        line = ctl.wait_event("job_submitted", 30, job_id=job.id)
        assert line["epoch"] == epoch  # before: no epoch on the handlers' lines
        assert ctl.wait_event("rpc_call", 5, method="SubmitJob")["epoch"] == epoch
    finally:
        ctl.stop()


def test_a_standbys_dashboard_names_the_leader(etcd_endpoint: str, tmp_path: Path) -> None:
    """Its 503 says where the leader is, as a standby's gRPC refusal does (serve_ha hands the
    dashboard the campaign's leader hint)."""
    import json
    import ssl
    import urllib.error

    auth, admin = cluster_tokens(tmp_path)
    common = ("--store", "etcd", "--etcd-endpoints", etcd_endpoint, "--etcd-prefix", f"/t-{uuid.uuid4().hex[:8]}",
              "--checkpoint-root", str(tmp_path / "ckpt"), *auth)
    leader = start_controller(tmp_path / "a", *common)
    try:
        leader.wait_event("controller_leading", 60)
        standby = start_controller(tmp_path / "b", *common, "--dashboard-addr", "127.0.0.1:0")
        try:
            started = standby.wait_event("dashboard_started", 30)
            standby.wait_event("controller_started", 30)
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # the dev PKI's certificate
            req = urllib.request.Request(f"{started['scheme']}://127.0.0.1:{started['port']}/api/jobs",
                                         headers={"Authorization": f"Bearer {admin}"})
            try:
                urllib.request.urlopen(req, timeout=10, context=ctx)
                raise AssertionError("a standby served the API")
            except urllib.error.HTTPError as err:
                assert err.code == 503
                assert json.loads(err.read())["leader"] == leader.address
        finally:
            standby.stop()
    finally:
        leader.stop()
