"""Placeholders in a job's entrypoint (docs/launchers.md) and `{python}` as any argument of its own.

A live audit ran an unchanged DDP script under `launcher: torchrun` with `--ckpt {checkpoint_dir}`:
the script got the literal `{checkpoint_dir}`, saved under each attempt's own folder, and resumed
nothing after a drain. `{python}` after argv[0] (`/usr/bin/env {python} ...`, an entrypoint's
`{python}` under a template) reached exec as written.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tessera.clients.jobfile import JobFileError, parse_job_yaml
from tessera.common.jobspec import spec_errors
from tessera.controller.core import launchers
from tessera.controller.launches import launch_requests
from tessera.controller.store import JobRecord
from tessera.nodeagent import contract
from tessera.nodeagent.supervisor import Supervisor
from tessera.v1 import common_pb2 as P
from tests.workerenv import worker_python

VALUES: dict[str, object] = {"nnodes": 2, "world_size": 4, "master_addr": "10.0.0.1", "master_port": "29501",
                             "dp": 4, "tp": 1, "pp": 1, "micro_batch": 4, "grad_accum": 1,
                             "global_batch_size": 16, "iterations": 30, "checkpoint_dir": "/ckpt/j-1",
                             "world_info": "d2k=", "node_rank": 1, "nproc_per_node": 2}
AUDIT_ENTRYPOINT = ["/path/ddp.py", "--steps", "60", "--ckpt", "{checkpoint_dir}"]


@pytest.mark.parametrize("name", ["direct", "torchrun", "deepspeed"])
def test_every_builtin_launcher_expands_the_entrypoints_placeholders(name: str) -> None:
    tpl = launchers.template_of(P.Launcher(name=name))
    argv = launchers.expand(tpl, [*AUDIT_ENTRYPOINT, "--rank={node_rank}", "{world_info}"], VALUES, head=False)
    assert argv[-7:] == ["/path/ddp.py", "--steps", "60", "--ckpt", "/ckpt/j-1", "--rank=1", "d2k="]


def test_a_custom_per_node_templates_head_and_workers_expand_the_entrypoint() -> None:
    tpl = launchers.template_of(P.Launcher(argv=["/opt/launch", "{entrypoint}"], per_node=True,
                                           head_argv=["/opt/head", "--n={nnodes}", "{entrypoint}"]))
    entry = ["train.py", "--out={checkpoint_dir}/n{node_rank}"]
    assert launchers.expand(tpl, entry, {**VALUES, "node_rank": 0}, head=True) == \
        ["/opt/head", "--n=2", "train.py", "--out=/ckpt/j-1/n0"]
    assert launchers.expand(tpl, entry, VALUES, head=False) == ["/opt/launch", "train.py", "--out=/ckpt/j-1/n1"]


def test_every_other_brace_of_an_entrypoint_reaches_the_program_unchanged() -> None:
    """As in a template: only an exact known `{name}` is replaced. An unknown `{word}` is accepted at
    submit and passed as written: an entrypoint carries other tools' templates (Lightning's
    `{epoch}`, a bash -c script's `${step}`, a str.format pattern)."""
    odd = ['--config={"lr": 3e-4, "dp": {}}', "{", "}", "{}", "{dp:>8}", "{dp.__class__}", "{epoch}-{step}",
           "bash -c 'echo ${step}'", "{DP}", "x{python}", "{entrypoint}", "{checkpoint_dirs}"]
    spec = P.JobSpec(name="j", entrypoint=["/bin/train", *odd], launcher=P.Launcher(name="torchrun"))
    assert spec_errors(spec) == []
    tpl = launchers.template_of(spec.launcher)
    assert launchers.expand(tpl, list(spec.entrypoint), VALUES, head=False)[-len(odd) - 1:] == ["/bin/train", *odd]


def test_an_entrypoint_that_expands_past_what_exec_takes_is_refused() -> None:
    big = {**VALUES, "world_info": "w" * 10_000}
    direct = launchers.template_of(P.Launcher())
    with pytest.raises(launchers.LaunchTooLarge, match="longest argument 140,000"):
        launchers.expand(direct, ["/bin/train", "{world_info}" * 14], big, head=False)
    torchrun = launchers.template_of(P.Launcher(name="torchrun"))
    with pytest.raises(launchers.LaunchTooLarge, match="over what exec takes"):
        launchers.expand(torchrun, ["/bin/train", *["{world_info}" * 10] * 11], big, head=False)
    assert len(launchers.expand(direct, ["/bin/train", *["{world_info}" * 10] * 10], big, head=False)) == 11


def _placed(spec: P.JobSpec, attempt: int, nodes: dict[str, list[int]]) -> JobRecord:
    rec = JobRecord("j-1", "r", spec, P.JOB_STATE_PENDING, "", 1.0)
    return rec.with_(state=P.JOB_STATE_STARTING, attempt=attempt,
                     plan=P.Plan(dp=sum(map(len, nodes.values())), tp=1, pp=1, micro_batch=1, grad_accum=1,
                                 gpu_model="A40-48GB"),
                     placement=P.Placement(slices=[P.NodeSlice(node_id=n, gpu_indices=g) for n, g in nodes.items()],
                                           rendezvous="127.0.0.1:29500"))


def test_the_audits_torchrun_job_gets_the_same_checkpoint_dir_on_every_attempt() -> None:
    spec = P.JobSpec(name="ddp", entrypoint=AUDIT_ENTRYPOINT, launcher=P.Launcher(name="torchrun"))
    assert spec_errors(spec) == []
    seen = set()
    for attempt, nodes in ((1, {"a": [0, 1], "b": [0, 1]}), (2, {"c": [2, 3], "a": [0, 1]})):
        for _, req in launch_requests(_placed(spec, attempt, nodes), 1, "/ckpt"):
            assert list(req.argv[-5:]) == ["/path/ddp.py", "--steps", "60", "--ckpt", req.checkpoint_dir]
            seen.add(req.checkpoint_dir)
    assert seen == {"/ckpt/j-1"}


def test_python_after_argv0_becomes_the_agents_interpreter() -> None:
    tpl = launchers.template_of(P.Launcher(argv=["/usr/bin/env", "{python}", "{entrypoint}"]))
    argv = launchers.expand(tpl, ["train.py", "--py", "{python}", "--x={python}"], VALUES, head=False)
    assert contract.worker_argv(argv, "/venv/bin/python") == \
        ["/usr/bin/env", "/venv/bin/python", "train.py", "--py", "/venv/bin/python", "--x={python}"]


@pytest.mark.parametrize("name", ["torchrun", "deepspeed"])
def test_python_first_under_a_launcher_that_runs_its_own_is_refused_at_submit(name: str) -> None:
    # torchrun and deepspeed run `python -u <entrypoint>`: `{python} train.py` would run the
    # interpreter's binary as a script (SyntaxError: source code cannot contain null bytes).
    spec = P.JobSpec(name="j", entrypoint=["{python}", "train.py"], launcher=P.Launcher(name=name))
    ((field, why),) = spec_errors(spec)
    assert field == "entrypoint[0]" and why.startswith(f"{name} runs the entrypoint with its own Python")
    assert spec_errors(P.JobSpec(name="j", entrypoint=["train.py", "{python}"], launcher=P.Launcher(name=name))) == []
    for ok in (P.Launcher(), P.Launcher(name="direct"), P.Launcher(argv=["/usr/bin/env", "{entrypoint}"])):
        assert spec_errors(P.JobSpec(name="j", entrypoint=["{python}", "train.py"], launcher=ok)) == [], ok


async def test_a_worker_started_through_env_gets_its_interpreter_and_checkpoint_dir(worker_dir: Path) -> None:
    """The whole path: the controller expands a `/usr/bin/env {python} {entrypoint}` template and the
    entrypoint's placeholders, the agent replaces {python} and starts the worker."""
    code = textwrap.dedent("""
        import json, pathlib, sys
        pathlib.Path("seen.json").write_text(json.dumps({"argv": sys.argv[1:], "python": sys.executable}))
        """)
    spec = P.JobSpec(name="j", launcher=P.Launcher(argv=["/usr/bin/env", "{python}", "{entrypoint}"]),
                     entrypoint=["-c", code, "{checkpoint_dir}", "{node_rank}", "{python}"])
    assert spec_errors(spec) == []
    ((_, req),) = launch_requests(_placed(spec, 1, {"a": [0]}), 1, str(worker_dir / "ckpt"))
    sup = Supervisor(worker_dir, range(4), declared=True, agent_addr="127.0.0.1:5555", poll_interval=0.05,
                     worker_python=worker_python())
    try:
        started, _ = await sup.launch(req)
        assert started and await sup.wait_exited("j-1", 1, 10.0)
        seen = json.loads((contract.attempt_dir(worker_dir, "j-1", 1) / "seen.json").read_text())
    finally:
        await sup.shutdown(kill_workers=True, grace=0.0)
    assert seen == {"argv": [str(worker_dir / "ckpt" / "j-1"), "0", worker_python()], "python": worker_python()}


def test_an_unquoted_placeholder_in_a_job_file_says_to_quote_it() -> None:
    # YAML reads `{checkpoint_dir}` unquoted as a mapping: the error said "quote numbers".
    with pytest.raises(JobFileError, match=r"entrypoint\[2\]: must be a string: quote placeholders, '\{checkpoint_dir\}'"):
        parse_job_yaml("name: x\nlauncher: torchrun\nentrypoint: [/x/train.py, --ckpt, {checkpoint_dir}]\n")
