"""The cost objective's inputs: job files' `objective`/`slo`, SubmitJob's bounds and precondition, the
controller's --prices file, the SLO as seconds left, and the trainer's per-stage layer ranges."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tessera.clients.jobfile import JobFileError, parse_job_yaml
from tessera.clients.output_objective import slo_text
from tessera.clients.trainer.plan import Plan
from tessera.clients.trainer.reference.config import Unsupported, stage_ranges
from tessera.common.errors import FailedPrecondition, InvalidInput
from tessera.common.jobspec import spec_errors
from tessera.common.objective import (
    PricesError,
    cost_precondition,
    load_prices,
    parse_duration,
    parse_prices,
    slo_seconds,
)
from tessera.controller.snapshots import job_view
from tessera.controller.store import JobRecord
from tessera.v1 import common_pb2 as P

BASE = "name: j\nmodel: gpt2-small\nglobal_batch_size: 8\niterations: 100\n"


def test_job_file_objective_and_slo() -> None:
    spec = parse_job_yaml(BASE + "objective: cost\nslo: {iterations_within: 6h}\n")
    assert spec.objective == P.OBJECTIVE_COST and spec.slo.iterations_within_seconds == 6 * 3600
    spec = parse_job_yaml(BASE + "objective: cost\nslo: {deadline: 2026-11-27T06:00:00Z}\n")
    assert spec.slo.deadline == 1795759200.0
    spec = parse_job_yaml(BASE + "objective: cost\nslo: {deadline: '2026-11-27T07:00:00+01:00'}\n")
    assert spec.slo.deadline == 1795759200.0
    assert parse_duration("90m", "x") == 5400 and parse_duration("1.5d", "x") == 129600 and parse_duration(45, "x") == 45


@pytest.mark.parametrize(("extra", "field", "why"), [
    ("objective: cost\nslo: {iterations_within: 0s}\n", "slo.iterations_within", "must be > 0"),
    ("objective: cost\nslo: {iterations_within: -5}\n", "slo.iterations_within", "must be > 0"),
    ("objective: cost\nslo: {iterations_within: soon}\n", "slo.iterations_within", "duration"),
    ("objective: cost\nslo: {deadline: tomorrow}\n", "slo.deadline", "RFC 3339"),
    ("objective: cost\nslo: {deadline: '2026-11-27T06:00:00'}\n", "slo.deadline", "time zone"),
    ("objective: cost\nslo: {iterations_within: 1h, deadline: 2026-11-27T06:00:00Z}\n", "slo", "exactly one"),
    ("objective: cost\nslo: {within: 1h}\n", "slo.within", "unknown field"),
    ("objective: cost\n", "slo", "needs exactly one"),
    ("slo: {iterations_within: 1h}\n", "slo", "only the cost objective"),
    ("objective: cheapest\n", "objective", "must be one of default, cost"),
    ("objective: cost\nslo: {iterations_within: 1h}\npriority: guaranteed\nguarantee: {gpus: 2}\n",
     "priority", "the cost objective is best-effort"),
])
def test_job_file_bad_objective_or_slo_names_the_field(extra: str, field: str, why: str) -> None:
    with pytest.raises(JobFileError) as e:
        parse_job_yaml(BASE + extra)
    assert e.value.field == field and why in str(e.value)


def test_submit_bounds_and_precondition() -> None:
    spec = parse_job_yaml(BASE + "objective: cost\nslo: {iterations_within: 1h}\n")
    assert spec_errors(spec) == []
    spec.slo.iterations_within_seconds = -1.0
    within = "must be a finite number of seconds from 0 (none) to 10 years (315360000), got"
    assert spec_errors(spec) == [("slo.iterations_within_seconds", f"{within} -1.0")]
    for bad in (float("inf"), float("nan"), 4e8):  # inf read "must be > 0, got inf"
        spec.slo.iterations_within_seconds = bad
        assert spec_errors(spec) == [("slo.iterations_within_seconds", f"{within} {bad}")]
    spec.slo.iterations_within_seconds = 0.0
    spec.slo.deadline = float("inf")
    assert spec_errors(spec) == [("slo.deadline", ("must be a Unix time from 0 (none) to 2100-01-01T00:00:00Z "
                                                   "(4102444800), got inf"))]
    spec.slo.deadline = 0.0
    spec.slo.iterations_within_seconds = 3600.0
    with pytest.raises(FailedPrecondition, match="--prices"):
        cost_precondition(spec, ())
    cost_precondition(spec, (("A100-80GB", 4.0),))
    spec.hint.gpu_types.append("A10-24GB")
    with pytest.raises(FailedPrecondition, match="no price for A10-24GB"):
        cost_precondition(spec, (("A100-80GB", 4.0),))
    cost_precondition(P.JobSpec(name="plain"), ())  # other objectives need no prices


def test_prices_file(tmp_path: Path) -> None:
    assert parse_prices({"a100": 4, "A10-24GB": 1.01}) == {"A10-24GB": 1.01, "A100-80GB": 4.0}
    for doc, field, why in (({"A100-80GB": -1.0}, "A100-80GB", "must be > 0"),
                            ({"A100-80GB": "cheap"}, "A100-80GB", "must be a number"),
                            ({"Z9000": 1.0}, "Z9000", "unknown GPU"),
                            ({"a100": 1.0, "A100-80GB": 2.0}, "A100-80GB", "priced twice"),
                            ({}, "", "non-empty mapping")):
        with pytest.raises(PricesError) as e:
            parse_prices(doc)
        assert e.value.field == field and why.lower() in str(e.value).lower()
    f = tmp_path / "prices.yaml"
    f.write_text("A10-24GB: 1.0\nA100-80GB: -3\n")
    with pytest.raises(InvalidInput, match=r"prices.yaml line 2: field A100-80GB: must be > 0"):
        load_prices(f)
    with pytest.raises(InvalidInput, match="missing.yaml"):
        load_prices(tmp_path / "missing.yaml")
    # A key YAML reads as null named the GPU model 'None' ("field None: unknown GPU model").
    f.write_text("A10-24GB: 1.0\n~: 2\n")
    with pytest.raises(InvalidInput, match=r"prices.yaml line 2: a GPU type name must be a string, got null"):
        load_prices(f)


def test_slo_seconds_left() -> None:
    spec = P.JobSpec(iterations=100, objective=P.OBJECTIVE_COST, slo=P.Slo(iterations_within_seconds=600))
    assert slo_seconds(spec, 0, 0) == 600 and slo_seconds(spec, 50, 0) == 300
    spec = P.JobSpec(iterations=100, objective=P.OBJECTIVE_COST, slo=P.Slo(deadline=1000))
    assert slo_seconds(spec, 0, 400) == 600 and slo_seconds(spec, 0, 1000) == -1.0
    assert slo_seconds(P.JobSpec(iterations=10), 0, 0) == 0.0


def test_a_requeued_job_counts_from_its_checkpoint() -> None:
    """controller/snapshots.py job_view: a waiting job's next attempt resumes from its last
    checkpoint, so its iterations left and its SLO's share count from there, not from the last
    report (an audit's requeued job was planned for 100 iterations where 500 were left)."""
    spec = P.JobSpec(name="c", model=P.ModelSpec(hidden_size=128, num_layers=6, num_heads=4, vocab_size=4096,
                                                 seq_length=128), global_batch_size=16, iterations=1000,
                     objective=P.OBJECTIVE_COST, slo=P.Slo(iterations_within_seconds=1000))
    prog = P.Progress(iteration=900, checkpoint_iteration=500)
    running = JobRecord("j-1", "r", spec, P.JOB_STATE_RUNNING, "", 0.0, attempt=1, progress=prog)
    view = job_view(running, None)
    assert (view.done_iterations, view.slo_s) == (900.0, 100.0)
    view = job_view(dataclasses.replace(running, state=P.JOB_STATE_PENDING, attempt=2), None)
    assert (view.done_iterations, view.remaining_iterations, view.slo_s) == (500.0, 500.0, 500.0)
    never = dataclasses.replace(running, state=P.JOB_STATE_PENDING, progress=P.Progress(iteration=900, checkpoint_iteration=-1))
    assert job_view(never, None).done_iterations == 0.0


def test_trainer_takes_each_stage_layer_range() -> None:
    plan = Plan.from_dict({"dp": 1, "pp": 2, "stages": [{"layer_start": 0, "layer_end": 5, "gpu_model": "A10-24GB"},
                                                        {"layer_start": 5, "layer_end": 6}]})
    assert stage_ranges(plan, 6) == [(0, 5, "A10-24GB"), (5, 6, "")]
    assert stage_ranges(Plan.from_dict({"pp": 2}), 6) == []
    for stages, why in (([{"layer_start": 0, "layer_end": 6}], "1 stages for pp=2"),
                        ([{"layer_start": 0, "layer_end": 3}, {"layer_start": 4, "layer_end": 6}], "follow on"),
                        ([{"layer_start": 0, "layer_end": 3}, {"layer_start": 3, "layer_end": 3}], "follow on"),
                        ([{"layer_start": 0, "layer_end": 2}, {"layer_start": 2, "layer_end": 5}], "cover layers 0-4"),
                        ("0-3", "must be a list")):
        with pytest.raises(Unsupported, match=why):
            stage_ranges(Plan.from_dict({"pp": 2, "stages": stages}), 6)


def test_controller_refuses_a_bad_prices_file_at_startup(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tessera.controller.main import parse_args

    f = tmp_path / "prices.yaml"
    f.write_text("A10-24GB: 1.0\nA40-48GB: -2\n")
    with pytest.raises(SystemExit):
        parse_args(["--state-dir", str(tmp_path), "--insecure", "--prices", str(f)])
    assert "--prices: " in (err := capsys.readouterr().err) and "line 2: field A40-48GB: must be > 0" in err
    f.write_text("A10-24GB: 1.0\n")
    assert parse_args(["--state-dir", str(tmp_path), "--insecure", "--prices", str(f)]).price_table == (("A10-24GB", 1.0),)


def test_iterations_within_needs_the_jobs_iterations() -> None:
    """A job running its own program may leave iterations unset; with `iterations_within` its SLO
    then meant nothing, and it was accepted and waited forever, its reason saying it had no SLO."""
    spec = parse_job_yaml(BASE + "objective: cost\nslo: {iterations_within: 1h}\n")
    spec.iterations = 0
    spec.entrypoint.append("/usr/bin/train")  # its own program: iterations may be left unset
    assert spec_errors(spec) == [("iterations", ("an SLO of iterations_within is the time for the job's "
                                                 "iterations: give iterations > 0, or a deadline"))]
    spec.ClearField("slo")
    spec.slo.deadline = 2e9
    assert spec_errors(spec) == []


def test_a_deadline_past_2100_is_refused_and_describe_survives_an_old_one() -> None:
    """1e308 was stored (finite, > 0) and `describe job` then failed with OverflowError."""
    spec = parse_job_yaml(BASE + "objective: cost\nslo: {deadline: 2099-12-31T23:59:59Z}\n")
    assert spec_errors(spec) == []
    spec.slo.deadline = 1e308
    assert spec_errors(spec) == [("slo.deadline", ("must be a Unix time from 0 (none) to 2100-01-01T00:00:00Z "
                                                  "(4102444800), got 1e+308"))]
    # One stored before the bound still describes.
    assert slo_text(spec) == "done by unix time 1e+308"
