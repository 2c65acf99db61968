"""tessera-sim's busy-round average under every rule set, its labels, the warning of a window with no
arrivals, and the names among the flag values (docs/simulator.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.controller.sim import cli
from tessera.controller.sim.engine import RoundRecord, SimResult
from tessera.controller.sim.metrics import busy_rounds_are, compare, summarize

ARENA_HEADER = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type\n"


def _round(i: int, thr: float, pending: int) -> RoundRecord:
    return RoundRecord(i, 60.0 * i, thr, 1, pending, 8, 0, 0, 0, 0, 0)


def _result(rules: str, rounds: list[RoundRecord], policy: str = "crius") -> SimResult:
    return SimResult(policy, "paper", rules, "t", "c", [], rounds)


# Iterations/s as the morphling rules count them: never above 100.
MORPHLING_ROUNDS = [_round(0, 0.0, 3), _round(1, 12.0, 2), _round(2, 18.0, 1), _round(3, 9.0, 0), _round(4, 0.0, 0)]


def test_the_busy_average_means_something_under_the_morphling_rules() -> None:
    """Before: the rounds above 100 samples/s, of which there are none in iterations/s: 0.0."""
    s = summarize(_result("morphling", MORPHLING_ROUNDS))
    assert (s["throughput_avg_busy"], s["busy_rounds"]) == (10.0, 3)  # the rounds that left a job waiting
    assert s["throughput_avg"] == 7.8


def test_the_arena_and_fair_rules_keep_the_artifacts_cut() -> None:
    rounds = [_round(0, 50.0, 5), _round(1, 300.0, 0), _round(2, 100.0, 3), _round(3, 500.0, 0)]
    for rules in ("arena", "fair"):
        s = summarize(_result(rules, rounds))
        assert (s["throughput_avg_busy"], s["busy_rounds"]) == (400.0, 2)  # above 100 samples/s, waiting or not
    assert busy_rounds_are("arena") == busy_rounds_are("fair") == "throughput > 100 samples/s"
    assert busy_rounds_are("morphling") == "a job left waiting"


def test_the_table_says_what_busy_rounds_are() -> None:
    results = {"crius": _result("morphling", MORPHLING_ROUNDS),
               "morphling": _result("morphling", [_round(0, 20.0, 1), _round(1, 5.0, 0)], "morphling")}
    doc = {"policies": {k: summarize(v) for k, v in results.items()}, "comparison": compare(results, "crius"),
           "busy_rounds_are": busy_rounds_are("morphling")}
    text = cli.table(doc)
    assert "rounds > 100" not in text
    assert "throughput 0.62x (all rounds), 0.50x (busy rounds)" in text
    assert text.splitlines()[-1] == "thr busy: the average over busy rounds (a job left waiting)"


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    (data / "arena").mkdir(parents=True, exist_ok=True)
    (data / "arena" / "models.json").write_text("{}\n")
    return data


def test_a_run_without_arrivals_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "empty.csv"
    trace.write_text(ARENA_HEADER)
    argv = ["--trace", str(trace), "--oracle", "estimator", "--data-dir", str(_data(tmp_path)), "--cluster",
            "crius-testbed", "--policies", "fcfs", "--rounds", "1", "--out", str(tmp_path / "out"), "--no-plots"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err == (f"warning: the simulated window has no arrivals: every figure below is 0 (the trace "
                            f"{trace} has no jobs)\n")
    assert "0/0" in captured.out


def test_the_philly_warning_names_the_window() -> None:
    args = cli.build_parser().parse_args(["--trace", "philly", "--hours", "2", "--out", "x"])
    empty = {"crius": {"jobs_submitted": 0}, "fcfs": {"jobs_submitted": 0}}
    assert cli.no_arrivals_warning(args, 0, empty) == (
        "warning: the simulated window has no arrivals: every figure below is 0 (philly from hour 0 for 2 h at "
        "load 1 gave 0 jobs; try more --hours or another --start-hour)")
    assert cli.no_arrivals_warning(args, 3, {"crius": {"jobs_submitted": 3}}) == ""


@pytest.mark.parametrize(("flag", "value", "why"), [
    ("--trace", "nope", ("unknown trace 'nope': use one of arena-philly, arena-venus, arena-pai, philly, "
                        "morphling-base, morphling-bp, morphling-mt or a CSV file")),
    ("--cluster", "nope", ("unknown cluster 'nope': use a file or one of crius-1280, crius-testbed, frenzy-mixed, "
                          "frenzy-testbed, morphling-64")),
    ("--policies", "crius,nope", ("unknown policy 'nope': use one of crius, crius-ddl, crius-na, crius-nh, "
                                 "crius-no, elasticflow, elasticflow-l, fcfs, frenzy, gandiva, gavel, morphling, sia")),
    ("--policies", "gavel@bogus", "unknown mode 'bogus': use one of paper, artifact"),
    ("--policies", " , ", "no policy given"),
    ("--rules", "nope", "unknown rules 'nope': use one of arena, fair, morphling"),
])
def test_an_unknown_name_is_a_usage_error(flag: str, value: str, why: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Before: exit 1, after loading the inputs (the docs say 2 for a bad flag value)."""
    argv = ["--out", "/nonexistent/never-made", flag, value]
    if flag != "--trace":
        argv += ["--trace", "philly"]
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err == f"tessera-sim: error: argument {flag}: {why} (see --help)\n"


def test_good_names_still_parse(tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    args = cli.build_parser().parse_args(["--trace", str(csv), "--cluster", "mine.json", "--policies",
                                          "crius@artifact,gavel", "--rules", "morphling", "--out", "x"])
    assert (args.trace, args.cluster, args.policies, args.rules) == (str(csv), "mine.json", "crius@artifact,gavel",
                                                                     "morphling")
    assert cli.build_parser().parse_args(["--trace", "helios", "--out", "x"]).rules == ""


def test_the_usage_shows_the_rules_readably() -> None:
    parser = cli.build_parser()
    assert "[--rules {arena,fair,morphling}]" in parser.format_usage()
    assert "{,arena" not in parser.format_help()
    assert "default: by trace" in parser.format_help()
