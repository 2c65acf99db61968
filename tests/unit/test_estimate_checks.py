"""What `tessctl estimate memory|time` say beside the estimator's answer (docs/cli.md): the plan
fields `--mode marp` ignores, the figure the fits verdict judges, and the families they cover."""

from __future__ import annotations

import io

import pytest

from tessera.clients import tessctl
from tessera.clients.estimate import memory_table
from tessera.clients.estimate_checks import marp_ignored, marp_warning
from tessera.estimator.convert import plan_message
from tessera.estimator.plans import ExecutionPlan
from tessera.v1 import estimator_pb2 as pb
from tests.procs import REPO

LLAMA = str(REPO / "examples" / "estimate" / "llama3-8b-fsdp.yaml")
TINY = str(REPO / "examples" / "jobs" / "tiny.yaml")
WRESNET = str(REPO / "examples" / "estimate" / "wide-resnet-500m.yaml")


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    out = io.StringIO()
    try:
        rc = tessctl.main(list(args), out=out)
    except SystemExit as exc:
        rc = int(exc.code or 0)
    return rc, out.getvalue(), capsys.readouterr().err


def test_marp_names_the_plan_fields_it_ignores(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the header showed sharding=fsdp,checkpointing=op and MARP's 558 GB (the plain DP
    figure; the formula's is 52) came with nothing on stderr."""
    argv = ("estimate", "memory", "-f", LLAMA, "--gpu", "h100-80gb", "--plan", "dp=8,micro_batch=1")
    rc, out, err = _main(capsys, *argv, "--mode", "marp")
    assert rc == 0 and "Source:   formula:marp" in out
    assert err == ("tessctl: warning: --mode marp ignores the plan's sharding=fsdp, checkpointing=op, precision=amp, "
                   "loss=fp32: Frenzy's MARP counts dp, tp and the micro-batch only, so its figures are those of a "
                   "plan without them (--mode formula counts them)\n")
    rc, out, err = _main(capsys, *argv, "--mode", "marp", "-o", "json")
    assert rc == 0 and out.startswith("{") and "sharding=fsdp" in err  # stdout stays JSON
    rc, _, err = _main(capsys, *argv)
    assert (rc, err) == (0, "")  # the formula counts them all
    rc, _, err = _main(capsys, "estimate", "memory", "-f", TINY, "--gpu", "a100-80gb", "--mode", "marp",
                       "--plan", "dp=2,tp=2,micro_batch=4")
    assert (rc, err) == (0, "")  # nothing MARP leaves out


def test_marp_takes_dp_tp_and_the_micro_batch_only() -> None:
    assert marp_ignored(plan_message(ExecutionPlan(dp=4, tp=2, micro_batch=8, grad_accum=4))) == []
    assert marp_ignored(plan_message(ExecutionPlan(pp=2, grad_accum=4, sequence_parallel=True, tp=2))) == [
        "pp=2", "sequence_parallel=true"]
    assert marp_warning(plan_message(ExecutionPlan())) == ""


def _memory(reserved: int) -> pb.EstimateMemoryResponse:
    resp = pb.EstimateMemoryResponse(gpu="H100-80GB", num_gpus=8)
    m = resp.memory
    m.total, m.reserved, m.other, m.capacity, m.fits = 44_260_000_000, reserved, 1_070_000_000, 80_000_000_000, True
    return resp


def test_the_fits_line_says_what_its_figure_is() -> None:
    """Before: `Fits: yes (52.34 of 80.00 GB)` under `Reserved: 51.27 GB`, the sum unnamed."""
    lines = memory_table("j", _memory(51_270_000_000)).splitlines()
    assert "Reserved: 51.27 GB (caching allocator, predicted)" in lines
    assert "Fits:     yes (52.34 of 80.00 GB: reserved + other)" in lines
    assert "Fits:     yes (44.26 of 80.00 GB: total)" in memory_table("j", _memory(0)).splitlines()


@pytest.mark.parametrize(("command", "what"), [
    ("time", "`estimate time` covers transformers (the iteration time and the memory of the plan)"),
    ("memory", "`estimate memory` covers transformers"),
])
def test_a_wide_resnet_is_named_as_the_job_file_names_it(capsys: pytest.CaptureFixture[str], command: str,
                                                         what: str) -> None:
    """Before: `estimate time` said "the memory estimate covers transformers; a wresnet model"."""
    rc, out, err = _main(capsys, "estimate", command, "-f", WRESNET, "--gpu", "a100-80gb")
    assert (rc, out) == (1, "")
    assert err == (f"tessctl: error: model.family: {what}; a wide_resnet model has Cells only: `tessctl estimate "
                   f"cells -f FILE --cluster FILE` gives its iteration times\n")
