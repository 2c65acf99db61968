"""tessera-sim's answers to bad input: never a traceback. A bad flag value is a usage error (exit 2,
argparse's one line naming the flag and the range); a bad trace file or an --out that is no writable
folder is a bad input (exit 1, one line naming the file, line and field), as a bad --prices file is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.controller.sim import cli
from tessera.controller.sim.traces import PhillyOptions, TraceError, generate_philly, load_arena

ARENA_HEADER = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type\n"
ROW = "a,100,500,bert__760M,0,128,2,a40"


# ---------------------------------------------------------------------------------- flag values


@pytest.mark.parametrize(("flag", "value", "why"), [
    ("--restart-cost", "-1000", "must be a finite number >= 0, got '-1000'"),
    ("--restart-cost", "nan", "must be a finite number >= 0, got 'nan'"),
    ("--restart-cost", "inf", "must be a finite number >= 0, got 'inf'"),
    ("--min-run", "-1", "must be a finite number >= 0, got '-1'"),
    ("--min-run", "nan", "must be a finite number >= 0, got 'nan'"),
    ("--load", "nan", "must be a finite number > 0, got 'nan'"),
    ("--load", "0", "must be a finite number > 0, got '0'"),
    ("--load", "-2", "must be a finite number > 0, got '-2'"),
    ("--load", "lots", "must be a finite number > 0, got 'lots'"),
    ("--start-hour", "nan", "must be a finite number >= 0, got 'nan'"),
    ("--start-hour", "-1", "must be a finite number >= 0, got '-1'"),
    ("--hours", "-1", "must be a finite number > 0, got '-1'"),
    ("--hours", "0", "must be a finite number > 0, got '0'"),
    ("--hours", "1e400", "must be a finite number > 0, got '1e400'"),
    ("--rounds", "-5", "must be an integer >= 0, got '-5'"),
    ("--rounds", "1.5", "must be an integer >= 0, got '1.5'"),
    ("--depth", "-1", "must be an integer >= 0, got '-1'"),
])
def test_bad_flag_values_are_usage_errors(flag: str, value: str, why: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--trace", "philly", "--out", "/nonexistent/never-made", flag, value])
    assert exc.value.code == 2
    # One line, no usage block above it.
    assert capsys.readouterr().err == f"tessera-sim: error: argument {flag}: {why} (see --help)\n"


def test_an_unknown_flag_is_one_line_too(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--trace", "philly", "--out", "x", "--bogus"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == "tessera-sim: error: unrecognized arguments: --bogus (see --help)\n"


@pytest.mark.parametrize(("flag", "value", "want"), [
    ("--restart-cost", "0", 0.0), ("--restart-cost", "260", 260.0), ("--load", "0.5", 0.5),
    ("--start-hour", "0", 0.0), ("--hours", "1.5", 1.5), ("--rounds", "0", 0), ("--depth", "0", 0),
    ("--min-run", "600", 600.0),
])
def test_good_flag_values_still_parse(flag: str, value: str, want: float) -> None:
    args = cli.build_parser().parse_args(["--trace", "philly", "--out", "x", flag, value])
    assert getattr(args, flag[2:].replace("-", "_")) == want


def test_defaults_pass_their_own_checks() -> None:
    args = cli.build_parser().parse_args(["--trace", "philly", "--out", "x"])
    assert (args.rounds, args.depth, args.hours, args.start_hour, args.load, args.restart_cost) == \
        (0, 3, 24.0, 0.0, 1.0, None)


# ---------------------------------------------------------------------------------- trace files


@pytest.mark.parametrize(("body", "why"), [
    (ARENA_HEADER + ROW + ",extra,x\n",
     "line 2: 10 fields, the header has 8 (past field gpu_type: 'extra', 'x')"),
    (ARENA_HEADER + "a,100,inf,bert__760M,0,128,2,a40\n", "line 2: field num_iteration: not a finite number: 'inf'"),
    (ARENA_HEADER + "a,100,500,bert__760M,0,1e400,2,a40\n", "line 2: field batch_size: not a finite number: '1e400'"),
    (ARENA_HEADER + "a,100,500,bert__760M,0,128,-inf,a40\n", "line 2: field num_gpu: not a finite number: '-inf'"),
    # Line numbers count the file's lines, blank ones too.
    (ARENA_HEADER + "\n\n" + "a,100,x,bert__760M,0,128,2,a40\n", "line 4: field num_iteration: not a number: 'x'"),
])
def test_malformed_arena_rows_name_line_and_field(tmp_path: Path, body: str, why: str) -> None:
    p = tmp_path / "t.csv"
    p.write_text(body)
    with pytest.raises(TraceError) as exc:
        load_arena(p, {})
    assert str(exc.value) == f"{p} {why}"


def test_empty_fields_past_the_header_are_a_trailing_comma(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text(ARENA_HEADER + ROW + ",,\n")
    (job,) = load_arena(p, {})
    assert (job.id, job.iterations, job.gpus) == ("a", 500, 2)


@pytest.mark.parametrize(("data", "why"), [
    (b"\xff\xfej\x00o\x00", "line 1: not UTF-8 text (byte 0xff at offset 0); a trace is a UTF-8 CSV file"),
    # A byte-order mark is taken (utf-8-sig) and counted in the offset.
    (b"\xef\xbb\xbf" + ARENA_HEADER.encode() + b"a,1\xb5,500,bert__760M,0,128,2,a40\n",
     "line 2: not UTF-8 text (byte 0xb5 at offset 91); a trace is a UTF-8 CSV file"),
])
def test_a_trace_that_is_not_utf8_names_line_and_byte(tmp_path: Path, data: bytes, why: str) -> None:
    p = tmp_path / "t.csv"
    p.write_bytes(data)
    with pytest.raises(TraceError) as exc:
        load_arena(p, {})
    assert str(exc.value) == f"{p} {why}"


def test_a_csv_error_is_a_trace_error(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text(ARENA_HEADER + "a,100," + "9" * 200_000 + ",bert__760M,0,128,2,a40\n")  # over csv's field limit
    with pytest.raises(TraceError, match=r"line 2: not a CSV row: field larger than field limit"):
        load_arena(p, {})


def _philly(tmp_path: Path) -> Path:
    p = tmp_path / "philly.csv"
    p.write_text("timestamp,duration,num_gpus\n2017-10-03 00:00:00,3600,1\n2017-10-03 01:00:00,3600,2\n")
    return p


@pytest.mark.parametrize(("opts", "why"), [
    (PhillyOptions(load=0.0), "load: must be a finite number > 0, got 0.0"),
    (PhillyOptions(load=float("nan")), "load: must be a finite number > 0, got nan"),
    (PhillyOptions(hours=-1.0), "hours: must be a finite number > 0, got -1.0"),
    (PhillyOptions(start_hour=float("nan")), "start_hour: must be a finite number >= 0, got nan"),
])
def test_philly_generator_checks_its_options(tmp_path: Path, opts: PhillyOptions, why: str) -> None:
    with pytest.raises(TraceError) as exc:
        generate_philly(_philly(tmp_path), lambda key, t, n: 1.0, ["a40"], {}, opts)
    assert str(exc.value) == why


def test_philly_load_too_small_for_the_arrival_times(tmp_path: Path) -> None:
    p = _philly(tmp_path)
    with pytest.raises(TraceError, match=rf"load: 1e-320 puts the arrival of {p} line 3 past any time"):
        generate_philly(p, lambda key, t, n: 1.0, ["a40"], {}, PhillyOptions(load=1e-320))


# ---------------------------------------------------------------------------------- the command


def _data(tmp_path: Path) -> Path:
    """The least data folder a CSV trace needs under --oracle estimator: the artifact's model table."""
    data = tmp_path / "data"
    (data / "arena").mkdir(parents=True, exist_ok=True)
    (data / "arena" / "models.json").write_text("{}\n")
    return data


def _argv(tmp_path: Path, trace: Path, out: Path | str) -> list[str]:
    return ["--trace", str(trace), "--oracle", "estimator", "--data-dir", str(_data(tmp_path)),
            "--cluster", "crius-testbed", "--policies", "fcfs", "--rounds", "1", "--out", str(out),
            "--no-plots", "--quiet"]


def test_a_malformed_trace_is_one_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_bytes(b"\xb5\x00garbage\xff")
    assert cli.main(_argv(tmp_path, trace, tmp_path / "out")) == 1
    assert capsys.readouterr().err == (f"tessera-sim: error: {trace} line 1: not UTF-8 text (byte 0xb5 at "
                                       f"offset 0); a trace is a UTF-8 CSV file\n")


def _trace(tmp_path: Path) -> Path:
    trace = tmp_path / "t.csv"
    trace.write_text(ARENA_HEADER + ROW + "\n")
    return trace


def test_until_done_that_hits_its_round_cap_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A restart cost of 1e300 s (or a cap too low) ends an --until-done run at --rounds with jobs
    not done: a warning, not a table that reads as a finished run."""
    argv = _argv(tmp_path, _trace(tmp_path), tmp_path / "out")
    assert cli.main([*argv, "--until-done", "--restart-cost", "1e300"]) == 0
    assert capsys.readouterr().err == ("warning: fcfs: the run stopped at its round cap (1 rounds) with 1 jobs "
                                       "not done; raise --rounds or check the restart cost and the trace\n")
    assert cli.main(argv) == 0  # exactly --rounds 1 without --until-done: asked for, no warning
    assert capsys.readouterr().err == ""


def test_out_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "file"
    f.write_text("")
    assert cli.main(_argv(tmp_path, _trace(tmp_path), f)) == 1
    assert capsys.readouterr().err == f"tessera-sim: error: --out: {f}: not a folder\n"
    assert cli.main(_argv(tmp_path, _trace(tmp_path), f / "sub")) == 1
    assert capsys.readouterr().err == f"tessera-sim: error: --out: {f / 'sub'}: cannot make the folder: Not a directory\n"


def test_out_under_proc_cannot_be_made() -> None:
    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc")
    with pytest.raises(cli.SimInputError, match=r"^--out: /proc/tessera-sim-x: cannot make the folder: "):
        cli.output_folder("/proc/tessera-sim-x")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into any folder")
def test_out_not_writable(tmp_path: Path) -> None:
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        with pytest.raises(cli.SimInputError, match=r"^--out: .*/ro: folder not writable$"):
            cli.output_folder(str(d))
    finally:
        d.chmod(0o700)


def test_out_failing_after_the_run_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: object, **kwargs: object) -> list[str]:
        raise OSError(28, "No space left on device", str(tmp_path / "out" / "metrics.json"))

    monkeypatch.setattr(cli, "write_outputs", full)
    assert cli.main(_argv(tmp_path, _trace(tmp_path), tmp_path / "out")) == 1
    assert capsys.readouterr().err == (f"tessera-sim: error: --out: cannot write {tmp_path / 'out' / 'metrics.json'}: "
                                       f"No space left on device\n")


def test_a_good_run_still_writes_its_outputs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert cli.main(_argv(tmp_path, _trace(tmp_path), out)) == 0
    assert {p.name for p in out.iterdir()} >= {"metrics.json", "timing.json", "summary.csv", "fcfs"}
    assert {p.name for p in (out / "fcfs").iterdir()} == {"rounds.csv", "jobs.csv"}


def test_the_command_never_prints_a_traceback(tmp_path: Path) -> None:
    """The installed entry point, as the audit ran it: a bad flag (2) and a bad trace (1)."""
    trace = tmp_path / "t.csv"
    trace.write_text(ARENA_HEADER + ROW + ",extra\n")
    code = "import sys; from tessera.controller.sim.cli import main; sys.exit(main(sys.argv[1:]))"
    bad_flag = "tessera-sim: error: argument --load: must be a finite number > 0, got 'nan' (see --help)"
    bad_row = f"tessera-sim: error: {trace} line 2: 9 fields, the header has 8 (past field gpu_type: 'extra')"
    for extra, rc, last in ((["--load", "nan"], 2, bad_flag), ([], 1, bad_row)):
        p = subprocess.run([sys.executable, "-c", code, *_argv(tmp_path, trace, tmp_path / "out"), *extra],
                           capture_output=True, text=True, check=False, timeout=120)
        assert (p.returncode, p.stderr.strip().splitlines()[-1]) == (rc, last)
        assert "Traceback" not in p.stderr and p.stdout == ""
