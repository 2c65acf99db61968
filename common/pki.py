"""A development PKI: one CA, and certificates naming Tessera identities (docs/security.md).

    DIR/ca.pem, DIR/ca.key                    the CA (`tessctl admin pki init --dir DIR`)
    DIR/<who>/ca.pem, cert.pem, key.pem       one identity (`tessctl admin pki issue`), usable as
                                              a daemon's --tls-dir; <who> is controller, estimator
                                              or node-<id>

Keys are EC P-256 (an issue takes about a millisecond, so a benchmark can make a thousand node
certificates in a second through `CertificateAuthority.issue`). Every certificate carries its
identity as a URI SAN (spiffe://tessera/...), the identity's reserved DNS name (identity.py), and
the hosts it serves on as DNS/IP SANs (localhost and 127.0.0.1 unless others are given) so clients
that dial an address can check it. Private keys are written 0600, through a temporary file.

No certificate outlives the CA that signs it (`CertificateAuthority.validity_end`): past the CA's
end every handshake fails whatever the certificate's own date says, and that date is what the
daemons warn and export by (tls.announce), so a later one would hide the real end.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tessera.common.errors import InvalidInput
from tessera.common.identity import Identity, reserved_host
from tessera.common.privatefile import others_may_replace, write_private

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
CERT = "cert.pem"
KEY = "key.pem"
DEFAULT_HOSTS = ("localhost", "127.0.0.1")
CA_DAYS = 3650
CERT_DAYS = 365
# A CA closer than this to its end is said by `tessctl admin pki issue`: from then on a certificate of
# the default life is cut to the CA's end, and rotating a CA takes three rounds of restarts.
CA_WARNING_DAYS = CERT_DAYS
_DAY = datetime.timedelta(days=1)
_HOST_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*\.?")
# Clocks of the machines that check a certificate may lag the one that made it.
_BACKDATE = datetime.timedelta(minutes=5)


class PkiError(InvalidInput):
    """A PKI operation that cannot be done: one line naming the file or the argument."""


def identity_dir_name(identity: Identity) -> str:
    return f"node-{identity.name}" if identity.kind == "node" else identity.kind


def san_hosts(hosts: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for host in hosts:
        h = host.strip().strip("[]")
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
            continue
        except ValueError:
            pass
        if len(h) > 253 or not _HOST_RE.fullmatch(h):
            raise PkiError(f"--host: {host!r} is not a host name or an IP address")
        if reserved_host(h):
            raise PkiError(f"--host: {host!r} is in the reserved identity namespace (*.id.tessera)")
        out.append(x509.DNSName(h.lower().rstrip(".")))
    return out


def _write(path: Path, data: bytes, mode: int) -> None:
    """A key or certificate, never readable by others, not even for a moment, and a crash leaves the
    old file or the new one (privatefile.write_private: a random temporary name, O_EXCL|O_NOFOLLOW;
    a predictable one let another user of the folder pre-create it and read the key)."""
    write_private(path, data, mode)


def _private_dir(d: Path) -> None:
    """Create `d` (0700) and refuse it, or its parent, when another user may write in it (without
    the sticky bit): that user could swap the folder or a file in it for one of theirs."""
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    for p in (d, d.parent):
        st = p.stat()
        if others_may_replace(st.st_mode):
            raise PkiError(f"{p}: other users may write in it (mode {stat.S_IMODE(st.st_mode):04o}), so a key "
                           "written below it can be taken or swapped; chmod go-w it or choose another folder")


def _key_pem(key: ec.EllipticCurvePrivateKey, passphrase: bytes | None = None) -> bytes:
    """PKCS#8 PEM; encrypted under `passphrase` when given (the library's best available scheme,
    AES-256-CBC under a PBKDF2-derived key), as a CA key kept on an admin's machine should be."""
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass
class CertificateAuthority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    dir: Path

    @property
    def cert_pem(self) -> bytes:
        return _cert_pem(self.cert)

    @property
    def expires(self) -> datetime.datetime:
        return self.cert.not_valid_after_utc

    def validity_end(self, days: int, *, fit: bool = False,
                     now: datetime.datetime | None = None) -> datetime.datetime:
        """When a certificate issued `now` for `days` ends. One that would outlive the CA is cut to
        the CA's end with `fit` (for a default life nobody asked for: smallstep/certificates#381),
        and refused otherwise, naming the CA's end and the most --days that fits (a --days asked
        for is not silently shortened: Vault's leaf_not_after_behavior=err, its default); a CA past
        its end issues nothing."""
        now = now or _now()
        path, ends = self.dir / CA_CERT, self.expires
        if ends <= now:
            raise PkiError(f"{path}: the CA expired on {ends:%Y-%m-%d %H:%M} UTC and can sign nothing that "
                           "works: make a new one and rotate to it (docs/security.md, Rotation)")
        wanted = now + datetime.timedelta(days=days)
        if wanted <= ends or fit:
            return min(wanted, ends)
        most = (ends - now) // _DAY
        fits = (f"--days {most} at most, or rotate the CA first" if most else
                "no --days fits (it ends in less than a day): rotate the CA first")
        raise PkiError(f"--days {days}: the certificate would outlive the CA that signs it ({path}, "
                       f"valid until {ends:%Y-%m-%d %H:%M} UTC): {fits} (docs/security.md, Rotation)")

    @classmethod
    def init(cls, directory: Path | str, *, days: int = CA_DAYS, name: str = "Tessera dev CA",
             passphrase: bytes | None = None) -> CertificateAuthority:
        """Make a new CA in `directory` (created 0700 if missing); refuses to replace one. With
        `passphrase`, ca.key is encrypted under it: a copy of the file alone signs nothing."""
        d = Path(directory)
        if (d / CA_KEY).exists() or (d / CA_CERT).exists():
            raise PkiError(f"{d / CA_CERT}: a CA exists already; remove it first to make a new one")
        if days < 1:
            raise PkiError(f"--days: must be >= 1, got {days}")
        _private_dir(d)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        _write(d / CA_KEY, _key_pem(key, passphrase), 0o600)
        _write(d / CA_CERT, _cert_pem(cert), 0o644)
        return cls(cert, key, d)

    @classmethod
    def load(cls, directory: Path | str, passphrase: bytes | None = None) -> CertificateAuthority:
        """The CA of `directory`; `passphrase` opens an encrypted ca.key (`is_encrypted` says whether
        one is needed)."""
        d = Path(directory)
        cert_path, key_path = d / CA_CERT, d / CA_KEY
        for p in (cert_path, key_path):
            if not p.is_file():
                raise PkiError(f"{p}: no such file (make a CA first: tessctl admin pki init --dir {d})")
        try:
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        except ValueError:
            raise PkiError(f"{cert_path}: not a PEM certificate") from None
        pem = key_path.read_bytes()
        encrypted = _encrypted(pem)
        if encrypted and not passphrase:
            raise PkiError(f"{key_path}: the CA key is encrypted: give its passphrase (--passphrase-file FILE, "
                           "or type it when asked)")
        try:
            key = serialization.load_pem_private_key(pem, password=passphrase if encrypted else None)
        except (ValueError, TypeError):
            raise PkiError(f"{key_path}: wrong passphrase" if encrypted else
                           f"{key_path}: not a PEM private key") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
            raise PkiError(f"{key_path}: this key does not belong to {cert_path}")
        return cls(cert, key, d)

    def issue(self, identity: Identity, hosts: Sequence[str] = (), *, out: Path | str | None = None,
              days: int = CERT_DAYS, fit: bool = False) -> Path:
        """Write ca.pem, cert.pem and key.pem for `identity` into `out` (default DIR/<who>);
        returns that directory. An existing certificate there is replaced (rotation). `days` past
        the CA's end: cut to it with `fit`, else PkiError before anything is written."""
        if days < 1:
            raise PkiError(f"--days: must be >= 1, got {days}")
        now = _now()
        ends = self.validity_end(days, fit=fit, now=now)
        sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity.uri), x509.DNSName(identity.dns)]
        sans += san_hosts(hosts or DEFAULT_HOSTS)
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(identity))]))
            .issuer_name(self.cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE).not_valid_after(ends)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            # Every identity is both: the controller calls agents, agents call the controller.
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        target = Path(out) if out is not None else self.dir / identity_dir_name(identity)
        _private_dir(target)
        _write(target / KEY, _key_pem(key), 0o600)
        _write(target / CERT, _cert_pem(cert), 0o644)
        _write(target / CA_CERT, _bundle_with(target / CA_CERT, self.cert), 0o644)
        return target


def _encrypted(pem: bytes) -> bool:
    return b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in pem or b"Proc-Type: 4,ENCRYPTED" in pem


def is_encrypted(directory: Path | str) -> bool:
    """Whether DIR/ca.key is encrypted (False when it is missing or unreadable: `load` says why)."""
    try:
        return _encrypted((Path(directory) / CA_KEY).read_bytes())
    except OSError:
        return False


def expires(path: Path) -> datetime.datetime:
    """When the certificate in `path` (the first of a bundle) ends."""
    return x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc


def bundle_cas(path: Path) -> list[x509.Certificate]:
    """The certificates of a CA bundle (`ca.pem`); none when it is missing or not PEM."""
    try:
        return x509.load_pem_x509_certificates(path.read_bytes())
    except (OSError, ValueError):
        return []


def _bundle_with(path: Path, ca: x509.Certificate) -> bytes:
    """The CA bundle for `path`: the one there already, when it holds `ca` (a bundle of the old and
    the new CA, in the middle of a rotation: docs/security.md), or with `ca` added to what it
    holds, or `ca` alone."""
    held = bundle_cas(path)
    if ca in held:
        return b"".join(_cert_pem(c) for c in held)
    return b"".join(_cert_pem(c) for c in [*held, ca])


def identities_of(cert: x509.Certificate) -> list[Identity]:
    """The Tessera identities among a certificate's URI SANs."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    found = (Identity.parse(u) for u in san.get_values_for_type(x509.UniformResourceIdentifier))
    return [i for i in found if i is not None]
