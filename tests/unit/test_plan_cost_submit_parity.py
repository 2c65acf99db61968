"""`tessctl plan-cost` reads a job file as `tessctl submit` and the controller do: the same files
refused with the same field and reason, the job's `gpu_types` limiting the types planned over, the
prices read as the controller's --prices; and its table says GPUs, prices and memory failures
plainly."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from tessera.clients import tessctl
from tessera.common.objective import PricesError, load_prices

JOB = """\
name: plan-me
model: {hidden_size: 128, num_layers: 6, num_heads: 4, vocab_size: 4096, seq_length: 128}
global_batch_size: 16
iterations: 30
objective: cost
slo: {iterations_within: 1h}
"""
NO_CONTROLLER = ["--controller", "127.0.0.1:1"]


def _files(tmp_path: Path, job: str = JOB, prices: str = "{A30: 1.0, A100: 3.0}",
           quota: str = "{A30: 4, A100: 2}") -> list[str]:
    (tmp_path / "job.yaml").write_text(job)
    (tmp_path / "prices.yaml").write_text(prices + "\n")
    (tmp_path / "quota.yaml").write_text(quota + "\n")
    return ["plan-cost", "-f", str(tmp_path / "job.yaml"), "--prices", str(tmp_path / "prices.yaml"),
            "--quota", str(tmp_path / "quota.yaml"), "--max-stages", "2"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    rc = tessctl.main(argv, out=out)
    return rc, out.getvalue(), capsys.readouterr().err


def _allocation(tmp_path: Path, capsys: pytest.CaptureFixture[str], job: str, **files: str) -> dict[str, int]:
    rc, out, err = _run([*_files(tmp_path, job, **files), "-o", "json"], capsys)
    assert rc == 0, err
    return json.loads(out)["plans"]["espresso"]["allocation"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("types", ["[A100]", "[a100-80gb]", "[A100-80GB, A100]"])
def test_the_jobs_gpu_types_limit_the_types_planned_over(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         types: str) -> None:
    assert _allocation(tmp_path, capsys, JOB) == {"A30-24GB": 1}  # the cheapest type, when any may be used
    assert _allocation(tmp_path, capsys, JOB + f"gpu_types: {types}\n") == {"A100-80GB": 1}  # aliases resolved


def test_gpu_types_without_a_price_or_a_quota_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = JOB + "gpu_types: [A100]\n"
    rc, out, err = _run(_files(tmp_path, job, prices="{A30: 1.0}", quota="{A30: 4}"), capsys)
    assert (rc, out, err) == (2, "", ("tessctl: error: gpu_types: no price for A100-80GB in the prices file "
                                     "(--prices)\n"))
    # submit's rule: every type the job names needs a price, even when another of them has one
    rc, _, err = _run(_files(tmp_path, JOB + "gpu_types: [A30, A100]\n", prices="{A30: 1.0}", quota="{A30: 4}"),
                      capsys)
    assert (rc, err) == (2, "tessctl: error: gpu_types: no price for A100-80GB in the prices file (--prices)\n")
    rc, out, err = _run(_files(tmp_path, job, quota="{A30: 4}"), capsys)
    assert (rc, out) == (2, "")
    assert err == ("tessctl: error: gpu_types: the quota file offers none of the types the job may use "
                   "(A100-80GB); it offers A30-24GB\n")


@pytest.mark.parametrize(("change", "line", "reason"), [
    ({"slo: {iterations_within: 1h}": "slo: {deadline: 2200-01-01T00:00:00Z}"}, 6,
     "field slo.deadline: must be a Unix time from 0 (none) to 2100-01-01T00:00:00Z (4102444800), got 7258118400.0"),
    ({"iterations: 30\n": "iterations: 30\npriority: guaranteed\nguarantee: {gpus: 1}\n"}, 5,
     ("field priority: a job with the cost objective is best-effort (its SLO picks the cheapest plan of the free "
     "GPUs and holds no quota): drop priority: guaranteed, or the cost objective")),
    ({"iterations: 30\n": "iterations: 30\npriority: guaranteed\n"}, 5,
     ("field priority: a job with the cost objective is best-effort (its SLO picks the cheapest plan of the free "
     "GPUs and holds no quota): drop priority: guaranteed, or the cost objective")),
    ({"objective: cost\n": ""}, 5, "field slo: only the cost objective reads an SLO: set objective to cost"),
])
def test_a_job_file_submit_refuses_is_refused_with_the_same_field_and_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, str], line: int, reason: str) -> None:
    job = JOB
    for old, new in change.items():
        job = job.replace(old, new)
    argv = _files(tmp_path, job)
    path = tmp_path / "job.yaml"
    want = f"tessctl: error: {path} line {line}: {reason}\n"
    assert _run(["submit", *NO_CONTROLLER, str(path)], capsys)[1:] == ("", want)  # refused before any call
    assert _run(argv, capsys) == (2, "", want)


def test_a_deadline_already_past_is_refused_as_submitjob_refuses_it(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(_files(tmp_path, JOB.replace("{iterations_within: 1h}", "{deadline: 2020-01-01T00:00:00Z}")),
                      capsys)
    assert rc == 2 and err.startswith(f"tessctl: error: {tmp_path / 'job.yaml'} line 6: field slo.deadline: "
                                      "2020-01-01T00:00:00Z has passed (the clock here reads ")
    assert err.endswith("): no plan can meet it\n")


@pytest.mark.parametrize("prices", ["{A30: 0, A100: 3.0}", "{A30: -1, A100: 3.0}", "{A30: 1.0e7, A100: 3.0}"])
def test_prices_are_read_as_the_controllers_prices(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   prices: str) -> None:
    argv = _files(tmp_path, prices=prices)
    with pytest.raises(PricesError) as controller:
        load_prices(tmp_path / "prices.yaml")
    rc, out, err = _run(argv, capsys)
    assert (rc, out, err) == (2, "", f"tessctl: error: {controller.value}\n")


@pytest.mark.parametrize("which", ["prices", "quota"])
def test_a_null_gpu_type_is_named_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str) -> None:
    argv = _files(tmp_path, **{which: "{A30: 2, ~: 1}"})
    rc, _, err = _run(argv, capsys)
    assert (rc, err) == (2, (f"tessctl: error: {tmp_path / (which + '.yaml')} line 1: a GPU type name must be a "
                            "string, got null\n"))


def test_the_table_says_gpus_and_the_price_unit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(_files(tmp_path), capsys)
    assert rc == 0, err
    assert "espresso: 1 x A30-24GB  (1 GPU, 1 per hour: the prices file's price per GPU-hour x GPUs)" in out
    assert "(price per GPU-hour x GPUs x hours, in the prices file's currency)" in out
    # The table's layers are inclusive, -o json's half-open (docs/cli.md): the same stage.
    assert out.rstrip().endswith("0      A30-24GB           1  0-5")
    rc, out, err = _run([*_files(tmp_path), "-o", "json"], capsys)
    assert json.loads(out)["plans"]["espresso"]["stages"][0]["layers"] == [0, 6]
    wider = JOB.replace("hidden_size: 128, num_layers: 6, num_heads: 4, vocab_size: 4096, seq_length: 128",
                        "hidden_size: 1024, num_layers: 8, num_heads: 16, vocab_size: 32000, seq_length: 1024")
    rc, out, err = _run([*_files(tmp_path, wider, quota="{A30: 4}", prices="{A30: 1.0}"), "--slo", "8"], capsys)
    assert rc == 0 and "espresso: 2 x A30-24GB  (2 GPUs, 2 per hour: " in out, err  # one GPU takes 9 s


def test_a_model_no_gpu_holds_is_no_slo_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = JOB.replace("model: {hidden_size: 128, num_layers: 6, num_heads: 4, vocab_size: 4096, seq_length: 128}",
                      "model: llama3.1-70b")
    rc, out, err = _run(_files(tmp_path, job, prices="{A30: 1.0}", quota="{A30: 2}"), capsys)
    assert (rc, out) == (2, "")
    assert err == ("tessctl: error: no allocation of 1 GPU type(s) within their quotas, at most 2 stages holds "
                   "llama3.1-70b in GPU memory\n")
    rc, out, err = _run([*_files(tmp_path, job, prices="{A30: 1.0}", quota="{A30: 2}"), "--baselines",
                         "--placement", "best", "-o", "json"], capsys)
    assert rc == 2 and "slo_s" not in err
