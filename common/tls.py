"""TLS for every daemon and client: files, credentials, and who the peer of a call is.

A daemon takes `--tls-dir DIR` (DIR/ca.pem, DIR/cert.pem, DIR/key.pem, as `tessctl admin pki issue`
writes them) or `--insecure`; with neither it refuses to start (a usage error), and `--insecure`
says so loudly in its log and in the metric `tessera_transport_insecure`. Files are checked when
loaded, so a wrong path, a non-PEM file, a key of another certificate or a certificate of another
CA is one line naming the file at start, not a failed handshake later.

`peer_identity(context)` is the identity (tessera.common.identity) in the verified client
certificate of a call, None without one. gRPC puts the peer's URI SANs under `peer_uri` in the
auth context and the whole certificate under `x509_pem_cert`; the URI list is read, the PEM only
when a gRPC build leaves the list out.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import grpc
import structlog
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from prometheus_client import Gauge

from tessera.common.errors import InvalidInput
from tessera.common.identity import Identity
from tessera.common.pki import identities_of
from tessera.common.plainfile import NotPlainFile, read_plain
from tessera.common.privatefile import open_to_others

log = structlog.get_logger(__name__)

CA_FILE = "ca.pem"
CERT_FILE = "cert.pem"
KEY_FILE = "key.pem"

INSECURE = Gauge("tessera_transport_insecure", "1 when this daemon was started with --insecure (plaintext gRPC)")
CERT_EXPIRY = Gauge("tessera_certificate_expiry_timestamp_seconds",
                    "When this daemon's own certificate expires (Unix time; 0 with --insecure)")
# A certificate closer than this to its end is said at start: a fleet issued on one day (every
# default certificate is for 365 days) otherwise stops on one day, every handshake refused.
EXPIRY_WARNING_DAYS = 30


class TlsError(InvalidInput):
    """A TLS file that cannot be used: one line naming the file."""


@dataclass(frozen=True)
class TlsConfig:
    """PEM bytes: the CA that peers' certificates must chain to (None: the system's trusted CAs, for
    a client only), and this process's certificate and key (None for a client that presents none)."""

    ca: bytes | None
    cert: bytes | None = None
    key: bytes | None = None
    identity: Identity | None = None
    source: str = ""


MAX_PEM_BYTES = 1 << 20  # a certificate chain or key is a few KiB


def _read_stat(path: Path) -> tuple[bytes, os.stat_result]:
    """The file's bytes and the stat of the very file read (a key's mode is checked on what was
    read, not on whatever the path names a moment later)."""
    try:
        data, st = read_plain(path, MAX_PEM_BYTES)
    except FileNotFoundError:
        raise TlsError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TlsError(f"{path}: is a directory, not a file") from None
    except NotPlainFile:
        raise TlsError(f"{path}: not a plain file") from None
    except OSError as exc:
        raise TlsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_PEM_BYTES:
        raise TlsError(f"{path}: over {MAX_PEM_BYTES} bytes, not a PEM certificate or key")
    return data, st


def _read(path: Path) -> bytes:
    return _read_stat(path)[0]


def _certs(path: Path, data: bytes) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        certs = []
    if not certs:
        raise TlsError(f"{path}: not a PEM certificate")
    return certs


def load(ca: str | os.PathLike[str], cert: str | os.PathLike[str] | None = None,
         key: str | os.PathLike[str] | None = None) -> TlsConfig:
    """Read and check the files; TlsError (one line, naming the file) on any problem."""
    ca_path = Path(ca)
    ca_pem = _read(ca_path)
    ca_certs = _certs(ca_path, ca_pem)
    if cert is None or key is None:
        if cert is not None or key is not None:
            raise TlsError("a certificate needs its key, and a key its certificate")
        return TlsConfig(ca_pem, source=str(ca_path))
    cert_path, key_path = Path(cert), Path(key)
    cert_pem, (key_pem, key_stat) = _read(cert_path), _read_stat(key_path)
    leaf = _certs(cert_path, cert_pem)[0]
    try:
        private = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise TlsError(f"{key_path}: not an unencrypted PEM private key") from None
    if open_to_others(key_stat):  # as ssh and PostgreSQL refuse theirs: anyone on the host could be us
        raise TlsError(f"{key_path}: other users may read or change this private key (mode "
                       f"{stat.S_IMODE(key_stat.st_mode):04o}): chmod 600 it (or 640, owned by root)")
    if not isinstance(private, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey) \
            or private.public_key() != leaf.public_key():
        raise TlsError(f"{key_path}: this key does not belong to the certificate {cert_path}")
    if not any(_issued_by(leaf, c) for c in ca_certs):
        raise TlsError(f"{cert_path}: not issued by the CA in {ca_path}")
    now = datetime.datetime.now(datetime.UTC)
    if leaf.not_valid_after_utc < now:
        raise TlsError(f"{cert_path}: expired on {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
    ids = identities_of(leaf)
    return TlsConfig(ca_pem, cert_pem, key_pem, ids[0] if len(ids) == 1 else None, str(cert_path.parent))


def _issued_by(leaf: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        leaf.verify_directly_issued_by(ca)
    except Exception:  # noqa: BLE001 (InvalidSignature, another key type: not this CA's)
        return False
    return True


def load_dir(directory: Path | str) -> TlsConfig:
    d = Path(directory)
    if not d.is_dir():
        raise TlsError(f"{d}: no such directory (make one with tessctl admin pki issue)")
    return load(d / CA_FILE, d / CERT_FILE, d / KEY_FILE)


def server_credentials(cfg: TlsConfig, *, client_cert: bool) -> grpc.ServerCredentials:
    """`client_cert`: require a client certificate of the CA (mTLS). gRPC's Python API cannot ask for
    an optional one: without it, no client certificate is requested at all."""
    if cfg.cert is None or cfg.key is None or cfg.ca is None:
        raise TlsError(f"{cfg.source}: a server needs a CA, a certificate and its key")
    return grpc.ssl_server_credentials([(cfg.key, cfg.cert)], root_certificates=cfg.ca,
                                       require_client_auth=client_cert)


def channel_credentials(cfg: TlsConfig) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=cfg.ca, private_key=cfg.key, certificate_chain=cfg.cert)


@functools.lru_cache(maxsize=4096)
def _not_after(pem: bytes) -> float:
    """A certificate's end of validity (POSIX seconds); 0 for one that does not parse."""
    try:
        return x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp()
    except ValueError:
        return 0.0


def peer_identity(context: Any) -> Identity | None:
    """The identity of the verified client certificate of this call; None without one, when it names
    no single Tessera identity, or once it has expired: TLS checks validity at the handshake only,
    and a connection can outlive its certificate by months."""
    try:
        auth = context.auth_context()
    except Exception:  # noqa: BLE001 (a context without one: a test double)
        return None
    pems = auth.get("x509_pem_cert") or []
    if pems and _not_after(pems[0]) < time.time():
        return None
    uris = [u.decode(errors="replace") for u in auth.get("peer_uri", [])]
    if not uris and pems:
        try:
            found = identities_of(x509.load_pem_x509_certificate(pems[0]))
        except ValueError:
            return None
        return found[0] if len(found) == 1 else None
    ids = {i for i in map(Identity.parse, uris) if i is not None}
    return ids.pop() if len(ids) == 1 else None


def peer_is_local(context: Any) -> bool:
    """Whether the call came over a unix socket (a local worker), not over TCP."""
    try:
        peer = str(context.peer())
    except Exception:  # noqa: BLE001
        return False
    return peer.startswith("unix:")


# --- daemon command lines ---------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("transport security (one of them is required)")
    g.add_argument("--tls-dir", metavar="DIR",
                   help="DIR/ca.pem, DIR/cert.pem, DIR/key.pem (tessctl admin pki issue); mTLS")
    g.add_argument("--insecure", action="store_true",
                   help="plaintext gRPC: anyone who reaches the port is trusted (development only; logged loudly)")


def from_args(args: argparse.Namespace, error: Callable[[str], NoReturn]) -> TlsConfig | None:
    """The TLS configuration the flags name; None for --insecure. `error` is the parser's (exit 2)."""
    if args.tls_dir and args.insecure:
        error("--tls-dir and --insecure exclude each other")
    if not args.tls_dir and not args.insecure:
        error("give --tls-dir DIR (certificates: tessctl admin pki) or, for development only, --insecure")
    if args.insecure:
        return None
    try:
        return load_dir(args.tls_dir)
    except TlsError as exc:
        error(f"--tls-dir: {exc}")


def announce(prog: str, cfg: TlsConfig | None) -> None:
    """Log how this daemon's gRPC is secured; a loud warning (and the metric) for plaintext."""
    if cfg is None:
        INSECURE.set(1)
        log.warning("insecure_transport", daemon=prog,
                    message=f"{prog} runs with --insecure: plaintext gRPC, no peer identities checked; "
                            "anyone who reaches its ports can act as the controller, any node or any user")
    else:
        INSECURE.set(0)
        log.info("tls_enabled", daemon=prog, identity=str(cfg.identity) if cfg.identity else None, dir=cfg.source)
        if cfg.cert is None:
            return
        ends = x509.load_pem_x509_certificate(cfg.cert).not_valid_after_utc
        CERT_EXPIRY.set(ends.timestamp())
        left = ends - datetime.datetime.now(datetime.UTC)
        if left < datetime.timedelta(days=EXPIRY_WARNING_DAYS):
            log.warning("certificate_expires_soon", daemon=prog, dir=cfg.source, expires=f"{ends:%Y-%m-%d %H:%M} UTC",
                        days_left=round(left.total_seconds() / 86400, 1),
                        detail="issue it again (tessctl admin pki issue) and restart: docs/security.md, Rotation")
