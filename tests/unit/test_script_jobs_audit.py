"""A live audit of jobs that run users' own scripts, on literal inputs: a template that drops the
entrypoint (refused at submit), `describe job`'s program lines, the SIGKILL reason said once, the
no-rank error under a per-node launcher, an early exit 0 of a job that counts iterations, and the
pending reason the docs quote."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tessera.clients import output
from tessera.clients.jobfile import JobFileError, parse_job_yaml
from tessera.common.jobspec import runs_own_program, spec_errors
from tessera.controller.core.attempts import RankStatus, Verdict, judge
from tessera.controller.core.opaque import fits_nowhere
from tessera.controller.core.validate import validate_spec
from tessera.controller.judging import settle
from tessera.controller.logstream import no_rank_text
from tessera.controller.snapshots import job_view
from tessera.controller.store import JobRecord
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2

DOCS = Path(__file__).resolve().parents[2] / "docs"
ENVDUMP = P.Launcher(per_node=True, argv=["{python}", "/tmp/x/envdump.py"])
DROPPED = ("the launcher template has no {entrypoint}, so the entrypoint would never run; drop it or put "
           "{entrypoint} in launcher.argv")


# -- M1: an entrypoint that the template never runs ---------------------------------------------------

def test_a_template_without_entrypoint_refuses_an_entrypoint() -> None:
    spec = P.JobSpec(name="j", launcher=ENVDUMP, entrypoint=["/tmp/a.py"])
    assert spec_errors(spec) == [("entrypoint", DROPPED)]
    assert [(e.field, e.reason) for e in validate_spec(spec)] == [("entrypoint", DROPPED)]


def test_the_job_file_gives_the_same_answer() -> None:
    text = ("name: j\nlauncher: {per_node: true, argv: ['{python}', /tmp/x/envdump.py]}\n"
            "entrypoint: [/tmp/a.py]\n")
    with pytest.raises(JobFileError) as ei:
        parse_job_yaml(text)
    assert (ei.value.field, ei.value.reason) == ("entrypoint", DROPPED)
    # without the entrypoint, the template's own program is the job's
    assert runs_own_program(parse_job_yaml(text.replace("entrypoint: [/tmp/a.py]\n", "")))


@pytest.mark.parametrize("launcher", [
    P.Launcher(argv=["/usr/bin/env", "{python}", "{entrypoint}"]),
    P.Launcher(per_node=True, argv=["ray", "start", "--block"], head_argv=["{python}", "{entrypoint}"]),
    P.Launcher(name="torchrun"),
    P.Launcher(),
])
def test_templates_that_run_the_entrypoint_take_one(launcher: P.Launcher) -> None:
    assert spec_errors(P.JobSpec(name="j", launcher=launcher, entrypoint=["/tmp/a.py"])) == []


# -- M2, L4: describe job's entrypoint, launcher and checkpoint interval --------------------------------

def _describe(**spec: object) -> dict[str, str]:
    job = controller_pb2.Job(id="j-1", spec=P.JobSpec(name="j", **spec))  # type: ignore[arg-type]
    text = output.describe_job(job, 1_700_000_000.0)
    return {k: v.strip() for k, v in re.findall(r"^([A-Z][\w ]*):[ ]*(.*)$", text, re.MULTILINE)}


def test_describe_shows_a_template_that_runs_its_own_program() -> None:
    got = _describe(launcher=P.Launcher(argv=["/usr/bin/env", "{python}", "script.py", "{world_info}", "{dp}"]))
    assert got["Entrypoint"] == "(the launcher template's program)"
    assert got["Launcher"] == "/usr/bin/env {python} script.py {world_info} {dp} (template, one process per rank)"
    assert got["Checkpoint every"] == "not set (the program decides)"
    assert "Launcher head" not in got


def test_describe_shows_every_launcher() -> None:
    ray = P.Launcher(per_node=True, argv=["ray", "start", "--block"], head_argv=["{python}", "-m", "drv", "{entrypoint}"])
    got = _describe(launcher=ray, model=P.ModelSpec(name="gpt2-small"))
    assert (got["Entrypoint"], got["Launcher"], got["Launcher head"]) == (
        "(reference trainer)", "ray start --block (template, one process per node)",
        "{python} -m drv {entrypoint} (node rank 0)")
    assert got["Checkpoint every"] == "trainer default"
    got = _describe(launcher=P.Launcher(name="torchrun"), entrypoint=["/tmp/ddp.py"], checkpoint_every=50)
    assert (got["Entrypoint"], got["Launcher"], got["Checkpoint every"]) == (
        "/tmp/ddp.py", "torchrun (one process per node, starting its ranks)", "50")
    assert _describe(entrypoint=["/tmp/a.py"])["Launcher"] == "direct (default: one process per rank)"
    assert _describe(launcher=P.Launcher(name="direct"))["Launcher"] == "direct (one process per rank)"
    assert _describe(entrypoint=["/tmp/a.py"])["Checkpoint every"] == "not set (the program decides)"
    # a job stored before submit refused an entrypoint its template drops
    got = _describe(launcher=ENVDUMP, entrypoint=["/tmp/a.py"])
    assert (got["Entrypoint"], got["Launcher"]) == ("/tmp/a.py (never run: the launcher template has no {entrypoint})",
                                                    "{python} /tmp/x/envdump.py (template, one process per node)")


# -- L1: the SIGKILL reason, once ---------------------------------------------------------------------

def test_the_agents_words_for_an_exit_are_not_repeated() -> None:
    killed = judge(1, {0: RankStatus(0, False, -9, "killed by SIGKILL")}, 10, False)
    assert killed.reason == "rank 0: killed by SIGKILL (out of memory? the kernel OOM killer sends SIGKILL)"
    missing = judge(1, {0: RankStatus(0, False, 127, "exit code 127")}, 10, False)
    assert missing.reason == "rank 0: exit code 127 (program not found or not executable)"
    # what the agent says beyond the code is kept
    said_more = judge(1, {0: RankStatus(0, False, -9, "evicted for memory, killed by SIGKILL")}, 10, False)
    assert said_more.reason.endswith("; evicted for memory, killed by SIGKILL")


# -- L2, L3: a per-node launcher's ranks, and iterations only reports count ----------------------------

def _record(launcher: P.Launcher, *, retries: int = 0, max_retries: int = 0, iterations: int = 5) -> JobRecord:
    spec = P.JobSpec(name="j", entrypoint=["/tmp/a.py"], launcher=launcher, iterations=iterations,
                     max_retries=max_retries)
    return JobRecord(id="j-1", request_id="r", spec=spec, state=P.JOB_STATE_RUNNING, reason="training",
                     submit_time=1.0, attempt=retries + 1, plan=P.Plan(dp=2, tp=1, pp=1),
                     placement=P.Placement(slices=[P.NodeSlice(node_id="a", gpu_indices=[0, 1])]),
                     retries=retries)


def test_no_rank_under_a_per_node_launcher_says_it_is_a_node_rank() -> None:
    torchrun = _record(P.Launcher(name="torchrun"))
    assert no_rank_text(torchrun, "job j-1", 1, 1) == (
        "job j-1 has no node rank 1: under its per-node torchrun launcher a rank is a node rank (0..0), whose "
        "log holds the ranks it starts")
    own = _record(P.Launcher(per_node=True, argv=["/opt/launch", "{entrypoint}"]))
    assert no_rank_text(own, "job j-1", 3, 1).startswith("job j-1 has no node rank 3: under its per-node launcher a")
    assert no_rank_text(_record(P.Launcher()), "job j-1", 2, 2) == "job j-1 has no rank 2 (ranks 0..1)"


def test_an_early_exit_0_says_only_reports_count_and_its_retries() -> None:
    stopped = Verdict("stopped", "all ranks stopped before the end")
    why = "before reaching 5 iterations: only progress reports (the trainer SDK's) count them"
    assert settle(_record(P.Launcher(), max_retries=2), stopped, False) == (
        "retry", f"attempt 1 exited 0 {why}; retry 1 of 2")
    assert settle(_record(P.Launcher(), retries=2, max_retries=2), stopped, False) == (
        "give_up", f"program exited 0 {why} (after 2 retries)")
    assert settle(_record(P.Launcher(), retries=1, max_retries=1), stopped, False)[1].endswith("(after 1 retry)")
    assert settle(_record(P.Launcher()), stopped, False) == ("give_up", f"program exited 0 {why}")


# -- L5: the docs' pending reason is one the controller writes ----------------------------------------

def test_the_documented_pending_reason_is_real() -> None:
    spec = P.JobSpec(name="j", entrypoint=["/tmp/a.py"], hint=P.ResourceHint(gpus=1, gpu_types=["H200-141GB"]))
    view = job_view(JobRecord(id="j-1", request_id="r", spec=spec, state=P.JOB_STATE_PENDING, reason="",
                              submit_time=1.0), None)
    got = fits_nowhere(view, [("A40-48GB", 48, 2), ("H100-80GB", 80, 4)])
    assert got == "opaque job asks for H200-141GB: no such GPU in the cluster (it has A40-48GB, H100-80GB)"
    doc = " ".join((DOCS / "opaque-jobs.md").read_text().split())
    assert f"`{got}`" in doc
