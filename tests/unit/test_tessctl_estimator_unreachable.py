"""`tessctl estimate ... --estimator` that cannot reach the estimator: without --tls-dir tessctl
presents no certificate, a TLS estimator closes the connection, and gRPC says only "Socket closed";
the message says what is missing."""

from __future__ import annotations

import argparse

import pytest

from tessera.clients.estimate import EstimatorUnreachable
from tessera.clients.tessctl import _estimator_unreachable_message, main
from tests.procs import REPO

CLOSED = "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:47053: Socket closed"
HINT = "; a TLS estimator needs --tls-dir DIR (a certificate of its CA), an --insecure one --insecure"


@pytest.mark.parametrize(
    ("flags", "hint"),
    [
        ({}, True),
        ({"tls_dir": None, "insecure": False}, True),
        ({"tls_dir": "/etc/tessera/tls/me"}, False),  # a certificate was presented: the cause is elsewhere
        ({"insecure": True}, False),
    ],
)
def test_the_hint_is_given_only_without_tls_dir_or_insecure(flags: dict[str, object], hint: bool) -> None:
    exc = EstimatorUnreachable("127.0.0.1:47053", CLOSED)
    want = f"cannot reach estimator at 127.0.0.1:47053 ({CLOSED})" + (HINT if hint else "")
    assert _estimator_unreachable_message(exc, argparse.Namespace(**flags)) == want


def test_tessctl_prints_it_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    job = str(REPO / "examples" / "jobs" / "medium.yaml")
    rc = main(["estimate", "memory", "-f", job, "--gpu", "a100", "--estimator", "127.0.0.1:1", "--timeout", "5"])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("tessctl: error: cannot reach estimator at 127.0.0.1:1 (") and err.count("\n") == 1
    assert err.rstrip("\n").endswith(HINT)
