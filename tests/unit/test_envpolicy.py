"""The environment policy (common/envpolicy.py) and its three users: SubmitJob validation, the job-file
parser and the agent's Launch check (the Launch side is in tests/unit/test_agent_server.py)."""

from __future__ import annotations

import pytest

from tessera.clients.jobfile import JobFileError, parse_job_yaml
from tessera.common import envpolicy
from tessera.controller.core.validate import validate_spec
from tessera.v1 import common_pb2 as P

HOOKS = ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_ANYTHING_NEW", "PYTHONPATH", "PYTHONHOME",
         "PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONUSERBASE", "PYTHONEXECUTABLE", "PYTHONBREAKPOINT", "BASH_ENV",
         "ENV", "PERL5LIB", "PERL5OPT", "RUBYOPT", "NODE_OPTIONS", "JAVA_TOOL_OPTIONS", "GCONV_PATH",
         "GLIBC_TUNABLES"]
ORDINARY = ["PATH", "HOME", "PYTHONUNBUFFERED", "PYTHONWARNINGS", "OMP_NUM_THREADS", "NCCL_DEBUG",
            "TESSERA_TORCH_THREADS", "LDFLAGS", "ENVIRONMENT", "MY_LD_PRELOAD"]


@pytest.mark.parametrize("name", HOOKS)
def test_hooks_are_refused_with_the_flag_that_allows_them(name: str) -> None:
    why = envpolicy.refusal(name)
    assert why is not None and why.startswith("refused: ") and why.endswith(f"--allow-env {name}")
    assert envpolicy.refusal(name, {name}) is None  # the operator's allow-list wins
    assert envpolicy.refusal(name, {"SOMETHING_ELSE"}) is not None


@pytest.mark.parametrize("name", ORDINARY)
def test_ordinary_variables_pass(name: str) -> None:
    assert envpolicy.refusal(name) is None


def test_refused_names_lists_fields_in_order() -> None:
    env = {"PYTHONPATH": "/x", "OK": "1", "LD_PRELOAD": "/evil.so"}
    assert [f for f, _ in envpolicy.refused_names(env)] == ["env.LD_PRELOAD", "env.PYTHONPATH"]
    assert [f for f, _ in envpolicy.refused_names(env, {"PYTHONPATH"})] == ["env.LD_PRELOAD"]


def _spec(**env: str) -> P.JobSpec:
    spec = P.JobSpec(name="j", model=P.ModelSpec(name="gpt2-small"), global_batch_size=8, iterations=10)
    spec.env.update(env)
    return spec


def test_submit_validation_names_the_field() -> None:
    errs = [str(e) for e in validate_spec(_spec(LD_PRELOAD="/tmp/evil.so", OK="1"))]
    assert len(errs) == 1 and errs[0].startswith("env.LD_PRELOAD: refused: a dynamic-loader hook"), errs
    assert validate_spec(_spec(LD_PRELOAD="/tmp/x.so"), frozenset({"LD_PRELOAD"})) == []


def test_job_file_refuses_hooks_unless_allowed_locally() -> None:
    text = "name: j\nmodel: gpt2-small\nglobal_batch_size: 8\niterations: 10\nenv:\n  PYTHONPATH: /tmp\n"
    with pytest.raises(JobFileError, match=r"line 6: field env\.PYTHONPATH: refused: a Python interpreter hook"):
        parse_job_yaml(text, "job.yaml")
    assert parse_job_yaml(text, "job.yaml", allowed_env={"PYTHONPATH"}).env["PYTHONPATH"] == "/tmp"
