"""`--plan lora_rank=0,compile=false` over a job file's `plan: {lora_rank: 16, compile: true}` through a
real tessera-estimator on loopback (--estimator, mTLS) and in process: the same answer either way,
the flag's 0 and false in it (tessctl merges, the request carries the merged plan)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_tessctl_estimate_time import _both, estimator  # noqa: F401 (the fixture)
from tests.procs import Daemon

pytestmark = pytest.mark.slow

JOB = ("name: ov\nmodel: llama3.1-8b\nglobal_batch_size: 8\niterations: 10\n"
       "plan: {lora_rank: 16, compile: true, sequence_parallel: true, checkpointing: full, sharding: fsdp}\n")


@pytest.mark.parametrize("command", ["memory", "time"])
def test_zero_and_false_override_the_job_file_on_both_paths(estimator: Daemon, tmp_path: Path,  # noqa: F811
                                                            command: str) -> None:
    job = tmp_path / "ov.yaml"
    job.write_text(JOB)
    (rc1, out1, err1), (rc2, out2, err2) = _both(
        estimator.address, "estimate", command, "-f", str(job), "--gpu", "h100", "-o", "json",
        "--plan", "dp=8,micro_batch=1,lora_rank=0,compile=false,sequence_parallel=false")
    assert (rc1, err1) == (0, "") and (rc2, err2) == (0, ""), err1 + err2
    assert out1 == out2
    plan = json.loads(out2)["plan"]
    assert (plan["lora_rank"], plan["compile"], plan["sequence_parallel"]) == (0, False, False)
    assert (plan["dp"], plan["checkpointing"], plan["sharding"]) == (8, "full", "fsdp")  # the job file's rest
