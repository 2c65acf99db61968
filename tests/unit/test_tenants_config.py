"""The tenants file, its reloads, the submit-time refusals and the usage of `get tenants`
(controller/tenantsfile.py, controller/tenants.py; docs/tenants.md, "Live")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import structlog

from tessera.controller.core.snapshot import TenantQuota
from tessera.controller.store import JobRecord
from tessera.controller.tenants import TenantsSource, submit_refusal, tenant_rows
from tessera.controller.tenantsfile import (
    TenantsConfig,
    TenantsFileError,
    over_cluster,
    parse_tenants,
    read_tenants_file,
)
from tessera.v1 import common_pb2 as P

GOOD = """\
tenants:
  team-a:
    quota: {a100: 4, H100: 2}
  team-b: {}
  team-c:
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_good_file_gives_sorted_canonical_quotas(tmp_path: Path) -> None:
    cfg = read_tenants_file(write(tmp_path / "t.yaml", GOOD))
    assert cfg.tenants == (TenantQuota("team-a", (("A100-80GB", 4), ("H100-80GB", 2))), TenantQuota("team-b"),
                           TenantQuota("team-c"))
    assert cfg.get("team-a").quota("A100-80GB") == 4 and cfg.get("nobody") is None  # type: ignore[union-attr]


BAD = [
    ("tenant: {}\n", 1, "tenant", "unknown key"),
    ("tenants: [a, b]\n", 1, "tenants", "must be a mapping of tenant name"),
    ("tenants:\n  Team_A: {}\n", 2, "tenants.Team_A", "a tenant name must be"),
    ("tenants:\n  a:\n    quota: {A100: -1}\n", 3, "tenants.a.quota.A100", "must be a number of GPUs in 0..1,000,000"),
    ("tenants:\n  a:\n    quota: {A100: 1.5}\n", 3, "tenants.a.quota.A100", "must be a number of GPUs"),
    ("tenants:\n  a:\n    quota: {Z9000: 1}\n", 3, "tenants.a.quota.Z9000", "unknown GPU"),
    ("tenants:\n  a:\n    quota: {A100: 1, a100-80gb: 2}\n", 3, "tenants.a.quota.a100-80gb", "A100-80GB is given twice"),
    ("tenants:\n  a:\n    quota: 16\n", 3, "tenants.a.quota", "must be a mapping of GPU type"),
    ("tenants:\n  a:\n    qouta: {A100: 1}\n", 3, "tenants.a.qouta", "unknown key"),
    ("tenants:\n  a:\n    max_unended_jobs: -1\n", 3, "tenants.a.max_unended_jobs", "must be a number of jobs in 0.."),
    ("tenants:\n  a: {}\n  a: {}\n", 3, "tenants.a", "duplicate key"),
]


@pytest.mark.parametrize(("text", "line", "field", "why"), BAD, ids=[b[2] + ":" + b[3][:20] for b in BAD])
def test_bad_file_names_file_line_and_field(tmp_path: Path, text: str, line: int, field: str, why: str) -> None:
    path = write(tmp_path / "t.yaml", text)
    with pytest.raises(TenantsFileError) as err:
        read_tenants_file(path)
    assert (err.value.file, err.value.line, err.value.field) == (str(path), line, field), err.value
    assert why in err.value.reason


def test_quotas_over_the_cluster_are_a_warning_per_type() -> None:
    cfg = parse_tenants({"tenants": {"a": {"quota": {"A100": 4}}, "b": {"quota": {"A100": 2, "H100": 1}}}})
    warnings = over_cluster(cfg, {"A100-80GB": 4})
    assert warnings == [
        ("quotas of A100-80GB sum to 6 GPUs (a 4, b 2) but the cluster has 4 registered: guaranteed jobs within "
        "quota may wait for GPUs until nodes join"),
        ("quotas of H100-80GB sum to 1 GPUs (b 1) but the cluster has 0 registered: guaranteed jobs within quota "
        "may wait for GPUs until nodes join")]
    assert over_cluster(cfg, {"A100-80GB": 6, "H100-80GB": 8}) == []


def test_reload_takes_a_changed_file_and_refuses_a_bad_one(tmp_path: Path) -> None:
    path = write(tmp_path / "t.yaml", GOOD)
    clock = iter(range(100, 200))
    src = TenantsSource(str(path), lambda: float(next(clock)))
    assert src.config is not None and src.loaded_at == 100.0
    assert not src.refresh()  # unchanged: not read again
    write(path, "tenants:\n  team-a:\n    quota: {A100: 8}\n")
    os.utime(path, ns=(1, 10**18))  # a new mtime even within the file system's resolution
    assert src.refresh()
    assert src.config.names == ("team-a",) and src.config.get("team-a").quota("A100-80GB") == 8  # type: ignore[union-attr]
    with structlog.testing.capture_logs() as logs:
        write(path, "tenants:\n  team-a:\n    quota: {A100: -8}\n")
        os.utime(path, ns=(1, 2 * 10**18))
        assert not src.refresh()
        assert not src.refresh()  # refused once per change, not at every round
    assert [e["event"] for e in logs] == ["tenants_reload_refused"]
    assert src.config.get("team-a").quota("A100-80GB") == 8  # type: ignore[union-attr]  # the old config kept
    assert "field tenants.team-a.quota.A100: must be a number of GPUs" in src.last_error
    # The time as tessctl shows every other (UTC, to the second), not raw seconds since the epoch.
    assert src.last_error.startswith("reload refused at 1970-01-01T00:01:42Z, the config loaded before is kept: ")
    assert src.last_error in src.warnings({"A100-80GB": 8})
    path.unlink()  # a removed file is refused the same way
    assert not src.refresh() and src.config.names == ("team-a",)
    src.request_reload()  # SIGHUP: read again although nothing changed
    write(path, GOOD)
    os.utime(path, ns=(1, 2 * 10**18))
    assert src.refresh() and src.last_error == "" and len(src.config.names) == 3


def test_a_bad_file_at_start_is_an_error_or_refuses_every_submission(tmp_path: Path) -> None:
    bad = write(tmp_path / "t.yaml", "tenants: 3\n")
    with pytest.raises(TenantsFileError):
        TenantsSource(str(bad), lambda: 0.0)
    assert not TenantsSource("", lambda: 0.0).configured
    # Not strict (the engine's: a standby taking the lead after the file went bad): it runs, and
    # refuses every submission, naming the file and the problem, until the file is fixed.
    src = TenantsSource(str(bad), lambda: 0.0, strict=False)
    assert src.config is None and "no config: submissions refused" in src.last_error
    refused = submit_refusal(src.config, src.path, spec("team-a"), src.last_error)
    assert refused is not None and refused.message.startswith(f"the tenants file {bad} could not be loaded")
    assert "field tenants: must be a mapping" in refused.message
    write(bad, GOOD)
    os.utime(bad, ns=(1, 10**18))
    assert src.refresh() and src.configured


CFG = TenantsConfig((TenantQuota("team-a", (("A100-80GB", 4),)), TenantQuota("team-b")))


def spec(tenant: str, gpus: int = 0, gpu_type: str = "", hint_types: tuple[str, ...] = ()) -> P.JobSpec:
    s = P.JobSpec(name="j", tenant=tenant, hint=P.ResourceHint(gpu_types=list(hint_types)))
    if gpus:
        s.priority = P.PRIORITY_GUARANTEED
        s.guarantee.CopyFrom(P.Guarantee(num_gpus=gpus, gpu_type=gpu_type))
    return s


@pytest.mark.parametrize(("config", "job", "why"), [
    (None, spec("team-a", 2), ("priority: a guaranteed job needs a tenant quota, and this controller has no tenants "
                              "file (--tenants)")),
    (CFG, spec("team-z"), ("tenant: team-z is not a tenant of this controller (tenants file /etc/t.yaml; known: "
                          "team-a, team-b)")),
    (CFG, spec("team-a", 8, "A100"), ("guarantee.num_gpus: 8 GPUs of A100-80GB exceed tenant team-a's whole quota "
                                     "of 4: the job could never be admitted")),
    (CFG, spec("team-a", 2, "H100"), ("guarantee.gpu_type: tenant team-a has no guaranteed quota of H100-80GB (its "
                                     "quota: 4 x A100-80GB)")),
    (CFG, spec("team-a", 5), "guarantee.num_gpus: 5 GPUs exceed tenant team-a's whole quota of every type"),
    (CFG, spec("team-a", 2, hint_types=("A10",)), ("guarantee: tenant team-a has no guaranteed quota of a type the "
                                                   "job may run on")),
    (CFG, spec("team-b", 1), "guarantee: tenant team-b has no guaranteed quota"),
])
def test_submissions_that_could_never_be_admitted_are_refused(config: TenantsConfig | None, job: P.JobSpec,
                                                              why: str) -> None:
    refused = submit_refusal(config, "/etc/t.yaml", job)
    assert refused is not None and refused.message.startswith(why), refused


def test_submissions_within_quota_pass() -> None:
    assert submit_refusal(None, "", spec("anyone")) is None  # no file: best-effort from anyone
    assert submit_refusal(CFG, "f", spec("team-b")) is None  # a tenant without quota: best-effort
    assert submit_refusal(CFG, "f", spec("team-a", 4, "A100")) is None  # the whole quota: waits if it must
    assert submit_refusal(CFG, "f", spec("team-a", 3)) is None


def rec(jid: str, tenant: str, state: int, gpus: int = 0, guaranteed: bool = False) -> JobRecord:
    s = spec(tenant, gpus if guaranteed else 0)
    plan = P.Plan(dp=gpus, tp=1, pp=1, gpu_model="A100-80GB") if gpus and state != P.JOB_STATE_PENDING else None
    return JobRecord(id=jid, request_id=jid, spec=s, state=state, reason="", submit_time=0.0, plan=plan)


def test_usage_counts_guaranteed_and_borrowed_gpus() -> None:
    jobs = [rec("g1", "team-a", P.JOB_STATE_RUNNING, 2, guaranteed=True),
            rec("b1", "team-a", P.JOB_STATE_RUNNING, 3),  # 2 left of team-a's quota: 1 borrowed
            rec("b2", "team-b", P.JOB_STATE_MIGRATING, 2),  # no quota: all borrowed
            rec("p1", "team-b", P.JOB_STATE_PENDING), rec("x", "team-b", P.JOB_STATE_SUCCEEDED, 2),
            rec("o1", "gone", P.JOB_STATE_RUNNING, 1)]  # a tenant no longer in the file still shows
    rows = {t.name: t for t in tenant_rows(CFG, jobs)}
    assert sorted(rows) == ["gone", "team-a", "team-b"]
    a, b = rows["team-a"], rows["team-b"]
    assert [(q.gpu_type, q.gpus) for q in a.quota] == [("A100-80GB", 4)]
    assert [(q.gpu_type, q.gpus) for q in a.guaranteed_in_use] == [("A100-80GB", 2)]
    assert [(q.gpu_type, q.gpus) for q in a.borrowed] == [("A100-80GB", 1)]
    assert (a.jobs_running, a.jobs_pending) == (2, 0)
    assert [(q.gpu_type, q.gpus) for q in b.borrowed] == [("A100-80GB", 2)] and not b.quota
    assert (b.jobs_running, b.jobs_pending) == (1, 1)
    assert [t.name for t in tenant_rows(CFG, jobs, only="team-b")] == ["team-b"]


def test_each_row_has_the_tenants_cap_of_jobs_not_yet_ended() -> None:
    cfg = parse_tenants({"tenants": {"team-a": {"max_unended_jobs": 50}, "team-b": {}, "team-c": {"max_unended_jobs": 0}}})
    rows = {t.name: t.max_unended_jobs for t in tenant_rows(cfg, [], default_cap=10_000)}
    assert rows == {"team-a": 50, "team-b": 10_000, "team-c": 0}  # the file's, else the flag's; 0 = none
    (row,) = tenant_rows(None, [rec("o1", "solo", P.JOB_STATE_PENDING)], default_cap=7)
    assert row.max_unended_jobs == 7


def test_a_mixed_type_pipeline_counts_each_stage_on_its_own_type() -> None:
    """A cost job's pipeline over two types: its plan's gpu_model names both ("A10-24GB+A40-48GB"),
    which `get tenants` showed as one type."""
    job = rec("c1", "team-b", P.JOB_STATE_RUNNING, 2)
    assert job.plan is not None
    job.plan.gpu_model = "A10-24GB+A40-48GB"
    job.plan.stages.add(gpu_model="A10-24GB", gpus=1, layer_start=0, layer_end=6)
    job.plan.stages.add(gpu_model="A40-48GB", gpus=1, layer_start=6, layer_end=12)
    (row,) = tenant_rows(None, [job])
    assert [(q.gpu_type, q.gpus) for q in row.borrowed] == [("A10-24GB", 1), ("A40-48GB", 1)]


def test_the_controller_refuses_to_start_with_a_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tessera.controller.main import parse_args

    bad = write(tmp_path / "t.yaml", "tenants:\n  a:\n    quota: {A100: many}\n")
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--state-dir", str(tmp_path / "s"), "--insecure", "--tenants", str(bad)])
    assert exit_.value.code == 2
    assert f"--tenants: {bad} line 3: field tenants.a.quota.A100: must be a number of GPUs" in capsys.readouterr().err
    good = write(tmp_path / "g.yaml", GOOD)
    assert parse_args(["--state-dir", str(tmp_path / "s"), "--insecure", "--tenants", str(good)]).tenants == str(good)


def test_a_user_is_told_neither_the_files_path_nor_other_tenants() -> None:
    """As `get tenants` shows a user its own tenant only; an admin gets the whole answer."""
    user = submit_refusal(CFG, "/etc/tessera/t.yaml", spec("team-z"), operator=False)
    assert user is not None and str(user) == ("tenant: team-z is not a tenant of this controller (tenants file "
                                             "t.yaml)")
    admin = submit_refusal(CFG, "/etc/tessera/t.yaml", spec("team-z"))
    assert admin is not None and "/etc/tessera/t.yaml; known: team-a" in str(admin)
    broken = submit_refusal(None, "/etc/tessera/t.yaml", spec("team-a"), "line 3: field x: bad", operator=False)
    assert broken is not None and str(broken).endswith("t.yaml could not be loaded, so no tenant may submit until "
                                                       "it is fixed (it is read again when it changes, or on SIGHUP): "
                                                       "ask an operator")
