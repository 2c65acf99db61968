"""`tessctl plan-cost`: the cheapest GPU mix for a job file, prices and quotas, without a cluster."""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path

import pytest

from tessera.clients import tessctl

JOB = """\
name: plan-me
model: {hidden_size: 1024, num_layers: 8, num_heads: 16, vocab_size: 32000, seq_length: 1024}
global_batch_size: 16
iterations: 50
objective: cost
slo: {iterations_within: %s}
"""


def _files(tmp_path: Path, slo: str = "1h", prices: str = "{A6000: 6, A30: 4, RTX3090: 2.5, A4000: 2}",
           quota: str = '{"A6000": 2, "A30": 2, "RTX3090": 2, "A4000": 2}') -> list[str]:
    (tmp_path / "job.yaml").write_text(JOB % slo)
    (tmp_path / "prices.yaml").write_text(prices + "\n")
    (tmp_path / "quota.json").write_text(quota + "\n")
    return ["plan-cost", "-f", str(tmp_path / "job.yaml"), "--prices", str(tmp_path / "prices.yaml"),
            "--quota", str(tmp_path / "quota.json"), "--max-stages", "3"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    rc = tessctl.main(argv, out=out)
    return rc, out.getvalue(), capsys.readouterr().err


def test_plan_cost_answers_allocation_layers_time_and_cost_as_json(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run([*_files(tmp_path), "-o", "json", "--baselines"], capsys)
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["iterations"] == 50 and doc["slo_s"] == 3600
    plan = doc["plans"]["espresso"]
    assert plan["feasible"] and plan["total_time_s"] <= 3600
    assert plan["total_time_s"] == pytest.approx(50 * plan["iter_time_s"])
    assert sum(plan["allocation"].values()) == plan["num_gpus"] == sum(s["dp"] for s in plan["stages"])
    prices = {"RTX-A6000-48GB": 6, "A30-24GB": 4, "RTX-3090-24GB": 2.5, "RTX-A4000-16GB": 2}
    per_hour = sum(prices[t] * n for t, n in plan["allocation"].items())
    assert plan["cost"] == pytest.approx(per_hour * plan["total_time_s"] / 3600)
    ranges = [s["layers"] for s in plan["stages"]]
    assert ranges[0][0] == 0 and ranges[-1][1] == 8 and all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert set(doc["plans"]) == {"espresso", "sia+", "whale+", "hph+"}
    sia = doc["plans"]["sia+"]  # a subset of the tree's allocations, placed the same way: never cheaper
    assert not sia["feasible"] or sia["cost"] >= plan["cost"] * (1 - 1e-9)


def test_plan_cost_table_and_slo_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run([*_files(tmp_path), "--slo", "2h"], capsys)
    assert rc == 0, err
    assert "50 iterations within 7200 s" in out and "Cost:" in out and "STAGE" in out


@pytest.mark.parametrize(("change", "words"), [
    ({"prices": "{A6000: -6, A30: 4, RTX3090: 2.5, A4000: 2}"}, "A6000: must be > 0 (price per GPU-hour), got -6"),
    ({"prices": "{A6000: 6, A30: 4}"}, "prices: no price for RTX-3090-24GB, RTX-A4000-16GB"),
    ({"prices": "{A6000: 6, A3O: 4}"}, "did you mean"),
    ({"quota": '{"A6000": 0}'}, "A6000: must be a whole number of GPUs >= 1"),
    ({"quota": "[1, 2]"}, "must be a non-empty mapping"),
    ({"slo": "soon"}, "slo.iterations_within: must be a duration"),
    ({"slo": "1s"}, "slo_s: no allocation"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          change: dict[str, str], words: str) -> None:
    rc, out, err = _run(_files(tmp_path, **change), capsys)
    assert rc == 2 and out == ""
    assert err.startswith("tessctl: error: ") and err.count("\n") == 1 and words in err, err


def test_an_slo_no_plan_meets_reports_the_best_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(_files(tmp_path, slo="1s"), capsys)
    assert rc == 2 and "the fastest takes" in err


def test_a_job_without_an_slo_is_refused_unless_given_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _files(tmp_path)
    (tmp_path / "job.yaml").write_text("\n".join(line for line in (JOB % "1h").splitlines()
                                                 if not line.startswith(("slo", "objective"))) + "\n")
    rc, _, err = _run(argv, capsys)
    assert rc == 2 and "slo: the job file has no slo" in err
    rc, _, err = _run([*argv, "--slo", "3600"], capsys)
    assert rc == 0, err


def test_quotas_over_a_given_cluster_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rental = str(Path(__file__).resolve().parents[2] / "examples" / "clusters" / "espresso-rental.yaml")
    argv = _files(tmp_path, quota='{"A6000": 2, "A30": 20}', prices="{A6000: 6, A30: 4}")
    rc, _, err = _run([*argv, "--cluster", rental], capsys)
    assert rc == 2 and "quota.A30-24GB: 20 GPUs exceed the cluster's 16" in err
    rc, out, err = _run([*_files(tmp_path, quota='{"A6000": 2, "A30": 2}', prices="{A6000: 6, A30: 4}"),
                         "--cluster", rental, "-o", "json"], capsys)
    assert rc == 0, err
    assert json.loads(out)["plans"]["espresso"]["feasible"]


@pytest.mark.parametrize(("objective", "got"), [("cheapest", "'cheapest'"), ("5", "5")])
def test_an_invalid_objective_is_refused_as_submit_refuses_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              objective: str, got: str) -> None:
    argv = _files(tmp_path)
    job = tmp_path / "job.yaml"
    job.write_text((JOB % "1h").replace("objective: cost", f"objective: {objective}"))
    rc, out, err = _run(argv, capsys)
    reason = f"field objective: must be one of default, cost, got {got}"
    assert (rc, out, err) == (2, "", f"tessctl: error: {job} line 5: {reason}\n")
    rc, _, err = _run(["submit", "--controller", "127.0.0.1:1", str(job)], capsys)
    assert rc == 1 and err == f"tessctl: error: {job} line 5: {reason}\n"  # the same words as submit
    job.write_text((JOB % "1h").replace("objective: cost", "objective: default"))
    rc, _, err = _run(argv, capsys)  # an SLO without the cost objective: refused, as submit refuses it
    assert (rc, err) == (2, (f"tessctl: error: {job} line 6: field slo: only the cost objective reads an SLO: "
                            "set objective to cost\n"))


@pytest.mark.parametrize("deadline", ["2030-01-01T00:00:00", "2030-01-01"])
def test_a_deadline_without_a_time_zone_is_named_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            deadline: str) -> None:
    argv = _files(tmp_path)
    job = tmp_path / "job.yaml"
    job.write_text((JOB % "1h").replace("{iterations_within: 1h}", f"{{deadline: {deadline}}}"))
    rc, _, err = _run(argv, capsys)
    assert rc == 2
    assert err == (f"tessctl: error: {job} line 6: field slo.deadline: needs its time zone (Z or +HH:MM), "
                   f"got '{deadline}'\n")


def test_prices_written_with_an_exponent_are_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run([*_files(tmp_path, prices='{"A6000": 6e0, "A30": 4E0, "RTX3090": 25e-1, "A4000": 2}'),
                         "-o", "json"], capsys)
    assert rc == 0, err
    assert json.loads(out)["plans"]["espresso"]["feasible"]
    rc, _, err = _run(_files(tmp_path, prices="{A6000: -6e0, A30: 4, RTX3090: 2.5, A4000: 2}"), capsys)
    assert rc == 2 and "A6000: must be > 0 (price per GPU-hour), got -6e0\n" in err  # as written


def test_a_jsonpath_that_selects_nothing_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run([*_files(tmp_path), "-o", "jsonpath={.nope}"], capsys)
    assert (rc, out) == (1, "")
    assert err == "tessctl: error: jsonpath: .nope: no field 'nope' (fields: job, model, iterations, slo_s, plans)\n"
    rc, out, err = _run([*_files(tmp_path), "-o", "jsonpath={.job}"], capsys)
    assert (rc, out) == (0, "plan-me\n"), err
