"""tessera-controller's --store etcd flags: bad values are refused with one line naming the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.controller.ha import advertised, etcd_config, failover_gap
from tessera.controller.main import parse_args
from tessera.controller.registry import LivenessConfig, fence_seconds


def _err(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--insecure", "--state-dir", "/tmp/x", *argv])
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_etcd_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--etcd-endpoints" in _err(capsys, "--store", "etcd")
    assert "'nohost' is not host:port" in _err(capsys, "--store", "etcd", "--etcd-endpoints", "a:1,nohost")
    assert "'a:99999' is not host:port" in _err(capsys, "--store", "etcd", "--etcd-endpoints", "a:99999")
    assert "--etcd-lease-ttl must be 2..60" in _err(capsys, "--store", "etcd", "--etcd-endpoints", "a:1",
                                                     "--etcd-lease-ttl", "1")
    assert "go together" in _err(capsys, "--store", "etcd", "--etcd-endpoints", "a:1", "--checkpoint-root", "/c",
                                 "--etcd-cert", "c.pem")
    assert "--store etcd needs --checkpoint-root DIR" in _err(capsys, "--store", "etcd", "--etcd-endpoints", "a:1")
    assert "invalid choice" in _err(capsys, "--store", "zookeeper")


def test_etcd_config_and_advertised_address() -> None:
    args = parse_args(["--insecure", "--state-dir", "/tmp/x", "--checkpoint-root", "/shared/ckpt", "--store", "etcd", "--etcd-endpoints",
                       "https://e1:2379, e2:2379", "--etcd-prefix", "/prod", "--etcd-plaintext"])
    cfg = etcd_config(args)
    assert cfg.endpoints == ("e1:2379", "e2:2379") and cfg.prefix == "/prod/"
    assert parse_args(["--insecure", "--state-dir", "/tmp/x"]).store == "sqlite"  # SQLite stays the default
    assert advertised("127.0.0.1:0", 5051, "") == "127.0.0.1:5051"
    assert advertised("0.0.0.0:5051", 5051, "ctl-1:5051") == "ctl-1:5051"


def test_the_failover_gap_against_the_fence() -> None:
    """docs/ha.md, "Failover and the agents' fence": the defaults fence during a failover; the
    suggested settings and the chaos tests' do not."""
    default = LivenessConfig()
    assert failover_gap(default, 5) == 12.5 > fence_seconds(default) == 10
    suggested = LivenessConfig(lease_s=20, heartbeat_interval_s=2)
    assert fence_seconds(suggested) == 10 > failover_gap(suggested, 5) == 9.5
    chaos = LivenessConfig(lease_s=10, heartbeat_interval_s=0.5, fence_s=8)
    assert fence_seconds(chaos) == 8 > failover_gap(chaos, 2) == 7.5



@pytest.mark.parametrize("flag", ["--prices", "--tenants"])
def test_a_bad_file_is_one_line_without_the_usage_block(flag: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("x: [\n")
    with pytest.raises(SystemExit) as exc:
        parse_args(["--insecure", "--state-dir", "/tmp/x", flag, str(bad)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and err[0].startswith(f"tessera-controller: error: {flag}: "), err


@pytest.mark.parametrize("listen", ["0.0.0.0:50051", "10.0.0.1:50051", "[::]:50051", "ctl-1.internal:50051"])
def test_an_api_other_machines_reach_needs_tokens(listen: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --tokens every caller is an anonymous admin: on loopback that is the developer's own
    machine; on a network address it was anyone's (an audit drained a node from another host)."""
    with pytest.raises(SystemExit) as exc:
        parse_args(["--insecure", "--state-dir", "/tmp/x", "--listen", listen])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "without --tokens every caller" in err[0], err
    assert parse_args(["--insecure", "--state-dir", "/tmp/x", "--listen", listen, "--allow-anonymous"]).allow_anonymous
    assert parse_args(["--insecure", "--state-dir", "/tmp/x", "--listen", listen, "--tokens", "t.yaml"]).tokens
    assert not parse_args(["--insecure", "--state-dir", "/tmp/x", "--listen", "127.0.0.1:0"]).tokens


def test_etcd_other_machines_reach_needs_tls_and_a_client_certificate(capsys: pytest.CaptureFixture[str]) -> None:
    """The whole state (job specs with their env, nodes, epochs, the leader key) lives there."""
    base = ["--insecure", "--state-dir", "/tmp/x", "--checkpoint-root", "/shared/ckpt", "--store", "etcd", "--etcd-endpoints", "127.0.0.1:2379,10.0.0.2:2379"]
    with pytest.raises(SystemExit) as exc:
        parse_args(base)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "10.0.0.2:2379 is reachable from other machines" in err[0]
    assert parse_args([*base, "--etcd-plaintext"]).etcd_plaintext
    assert parse_args([*base, "--etcd-ca", "ca.pem", "--etcd-cert", "c.pem", "--etcd-key", "k.pem"]).etcd_cert
    assert parse_args(["--insecure", "--state-dir", "/tmp/x", "--checkpoint-root", "/shared/ckpt", "--store", "etcd", "--etcd-endpoints",
                       "127.0.0.1:2379,[::1]:2380,localhost:2381"]).store == "etcd"
