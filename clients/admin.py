"""`tessctl admin ...`: operators' tools that work on files, not on a controller (docs/auth.md,
docs/security.md).

    tessctl admin token create --tokens-file F --name N --tenant T --role user|admin
    tessctl admin token list   --tokens-file F
    tessctl admin token revoke --tokens-file F --name N
    tessctl admin pki init  --dir DIR                      a development CA in DIR
    tessctl admin pki issue --dir DIR --controller         DIR/controller/{ca,cert,key}.pem
    tessctl admin pki issue --dir DIR --node ID [ID ...]   DIR/node-ID/... for each node
    tessctl admin pki issue --dir DIR --estimator          DIR/estimator/...

Each group is one function under `add_arguments`. tessctl runs every `admin` command without
connecting to a controller. Every one prints one JSON object with `-o json` (docs/cli.md); a bad
value of a flag, found from the command line alone, is a usage error (exit 2), while what depends
on the files (a taken name, a missing CA) is an error (exit 1).
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from tessera.clients import argtypes, capassphrase, formats, output
from tessera.common import identity
from tessera.common.errors import InvalidInput
from tessera.common.pki import (
    CA_CERT,
    CA_DAYS,
    CA_KEY,
    CA_WARNING_DAYS,
    CERT,
    CERT_DAYS,
    DEFAULT_HOSTS,
    KEY,
    CertificateAuthority,
    PkiError,
    bundle_cas,
    expires,
    san_hosts,  # the one check of a --host, as issue() makes it
)
from tessera.common.tokens import (
    PRINCIPAL_RE,
    ROLES,
    TENANT_RE,
    TokenEntry,
    hash_token,
    new_token,
    read_tokens_file,
    write_tokens_file,
)

ADMIN_HELP = "operator tools on local files: API tokens, certificates (pki)"
Command = Callable[..., argparse.ArgumentParser]


class AdminUsageError(InvalidInput):
    """A bad `tessctl admin` request (a taken name, an unknown one): exit 1 with one line."""


def add_arguments(sub: Any, command: Any) -> None:
    """The `admin` command and its groups (command(parent, name, func, help))."""
    admin = command(sub, "admin", _needs_group, ADMIN_HELP)
    groups = admin.add_subparsers(dest="group", metavar="GROUP", required=True)
    _add_token(groups, command)
    _pki_arguments(groups, command)


def _needs_group(client: Any, args: argparse.Namespace, out: TextIO) -> int:
    raise AssertionError("argparse requires a group")


def _add_token(groups: Any, command: Any) -> None:
    token = command(groups, "token", _needs_group, "API tokens in a controller's tokens file (--tokens)")
    ts = token.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = command(ts, "create", cmd_token_create,
                "make a token, print it once and add its SHA-256 to the tokens file (created 0600 if missing)")
    _tokens_file(p)
    p.add_argument("--name", required=True, type=_matching(PRINCIPAL_RE),
                   help="who holds it: [A-Za-z0-9][A-Za-z0-9._@-]{0,62}, unique in the file")
    p.add_argument("--tenant", required=True, type=_matching(TENANT_RE),
                   help="the tenant its calls act for: [a-z0-9][a-z0-9-]{0,62}")
    p.add_argument("--role", required=True, choices=ROLES, help="user: its tenant's jobs; admin: every tenant, nodes")
    p = command(ts, "list", cmd_token_list, "the names, tenants and roles in the tokens file")
    _tokens_file(p)
    p = command(ts, "revoke", cmd_token_revoke, "remove a token from the tokens file (a controller reading it in place re-reads it; "
                "one given it as a systemd credential needs a restart)")
    _tokens_file(p)
    p.add_argument("--name", required=True, help="the token's name")


def _matching(pattern: re.Pattern[str]) -> Callable[[str], str]:
    """An argparse type: the text when the whole of it matches `pattern` (a usage error otherwise,
    exit 2, as the controller's tokens file would refuse it)."""
    shown = pattern.pattern.removeprefix("^").removesuffix("$")

    def check(text: str) -> str:
        if not pattern.fullmatch(text):
            raise argparse.ArgumentTypeError(f"must match {shown}: {text!r}")
        return text
    return check


def _tokens_file(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens-file", required=True, type=Path, metavar="FILE",
                   help="the file the controller reads with --tokens")


def _read(path: Path, missing_ok: bool) -> tuple[TokenEntry, ...]:
    if missing_ok and not path.exists():
        return ()
    return read_tokens_file(path)


def cmd_token_create(client: Any, args: argparse.Namespace, out: TextIO) -> int:
    entries = _read(args.tokens_file, missing_ok=True)
    if any(e.name == args.name for e in entries):
        raise AdminUsageError(f"--name: {args.tokens_file} already has a token named {args.name!r} "
                              "(revoke it first, or choose another name)")
    token = new_token()
    write_tokens_file(args.tokens_file, [*entries, TokenEntry(args.name, args.tenant, args.role, hash_token(token))])
    if args.output == "json":
        out.write(output.dumps({"name": args.name, "tenant": args.tenant, "role": args.role, "token": token}) + "\n")
    else:
        out.write(token + "\n")
    print(f"tessctl: token {args.name!r} ({args.role} of tenant {args.tenant}) added to {args.tokens_file}; "
          "it is shown only now", file=sys.stderr)
    return 0


def cmd_token_list(client: Any, args: argparse.Namespace, out: TextIO) -> int:
    entries = _read(args.tokens_file, missing_ok=False)
    if args.output == "json":
        out.write(output.dumps({"tokens": [{"name": e.name, "tenant": e.tenant, "role": e.role} for e in entries]})
                  + "\n")
        return 0
    out.write(output.table(("NAME", "TENANT", "ROLE"), [(e.name, e.tenant, e.role) for e in entries]) + "\n")
    return 0


def cmd_token_revoke(client: Any, args: argparse.Namespace, out: TextIO) -> int:
    entries = _read(args.tokens_file, missing_ok=False)
    kept = [e for e in entries if e.name != args.name]
    if len(kept) == len(entries):
        raise AdminUsageError(f"--name: {args.tokens_file} has no token named {args.name!r}")
    write_tokens_file(args.tokens_file, kept)
    # The controller re-reads a file it reads in place within a second, but a systemd credential
    # (LoadCredential=, docs/auth.md) is a copy made at start: there the token stays valid until then.
    note = ("a controller reading this file in place stops accepting it within a second; one that reads it "
            "as a systemd credential (LoadCredential=) only after `systemctl restart tessera-controller`")
    if args.output == "json":
        out.write(output.dumps({"name": args.name, "tokens_file": str(args.tokens_file), "removed": True}) + "\n")
        print(f"tessctl: {note}", file=sys.stderr)  # stdout holds the one JSON object
        return 0
    out.write(f"token {args.name!r} removed from {args.tokens_file}\n{note}\n")
    return 0


def _node_id(text: str) -> str:
    if not identity.valid_node_id(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a node id ({identity.NODE_ID_PATTERN})")
    return text


def _host(text: str) -> str:
    """argparse type of --host: refused before the CA is read (exit 2), in pki's own words."""
    try:
        san_hosts([text])
    except PkiError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--host: ")) from None
    return text


def _pki_arguments(admin_sub: Any, command: Command) -> None:
    pki = command(admin_sub, "pki", _needs_group, "a development CA and the daemons' certificates")
    pki_sub = pki.add_subparsers(dest="pki_command", metavar="COMMAND", required=True)

    # Files only: no controller options (and `--controller` here names the identity to issue).
    p = _local(pki_sub, "init", cmd_pki_init, "make a CA (DIR/ca.pem, DIR/ca.key)")
    p.add_argument("--dir", required=True, metavar="DIR", help="the PKI directory (created 0700)")
    p.add_argument("--days", type=argtypes.days, default=CA_DAYS,
                   help=f"validity of the CA, 1 to {argtypes.MAX_DAYS} days (default {CA_DAYS})")
    secret = p.add_mutually_exclusive_group()
    secret.add_argument("--passphrase-file", metavar="FILE", default=None,
                        help="encrypt ca.key under the passphrase on FILE's first line (at least 8 characters)")
    secret.add_argument("--encrypt", action="store_true",
                        help="encrypt ca.key under a passphrase typed at the terminal (twice)")

    p = _local(pki_sub, "issue", cmd_pki_issue,
               "issue a certificate for the controller, the estimator or nodes (DIR/<who>/, a --tls-dir)")
    p.add_argument("--dir", required=True, metavar="DIR", help="the PKI directory made by `admin pki init`")
    who = p.add_mutually_exclusive_group(required=True)
    # dest: tessctl's own `controller` attribute is the controller's address.
    who.add_argument("--controller", dest="issue_controller", action="store_true", help="spiffe://tessera/controller")
    who.add_argument("--estimator", dest="issue_estimator", action="store_true", help="spiffe://tessera/estimator")
    who.add_argument("--node", dest="issue_nodes", nargs="+", type=_node_id, metavar="ID",
                     help="spiffe://tessera/node/ID, one certificate per ID")
    p.add_argument("--host", action="append", default=[], metavar="HOST", type=_host,
                   help="a DNS name or IP address the daemon serves on (repeatable; default: "
                        f"{' and '.join(DEFAULT_HOSTS)})")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="write the files here instead of DIR/<who> (one identity only)")
    p.add_argument("--passphrase-file", metavar="FILE", default=None,
                   help="the passphrase of an encrypted ca.key, on FILE's first line (default: asked at the "
                        "terminal when ca.key is encrypted)")
    # None: the default, which a CA ending sooner cuts (with a warning); a --days given is refused then.
    p.add_argument("--days", type=argtypes.days, default=None,
                   help=f"validity, 1 to {argtypes.MAX_DAYS} days, never past the CA's end "
                        f"(default {CERT_DAYS}, cut to the CA's end when it ends sooner)")


def _local(parent: Any, name: str, func: Callable[..., int], help: str) -> argparse.ArgumentParser:
    """A command that works on files only: tessctl runs it without a controller. It takes -o but
    none of the connection flags (`--controller` of `pki issue` names the identity to issue)."""
    p: argparse.ArgumentParser = parent.add_parser(name, help=help, description=help)
    p.add_argument("-o", "--output", type=formats.output_format, default=argparse.SUPPRESS, metavar="FORMAT",
                   help=f"output format: {formats.CHOICES} (default: table)")
    p.set_defaults(func=func, local=True)
    return p


def _directory(path: str, flag: str) -> None:
    """AdminUsageError when `path`, or the nearest of its parents that exists, is not a directory
    (mkdir would say only "File exists" or "Not a directory")."""
    for p in (Path(path), *Path(path).parents):
        if p.exists():
            if not p.is_dir():
                within = "" if p == Path(path) else f"{path}: "
                raise AdminUsageError(f"{flag}: {within}{p} exists and is not a directory")
            return


def cmd_pki_init(client: Any, args: argparse.Namespace, out: TextIO) -> int:
    _directory(args.dir, "--dir")
    ca = CertificateAuthority.init(args.dir, days=args.days,
                                   passphrase=capassphrase.for_init(args.passphrase_file, args.encrypt))
    if args.output == "json":
        out.write(output.dumps({"ca": str(ca.dir / CA_CERT), "key": str(ca.dir / CA_KEY), "days": args.days}) + "\n")
    else:
        print(f"CA written to {ca.dir / CA_CERT} (key {ca.dir / CA_KEY}, mode 0600)", file=out)
    return 0


def cmd_pki_issue(client: Any, args: argparse.Namespace, out: TextIO) -> int:
    if args.issue_controller:
        who = [identity.CONTROLLER]
    elif args.issue_estimator:
        who = [identity.ESTIMATOR]
    else:
        who = [identity.node(n) for n in dict.fromkeys(args.issue_nodes)]
    if args.out is not None and len(who) > 1:
        raise argtypes.UsageError(f"argument --out: one identity only, not {len(who)} nodes; without --out each "
                                  "node gets DIR/node-ID (see 'tessctl admin pki issue --help')")
    _directory(args.dir, "--dir")
    if args.out is not None:
        _directory(args.out, "--out")
    ca = CertificateAuthority.load(args.dir, capassphrase.for_issue(args.dir, args.passphrase_file))
    days, fit = (CERT_DAYS, True) if args.days is None else (args.days, False)
    now = datetime.datetime.now(datetime.UTC)
    ends = ca.validity_end(days, fit=fit, now=now)  # refused before anything is written
    _say_ca_end(ca, now, cut=ends < now + datetime.timedelta(days=days))
    json_out = args.output == "json"
    issued = []
    for ident in who:
        target = ca.issue(ident, args.host, out=args.out, days=days, fit=fit)
        held = len(bundle_cas(target / CA_CERT))
        until = expires(target / CERT)
        issued.append({"identity": ident.uri, "dir": str(target), "cert": str(target / CERT),
                       "key": str(target / KEY), "ca": str(target / CA_CERT), "cas_trusted": held,
                       "expires": _rfc3339(until)})
        if not json_out:
            print(f"{ident.uri}: {target}/cert.pem, key.pem, ca.pem, valid until {until:%Y-%m-%d %H:%M} UTC "
                  f"(use as --tls-dir {target})", file=out)
        if held > 1:  # a CA rotation's middle round (docs/security.md, "Rotation"); -o json: on stderr
            print(f"{'tessctl: ' if json_out else '  '}{target}/ca.pem trusts {held} CAs (the ones it held, and "
                  "this one): drop the old one once every daemon has its new certificate",
                  file=sys.stderr if json_out else out)
    if json_out:
        out.write(output.dumps({"certificates": issued, "ca_expires": _rfc3339(ca.expires)}) + "\n")
    return 0


def _rfc3339(t: datetime.datetime) -> str:
    return output.rfc3339(t.timestamp()) or ""


def _say_ca_end(ca: CertificateAuthority, now: datetime.datetime, cut: bool) -> None:
    """A warning on stderr (every -o) when the CA ends within CA_WARNING_DAYS: when it does, every
    certificate it signed stops working at once, whatever their own dates, and a rotation takes
    three rounds of restarts (docs/security.md). `cut`: the default life was cut to the CA's end."""
    left = ca.expires - now
    if left >= datetime.timedelta(days=CA_WARNING_DAYS):
        return
    when = f"the CA {ca.dir / CA_CERT} expires on {ca.expires:%Y-%m-%d %H:%M} UTC (in {_days(left)})"
    what = (f"these certificates end with it, not in {CERT_DAYS} days" if cut else
            "every certificate it signed stops working then")
    print(f"tessctl: warning: {when}: {what}; make a new CA and rotate to it (docs/security.md, Rotation)",
          file=sys.stderr)


def _days(left: datetime.timedelta) -> str:
    n = left // datetime.timedelta(days=1)
    return f"{n} day{'s' if n != 1 else ''}" if n else "less than a day"
