"""common/rpc.py `check_listen`: the one check of the addresses the daemons listen on (tessera-controller,
tessera-agent, tessera-estimator): what `check_address` takes for the addresses clients dial, in the
same words, plus port 0; an empty host (":50051", which gRPC does not bind) refused with what to give
instead; and each daemon's refusal of a bad --listen (exit 2, one line naming the flag)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.common.errors import InvalidArgument
from tessera.common.rpc import check_listen

NOT_HOST_PORT = "is not host:port (port 0-65535; IPv6 as [addr]:port)"


@pytest.mark.parametrize("value", ["127.0.0.1:0", "0.0.0.0:50051", "[::1]:0", "127.0.0.1:50051", "localhost:50051",
                                   "[::]:50051", "[::]:0", "ctl-1.internal:50051", "unix:/run/tessera.sock"])
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
    (":99999", f"--listen: ':99999' {NOT_HOST_PORT}"),
    # digits other than ASCII ones (fullwidth, Arabic-Indic): no server binds them
    ("127.0.0.1:\uff15\uff10\uff10\uff15\uff11", "--listen: '127.0.0.1:\uff15\uff10\uff10\uff15\uff11' " + NOT_HOST_PORT),
    ("127.0.0.1:\u0665\u0660\u0660\u0665\u0661", "--listen: '127.0.0.1:\u0665\u0660\u0660\u0665\u0661' " + NOT_HOST_PORT),
    ("127.0.0.1:000000", f"--listen: '127.0.0.1:000000' {NOT_HOST_PORT}"),  # at most 5 digits, as for any port
])
def test_other_addresses_are_refused_naming_the_flag(value: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        check_listen(value, "--listen", 50051)
    assert str(exc.value) == message
    assert exc.value.field == "--listen"


EMPTY_HOST = ("has an empty host: give 0.0.0.0:{p} (every IPv4 address), [::]:{p} (every address) or "
              "127.0.0.1:{p} (this machine only)")


@pytest.mark.parametrize(("value", "port"), [(":50051", "50051"), (":0", "0"), (" :0 ", "0"), (":00000", "0")])
def test_an_empty_host_is_refused_with_what_to_give_instead(value: str, port: str) -> None:
    """gRPC refuses to bind ":PORT" ("host must not be empty"): refused here, before a daemon opens anything."""
    with pytest.raises(InvalidArgument) as exc:
        check_listen(value, "--listen", 50051)
    assert str(exc.value) == f"--listen: {value.strip()!r} " + EMPTY_HOST.format(p=port)
    assert exc.value.field == "--listen"


@pytest.mark.parametrize("zeros", ["0", "00", "00000"])
def test_an_all_zero_port_is_port_0(zeros: str) -> None:
    assert check_listen(f"127.0.0.1:{zeros}", "--listen", 50051) == "127.0.0.1:0"
    assert check_listen(f"[::1]:{zeros}", "--listen", 50051) == "[::1]:0"


async def test_what_check_listen_passes_a_grpc_server_binds() -> None:
    """The check and gRPC agree: every value it passes binds (port 0), an empty host it refuses does not."""
    import grpc

    from tessera.common.rpc import add_port

    server = grpc.aio.server()
    try:
        for value in ("127.0.0.1:0", "127.0.0.1:00000"):
            assert add_port(server, check_listen(value, "--listen", 50051), insecure=True) > 0
        with pytest.raises(OSError, match="cannot bind"):
            add_port(server, ":0", insecure=True)
    finally:
        await server.stop(0)


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
    (":50051", "':50051' " + EMPTY_HOST.format(p=50051)),
])
def test_the_controller_refuses_a_bad_listen(value: str, reason: str, capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    from tessera.controller.main import parse_args
    with pytest.raises(SystemExit) as exc:
        parse_args(["--insecure", "--state-dir", str(tmp_path / "state"), "--listen", value])
    assert exc.value.code == 2
    assert _last_line(capsys) == f"tessera-controller: error: --listen: {reason}"
    assert not (tmp_path / "state").exists()  # refused before the state dir is opened


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
    (":7070", "':7070' " + EMPTY_HOST.format(p=7070)),
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
    for value, stored in (("127.0.0.1:0", "127.0.0.1:0"), ("0.0.0.0:7070", "0.0.0.0:7070"), ("[::1]:0", "[::1]:0"),
                          ("127.0.0.1:00000", "127.0.0.1:0")):
        config, _ = parse_config(["--controller", "ctl:50054", "--node-id", "n1", "--work-dir", str(tmp_path),
                                  "--insecure", "--listen", value])
        assert config.listen == stored


# --metrics-listen: checked stripped, and used as checked (the metrics server would refuse the spaces).

def test_each_daemon_keeps_metrics_listen_as_checked(tmp_path: Path) -> None:
    from tessera.controller.main import parse_args as controller_args
    from tessera.estimator.service.main import parse_args as estimator_args
    from tessera.nodeagent.main import parse_config

    value = " 127.0.0.1:9451 "
    ctl = controller_args(["--insecure", "--state-dir", str(tmp_path / "state"), "--metrics-listen", value])
    assert ctl.metrics_listen == "127.0.0.1:9451"
    assert estimator_args(["--insecure", "--metrics-listen", value]).metrics_listen == "127.0.0.1:9451"
    _, agent = parse_config(["--controller", "ctl:50054", "--node-id", "n1", "--work-dir", str(tmp_path),
                             "--insecure", "--metrics-listen", value])
    assert agent.metrics_listen == "127.0.0.1:9451"
    assert estimator_args(["--insecure", "--metrics-listen", "127.0.0.1:00000"]).metrics_listen == "127.0.0.1:0"
