"""tessera-controller's policy flags: --critical-factor reaches the morphling policy's makespan guard
(docs/scheduler-morphling.md, "Critical jobs"), and a bad value is refused with one line naming the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.controller.core.policies.morphling import MorphlingPolicy
from tessera.controller.main import engine_config, parse_args
from tessera.controller.rounds import policy_from_config


def _args(*argv: str) -> list[str]:
    return ["--insecure", "--state-dir", "/tmp/x", "--policy", "morphling", *argv]


def test_critical_factor_reaches_the_morphling_policy() -> None:
    pol = policy_from_config(engine_config(parse_args(_args()), Path("/tmp/x/ckpt")))
    assert isinstance(pol, MorphlingPolicy) and pol.options.critical_factor == 0.85
    pol = policy_from_config(engine_config(parse_args(_args("--critical-factor", "0")), Path("/tmp/x/ckpt")))
    assert isinstance(pol, MorphlingPolicy) and pol.options.critical_factor == 0.0


@pytest.mark.parametrize("bad", ["-1", "nan", "inf"])
def test_a_bad_critical_factor_is_refused(capsys: pytest.CaptureFixture[str], bad: str) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(_args("--critical-factor", bad))
    assert exc.value.code == 2
    assert "--critical-factor must be a finite number >= 0" in capsys.readouterr().err.strip().splitlines()[-1]
