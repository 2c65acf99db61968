"""No certificate outlives the CA that signs it (common/pki.py, docs/security.md "Making the PKI").

Before: `tessctl admin pki issue --days 400` under a CA with 100 days left wrote a certificate valid
for 400 days; TLS refuses it from the CA's end on, while its own date, which the daemons warn and
export by, said it had 300 days more. Nothing said when the CA itself ends.
"""

from __future__ import annotations

import datetime
import io
import json
from pathlib import Path

import pytest
from cryptography import x509

from tessera.clients import tessctl
from tessera.common import identity, pki
from tessera.common.pki import CertificateAuthority, PkiError

DAY = datetime.timedelta(days=1)


def _end(path: Path) -> datetime.datetime:
    return x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    rc = tessctl.main(argv, out=out)
    return rc, out.getvalue(), capsys.readouterr().err


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority.init(tmp_path / "pki", days=100)


def test_days_past_the_cas_end_are_refused_naming_it_and_the_most_that_fits(ca: CertificateAuthority) -> None:
    with pytest.raises(PkiError) as err:
        ca.issue(identity.CONTROLLER, days=200)
    assert str(err.value) == (
        f"--days 200: the certificate would outlive the CA that signs it ({ca.dir / 'ca.pem'}, valid until "
        f"{ca.expires:%Y-%m-%d %H:%M} UTC): --days 99 at most, or rotate the CA first "
        "(docs/security.md, Rotation)")
    assert not (ca.dir / "controller").exists()  # refused before anything is written
    target = ca.issue(identity.CONTROLLER, days=99)  # the most it named fits
    assert _end(target / "cert.pem") <= ca.expires


def test_fit_cuts_a_certificate_to_the_cas_end(ca: CertificateAuthority) -> None:
    target = ca.issue(identity.node("n1"), days=365, fit=True)
    assert _end(target / "cert.pem") == ca.expires
    short = ca.issue(identity.node("n2"), days=10, fit=True)  # within the CA's life: as asked
    assert ca.expires - _end(short / "cert.pem") > 80 * DAY


def test_a_ca_past_or_near_its_end(ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch) -> None:
    hours_left = ca.expires - datetime.timedelta(hours=3)
    with pytest.raises(PkiError, match=r"no --days fits \(it ends in less than a day\): rotate the CA first"):
        ca.validity_end(1, now=hours_left)
    assert ca.validity_end(1, fit=True, now=hours_left) == ca.expires
    monkeypatch.setattr(pki, "_now", lambda: ca.expires + DAY)
    for fit in (False, True):
        with pytest.raises(PkiError, match=r"the CA expired on .* and can sign nothing that works"):
            ca.issue(identity.ESTIMATOR, days=1, fit=fit)


def test_tessctl_refuses_a_days_past_the_ca(ca: CertificateAuthority,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(["admin", "pki", "issue", "--dir", str(ca.dir), "--node", "a", "b", "--days", "365"],
                        capsys)
    assert (rc, out) == (1, "")
    assert err.startswith("tessctl: error: --days 365: the certificate would outlive the CA")
    assert "--days 99 at most" in err
    assert err.count("\n") == 1
    assert sorted(p.name for p in ca.dir.iterdir()) == ["ca.key", "ca.pem"]  # no node got one


def test_tessctl_cuts_the_default_to_the_ca_and_says_when_it_ends(ca: CertificateAuthority,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(["admin", "pki", "issue", "--dir", str(ca.dir), "--controller"], capsys)
    assert rc == 0
    assert _end(ca.dir / "controller" / "cert.pem") == ca.expires
    when = f"{ca.expires:%Y-%m-%d %H:%M} UTC"
    assert f"valid until {when} (use as --tls-dir {ca.dir / 'controller'})" in out
    assert err == (f"tessctl: warning: the CA {ca.dir / 'ca.pem'} expires on {when} (in 99 days): these "
                   "certificates end with it, not in 365 days; make a new CA and rotate to it "
                   "(docs/security.md, Rotation)\n")
    # A --days that fits: the same warning of the CA's end, said as such.
    rc, out, err = _run(["admin", "pki", "issue", "--dir", str(ca.dir), "--estimator", "--days", "30",
                         "-o", "json"], capsys)
    assert rc == 0 and "every certificate it signed stops working then" in err
    doc = json.loads(out)
    assert doc["ca_expires"] == ca.expires.strftime("%Y-%m-%dT%H:%M:%SZ")
    ends = _end(ca.dir / "estimator" / "cert.pem")
    assert doc["certificates"][0]["expires"] == ends.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_ca_far_from_its_end_is_not_warned_of(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    CertificateAuthority.init(tmp_path / "pki", days=366)
    rc, _, err = _run(["admin", "pki", "issue", "--dir", str(tmp_path / "pki"), "--controller"], capsys)
    assert (rc, err) == (0, "")
    assert _end(tmp_path / "pki" / "controller" / "cert.pem") < _end(tmp_path / "pki" / "ca.pem")
