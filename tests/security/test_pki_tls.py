"""The dev PKI, identities, TLS file loading and the daemons' TLS flags (in process, no sockets but
the handshake checks of rpc)."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

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
    # A FIFO or device is refused, not read: reading /dev/zero to its end never ends.
    with pytest.raises(tls.TlsError, match="^/dev/zero: not a plain file$"):
        tls.load(d / "ca.pem", d / "cert.pem", "/dev/zero")
    with pytest.raises(tls.TlsError, match=f"^{d}: is a directory, not a file$"):
        tls.load(d)
    big = tmp_path / "big.pem"
    big.write_bytes(b"x" * (tls.MAX_PEM_BYTES + 1))
    with pytest.raises(tls.TlsError, match=f"^{big}: over {tls.MAX_PEM_BYTES} bytes"):
        tls.load(big)


@pytest.mark.parametrize(("mode", "root_owned", "refused"), [
    (0o600, False, False), (0o400, False, False), (0o640, True, False),  # PostgreSQL's rule for its key
    (0o644, False, True), (0o604, False, True), (0o640, False, True), (0o660, True, True), (0o620, True, True),
])
def test_a_private_key_others_may_read_is_refused(ca: CertificateAuthority, mode: int, root_owned: bool,
                                                   refused: bool) -> None:
    """A key.pem other users could read let any of them act as this daemon (a node, the controller)."""
    d = ca.issue(identity.CONTROLLER)
    key = d / "key.pem"
    key.chmod(mode)
    if not root_owned and os.geteuid() == 0:
        os.chown(key, 65534, -1)  # nobody: not root, so group read is no longer excused
    if refused:
        with pytest.raises(tls.TlsError, match=f"^{key}: other users may read or change this private key "
                                               f"\\(mode 0{mode:o}\\): chmod 600 it"):
            tls.load_dir(d)
    elif os.access(key, os.R_OK):
        assert tls.load_dir(d).key == key.read_bytes()


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


def test_a_planted_temporary_name_does_not_capture_a_key(ca: CertificateAuthority, tmp_path: Path) -> None:
    """The key used to go through `.key.pem.<pid>.tmp`, opened without O_EXCL or O_NOFOLLOW: another
    user of the folder pre-created it (and kept the key) or linked it to a file of root's (which
    then held the key). The temporary name is random now, and made exclusively."""
    import os

    out = tmp_path / "node"
    out.mkdir(mode=0o700)
    victim = tmp_path / "victim.conf"
    victim.write_text("root's own file\n")
    (out / f".key.pem.{os.getpid()}.tmp").symlink_to(victim)
    ca.issue(identity.node("gpu-a1"), out=out)
    assert victim.read_text() == "root's own file\n"
    key = out / "key.pem"
    assert key.is_file() and not key.is_symlink() and stat.S_IMODE(key.stat().st_mode) == 0o600


def test_a_key_folder_other_users_may_write_is_refused(ca: CertificateAuthority, tmp_path: Path) -> None:
    share = tmp_path / "share"
    share.mkdir()
    share.chmod(0o777)  # another user could rename the key folder away and put one of theirs there
    with pytest.raises(PkiError, match="other users may write in it"):
        ca.issue(identity.node("gpu-a1"), out=share / "node")
    share.chmod(0o1777)  # sticky, as /tmp: others cannot rename what they do not own
    assert (ca.issue(identity.node("gpu-a1"), out=share / "node") / "key.pem").is_file()


def test_rewriting_a_private_file_keeps_its_owner_and_writes_through_a_symlink(tmp_path: Path) -> None:
    """A tokens file a non-root controller reads became root's after `tessctl admin token create` (the
    controller then failed closed); through a symlink the link was replaced and the file it named,
    the one the controller read, kept the revoked token."""
    import os

    from tessera.common.privatefile import write_private

    f = tmp_path / "tokens.yaml"
    f.write_text("old\n")
    if os.geteuid() == 0:
        os.chown(f, 65534, 65534)
    write_private(f, "new\n")
    assert f.read_text() == "new\n" and stat.S_IMODE(f.stat().st_mode) == 0o600
    if os.geteuid() == 0:
        assert (f.stat().st_uid, f.stat().st_gid) == (65534, 65534)
    link = tmp_path / "link.yaml"
    link.symlink_to(f)
    write_private(link, "through the link\n")
    assert f.read_text() == "through the link\n" and link.is_symlink()


def test_issuing_under_a_new_ca_keeps_the_bundle_a_rotation_put_there(tmp_path: Path) -> None:
    """Round 2 of a CA rotation (docs/security.md): a daemon's ca.pem holds the old and the new CA;
    issuing its new certificate must not drop the old CA, or the daemons still on old certificates
    are refused (an audit's rotation fenced every worker). Re-issuing under the same CA changes
    nothing; a fresh folder trusts the new CA alone."""
    from tessera.common.pki import bundle_cas

    old = CertificateAuthority.init(tmp_path / "old")
    new = CertificateAuthority.init(tmp_path / "new")
    out = old.issue(identity.node("gpu-a1"), out=tmp_path / "node")
    (out / "ca.pem").write_bytes(old.cert_pem + new.cert_pem)  # round 1: both CAs, old certificate
    new.issue(identity.node("gpu-a1"), out=out)  # round 2
    assert bundle_cas(out / "ca.pem") == [old.cert, new.cert]
    new.issue(identity.node("gpu-a1"), out=out)
    assert bundle_cas(out / "ca.pem") == [old.cert, new.cert]
    assert bundle_cas(new.issue(identity.node("gpu-a2"), out=tmp_path / "fresh") / "ca.pem") == [new.cert]
    buf = io.StringIO()
    assert tessctl.main(["admin", "pki", "issue", "--dir", str(tmp_path / "new"), "--node", "gpu-a1",
                         "--out", str(out)], out=buf) == 0
    assert "trusts 2 CAs" in buf.getvalue()


def test_a_certificate_near_its_end_is_said_at_start_and_exported(ca: CertificateAuthority) -> None:
    from prometheus_client import REGISTRY
    from structlog.testing import capture_logs

    for days, warned in ((10, True), (365, False)):
        cfg = tls.load_dir(ca.issue(identity.node(f"gpu-{days}"), days=days))
        with capture_logs() as logs:
            tls.announce("tessera-agent", cfg)
        assert any(e["event"] == "certificate_expires_soon" for e in logs) is warned
        assert cfg.cert is not None
        ends = x509.load_pem_x509_certificate(cfg.cert).not_valid_after_utc.timestamp()
        assert REGISTRY.get_sample_value("tessera_certificate_expiry_timestamp_seconds") == ends


def test_an_expired_client_certificate_names_no_identity() -> None:
    """TLS checks a certificate's validity at the handshake only; a connection made the day before a
    node's certificate expired kept acting as that node. Every call's identity now checks it."""
    import datetime

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "n1")])

    def pem(ends: datetime.datetime) -> bytes:
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=2))
                .not_valid_after(ends)
                .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier("spiffe://tessera/node/n1")]),
                               critical=False)
                .sign(key, hashes.SHA256()))
        return cert.public_bytes(serialization.Encoding.PEM)

    class Call:
        def __init__(self, cert: bytes) -> None:
            self.cert = cert

        def auth_context(self) -> dict[str, list[bytes]]:  # what grpc gives a server for a verified client
            return {"peer_uri": [b"spiffe://tessera/node/n1"], "x509_pem_cert": [self.cert]}

    assert tls.peer_identity(Call(pem(now + datetime.timedelta(days=1)))) == identity.node("n1")
    assert tls.peer_identity(Call(pem(now - datetime.timedelta(seconds=1)))) is None
    assert tls.peer_identity(Call(b"not a certificate")) is None
