"""When no allocation holds the model, the cost tree says what bounded its search: the global batch's
cap on data parallelism (dp divides global batch / micro-batches) when it kept the search below the
GPUs the quotas hold, memory alone otherwise (docs/espresso.md)."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest

from tessera.clients import tessctl
from tessera.estimator.cells import CellModel
from tessera.estimator.cost_tree import GpuOffer, NoFeasiblePlan, _quota_gpus, cheapest_plan, exhaustive_sweep
from tessera.estimator.models import ModelDims

JOB = """\
name: cost-70b
model: llama3.1-70b
global_batch_size: {batch}
iterations: 100
objective: cost
slo: {{iterations_within: 6h}}
plan: {{sharding: fsdp, checkpointing: full}}
"""


def _plan_cost(tmp_path: Path, capsys: pytest.CaptureFixture[str], batch: int, quota: int) -> tuple[int, str]:
    (tmp_path / "job.yaml").write_text(JOB.format(batch=batch))
    (tmp_path / "prices.yaml").write_text("{H100: 2.99}\n")
    (tmp_path / "quota.yaml").write_text(f"{{H100: {quota}}}\n")
    rc = tessctl.main(["plan-cost", "-f", str(tmp_path / "job.yaml"), "--prices", str(tmp_path / "prices.yaml"),
                       "--quota", str(tmp_path / "quota.yaml"), "--max-stages", "2"], out=io.StringIO())
    return rc, capsys.readouterr().err


def test_a_batch_that_bounds_the_gpus_is_said_with_its_numbers(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    # batch 64: one stage takes 4 micro-batches of 16 samples (dp <= 16), two stages 8 of 8 (dp <= 8)
    rc, err = _plan_cost(tmp_path, capsys, 64, 64)
    assert rc == 2
    assert err == ("tessctl: error: the global batch of 64 bounds data parallelism: each stage's dp must divide the "
                   "samples of one micro-batch (global batch / micro-batches, 4 per stage), so at most 16 of the 64 "
                   "GPUs the quotas hold were searched (dp x stages), and no allocation of 1 GPU type(s) within their "
                   "quotas, at most 2 stages on them holds llama3.1-70b in GPU memory; a larger global batch would "
                   "admit more GPUs\n")


def test_memory_alone_when_the_batch_admits_every_gpu_the_quotas_hold(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _plan_cost(tmp_path, capsys, 64, 16)
    assert rc == 2
    assert err == "tessctl: error: no allocation of 1 GPU type(s) within their quotas, at most 2 stages holds " \
                  "llama3.1-70b in GPU memory\n"


def test_the_library_and_the_exhaustive_sweep_say_the_same() -> None:
    big = CellModel.from_dims(ModelDims(8192, 8, 64, 32000, 4096, "wide"), 8)
    offers = [GpuOffer("A10-24GB", 1.0, 8)]
    with pytest.raises(NoFeasiblePlan) as err:
        cheapest_plan(big, offers, 10, 3600.0, max_stages=2)
    assert err.value.best_time_s == math.inf
    assert err.value.reason.startswith("the global batch of 8 bounds data parallelism") and "at most 2 of the 8 GPUs" \
        in err.value.reason, err.value.reason
    (swept,) = exhaustive_sweep(big, offers, 10, [3600.0], max_stages=2)
    assert isinstance(swept, NoFeasiblePlan) and swept.reason == f"slo_s: {err.value.reason}"


def test_quota_gpus_is_the_most_dp_x_stages_the_quotas_hold() -> None:
    offers = [GpuOffer("A10-24GB", 1.0, 5), GpuOffer("A100-80GB", 3.0, 3)]
    assert _quota_gpus(offers, 1) == 5  # one stage of one type
    assert _quota_gpus(offers, 2) == 6  # 2 x 3: 3 of each type
    assert _quota_gpus(offers, 3) == 6  # 3 x 2: two stages of A10, one of A100 (2 x 2 + 1 x 2)
