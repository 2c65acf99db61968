"""The dev PKI, identities, TLS file loading and the daemons' TLS flags (in process, no sockets but
the handshake checks of rpc)."""

from __future__ import annotations

import io
import stat
from pathlib import Path

import pytest
from cryptography import x509

from tessera.clients import tessctl
from tessera.common import identity, rpc, tls
from tessera.common.identity import Identity
from tessera.common.pki import CertificateAuthority, PkiError, identities_of
from tessera.controller.main import parse_args as controller_args
from tessera.estimator.service.main import parse_args as estimator_args
from tessera.nodeagent.main import AgentUsageError, parse_config


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority.init(tmp_path / "pki")


@pytest.mark.parametrize(("uri", "want"), [
    ("spiffe://tessera/controller", Identity("controller")),
    ("spiffe://tessera/estimator", Identity("estimator")),
    ("spiffe://tessera/node/gpu-a1.rack2", Identity("node", "gpu-a1.rack2")),
    ("spiffe://other/controller", None),
    ("spiffe://tessera/node/GPU", None),
    ("spiffe://tessera/node/a/b", None),
    ("spiffe://tessera/node/", None),
    ("spiffe://tessera/controller/x", None),
    ("spiffe://tessera/admin", None),
    ("spiffe://tessera/node/a\n", None),
    ("https://tessera/controller", None),
])
def test_identity_parse(uri: str, want: Identity | None) -> None:
    assert Identity.parse(uri) == want
    if want is not None:
        assert want.uri == uri


def test_identity_names_are_distinct_and_reserved() -> None:
    names = {identity.CONTROLLER.dns, identity.ESTIMATOR.dns, identity.node("controller").dns,
             identity.node("estimator").dns, identity.node("a.node").dns, identity.node("a").dns}
    assert len(names) == 6 and all(identity.reserved_host(n) for n in names)
    with pytest.raises(ValueError):
        identity.node("Bad_Name")


def test_issue_writes_identity_hosts_and_private_keys(ca: CertificateAuthority) -> None:
    d = ca.issue(identity.node("gpu-a1"), ["gpu-a1.example.org", "10.0.0.11"])
    cert = x509.load_pem_x509_certificate((d / "cert.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["spiffe://tessera/node/gpu-a1"]
    assert san.get_values_for_type(x509.DNSName) == ["gpu-a1.node.id.tessera", "gpu-a1.example.org"]
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.11"]
    assert identities_of(cert) == [identity.node("gpu-a1")]
    assert stat.S_IMODE((d / "key.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE((ca.dir / "ca.key").stat().st_mode) == 0o600
    assert d.name == "node-gpu-a1" and (d / "ca.pem").read_bytes() == ca.cert_pem
    default = x509.load_pem_x509_certificate((ca.issue(identity.CONTROLLER) / "cert.pem").read_bytes())
    dns = default.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName)
    assert dns == ["controller.id.tessera", "localhost"]
    assert tls.load_dir(d).identity == identity.node("gpu-a1")


@pytest.mark.parametrize(("host", "message"), [
    ("x.node.id.tessera", "reserved identity namespace"),
    ("controller.id.tessera", "reserved identity namespace"),
    ("*.example.org", "not a host name or an IP address"),
    ("a b", "not a host name or an IP address"),
    ("", "not a host name or an IP address"),
])
def test_issue_refuses_bad_hosts(ca: CertificateAuthority, host: str, message: str) -> None:
    with pytest.raises(PkiError, match=message):
        ca.issue(identity.CONTROLLER, [host])


def test_init_refuses_to_replace_a_ca(ca: CertificateAuthority) -> None:
    with pytest.raises(PkiError, match="a CA exists already"):
        CertificateAuthority.init(ca.dir)


def test_load_errors_name_the_file(ca: CertificateAuthority, tmp_path: Path) -> None:
    d = ca.issue(identity.CONTROLLER)
    other = CertificateAuthority.init(tmp_path / "other").issue(identity.CONTROLLER)
    with pytest.raises(tls.TlsError, match=f"^{tmp_path / 'nowhere'}: no such directory"):
        tls.load_dir(tmp_path / "nowhere")
    with pytest.raises(tls.TlsError, match=f"^{d / 'missing.pem'}: no such file$"):
        tls.load(d / "missing.pem", d / "cert.pem", d / "key.pem")
    with pytest.raises(tls.TlsError, match=f"^{d / 'key.pem'}: not a PEM certificate$"):
        tls.load(d / "key.pem", d / "cert.pem", d / "key.pem")
    with pytest.raises(tls.TlsError, match=f"^{d / 'cert.pem'}: not an unencrypted PEM private key$"):
        tls.load(d / "ca.pem", d / "cert.pem", d / "cert.pem")
    with pytest.raises(tls.TlsError, match=f"^{other / 'key.pem'}: this key does not belong to the certificate"):
        tls.load(d / "ca.pem", d / "cert.pem", other / "key.pem")
    with pytest.raises(tls.TlsError, match=f"^{other / 'cert.pem'}: not issued by the CA in {d / 'ca.pem'}$"):
        tls.load(d / "ca.pem", other / "cert.pem", other / "key.pem")


def test_servers_and_channels_need_tls_or_an_explicit_insecure() -> None:
    with pytest.raises(ValueError, match="plaintext only with insecure=True"):
        rpc.aio_channel("127.0.0.1:1")
    with pytest.raises(ValueError, match="plaintext only with insecure=True"):
        rpc.sync_channel("127.0.0.1:1")


def test_tessctl_admin_pki(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pki = tmp_path / "pki"
    assert tessctl.main(["admin", "pki", "init", "--dir", str(pki)], out=io.StringIO()) == 0
    out = io.StringIO()
    assert tessctl.main(["admin", "pki", "issue", "--dir", str(pki), "--node", "n1", "n2",
                         "--host", "gpu.example.org"], out=out) == 0
    assert "spiffe://tessera/node/n1" in out.getvalue() and (pki / "node-n2" / "key.pem").exists()
    assert tls.load_dir(pki / "node-n1").identity == identity.node("n1")
    assert tessctl.main(["admin", "pki", "issue", "--dir", str(pki), "--controller", "--out",
                         str(tmp_path / "ctl")], out=io.StringIO()) == 0
    assert tls.load_dir(tmp_path / "ctl").identity == identity.CONTROLLER
    capsys.readouterr()
    assert tessctl.main(["admin", "pki", "init", "--dir", str(pki)], out=io.StringIO()) == 1
    assert capsys.readouterr().err == f"tessctl: error: {pki / 'ca.pem'}: a CA exists already; remove it first " \
                                      "to make a new one\n"
    assert tessctl.main(["admin", "pki", "issue", "--dir", str(tmp_path / "none"), "--estimator"],
                        out=io.StringIO()) == 1
    assert "no such file (make a CA first" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        tessctl.main(["admin", "pki", "issue", "--dir", str(pki), "--node", "Bad_Node"])
    assert exit_.value.code == 2
    assert "'Bad_Node' is not a node id" in capsys.readouterr().err


def _refused(call: object, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        call()  # type: ignore[operator]
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_daemons_refuse_to_start_without_tls_or_insecure(tmp_path: Path, ca: CertificateAuthority,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    state = ["--state-dir", str(tmp_path / "s")]
    err = _refused(lambda: controller_args(state), capsys)
    assert "give --tls-dir DIR (certificates: tessctl admin pki) or, for development only, --insecure" in err
    err = _refused(lambda: controller_args([*state, "--insecure", "--tls-dir", str(ca.dir)]), capsys)
    assert "--tls-dir and --insecure exclude each other" in err
    node = ca.issue(identity.node("n1"))
    err = _refused(lambda: controller_args([*state, "--tls-dir", str(node)]), capsys)
    assert "holds a certificate of node/n1, not of the controller" in err
    err = _refused(lambda: estimator_args([]), capsys)
    assert "give --tls-dir DIR" in err
    err = _refused(lambda: estimator_args(["--tls-dir", str(node)]), capsys)
    assert "does not hold the estimator's certificate" in err
    assert controller_args([*state, "--tls-dir", str(ca.issue(identity.CONTROLLER))]).tls.identity == \
        identity.CONTROLLER
    agent = ["--controller", "c:1", "--node-id", "n2", "--work-dir", str(tmp_path / "w")]
    with pytest.raises(AgentUsageError, match="give --tls-dir DIR"):
        parse_config(agent)
    with pytest.raises(AgentUsageError, match="holds a certificate of node/n1, not of node n2"):
        parse_config([*agent, "--tls-dir", str(node)])
    with pytest.raises(AgentUsageError, match=f"--tls-dir: {tmp_path / 'nope'}: no such directory"):
        parse_config([*agent, "--tls-dir", str(tmp_path / "nope")])
    config, _ = parse_config([*agent, "--tls-dir", str(ca.issue(identity.node("n2")))])
    assert config.tls is not None and config.tls.identity == identity.node("n2") and not config.insecure
