"""common/rpc.py `check_listen`: the one check of the addresses the daemons listen on (tessera-controller,
tessera-agent, tessera-estimator): what `check_address` takes for the addresses clients dial, in the
same words, plus port 0 and an empty host; and each daemon's refusal of a bad --listen (exit 2, one line
naming the flag)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.common.errors import InvalidArgument
from tessera.common.rpc import check_listen

NOT_HOST_PORT = "is not host:port (port 0-65535; IPv6 as [addr]:port)"


@pytest.mark.parametrize("value", ["127.0.0.1:0", ":50051", "[::1]:0", "127.0.0.1:50051", "localhost:50051",
                                   "[::]:50051", ":0", "ctl-1.internal:50051", "unix:/run/tessera.sock"])
def test_addresses_a_server_binds_pass(value: str) -> None:
    assert check_listen(value, "--listen", 50051) == value
    assert check_listen(f" {value} ", "--listen", 50051) == value  # stripped


@pytest.mark.parametrize(("value", "message"), [
    ("localhost", "--listen: 'localhost' has no port: expected host:port, e.g. localhost:50051"),
    ("127.0.0.1", "--listen: '127.0.0.1' has no port: expected host:port, e.g. 127.0.0.1:50051"),
    ("host:99999", f"--listen: 'host:99999' {NOT_HOST_PORT}"),
    ("dns:///x:1", f"--listen: 'dns:///x:1' {NOT_HOST_PORT}"),
    ("", "--listen: empty address: expected host:port"),
    ("   ", "--listen: empty address: expected host:port"),
    ("a b:0", f"--listen: 'a b:0' {NOT_HOST_PORT}"),
    (":x", f"--listen: ':x' {NOT_HOST_PORT}"),
])
def test_other_addresses_are_refused_naming_the_flag(value: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        check_listen(value, "--listen", 50051)
    assert str(exc.value) == message
    assert exc.value.field == "--listen"


def test_the_example_uses_the_port_given() -> None:
    with pytest.raises(InvalidArgument, match=r"e\.g\. localhost:9452$"):
        check_listen("localhost", "--metrics-listen", 9452)


# Each daemon's parser: exit status 2 and one line on stderr naming the flag.

def _last_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err.strip().splitlines()[-1]


@pytest.mark.parametrize(("value", "reason"), [
    ("localhost", "'localhost' has no port: expected host:port, e.g. localhost:50051"),
    ("host:99999", f"'host:99999' {NOT_HOST_PORT}"),
])
def test_the_controller_refuses_a_bad_listen(value: str, reason: str, capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    from tessera.controller.main import parse_args
    with pytest.raises(SystemExit) as exc:
        parse_args(["--insecure", "--state-dir", str(tmp_path / "state"), "--listen", value])
    assert exc.value.code == 2
    assert _last_line(capsys) == f"tessera-controller: error: --listen: {reason}"


@pytest.mark.parametrize(("flag", "value", "reason"), [
    ("--listen", "localhost", "'localhost' has no port: expected host:port, e.g. localhost:50053"),
    ("--listen", "dns:///x:1", f"'dns:///x:1' {NOT_HOST_PORT}"),
    ("--metrics-listen", "127.0.0.1:99999", f"'127.0.0.1:99999' {NOT_HOST_PORT}"),
])
def test_the_estimator_refuses_a_bad_listen(flag: str, value: str, reason: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from tessera.estimator.service.main import parse_args
    with pytest.raises(SystemExit) as exc:
        parse_args(["--insecure", flag, value])
    assert exc.value.code == 2
    assert _last_line(capsys) == f"tessera-estimator: error: {flag}: {reason}"
    args = parse_args(["--insecure", "--listen", " 127.0.0.1:0 "])
    assert args.listen == "127.0.0.1:0"


@pytest.mark.parametrize(("value", "reason"), [
    ("localhost", "'localhost' has no port: expected host:port, e.g. localhost:7070"),
    ("host:99999", f"'host:99999' {NOT_HOST_PORT}"),
    ("", "empty address: expected host:port"),
])
def test_the_agent_refuses_a_bad_listen(value: str, reason: str, capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    from tessera.nodeagent.main import main
    work = tmp_path / "work"
    code = main(["--controller", "127.0.0.1:50054", "--node-id", "n1", "--work-dir", str(work), "--insecure",
                 "--listen", value])
    assert code == 2
    assert _last_line(capsys) == f"tessera-agent: error: --listen: {reason}"
    assert not work.exists()  # refused before anything is created


def test_the_agent_takes_what_a_server_binds(tmp_path: Path) -> None:
    from tessera.nodeagent.main import parse_config
    for value in ("127.0.0.1:0", ":7070", "[::1]:0"):
        config, _ = parse_config(["--controller", "ctl:50054", "--node-id", "n1", "--work-dir", str(tmp_path),
                                  "--insecure", "--listen", value])
        assert config.listen == value
