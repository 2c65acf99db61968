"""tessera-controller's --listen, --agent-listen and --metrics-listen: host:port is checked first
(common/rpc.py `check_listen`, tested in test_rpc_check_listen.py), with the wording clients get for
the addresses they dial, before the loopback test or the agent port derived from --listen read the host."""

from __future__ import annotations

import pytest

from tessera.controller.main import parse_args

BASE = ["--insecure", "--state-dir", "/tmp/x"]


def _err(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_args([*BASE, *argv])
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_a_listen_without_port_is_a_usage_error_not_a_loopback_refusal(capsys: pytest.CaptureFixture[str]) -> None:
    # Read as host "" it was "every address is reachable from other machines ... give --tokens".
    assert _err(capsys, "--listen", "127.0.0.1") == (
        "tessera-controller: error: --listen: '127.0.0.1' has no port: expected host:port, e.g. 127.0.0.1:50051")
    # With --tokens it went on to bind the derived agent address ':50054' (every address).
    assert _err(capsys, "--listen", "localhost", "--tokens", "tokens.yaml") == (
        "tessera-controller: error: --listen: 'localhost' has no port: expected host:port, e.g. localhost:50051")


def test_agent_and_metrics_addresses_are_checked_alike(capsys: pytest.CaptureFixture[str]) -> None:
    assert _err(capsys, "--agent-listen", "localhost") == (
        "tessera-controller: error: --agent-listen: 'localhost' has no port: expected host:port, e.g. localhost:50054")
    assert _err(capsys, "--metrics-listen", "localhost") == (
        "tessera-controller: error: --metrics-listen: 'localhost' has no port: expected host:port, e.g. "
        "localhost:9451")
    args = parse_args([*BASE, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
    assert (args.listen, args.agent_listen) == ("127.0.0.1:0", "127.0.0.1:0")
    assert parse_args([*BASE, "--listen", "localhost:50051"]).agent_listen == "localhost:50054"
