"""A job's priority and guarantee (docs/tenants.md): the job file, `tessctl submit --priority
--guarantee`, and the controller's own validation of a raw spec agree on what they refuse."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from tessera.clients.jobfile import JobFileError, job_spec_from_dict
from tessera.clients.submit_args import apply_priority_arguments, parse_guarantee
from tessera.common.jobspec import fill_guarantee
from tessera.controller.core.snapshot import Priority, Promise
from tessera.controller.core.validate import validate_spec
from tessera.controller.snapshots import job_promise
from tessera.v1 import common_pb2 as P

BASE: dict[str, Any] = {
    "name": "job-1",
    "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 256, "seq_length": 64},
    "global_batch_size": 16,
    "iterations": 10,
}


def doc(**kw: Any) -> dict[str, Any]:
    return {**BASE, **kw}


def test_default_is_best_effort_without_guarantee() -> None:
    spec = job_spec_from_dict(doc())
    assert spec.priority == P.PRIORITY_UNSPECIFIED and not spec.HasField("guarantee")
    assert job_promise(spec) == (Priority.BEST_EFFORT, None)


def test_guarantee_in_full() -> None:
    spec = job_spec_from_dict(doc(priority="guaranteed",
                                  guarantee={"gpus": 8, "cpus": 64, "gpu_type": "a100-80gb", "plan": "zero-dp"}))
    assert spec.priority == P.PRIORITY_GUARANTEED
    g = spec.guarantee
    assert (g.num_gpus, g.num_cpus, g.gpu_type, g.plan) == (8, 64, "A100-80GB", "zero-dp")
    assert job_promise(spec) == (Priority.GUARANTEED, Promise(8, 64, "zero-dp", "A100-80GB"))
    assert validate_spec(spec) == []


def test_a_3d_plan_name_is_digits_whose_product_is_the_gpus() -> None:
    spec = job_spec_from_dict(doc(priority="guaranteed", guarantee={"gpus": 8, "plan": 222}))
    assert spec.guarantee.plan == "222" and validate_spec(spec) == []
    with pytest.raises(JobFileError) as err:
        job_spec_from_dict(doc(priority="guaranteed", guarantee={"gpus": 4, "plan": 248}))
    assert err.value.field == "guarantee.plan"
    assert err.value.reason == "248 is PP2 TP4 DP8 = 64 GPUs, the guarantee has 4"
    raw = P.JobSpec(name="x", model=P.ModelSpec(name="gpt2-small"), global_batch_size=8, iterations=1,
                    priority=P.PRIORITY_GUARANTEED, guarantee=P.Guarantee(num_gpus=4, plan="248"))
    assert [str(e) for e in validate_spec(raw)] == ["guarantee.plan: 248 is PP2 TP4 DP8 = 64 GPUs, the guarantee has 4"]


def test_guaranteed_without_guarantee_is_promised_its_hint() -> None:
    spec = job_spec_from_dict(doc(priority="guaranteed", gpus=4, gpu_types=["A100"]))
    assert (spec.guarantee.num_gpus, spec.guarantee.gpu_type) == (4, "A100-80GB")
    # The controller does the same for a raw spec (SubmitJob calls fill_guarantee first).
    raw = P.JobSpec(name="x", model=P.ModelSpec(name="gpt2-small"), global_batch_size=8, iterations=1,
                    priority=P.PRIORITY_GUARANTEED, hint=P.ResourceHint(gpus=2))
    fill_guarantee(raw)
    assert raw.guarantee.num_gpus == 2 and validate_spec(raw) == []


BAD = [
    (doc(priority="guaranteed"), "guarantee", "a guaranteed job needs its promise"),
    (doc(priority="best-effort", guarantee={"gpus": 2}), "guarantee", "only a guaranteed job has a guarantee"),
    (doc(priority=1), "priority", "must be one of guaranteed, best-effort"),
    (doc(priority="guaranteed", guarantee={"gpus": -2}), "guarantee.gpus", "must be >= 1, got -2"),
    (doc(priority="guaranteed", guarantee={"gpus": 2, "cpus": -1}), "guarantee.cpus", "must be >= 0, got -1"),
    (doc(priority="guaranteed", guarantee={"cpus": 8}), "guarantee.gpus", "required"),
    (doc(priority="guaranteed", guarantee={"gpus": 2, "gpu_type": "Z9000"}), "guarantee.gpu_type", "unknown GPU"),
    (doc(priority="guaranteed", guarantee={"gpus": 2, "plan": "fsdp-magic"}), "guarantee.plan",
     "expects ga, gc, zero-dp, zero-offload or PP/TP/DP digits"),
    (doc(priority="guaranteed", guarantee={"gpus": 2, "plna": "ga"}), "guarantee.plna", "unknown field"),
    (doc(priority="guaranteed", guarantee=[2]), "guarantee", "must be a mapping"),
    (doc(priority="guaranteed", gpu_types=["A10"], guarantee={"gpus": 2, "gpu_type": "A100"}), "guarantee.gpu_type",
     "A100-80GB is not among the job's gpu_types (A10-24GB)"),  # the file's key, not hint.gpu_types
    (doc(priority="guaranteed"), "guarantee", "guarantee.gpus (or a GPU count in gpus, which becomes the promise)"),
]


@pytest.mark.parametrize(("data", "field", "reason"), BAD, ids=[f"{f}:{r[:24]}" for _, f, r in BAD])
def test_bad_priority_or_guarantee_names_the_field(data: dict[str, Any], field: str, reason: str) -> None:
    with pytest.raises(JobFileError) as err:
        job_spec_from_dict(data)
    assert err.value.field == field, err.value
    assert reason.lower() in err.value.reason.lower(), err.value.reason


RAW_BAD = [
    ({"priority": P.PRIORITY_GUARANTEED}, "guarantee", "needs its promise"),
    ({"priority": 7}, "priority", "unknown value 7"),
    ({"guarantee": P.Guarantee(num_gpus=2)}, "guarantee", "only a guaranteed job"),
    ({"priority": P.PRIORITY_GUARANTEED, "guarantee": P.Guarantee(num_gpus=-1)}, "guarantee.num_gpus", "must be >= 1"),
    ({"priority": P.PRIORITY_GUARANTEED, "guarantee": P.Guarantee(num_gpus=2, num_cpus=-4)}, "guarantee.num_cpus",
     "must be >= 0"),
    ({"priority": P.PRIORITY_GUARANTEED, "guarantee": P.Guarantee(num_gpus=2, plan="Zero DP!")}, "guarantee.plan",
     "must be a plan name"),
    ({"priority": P.PRIORITY_GUARANTEED, "guarantee": P.Guarantee(num_gpus=2, plan="hyper")}, "guarantee.plan",
     "expects ga, gc"),
    ({"priority": P.PRIORITY_GUARANTEED, "hint": P.ResourceHint(gpu_types=["A10"]),
      "guarantee": P.Guarantee(num_gpus=2, gpu_type="A100")}, "guarantee.gpu_type",
     "A100-80GB is not among the job's hint.gpu_types (A10-24GB)"),  # gRPC callers keep the proto's name
]


@pytest.mark.parametrize(("fields", "field", "reason"), RAW_BAD, ids=[f"{f}:{r[:20]}" for _, f, r in RAW_BAD])
def test_raw_spec_refusals_name_the_field(fields: dict[str, Any], field: str, reason: str) -> None:
    spec = P.JobSpec(name="x", model=P.ModelSpec(name="gpt2-small"), global_batch_size=8, iterations=1, **fields)
    errors = validate_spec(spec)
    assert [e.field for e in errors] == [field] and reason in errors[0].reason, errors


def _args(priority: str | None = None, guarantee: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(priority=priority, guarantee=guarantee)


def test_submit_flags_override_the_file() -> None:
    spec = job_spec_from_dict(doc(gpus=2))
    apply_priority_arguments(spec, _args(guarantee="gpus=2,cpus=16,plan=ga"))
    assert spec.priority == P.PRIORITY_GUARANTEED  # --guarantee alone implies guaranteed
    assert (spec.guarantee.num_gpus, spec.guarantee.num_cpus, spec.guarantee.plan) == (2, 16, "ga")
    apply_priority_arguments(spec, _args(priority="best-effort"))
    assert spec.priority == P.PRIORITY_BEST_EFFORT and not spec.HasField("guarantee")
    apply_priority_arguments(spec, _args(priority="guaranteed"))  # promised its hint
    assert spec.guarantee.num_gpus == 2


def test_submit_flags_refuse_bad_input() -> None:
    spec = job_spec_from_dict(doc())
    with pytest.raises(JobFileError) as err:
        apply_priority_arguments(spec, _args(priority="guaranteed"))
    assert err.value.field == "guarantee"
    with pytest.raises(JobFileError) as err:
        apply_priority_arguments(spec, _args(guarantee="gpus=-3"))
    assert err.value.field == "guarantee.gpus"
    # --guarantee on a file that says gpu_types: the reason names what the file wrote.
    spec = job_spec_from_dict(doc(gpu_types=["A10"]))
    with pytest.raises(JobFileError) as err:
        apply_priority_arguments(spec, _args(guarantee="gpus=2,gpu_type=A40-48GB"))
    assert (err.value.field, err.value.reason) == ("guarantee.gpu_type",
                                                   "A40-48GB is not among the job's gpu_types (A10-24GB)")
    with pytest.raises(JobFileError) as err:
        parse_guarantee("gpus")
    assert err.value.field == "guarantee"


def test_tessctl_parses_the_submit_flags_and_get_tenants() -> None:
    from tessera.clients.tessctl import build_parser

    args = build_parser().parse_args(["submit", "-f", "job.yaml", "--priority", "guaranteed",
                                      "--guarantee", "gpus=2,plan=zero-dp"])
    assert (args.priority, args.guarantee) == ("guaranteed", "gpus=2,plan=zero-dp")
    assert build_parser().parse_args(["get", "tenants"]).func.__name__ == "cmd_get_tenants"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["submit", "-f", "job.yaml", "--priority", "urgent"])


def test_tenants_table_and_json() -> None:
    from tessera.clients.tenants_output import tenants_json, tenants_table
    from tessera.v1 import controller_pb2 as C

    resp = C.ListTenantsResponse(
        tenants=[C.Tenant(name="team-a", quota=[C.TypeGpus(gpu_type="A100-80GB", gpus=2)],
                          guaranteed_in_use=[C.TypeGpus(gpu_type="A100-80GB", gpus=1)], jobs_running=1,
                          max_unended_jobs=10_000),
                 C.Tenant(name="team-b", borrowed=[C.TypeGpus(gpu_type="A100-80GB", gpus=1)], jobs_running=1,
                          jobs_pending=2)],
        file="/etc/tessera/tenants.yaml", warnings=["quotas of A100-80GB sum to 2 GPUs\x1b[2J"])
    assert tenants_table(resp).splitlines() == [
        "TENANT   QUOTA           GUARANTEED      BORROWED        RUNNING   PENDING   MAX-UNENDED",
        "team-a   2 x A100-80GB   1 x A100-80GB   -               1         0         10,000",
        "team-b   -               -               1 x A100-80GB   1         2         -",
        "warning: quotas of A100-80GB sum to 2 GPUs\\x1b[2J"]  # untrusted text made safe
    out = tenants_json(resp)
    assert out["tenants"][1]["borrowed"] == [{"gpu_type": "A100-80GB", "gpus": 1}]
    assert out["file"] == "/etc/tessera/tenants.yaml"
    assert tenants_table(C.ListTenantsResponse()) == "no tenants file (--tenants): no quotas, every job is best-effort"


def test_describe_shows_the_priority_and_the_promised_cpus() -> None:
    import re

    from tessera.clients import output
    from tessera.v1 import controller_pb2 as C

    spec = job_spec_from_dict(doc(priority="guaranteed", guarantee={"gpus": 8, "cpus": 64, "gpu_type": "A100",
                                                                    "plan": "zero-dp"}))
    text = output.describe_job(C.Job(id="j-1", spec=spec, state=P.JOB_STATE_PENDING), 0.0)
    assert re.search(r"Priority:\s+guaranteed: 8 x A100-80GB, 64 CPUs, plan zero-dp", text)
    assert re.search(r"Priority:\s+best-effort", output.describe_job(C.Job(id="j-2", spec=job_spec_from_dict(doc())),
                                                                     0.0))
    node = C.Node(id="n", inventory=P.NodeInventory(cpu_count=32), busy_cpus=12)
    assert re.search(r"CPUs:\s+32 \(12 promised to guaranteed jobs\)", output.describe_node(node, 0.0))


def test_an_opaque_jobs_promise_is_its_hint() -> None:
    """An opaque job runs on exactly hint.gpus: a smaller promise charged its tenant less than the
    job held, past its quota."""
    spec = P.JobSpec(name="x", entrypoint=["/bin/true"], hint=P.ResourceHint(gpus=2),
                     priority=P.PRIORITY_GUARANTEED, guarantee=P.Guarantee(num_gpus=1))
    errors = validate_spec(spec)
    assert [(e.field, e.reason) for e in errors] == [
        ("guarantee.num_gpus", "an opaque job runs on exactly its hint.gpus (2): its promise must be that many GPUs, got 1")]
    spec.guarantee.num_gpus = 2
    assert validate_spec(spec) == []
    # Without hint.gpus it runs on one GPU: a promise of two charged its tenant a GPU it never held.
    spec.hint.gpus = 0
    assert [(e.field, e.reason) for e in validate_spec(spec)] == [
        ("guarantee.num_gpus", ("an opaque job runs on exactly its hint.gpus (1: none given is 1): its promise must be "
                               "that many GPUs, got 2"))]
    spec.guarantee.num_gpus = 1
    assert validate_spec(spec) == []
