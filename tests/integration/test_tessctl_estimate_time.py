"""`tessctl estimate time` through a real tessera-estimator on loopback (--estimator, mTLS) and in
process: the same JSON either way, the library's numbers, and errors naming the field on both paths."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from tessera.common.identity import CONTROLLER
from tessera.common.localcluster import pki, start_estimator
from tessera.estimator.models import ModelDims
from tessera.estimator.plan_time import estimate_plan_time
from tessera.estimator.plans import ExecutionPlan
from tests.procs import BIN, REPO, Daemon, env

pytestmark = pytest.mark.slow

MEDIUM = str(REPO / "examples" / "jobs" / "medium.yaml")


@pytest.fixture(scope="module")
def estimator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_estimator(tmp_path_factory.mktemp("est") / "estimator.log")
    try:
        yield d
    finally:
        d.stop()


def _both(address: str, *args: str) -> list[tuple[int, str, str]]:
    remote = ("--estimator", address, "--tls-dir", str(pki().tls_dir(CONTROLLER)))
    procs = [subprocess.Popen([str(BIN / "tessctl"), *a], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env(), cwd=REPO) for a in (args, (*args, *remote))]
    out = []
    for p in procs:
        o, e = p.communicate(timeout=120)
        out.append((p.returncode, o, e))
    return out


def test_time_json_is_the_same_in_process_and_through_the_service(estimator: Daemon) -> None:
    (rc1, out1, err1), (rc2, out2, err2) = _both(
        estimator.address, "estimate", "time", "-f", MEDIUM, "--gpu", "a100-80gb", "--gpus", "4", "--gpus-per-node",
        "2", "--plan", "dp=2,tp=2,micro_batch=2,sharding=fsdp", "-o", "json")
    assert (rc1, err1) == (0, "") and (rc2, err2) == (0, ""), err1 + err2
    assert out1 == out2
    doc = json.loads(out1)
    plan = ExecutionPlan(dp=2, tp=2, micro_batch=2, grad_accum=2, sharding="fsdp")
    lib = estimate_plan_time(ModelDims(192, 4, 6, 512, 128), plan, "A100-80GB", gpus_per_node=2)
    assert doc["iter_time_seconds"] == pytest.approx(lib.iter_time, rel=1e-12)
    assert {c["name"]: c["seconds"] for c in doc["breakdown"]} == pytest.approx(lib.breakdown, rel=1e-12)
    assert doc["plan"]["sharding"] == "fsdp" and doc["gpus_per_node"] == 2 and doc["memory"]["fits"] is True


def test_time_errors_name_the_field_on_both_paths(estimator: Daemon) -> None:
    for args, want in (
        (("--gpu", "a100", "--plan", "tp=4"), "plan.tp: model.num_heads 6 is not divisible by tp 4"),
        (("--gpu", "a100", "--plan", "dp=4", "--gpus-per-node", "3"),
         "gpus_per_node: the plan's 4 GPUs do not fill whole nodes of 3"),
    ):
        (rc1, out1, err1), (rc2, out2, err2) = _both(estimator.address, "estimate", "time", "-f", MEDIUM, *args)
        assert rc1 == rc2 == 1 and out1 == out2 == ""
        assert err1 == err2 == f"tessctl: error: INVALID_ARGUMENT: {want}\n"
