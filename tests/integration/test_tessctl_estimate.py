"""`tessctl estimate memory|cells|stages` as a subprocess: in-process and through a real tessera-estimator
(--estimator), the same JSON either way; one JSON value with -o json; tables; one-line errors.

The two runs compared are started together and then waited for (each is a fresh Python); the
tables and the error cases run tessctl.main in this process, which is the same code without the start.
"""

from __future__ import annotations

import io
import json
import subprocess
from collections.abc import Iterator

import pytest

from tessera.clients import tessctl
from tessera.common.identity import CONTROLLER
from tessera.common.localcluster import pki, start_estimator
from tessera.estimator.memory import estimate_memory
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan
from tests.procs import BIN, REPO, Daemon, env

pytestmark = pytest.mark.slow

JOBS = REPO / "examples" / "jobs"
INV = REPO / "examples" / "inventories"
MEDIUM = str(JOBS / "medium.yaml")


@pytest.fixture(scope="module")
def estimator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_estimator(tmp_path_factory.mktemp("est") / "estimator.log")
    try:
        yield d
    finally:
        d.stop()


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(BIN / "tessctl"), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env(), cwd=REPO)


def _wait(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def _remote(address: str) -> tuple[str, ...]:
    """Through the estimator, presenting a certificate of the CA, as an operator would (the
    estimator requires one; docs/security.md)."""
    return "--estimator", address, "--tls-dir", str(pki().tls_dir(CONTROLLER))


def _both(address: str, *args: str) -> tuple[tuple[int, str, str], tuple[int, str, str]]:
    """The same tessctl command in-process and through the estimator at `address`."""
    local, remote = _start(*args), _start(*args, *_remote(address))
    return _wait(local), _wait(remote)


def test_memory_json_is_the_same_in_process_and_through_the_service(estimator: Daemon) -> None:
    args = ("estimate", "memory", "-f", MEDIUM, "--gpu", "a100-80gb", "--plan",
            "dp=2,tp=2,micro_batch=2,sharding=zero2,checkpointing=selective,flash_attention=false", "-o", "json")
    (rc1, out1, err1), (rc2, out2, err2) = _both(estimator.address, *args)
    assert (rc1, err1) == (0, "") and (rc2, err2) == (0, ""), err1 + err2
    assert out1 == out2
    doc = json.loads(out1)  # one JSON value
    mem = doc["memory"]
    lib = estimate_memory(ModelDims(192, 4, 6, 512, 128), ExecutionPlan(
        dp=2, tp=2, micro_batch=2, grad_accum=2, sharding="zero2", checkpointing="selective",
        flash_attention=False), gpu="A100-80GB")
    assert {k: mem[k] for k in ("parameters", "gradients", "optimizer", "activations", "other", "total")} == {
        "parameters": lib.parameters, "gradients": lib.gradients, "optimizer": lib.optimizer,
        "activations": lib.activations, "other": lib.other, "total": lib.total}
    assert mem["capacity"] == 80_000_000_000 and mem["fits"] is True and mem["source"] == "formula"
    assert doc["plan"]["sharding"] == "zero2" and doc["plan"]["grad_accum"] == 2 and doc["gpu"] == "A100-80GB"


def test_cells_json_is_the_same_in_process_and_through_the_service(estimator: Daemon) -> None:
    inventories = f"{INV / 'a100-node.yaml'},{INV / 'a40-node.yaml'}"
    (rc1, out1, err1), (rc2, out2, err2) = _both(
        estimator.address, "estimate", "cells", "-f", MEDIUM, "--cluster", inventories,
        "--cluster", str(INV / "a10-node.yaml"), "-o", "json")
    assert rc1 == rc2 == 0, err1 + err2
    assert out1 == out2
    doc = json.loads(out1)
    cells = doc["cells"]
    assert [(c["gpu_type"], c["num_gpus"], c["num_stages"]) for c in cells][:3] == [
        ("A100-80GB", 1, 1), ("A100-80GB", 2, 1), ("A100-80GB", 2, 2)]
    assert {c["gpu_type"] for c in cells} == {"A100-80GB", "A40-48GB", "A10-24GB"}
    for c in cells:
        assert c["fits"] and c["reason"] == ""
        assert c["iter_time_seconds"]["value"] > 0 and c["iter_time_seconds"]["source"].startswith("formula")
        assert c["memory_per_gpu_bytes"]["source"] and c["plan"]["description"].startswith(f"pp{c['num_stages']}")
        assert c["breakdown"] and all(b["source"] for b in c["breakdown"])


def test_stage_placement_json_is_the_same_in_process_and_through_the_service(estimator: Daemon) -> None:
    args = ("estimate", "stages", "-f", MEDIUM, "--stages", "A6000,A30,a4000", "--dp", "2", "--microbatches", "4",
            "--cluster", str(REPO / "examples/clusters/espresso-rental.yaml"), "--exhaustive", "-o", "json")
    (rc1, out1, err1), (rc2, out2, err2) = _both(estimator.address, *args)
    assert rc1 == rc2 == 0, err1 + err2
    assert out1 == out2
    doc = json.loads(out1)
    for key in ("placement", "optimum"):
        p = doc[key]
        assert sorted(s["gpu_type"] for s in p["stages"]) == ["A30-24GB", "RTX-A4000-16GB", "RTX-A6000-48GB"]
        assert sum(s["layers"] for s in p["stages"]) == 4 and p["fits"]
        assert all(s["stage"]["dp"] == 2 and s["stage"]["compute_seconds"] > 0 for s in p["stages"])
    assert doc["optimum"]["iter_time_seconds"]["value"] <= doc["placement"]["iter_time_seconds"]["value"]


def _main(*args: str) -> tuple[int, str]:
    """tessctl in this process (usage errors exit through argparse): (status, stdout)."""
    out = io.StringIO()
    try:
        rc = tessctl.main(list(args), out=out)
    except SystemExit as exc:
        rc = int(exc.code or 0)
    return rc, out.getvalue()


def test_tables_and_a_simulator_cluster() -> None:
    rc, out = _main("estimate", "memory", "-f", MEDIUM, "--gpu", "A40", "--plan", "pp=2,micro_batch=1")
    assert rc == 0
    assert "GPU:      A40-48GB" in out and "Plan:     dp=1,tp=1,pp=2,micro_batch=1,grad_accum=8" in out
    assert "Fits:     yes" in out and out.splitlines()[9].split()[0] == "parameters"
    rc, out = _main("estimate", "cells", "-f", MEDIUM, "--cluster",
                    str(REPO / "controller/sim/clusters/crius-1280.json"), "--best", "--max-gpus", "8")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["GPU", "GPUS", "STAGES", "NODES", "FITS"]
    assert {line.split()[0] for line in lines[1:-2]} == {"A100-40GB", "V100-32GB", "A40-48GB", "A10-24GB"}
    assert lines[-1].startswith(f"{len(lines) - 3} Cells")
    assert "COST/h" not in lines[0]  # no pool of that cluster has a price
    rc, out = _main("estimate", "stages", "-f", MEDIUM, "--stages", "A40,A10,A40", "--dp", "2", "--microbatches", "4",
                    "--overlap-sync")
    assert rc == 0
    lines = out.splitlines()
    assert lines[1].startswith("Espresso: [") and lines[1].endswith("] dp2 mb4") and "fits: yes" in lines[2]
    assert lines[3].split()[:3] == ["STAGE", "GPU", "LAYERS"] and len(lines) == 7
    rc, out = _main("estimate", "cells", "-f", MEDIUM, "--cluster", str(REPO / "examples/clusters/espresso-rental.yaml"),
                    "--best", "--max-gpus", "2")
    assert rc == 0
    head, *rows = out.splitlines()
    cols = head.split()
    assert cols[cols.index("PLAN") + 1: cols.index("PLAN") + 3] == ["COST/h", "COST(job)"]
    a30 = next(r for r in rows if r.startswith("A30-24GB ") and r.split()[1] == "2")
    assert "8 CNY" in a30  # 2 GPUs x 4 yuan per hour (the catalog's Espresso price)


def test_errors_are_one_line_with_the_field_on_both_paths(estimator: Daemon, capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    (rc1, out1, err1), (rc2, out2, err2) = _both(
        estimator.address, "estimate", "memory", "-f", MEDIUM, "--gpu", "a100", "--plan", "tp=4")
    assert rc1 == rc2 == 1 and out1 == out2 == ""
    assert err1 == err2 == "tessctl: error: INVALID_ARGUMENT: plan.tp: model.num_heads 6 is not divisible by tp 4\n"
    cases = [
        (("estimate", "memory", "-f", MEDIUM, "--gpu", "Z9000", *_remote(estimator.address)),
         1, "tessctl: error: INVALID_ARGUMENT: gpu: unknown GPU model 'Z9000'"),
        (("estimate", "memory", "-f", MEDIUM, "--gpu", "a100", "--plan", "dp=2", "--gpus", "4"),
         1, "tessctl: error: INVALID_ARGUMENT: num_gpus: plan dp*tp*pp = 2*1*1 = 2 does not equal num_gpus 4"),
        (("estimate", "cells", "-f", MEDIUM, "--cluster", str(JOBS / "tiny.yaml")),
         1, f"tessctl: error: {JOBS / 'tiny.yaml'} line 3: must have 'pools'"),  # where its mapping starts
        (("estimate", "cells", "-f", MEDIUM, "--cluster", str(JOBS / "missing.yaml")),
         1, f"tessctl: error: {JOBS / 'missing.yaml'}: cannot read"),
        (("estimate", "stages", "-f", MEDIUM, "--stages", "A40,Z9"),
         2, "tessctl: error: argument --stages: --stages[1]: unknown GPU model 'Z9'"),
        (("estimate", "stages", "-f", MEDIUM, "--stages", "A40,A100", "--cluster", str(INV / "a40-node.yaml")),
         1, "tessctl: error: --stages[1]: A100-80GB is not in the cluster files"),
        (("estimate", "stages", "-f", MEDIUM, "--stages", "A40,A10,A10,A40,A40"),
         1, "tessctl: error: INVALID_ARGUMENT: stages: 5 stages for 4 layers"),
        (("estimate", "memory", "-f", MEDIUM, "--gpu", "a100", "--plan", "dp=0"),
         2, "tessctl: error: argument --plan: plan.dp: must be an integer >= 1, got 0"),
        (("estimate", "memory", "-f", MEDIUM), 2, "tessctl: error: the following arguments are required: --gpu"),
        (("estimate", "memory", "-f", MEDIUM, "--gpu", "a100", "--estimator", "127.0.0.1:1"),
         1, "tessctl: error: cannot reach estimator at 127.0.0.1:1"),
    ]
    capsys.readouterr()
    for args, want_rc, want_err in cases:
        rc, out = _main(*args)
        err = capsys.readouterr().err
        assert (rc, out) == (want_rc, ""), err
        assert err.startswith(want_err) and err.count("\n") == 1, err
