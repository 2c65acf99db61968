"""Opaque jobs (docs/opaque-jobs.md): specs without model dims or iterations, their one Cell in every
policy, success on exit 0, no progress timeout unless opted in, max_runtime, launch requests and the
features `describe` names."""

from __future__ import annotations

import pytest

from tessera.clients.features import features
from tessera.clients.jobfile import JobFileError, parse_job_yaml
from tessera.common.durations import DurationError, format_duration, parse_duration
from tessera.common.jobspec import spec_errors
from tessera.controller import limits
from tessera.controller.core.attempts import RankStatus, Verdict, judge
from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.opaque import OpaqueAware, fits_nowhere
from tessera.controller.core.policies import make_policy, policy_names
from tessera.controller.core.policy import plan_round
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    GpuView,
    JobView,
    NodeView,
    RunningView,
    Slice,
    Snapshot,
    TenantQuota,
)
from tessera.controller.launches import launch_requests
from tessera.controller.snapshots import job_view
from tessera.controller.store import JobRecord
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2

GB = 1 << 30


def opaque_spec(**kw: object) -> P.JobSpec:
    return P.JobSpec(name="plain", entrypoint=["{python}", "-c", "print(1)"], **kw)  # type: ignore[arg-type]


def test_an_opaque_spec_needs_no_model_batch_or_iterations() -> None:
    assert spec_errors(opaque_spec()) == []
    assert spec_errors(opaque_spec(hint=P.ResourceHint(gpus=8, gpu_types=["A100-80GB"]))) == []
    fields = dict(spec_errors(P.JobSpec(name="ref")))  # the reference trainer needs dims
    assert "model" in fields and "iterations" in fields
    assert dict(spec_errors(opaque_spec(plan=P.ExecutionPlan(lora_rank=8))))["plan"].startswith("a training recipe")
    assert dict(spec_errors(opaque_spec(workdir="rel/dir")))["workdir"].startswith("must be an absolute path")
    assert "max_runtime_seconds" in dict(spec_errors(opaque_spec(max_runtime_seconds=-1)))
    # A launcher template that names no {entrypoint} runs its own program too.
    assert spec_errors(P.JobSpec(name="t", launcher=P.Launcher(argv=["/bin/true"]))) == []


def test_job_file_cell_workdir_and_max_runtime() -> None:
    spec = parse_job_yaml("name: x\ncell: 8 x a100-80gb\nentrypoint: [train.sh]\nworkdir: /srv/x\nmax_runtime: 1h30m\n")
    assert (spec.hint.gpus, list(spec.hint.gpu_types)) == (8, ["A100-80GB"])
    assert (spec.workdir, spec.max_runtime_seconds, spec.iterations, spec.HasField("model")) == ("/srv/x", 5400, 0,
                                                                                                 False)
    with pytest.raises(JobFileError, match="field cell: give either cell or gpus"):
        parse_job_yaml("name: x\ncell: 2 x A40\ngpus: 2\nentrypoint: [a]\n")
    with pytest.raises(JobFileError, match="field cell: must read 'COUNT x GPU-TYPE'"):
        parse_job_yaml("name: x\ncell: lots\nentrypoint: [a]\n")
    with pytest.raises(JobFileError, match="field max_runtime: not a duration"):
        parse_job_yaml("name: x\nmax_runtime: soon\nentrypoint: [a]\n")
    with pytest.raises(JobFileError, match="field model: required when the job runs the reference trainer"):
        parse_job_yaml("name: x\niterations: 3\n")


def test_durations() -> None:
    assert [parse_duration(t) for t in ("90s", "10m", "1h30m", "2d", "600", 5)] == [90, 600, 5400, 172800, 600, 5]
    assert [format_duration(s) for s in (600, 5400, 45, 90061)] == ["10m", "1h30m", "45s", "1d1h1m1s"]
    for bad in ("", "10x", "m10", "-5", "0", True):
        with pytest.raises(DurationError):
            parse_duration(bad)  # type: ignore[arg-type]


def record(spec: P.JobSpec, jid: str = "j-1", t: float = 1.0) -> JobRecord:
    return JobRecord(jid, "r", spec, P.JOB_STATE_PENDING, "", t)


def cluster() -> Snapshot:
    a40 = tuple(GpuView(i, "A40-48GB", 48 * GB) for i in range(4))
    h100 = tuple(GpuView(i, "H100-80GB", 80 * GB) for i in range(2))
    nodes = (NodeView("a", a40), NodeView("h", h100))
    jobs = (job_view(record(opaque_spec(hint=P.ResourceHint(gpus=2, gpu_types=["H100-80GB"])), "j-h"), None),
            job_view(record(opaque_spec(), "j-any", 2.0), None),
            job_view(record(opaque_spec(hint=P.ResourceHint(gpus=8)), "j-big", 3.0), None))
    return Snapshot(nodes, jobs, (("A40-48GB", 48 * GB, 4), ("H100-80GB", 80 * GB, 2)))


@pytest.mark.parametrize("name", policy_names())
def test_every_policy_places_opaque_jobs_as_asked(name: str) -> None:
    """Two GPUs of the one type allowed, one GPU of any type; 8 GPUs of one type exist nowhere."""
    plan = plan_round(cluster(), OpaqueAware(TableEstimates({})), make_policy(name))
    by_id = {d.job_id: d for d in plan.decisions}
    h = by_id["j-h"]
    assert h.action is Action.START, h.reason
    assert h.slices[0].node_id == "h" and len(h.slices[0].gpu_indices) == 2 and h.plan is not None
    assert (h.plan.dp, h.plan.tp, h.plan.pp, h.plan.memory_source) == (2, 1, 1, "opaque")
    one = by_id["j-any"]
    assert one.action is Action.START and sum(len(s.gpu_indices) for s in one.slices) == 1, one.reason
    # The nominal 1 s/iteration is no estimate: no figures in the PLACED reason ("est. 1 s/iter, 1.0 samples/s").
    assert not any(w in d.reason for d in (h, one) for w in ("s/iter", "samples/s", "estimate")), (h.reason, one.reason)
    assert by_id["j-big"].action is not Action.START


@pytest.mark.parametrize("name", policy_names())
def test_a_guaranteed_opaque_job_preempts_a_best_effort_one_in_every_policy(name: str) -> None:
    """Tenants (docs/tenants.md): an opaque job's one Cell times its promise (1 s per nominal
    iteration), so a guaranteed one is held to it and preempts best-effort work; an opaque victim
    is never halved (it runs only on the GPUs it asked for)."""
    def view(jid: str, gpus: int, tenant: str, guaranteed: bool) -> JobView:
        spec = opaque_spec(hint=P.ResourceHint(gpus=gpus, gpu_types=["A40-48GB"]), tenant=tenant)
        if guaranteed:
            spec.priority, spec.guarantee.num_gpus = P.PRIORITY_GUARANTEED, gpus
        return job_view(record(spec, jid), None)

    be, g = view("be", 4, "B", False), view("g", 2, "A", True)
    node = NodeView("a", tuple(GpuView(i, "A40-48GB", 48 * GB) for i in range(4)), frozenset(range(4)))
    snap = Snapshot((node,), (g,), (("A40-48GB", 48 * GB, 4),), (RunningView(be, Cell("A40-48GB", 4), (Slice("a", (0, 1, 2, 3)),)),),
                    now=10, tenants=(TenantQuota("A", (("A40-48GB", 4),)), TenantQuota("B")))
    by_id = {d.job_id: d for d in plan_round(snap, OpaqueAware(TableEstimates({})), make_policy(name)).decisions}
    assert by_id["be"].action is Action.STOP, by_id["be"].reason
    assert by_id["g"].action is Action.START and sum(len(s.gpu_indices) for s in by_id["g"].slices) == 2
    assert "s/iter" not in by_id["g"].reason and "samples/s" not in by_id["g"].reason, by_id["g"].reason


def test_why_an_opaque_job_fits_nowhere() -> None:
    snap = cluster()
    big = snap.pending[2]
    assert fits_nowhere(big, snap.cluster_gpus) == ("opaque job asks for 8 GPUs of one type; the most the cluster "
                                                    "has of A40-48GB/H100-80GB is 4")
    v100 = job_view(record(opaque_spec(hint=P.ResourceHint(gpus=1, gpu_types=["V100-32GB"]))), None)
    assert fits_nowhere(v100, snap.cluster_gpus) == ("opaque job asks for V100-32GB: no such GPU in the cluster (it "
                                                     "has A40-48GB, H100-80GB)")
    assert fits_nowhere(snap.pending[0], snap.cluster_gpus) == ""


def test_success_is_every_rank_exiting_zero_without_iterations() -> None:
    ranks = {0: RankStatus(0, False, 0), 1: RankStatus(1, False, 0)}
    assert judge(2, ranks, 0, False) == Verdict("succeeded", "all 2 ranks exited 0")  # not "after 0 iterations"
    assert judge(1, {0: RankStatus(0, False, 0)}, 0, False).reason == "its 1 rank exited 0"
    counted = {0: RankStatus(0, False, 0, "", 1)}
    assert judge(1, counted, 1, False).reason == "its 1 rank exited 0 after 1 iteration"
    assert judge(2, {0: RankStatus(0, False, 0, "", 7), 1: RankStatus(1, False, 0)}, 0, False).reason == (
        "all 2 ranks exited 0 after 7 iterations")  # no count asked, but rank 0 reported some
    assert judge(2, {**ranks, 1: RankStatus(1, False, 1)}, 0, False).kind == "failed"
    assert judge(2, ranks, 10, False).kind == "stopped"  # a job that counts iterations must reach them


def test_progress_timeout_and_max_runtime() -> None:
    plain = opaque_spec()
    assert limits.progress_timeout(plain, 900, reported=False) < 0  # never failed as hung
    assert limits.progress_timeout(plain, 900, reported=True) == 900  # it opted in by reporting
    assert limits.progress_timeout(opaque_spec(iterations=5), 900, reported=False) == 900
    assert limits.progress_timeout(opaque_spec(progress_timeout_seconds=30), 900, reported=False) == 30
    limited = opaque_spec(max_runtime_seconds=600)
    assert limits.over_runtime(limited, 599) is None
    assert limits.over_runtime(limited, 601) == "max_runtime 10m exceeded"
    assert limits.over_runtime(plain, 10**9) is None


def test_launch_requests_of_an_opaque_job() -> None:
    spec = opaque_spec(hint=P.ResourceHint(gpus=2), workdir="/srv/work")
    rec = record(spec).with_(state=P.JOB_STATE_STARTING, attempt=1,
                             plan=P.Plan(dp=2, tp=1, pp=1, micro_batch=1, grad_accum=1, gpu_model="A40-48GB"),
                             placement=P.Placement(slices=[P.NodeSlice(node_id="a", gpu_indices=[0, 1])],
                                                   rendezvous="127.0.0.1:29500"))
    ((node, req),) = launch_requests(rec, 1, "/ckpt")
    assert node == "a" and not req.HasField("model") and req.workdir == "/srv/work"
    assert [r.rank for r in req.ranks] == [0, 1] and list(req.argv) == ["{python}", "-c", "print(1)"]


def test_describe_names_the_features_and_why() -> None:
    opaque = dict(features(controller_pb2.Job(spec=opaque_spec(hint=P.ResourceHint(gpus=2)))))
    assert opaque["Kind"] == "opaque: no model dims: runs its program on exactly 2 x any type"
    assert opaque["Memory-aware placement"].startswith("no: no model dims")
    # TESSERA_CHECKPOINT_DIR is the same on every attempt: a script that saves and loads there resumes.
    assert opaque["Migration"] == ("stop and restart (no model dims: never moved to scale); resumes only if the "
                                   "script saves to and loads from $TESSERA_CHECKPOINT_DIR")
    assert opaque["Learned step times"].startswith("no: no model dims")
    assert opaque["Success"] == "every rank exits 0"
    assert opaque["Hang detection"].startswith("off until it reports progress")
    model = P.ModelSpec(name="gpt2-small")
    aware_spec = P.JobSpec(name="m", model=model, iterations=40)
    aware = dict(features(controller_pb2.Job(spec=aware_spec)))
    assert aware["Kind"] == "model-aware (the reference trainer)" and aware["Forecasts"] == "yes"
    assert aware["Migration"].startswith("yes: from the reference trainer's last checkpoint")
    # The controller learns only on nodes NVML probed (--learn-step-times nvml, its default), which
    # the Job does not say: the rule, not a plain "yes, from rank 0's reports".
    assert aware["Learned step times"] == ("from rank 0's step-time reports on nodes whose GPUs NVML probed (the "
                                           "controller's default, --learn-step-times nvml; declared inventories "
                                           "only with all, never with off)")
    own = dict(features(controller_pb2.Job(spec=P.JobSpec(name="m", model=model, entrypoint=["t.py"]))))
    assert own["Learned step times"].startswith("from rank 0's step-time reports (trainer SDK) on nodes whose")
    staged = controller_pb2.Job(spec=aware_spec, plan=P.Plan(stages=[P.PipelineStage()]))
    assert dict(features(staged))["Learned step times"].startswith("no: a staged pipeline")
    measured = controller_pb2.Job(spec=aware_spec, events=[P.JobEvent(kind="MEASURED", message="Cell ...")])
    assert dict(features(measured))["Learned step times"].startswith("yes: learned")
