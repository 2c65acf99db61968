"""tessctl refuses what it cannot use with one line and the documented exit status (docs/cli.md):
infinite or huge numbers at parse time (exit 2, naming the range), files that are not YAML (a
control character) like any other bad file, addresses without a port, a --dir that is a file."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from tessera.clients import argtypes, tessctl

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "examples" / "jobs" / "tiny.yaml")
NO_CONTROLLER = ["--controller", "127.0.0.1:1"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    try:
        rc = tessctl.main(argv, out=out)
    except SystemExit as exc:  # argparse's usage errors
        rc = int(exc.code or 0)
    return rc, out.getvalue(), capsys.readouterr().err


# -- numbers: refused at parse time, exit 2, with the range -------------------------------------------

TIMEOUT_RANGE = "must be > 0 and at most 100,000,000 seconds (about 3 years; or a duration such as 10m, 2d)"


@pytest.mark.parametrize("value", ["inf", "1e12", "nan", "-1", "0", "Infinity"])
def test_a_timeout_past_a_grpc_deadline_is_a_usage_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(["--timeout", value, "get", "jobs", *NO_CONTROLLER], capsys)
    assert (rc, out) == (2, "")
    assert err == f"tessctl: error: argument --timeout: {TIMEOUT_RANGE}: '{value}' (see 'tessctl --help')\n"


def test_wait_refuses_an_infinite_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(["wait", "j-1", "--timeout", "inf", *NO_CONTROLLER], capsys)
    assert rc == 2
    assert err == f"tessctl: error: argument --timeout: {TIMEOUT_RANGE}: 'inf' (see 'tessctl wait --help')\n"
    rc, _, err = _run(["wait", "j-1", "--timeout", "2000d", *NO_CONTROLLER], capsys)
    assert rc == 2 and "argument --timeout: longer than 100,000,000 seconds: '2000d'" in err


def test_timeouts_within_the_range_are_taken() -> None:
    assert argtypes.seconds("1e8") == 1e8
    assert argtypes.seconds("2.5") == 2.5
    assert argtypes.seconds("10m") == 600
    assert argtypes.seconds("1h30m") == 5400


@pytest.mark.parametrize("action", [["init"], ["issue", "--controller"]])
def test_pki_days_are_bounded(action: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pki = str(tmp_path / "pki")
    rc, _, err = _run(["admin", "pki", *action, "--dir", pki, "--days", "100000000"], capsys)
    assert rc == 2
    assert err == (f"tessctl: error: argument --days: must be from 1 to 36,500 days: '100000000' "
                   f"(see 'tessctl admin pki {action[0]} --help')\n")
    assert not (tmp_path / "pki").exists()
    assert argtypes.days("36500") == 36500


def test_pki_at_the_most_days(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pki = str(tmp_path / "pki")
    assert _run(["admin", "pki", "init", "--dir", pki, "--days", "36500"], capsys)[0] == 0
    # A CA made a moment before ends a moment before 36,500 days from now: the most that fits is one less.
    rc, _, err = _run(["admin", "pki", "issue", "--dir", pki, "--controller", "--days", "36500"], capsys)
    assert rc == 1 and "--days 36499 at most" in err
    rc, _, err = _run(["admin", "pki", "issue", "--dir", pki, "--controller", "--days", "36499"], capsys)
    assert rc == 0, err


@pytest.mark.parametrize("argv", [
    ["estimate", "memory", "-f", TINY, "--gpu", "a100", "--gpus", "100000000000"],
    ["estimate", "time", "-f", TINY, "--gpu", "a100", "--gpus", "100000000000"],
    ["logs", "j-1", "--tail", "100000000000", *NO_CONTROLLER],
])
def test_counts_past_int32_are_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(argv, capsys)
    assert rc == 2
    assert "must be from 1 to 2,147,483,647: '100000000000'" in err or \
        "must be from 0 to 2,147,483,647: '100000000000'" in err, err
    assert "internal error" not in err and err.count("\n") == 1


def test_a_plan_size_past_int32_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(["estimate", "memory", "-f", TINY, "--gpu", "a100", "--plan", "dp=100000000000"], capsys)
    assert rc == 2
    assert err == ("tessctl: error: argument --plan: plan.dp: must be an integer from 1 to 2,147,483,647, "
                   "got 100000000000 (see 'tessctl estimate memory --help')\n")


# -- files and addresses -------------------------------------------------------------------------------


CONTROL = b"name: x\x03\n"
CONTROL_WHY = "line 1: not valid YAML or JSON: character U+0003 at column 8 is not allowed (a control character)"


def test_a_control_character_is_a_bad_file_for_every_reader(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "ctrl.yaml"
    bad.write_bytes(CONTROL)
    rc, _, err = _run(["submit", *NO_CONTROLLER, str(bad)], capsys)
    assert (rc, err) == (1, f"tessctl: error: {bad} {CONTROL_WHY}\n")
    rc, _, err = _run(["estimate", "cells", "-f", TINY, "--cluster", str(bad)], capsys)
    assert (rc, err) == (1, f"tessctl: error: {bad} {CONTROL_WHY}\n")
    quota = tmp_path / "quota.yaml"
    quota.write_text("A10-24GB: 1\n")
    rc, _, err = _run(["plan-cost", "-f", str(REPO / "examples" / "cost" / "job.yaml"), "--prices", str(bad),
                       "--quota", str(quota)], capsys)
    assert (rc, err) == (2, f"tessctl: error: {bad} {CONTROL_WHY}\n")  # plan-cost's errors: exit 2
    monkeypatch.setattr("sys.stdin", io.StringIO(CONTROL.decode()))
    rc, _, err = _run(["estimate", "memory", "-f", "-", "--gpu", "a100"], capsys)
    assert (rc, err) == (1, f"tessctl: error: <stdin> {CONTROL_WHY}\n")
    monkeypatch.setenv("TESSERA_CONFIG", str(bad))
    rc, _, err = _run(["get", "jobs"], capsys)
    assert (rc, err) == (1, f"tessctl: error: {bad} {CONTROL_WHY}\n")


def test_a_cluster_price_with_an_exponent_is_a_number(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n  - {gpu: A10-24GB, nodes: 1, gpus_per_node: 2, price_per_hour: 1e3}\n")
    rc, out, err = _run(["estimate", "cells", "-f", TINY, "--cluster", str(pools), "--best"], capsys)
    assert rc == 0, err
    assert "A10-24GB" in out and "1000" in out


def test_an_estimator_without_a_port_is_refused_as_a_controller_is(capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    rc, _, err = _run(["estimate", "memory", "-f", TINY, "--gpu", "a100", "--estimator", "localhost",
                       "--insecure"], capsys)
    assert (rc, err) == (2, ("tessctl: error: argument --estimator: 'localhost' has no port: expected host:port, "
                            "e.g. localhost:50053 (see 'tessctl estimate memory --help')\n"))
    rc, _, err = _run(["get", "jobs", "--controller", "localhost"], capsys)
    assert (rc, err) == (2, ("tessctl: error: argument --controller: 'localhost' has no port: expected host:port, "
                            "e.g. localhost:50051 (see 'tessctl get jobs --help')\n"))
    monkeypatch.setenv("TESSERA_CONTROLLER", "localhost")  # not a flag: a setting, exit 1
    rc, _, err = _run(["get", "jobs"], capsys)
    assert (rc, err) == (1, ("tessctl: error: env TESSERA_CONTROLLER: 'localhost' has no port: expected host:port, "
                            "e.g. localhost:50051\n"))


def test_a_pki_dir_that_is_a_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "f.yaml"
    file.write_text("")
    rc, _, err = _run(["admin", "pki", "init", "--dir", str(file)], capsys)
    assert (rc, err) == (1, f"tessctl: error: --dir: {file} exists and is not a directory\n")
    rc, _, err = _run(["admin", "pki", "init", "--dir", str(file / "sub")], capsys)
    assert (rc, err) == (1, f"tessctl: error: --dir: {file / 'sub'}: {file} exists and is not a directory\n")
    rc, _, err = _run(["admin", "pki", "issue", "--dir", str(file), "--controller"], capsys)
    assert (rc, err) == (1, f"tessctl: error: --dir: {file} exists and is not a directory\n")
    pki = tmp_path / "pki"
    assert _run(["admin", "pki", "init", "--dir", str(pki)], capsys)[0] == 0
    rc, _, err = _run(["admin", "pki", "issue", "--dir", str(pki), "--controller", "--out", str(file)], capsys)
    assert (rc, err) == (1, f"tessctl: error: --out: {file} exists and is not a directory\n")
    assert sorted(os.listdir(pki)) == ["ca.key", "ca.pem"]
