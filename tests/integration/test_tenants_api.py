"""Tenants and quotas on a real controller process over real gRPC (docs/tenants.md, "Live"):
`ListTenants` / `tessctl get tenants`, the refusals at submit (an unknown tenant, a guarantee over
its tenant's whole quota), and reloads of the tenants file (a changed file, SIGHUP, a bad file
refused with the config before kept).

No agents: jobs stay PENDING, and the quotas are over the (empty) cluster, which `get tenants` warns
about. The callers are localcluster's: admin (tenant default), alice (team-a), bob (team-b).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.clients.jobfile import load_job_file
from tessera.clients.sdk import Client, RpcError
from tessera.v1 import common_pb2 as P
from tests.procs import REPO, Daemon, start_controller, tessctl, tessctl_json, wait_for

TENANTS = """\
tenants:
  team-a:
    quota: {A100-80GB: 2}
  team-b: {}
"""


def write(path: Path, text: str) -> None:
    """Write and move the mtime on (a rewrite within the file system's time resolution looks unchanged)."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, max(st.st_mtime_ns, before + 10**9)))


def start(root: Path) -> tuple[Daemon, Path]:
    tenants = root / "tenants.yaml"
    write(tenants, TENANTS)
    return start_controller(root / "state", "--tenants", str(tenants)), tenants


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d, _ = start(tmp_path_factory.mktemp("tenants-api"))
    yield d
    d.stop()


def spec(name: str, tenant: str = "", gpus: int = 0, guaranteed: bool = False) -> P.JobSpec:
    s = P.JobSpec(name=name, tenant=tenant, global_batch_size=16, iterations=10,
                  model=P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256, seq_length=64),
                  hint=P.ResourceHint(gpus=gpus, gpu_types=["A100-80GB"]))
    if guaranteed:
        s.priority = P.PRIORITY_GUARANTEED
    return s


def refused(fn: object) -> RpcError:
    with pytest.raises(RpcError) as ei:
        fn()  # type: ignore[operator]
    return ei.value


def as_(ctl: Daemon, name: str) -> Client:
    return Client(ctl.address, token=ctl.tokens[name])


def test_get_tenants_shows_quotas_jobs_and_warnings(ctl: Daemon) -> None:
    with as_(ctl, "alice") as alice:
        alice.submit(spec("be-a"))
        g = alice.submit(spec("g-a", gpus=2, guaranteed=True))  # promised its hint: 2 x A100-80GB
        assert (g.spec.guarantee.num_gpus, g.spec.guarantee.gpu_type) == (2, "A100-80GB")
        assert g.state == P.JOB_STATE_PENDING
        mine = alice.tenants()
        assert [t.name for t in mine.tenants] == ["team-a"] and not mine.warnings  # a user sees its own
        assert mine.file == "tenants.yaml"  # the file's name, not the controller's path to it
    with Client(ctl.address) as nobody:  # guarded like every Controller method: no token, no answer
        assert refused(nobody.tenants).code == "UNAUTHENTICATED"
    out = tessctl_json(ctl.address, "get", "tenants")
    rows = {t["name"]: t for t in out["tenants"]}
    assert sorted(rows) == ["team-a", "team-b"]
    assert rows["team-a"]["quota"] == [{"gpu_type": "A100-80GB", "gpus": 2}]
    assert rows["team-a"]["jobs_pending"] == 2 and rows["team-b"]["quota"] == []
    assert out["file"].endswith("/tenants.yaml")  # an admin's: the whole path
    assert out["warnings"] == [("quotas of A100-80GB sum to 2 GPUs (team-a 2) but the cluster has 0 registered: "
                               "guaranteed jobs within quota may wait for GPUs until nodes join")]
    table = tessctl(ctl.address, "get", "tenants").stdout.splitlines()
    assert table[0].split() == ["TENANT", "QUOTA", "GUARANTEED", "BORROWED", "RUNNING", "PENDING", "MAX-UNENDED"]
    assert table[1].split() == ["team-a", "2", "x", "A100-80GB", "-", "-", "0", "2", "10,000"]
    assert rows["team-a"]["max_unended_jobs"] == 10_000  # the controller's --max-unended-jobs
    assert table[-1].startswith("warning: quotas of A100-80GB sum to 2 GPUs")
    described = tessctl(ctl.address, "describe", "job", g.id).stdout
    assert "Priority:" in described and "guaranteed: 2 x A100-80GB" in described


def test_unknown_tenant_and_over_quota_are_refused_and_nothing_is_stored(ctl: Daemon) -> None:
    with as_(ctl, "admin") as admin:
        before = len(admin.list())
        err = refused(lambda: admin.submit(spec("by-admin")))  # its tenant, default, is not in the file
        assert err.code == "FAILED_PRECONDITION"
        assert err.message.startswith("tenant: default is not a tenant of this controller")
        err = refused(lambda: admin.submit(spec("elsewhere", tenant="team-z")))
        assert err.code == "FAILED_PRECONDITION" and "team-z is not a tenant" in err.message
        with as_(ctl, "alice") as alice:
            err = refused(lambda: alice.submit(spec("too-big", gpus=4, guaranteed=True)))
        assert err.code == "FAILED_PRECONDITION"
        assert err.message == ("guarantee.num_gpus: 4 GPUs of A100-80GB exceed tenant team-a's whole quota of 2: the "
                               "job could never be admitted")
        with as_(ctl, "bob") as bob:
            err = refused(lambda: bob.submit(spec("no-quota", gpus=1, guaranteed=True)))
            assert err.code == "FAILED_PRECONDITION"
            assert err.message.startswith("guarantee.gpu_type: tenant team-b has no guaranteed quota of A100-80GB")
            err = refused(lambda: bob.submit(spec("no-promise", guaranteed=True)))  # no guarantee, no GPU hint
            assert err.code == "INVALID_ARGUMENT" and err.message.startswith("guarantee: a guaranteed job needs")
            assert bob.submit(spec("be-b")).state == P.JOB_STATE_PENDING  # best-effort needs no quota
            # A job file without `tenant:` is the caller's tenant's, not "default"'s.
            assert bob.submit(load_job_file(REPO / "examples/jobs/tiny.yaml")).spec.tenant == "team-b"
        assert len(admin.list()) == before + 2


def test_reload_changed_file_sighup_and_a_bad_file(tmp_path: Path) -> None:
    d, tenants = start(tmp_path)
    try:
        with as_(d, "admin") as admin:
            assert refused(lambda: admin.submit(spec("early"))).code == "FAILED_PRECONDITION"
            # A changed file is taken at the next call (and round): now tenant default exists.
            write(tenants, TENANTS + "  default: {}\n")
            assert admin.submit(spec("later")).state == P.JOB_STATE_PENDING
            assert "default" in [t.name for t in admin.tenants().tenants]
            # A bad file is refused with a log line; the config before stays in force.
            write(tenants, TENANTS + "  default:\n    quota: {A100-80GB: -1}\n")
            resp = admin.tenants()
            assert "default" in [t.name for t in resp.tenants]
            assert any("reload refused" in w and "tenants.default.quota.A100-80GB" in w for w in resp.warnings)
            d.wait_event("tenants_reload_refused", 10)
            assert admin.submit(spec("still")).state == P.JOB_STATE_PENDING
            # SIGHUP: the round it asks for reads the file at once (no call needed to notice it).
            loads = sum(1 for e in d.events() if e.get("event") == "tenants_loaded")
            write(tenants, "tenants:\n  default:\n    quota: {H100: 8}\n")
            d.proc.send_signal(signal.SIGHUP)
            d.wait_event("sighup", 10)
            d.wait_event("tenants_loaded", 10, skip=loads)
            wait_for(lambda: [t.name for t in admin.tenants().tenants if t.quota] == ["default"], 10,
                     "the reloaded quotas")
            row = json.loads(tessctl(d.address, "get", "tenants", "-o", "json").stdout)["tenants"]
            assert {"gpu_type": "H100-80GB", "gpus": 8} in next(t for t in row if t["name"] == "default")["quota"]
    finally:
        d.stop()
