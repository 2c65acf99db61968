"""The worker contract as pure functions: launch validation and the worker environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.nodeagent import contract
from tessera.nodeagent.errors import InvalidArgument
from tessera.nodeagent.testing import launch_request
from tessera.v1 import agent_pb2

GPUS = range(4)


def test_paths() -> None:
    assert contract.log_path(Path("/w"), "j", 3, 1) == Path("/w/jobs/j/attempt-3/rank-1.log")
    assert contract.attempt_dir(Path("/w"), "j", 3) == Path("/w/jobs/j/attempt-3")


def test_valid_request_passes() -> None:
    contract.validate_launch(launch_request(gpus=[[0, 1], [2, 3]]), GPUS)
    contract.validate_launch(launch_request(gpus=[[]]), GPUS)  # a rank may hold no GPU


def _invalid(req: agent_pb2.LaunchRequest) -> str:
    with pytest.raises(InvalidArgument) as err:
        contract.validate_launch(req, GPUS)
    return str(err.value)


@pytest.mark.parametrize("job_id", ["", "../etc", "-x", ".hidden", "a/b", "x" * 129, "a b", "é", "job-1\n"])
def test_bad_job_ids(job_id: str) -> None:
    assert _invalid(launch_request(job_id=job_id)).startswith("job_id: ")


def test_field_errors() -> None:
    assert _invalid(launch_request(attempt=0)).startswith("attempt: must be >= 1")
    assert _invalid(launch_request(argv=[])) == "argv: must not be empty"
    assert _invalid(launch_request(argv=["", "x"])) == "argv[0]: must not be empty"
    assert _invalid(launch_request(argv=["python", "a\0b"])) == "argv[1]: contains a NUL byte"
    assert _invalid(launch_request(gpus=[[7]])).startswith("ranks[0].gpu_indices: GPU 7 does not exist")
    assert (
        _invalid(launch_request(gpus=[[0], [0]]))
        == "ranks[1].gpu_indices: GPU 0 is given to both rank 0 and rank 1"
    )
    assert _invalid(launch_request(gpus=[[0]], first_rank=2, world_size=2)).startswith(
        "ranks[0].rank: 2 is outside"
    )
    assert _invalid(launch_request(gpus=[], world_size=1)) == "ranks: must list at least one rank"
    assert _invalid(launch_request(gpus=[[0], [1]], world_size=1)).startswith(
        "ranks: 2 ranks for world_size 1"
    )
    assert _invalid(launch_request(rendezvous="nohost")).startswith("rendezvous: ")
    assert _invalid(launch_request(rendezvous="h:0")).startswith("rendezvous: ")
    assert _invalid(launch_request(checkpoint_dir="ckpt")).startswith(
        "checkpoint_dir: 'ckpt' must be an absolute path"
    )
    req = launch_request(gpus=[[0], [1]])
    req.ranks[1].local_rank = 0
    assert _invalid(req) == "ranks[1].local_rank: local rank 0 is listed twice"
    req = launch_request()
    req.iterations = -1
    assert _invalid(req) == "iterations: must be >= 0, got -1"


@pytest.mark.parametrize(
    "name", ["RANK", "CUDA_VISIBLE_DEVICES", "TESSERA_PLAN", "MASTER_PORT", "CUDA_DEVICE_ORDER"]
)
def test_env_cannot_override_contract(name: str) -> None:
    msg = _invalid(launch_request(env={name: "1"}))
    assert msg == f"env.{name}: is set by the agent (worker contract) and cannot be overridden"


@pytest.mark.parametrize("name", ["lower", "1ABC", "A-B", "", "A\n"])
def test_env_names_validated(name: str) -> None:
    assert _invalid(launch_request(env={name: "1"})).startswith(f"env.{name}: name does not match")


def test_validate_stop() -> None:
    contract.validate_stop("job", 0, 0.0)
    for args, field in [
        (("job", -1, 1.0), "attempt"),
        (("job", 1, -1.0), "grace_seconds"),
        (("job", 1, float("nan")), "grace_seconds"),
        (("../x", 1, 1.0), "job_id"),
    ]:
        with pytest.raises(InvalidArgument) as err:
            contract.validate_stop(*args)
        assert err.value.field == field


def test_worker_env_nvml_node() -> None:
    req = launch_request(
        gpus=[[0, 1], [2, 3]], env={"MY_FLAG": "on"}, rendezvous="10.0.0.5:29400", world_size=4
    )
    base = {"PATH": "/usr/bin", "NOTIFY_SOCKET": "/run/systemd/notify", "RANK": "99", "WATCHDOG_USEC": "1",
            "TESSERA_TLS_DIR": "/etc/tessera/tls", "TESSERA_TOKEN": "admin-secret",
            "PWD": "/tmp/where-the-agent-started", "OLDPWD": "/root", "_": "/usr/bin/nohup"}
    env = contract.worker_env(
        base,
        req,
        req.ranks[1],
        agent_addr="127.0.0.1:7000",
        declared=False,
        checkpoint_dir="/ckpt/job-1",
        omp_threads=8,
    )
    assert env["PATH"] == "/usr/bin" and env["MY_FLAG"] == "on"
    assert "NOTIFY_SOCKET" not in env and "WATCHDOG_USEC" not in env
    assert not {"PWD", "OLDPWD", "_"} & env.keys()  # the agent shell's, wrong in the attempt folder
    assert "TESSERA_TLS_DIR" not in env and "TESSERA_TOKEN" not in env  # the agent's, not the worker's
    expected = {
        "TESSERA_JOB_ID": "job-1",
        "TESSERA_ATTEMPT": "1",
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29400",
        "TESSERA_RENDEZVOUS": "10.0.0.5:29400",
        "TESSERA_ITERATIONS": "100",
        "TESSERA_GLOBAL_BATCH_SIZE": "16",
        "TESSERA_CHECKPOINT_DIR": "/ckpt/job-1",
        "TESSERA_CHECKPOINT_EVERY": "0",
        "TESSERA_AGENT_ADDR": "127.0.0.1:7000",
        "CUDA_VISIBLE_DEVICES": "2,3",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "TESSERA_INVENTORY_SOURCE": "nvml",
        "OMP_NUM_THREADS": "8",
    }
    assert {k: env[k] for k in expected} == expected
    assert json.loads(env["TESSERA_PLAN"]) == {
        "dp": 2,
        "tp": 1,
        "pp": 1,
        "micro_batch": 2,
        "grad_accum": 4,
        "gpu_model": "A100-80GB",
        "memory_per_gpu_bytes": 0,
        "memory_source": "",
    }
    assert list(json.loads(env["TESSERA_MODEL"])) == [
        "name",
        "hidden_size",
        "num_layers",
        "num_heads",
        "vocab_size",
        "seq_length",
    ]


def test_worker_env_declared_node_hides_gpus() -> None:
    req = launch_request(gpus=[[0, 1]], rendezvous="[::1]:29500")
    env = contract.worker_env(
        {}, req, req.ranks[0], agent_addr="a:1", declared=True, checkpoint_dir="/c", omp_threads=1
    )
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["TESSERA_INVENTORY_SOURCE"] == "declared"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("::1", "29500")


def test_omp_threads_default_and_who_overrides_it() -> None:
    def omp(base: dict[str, str], job_env: dict[str, str]) -> str:
        req = launch_request(gpus=[[0]], env=job_env)
        env = contract.worker_env(
            base, req, req.ranks[0], agent_addr="a:1", declared=False, checkpoint_dir="/c", omp_threads=4
        )
        return env["OMP_NUM_THREADS"]

    assert omp({}, {}) == "4"
    assert omp({"OMP_NUM_THREADS": "64"}, {}) == "4"  # the agent's own value is not passed on
    assert omp({"OMP_NUM_THREADS": "64"}, {"OMP_NUM_THREADS": "16"}) == "16"  # the job's env wins


def test_workers_are_unbuffered_unless_the_job_says_otherwise() -> None:
    """A live audit: a `direct` script's prints sat in its stdio buffer (`logs -f` showed nothing,
    an OOM kill lost its last lines); the demo and e2e tests never saw it, their agents inheriting
    PYTHONUNBUFFERED=1 from the local cluster. The parent environments here are literal."""
    def unbuffered(base: dict[str, str], job_env: dict[str, str]) -> str | None:
        req = launch_request(gpus=[[0]], env=job_env)
        env = contract.worker_env(
            base, req, req.ranks[0], agent_addr="a:1", declared=False, checkpoint_dir="/c", omp_threads=1
        )
        return env.get("PYTHONUNBUFFERED")

    assert unbuffered({"PATH": "/usr/bin"}, {}) == "1"  # the agent's rule, not its environment's
    assert unbuffered({"PYTHONUNBUFFERED": ""}, {}) == "1"  # nor the agent's own value
    assert unbuffered({"PYTHONUNBUFFERED": "1"}, {"PYTHONUNBUFFERED": ""}) == ""  # the job's env wins
    assert unbuffered({}, {"PYTHONUNBUFFERED": "x"}) == "x"


@pytest.mark.parametrize(
    ("cpus", "gpus", "threads"), [(64, 8, 8), (96, 8, 12), (20, 8, 2), (2, 4, 1), (16, 0, 16), (0, 8, 1)]
)
def test_cpu_threads_per_gpu(cpus: int, gpus: int, threads: int) -> None:
    assert contract.cpu_threads_per_gpu(cpus, gpus) == threads


def test_python_placeholder_is_replaced_as_every_argument_of_its_own() -> None:
    # docs/launchers.md: "{python} is replaced only as an argument of its own", wherever it stands.
    assert contract.worker_argv(["{python}", "-m", "x", "{python}"], "/venv/bin/python") == [
        "/venv/bin/python",
        "-m",
        "x",
        "/venv/bin/python",
    ]
    assert contract.worker_argv(["/usr/bin/env", "{python}"], "/p") == ["/usr/bin/env", "/p"]
    assert contract.worker_argv(["x{python}", "{python} ", "{PYTHON}"], "/p") == ["x{python}", "{python} ", "{PYTHON}"]
    assert contract.worker_argv([], "/p") == []


def test_plan_json_carries_the_execution_plan_options() -> None:
    import json

    from tessera.v1 import common_pb2

    plan = common_pb2.Plan(dp=2, tp=1, pp=1, micro_batch=2, grad_accum=4, gpu_model="A100-80GB",
                           options=common_pb2.ExecutionPlan(dp=9, sharding=common_pb2.SHARDING_ZERO1,
                                                            checkpointing=common_pb2.CHECKPOINTING_FULL))
    got = json.loads(contract.plan_json(plan))
    assert got["dp"] == 2  # the plan's sizes win over the options'
    assert got["sharding"] == "SHARDING_ZERO1" and got["checkpointing"] == "CHECKPOINTING_FULL"
    assert "options" not in got
    assert "sharding" not in json.loads(contract.plan_json(common_pb2.Plan(dp=1)))
