"""tessera-controller's --log-level takes the names the agent and the estimator take, and refuses
another (a typo such as `warnin` was taken as info, silently) with a usage error naming the flag."""

from __future__ import annotations

import argparse

import pytest

from tessera.controller.main import parse_args
from tessera.nodeagent.main import build_parser


def _choices(p: argparse.ArgumentParser, flag: str) -> tuple[str, ...]:
    (action,) = [a for a in p._actions if flag in a.option_strings]
    return tuple(action.choices or ())


def _args(*argv: str) -> list[str]:
    return ["--insecure", "--state-dir", "/tmp/x", *argv]


@pytest.mark.parametrize("level", ["debug", "info", "warning", "error"])
def test_every_level_the_agent_takes_is_taken(level: str) -> None:
    assert level in _choices(build_parser(), "--log-level")
    assert parse_args(_args("--log-level", level)).log_level == level


@pytest.mark.parametrize("bad", ["warnin", "loud", "INFO", ""])
def test_an_unknown_level_is_refused(capsys: pytest.CaptureFixture[str], bad: str) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(_args("--log-level", bad))
    assert exc.value.code == 2
    assert f"--log-level: invalid choice: {bad!r}" in capsys.readouterr().err.strip().splitlines()[-1]


def test_the_default_is_info_and_help_lists_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args(_args()).log_level == "info"
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    assert "--log-level {debug,info,warning,error}" in capsys.readouterr().out
