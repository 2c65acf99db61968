"""`tessctl plan-cost` as a live audit found it (clients/plancost.py, common/objective.py): `--slo`
giving the SLO of a cost job file that has none, prices needed only for the types the job may use,
the price per hour in plain decimals, and an unknown type's list of known types whole."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from tessera.clients import tessctl
from tessera.clients.plancost import per_hour_text
from tessera.common.gpus import CATALOG
from tessera.common.objective import PricesError, parse_prices

JOB = """\
name: plan-me
model: {hidden_size: 128, num_layers: 6, num_heads: 4, vocab_size: 4096, seq_length: 128}
global_batch_size: 16
iterations: 30
"""


def _run(tmp_path: Path, job: str, prices: str, quota: str, *extra: str) -> tuple[int, str, str]:
    (tmp_path / "job.yaml").write_text(job)
    (tmp_path / "prices.yaml").write_text(prices + "\n")
    (tmp_path / "quota.yaml").write_text(quota + "\n")
    out, err = io.StringIO(), io.StringIO()
    argv = ["plan-cost", "-f", str(tmp_path / "job.yaml"), "--prices", str(tmp_path / "prices.yaml"),
            "--quota", str(tmp_path / "quota.yaml"), "--max-stages", "2", *extra]
    with contextlib.redirect_stderr(err):
        rc = tessctl.main(argv, out=out)
    return rc, out.getvalue(), err.getvalue()


def test_slo_gives_the_slo_of_a_cost_job_file_without_one(tmp_path: Path) -> None:
    # It was refused by submit's check ("the cost objective needs exactly one of ...") before --slo was read.
    rc, out, err = _run(tmp_path, JOB + "objective: cost\n", "{A10: 1.0}", "{A10: 2}", "--slo", "400d")
    assert rc == 0, err
    assert "30 iterations within 34560000 s" in out
    # Without --slo the file is refused as submit refuses it, at its line.
    rc, _, err = _run(tmp_path, JOB + "objective: cost\n", "{A10: 1.0}", "{A10: 2}")
    assert rc == 2 and err == (f"tessctl: error: {tmp_path / 'job.yaml'} line 1: field slo: the cost objective needs "
                               "exactly one of iterations_within and deadline > 0\n")
    # The file's own SLO is still checked as submit checks it, --slo then overriding it.
    rc, _, err = _run(tmp_path, JOB + "objective: cost\nslo: {iterations_within: soon}\n", "{A10: 1.0}", "{A10: 2}",
                      "--slo", "1h")
    assert rc == 2 and "field slo.iterations_within: must be a duration" in err
    rc, out, err = _run(tmp_path, JOB + "objective: cost\nslo: {iterations_within: 1s}\n", "{A10: 1.0}", "{A10: 2}",
                        "--slo", "1h")
    assert rc == 0 and "30 iterations within 3600 s" in out, err
    # An SLO without the cost objective is the file's mistake, --slo or not; no SLO and no objective is fine.
    rc, _, err = _run(tmp_path, JOB + "slo: {iterations_within: 1h}\n", "{A10: 1.0}", "{A10: 2}", "--slo", "1h")
    assert rc == 2 and "field slo: only the cost objective reads an SLO" in err
    rc, _, err = _run(tmp_path, JOB, "{A10: 1.0}", "{A10: 2}", "--slo", "1h")
    assert rc == 0, err
    # A bad --slo is named as the flag.
    rc, _, err = _run(tmp_path, JOB + "objective: cost\n", "{A10: 1.0}", "{A10: 2}", "--slo", "4000d")
    assert rc == 2 and err == "tessctl: error: --slo: must be at most 10 years, got '4000d'\n"


def test_only_the_types_the_job_may_use_need_a_price(tmp_path: Path) -> None:
    job = JOB + "objective: cost\nslo: {iterations_within: 1h}\ngpu_types: [A40]\n"
    rc, out, err = _run(tmp_path, job, "{A40: 2.0}", "{A40: 2, H100: 4}")
    assert rc == 0, err  # was: "prices: no price for H100-80GB (the quota file offers it)"
    assert "A40-48GB" in out and "H100" not in out
    # A job that may use every type still needs every quota type priced.
    rc, _, err = _run(tmp_path, JOB + "objective: cost\nslo: {iterations_within: 1h}\n", "{A40: 2.0}",
                      "{A40: 2, H100: 4}")
    assert rc == 2 and "prices: no price for H100-80GB (the quota file offers it)" in err


def test_the_price_per_hour_is_plain_decimals(tmp_path: Path) -> None:
    rc, out, err = _run(tmp_path, JOB + "objective: cost\nslo: {iterations_within: 1h}\n", "{A10: 1000000}",
                        "{A10: 1}")
    assert rc == 0, err
    assert "(1 GPU, 1,000,000 per hour: " in out and "e+06" not in out  # was "1e+06 per hour"
    assert [per_hour_text(x) for x in (4e6, 1e6, 2.5, 1.0, 0.1 + 0.2, 1e-6, 1234567.891)] == [
        "4,000,000", "1,000,000", "2.5", "1", "0.3", "0.000001", "1,234,567.891"]


def test_an_unknown_type_in_a_prices_file_lists_every_known_type() -> None:
    with pytest.raises(PricesError) as e:
        parse_prices({"A41": 1.0})
    # It was cut at 200 characters, mid-name, dropping the names users type (T4, V100).
    assert "did you mean 'A40-48GB'?" in str(e.value)
    assert str(e.value).endswith(", ".join(sorted(CATALOG)))
