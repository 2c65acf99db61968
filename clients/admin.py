"""`tessctl admin ...`: operators' commands (docs/security.md, docs/cli.md).

    tessctl admin pki init  --dir DIR                      a development CA in DIR
    tessctl admin pki issue --dir DIR --controller         DIR/controller/{ca,cert,key}.pem
    tessctl admin pki issue --dir DIR --node ID [ID ...]   DIR/node-ID/... for each node
    tessctl admin pki issue --dir DIR --estimator          DIR/estimator/...

`add_arguments(subparsers, command)` registers the `admin` command; each group of sub-commands
(`pki` here) is one function, so another group (`token`) goes beside it. A command that needs no
controller sets `local=True` in its defaults: tessctl then runs it without connecting.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TextIO

from tessera.common import identity
from tessera.common.pki import CA_DAYS, CERT_DAYS, DEFAULT_HOSTS, CertificateAuthority, PkiError

Command = Callable[..., argparse.ArgumentParser]


def add_arguments(sub: Any, command: Command) -> None:
    """Register `tessctl admin`; `command(parent, name, func, help)` is tessctl's helper."""
    admin = command(sub, "admin", _needs_subcommand, "operators' commands: certificates (pki)")
    admin_sub = admin.add_subparsers(dest="admin_command", metavar="COMMAND", required=True)
    _pki_arguments(admin_sub, command)


def _needs_subcommand(client: Any, args: argparse.Namespace, out: TextIO) -> int:
    raise AssertionError("argparse requires a sub-command")


def _node_id(text: str) -> str:
    if not identity.valid_node_id(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a node id ({identity.NODE_ID_PATTERN})")
    return text


def _days(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return value


def _pki_arguments(admin_sub: Any, command: Command) -> None:
    pki = command(admin_sub, "pki", _needs_subcommand, "a development CA and the daemons' certificates")
    pki_sub = pki.add_subparsers(dest="pki_command", metavar="COMMAND", required=True)

    # Files only: no controller options (and `--controller` here names the identity to issue).
    p = _local(pki_sub, "init", cmd_pki_init, "make a CA (DIR/ca.pem, DIR/ca.key)")
    p.add_argument("--dir", required=True, metavar="DIR", help="the PKI directory (created 0700)")
    p.add_argument("--days", type=_days, default=CA_DAYS, help=f"validity of the CA (default {CA_DAYS})")

    p = _local(pki_sub, "issue", cmd_pki_issue,
               "issue a certificate for the controller, the estimator or nodes (DIR/<who>/, a --tls-dir)")
    p.add_argument("--dir", required=True, metavar="DIR", help="the PKI directory made by `admin pki init`")
    who = p.add_mutually_exclusive_group(required=True)
    # dest: tessctl's own `controller` attribute is the controller's address.
    who.add_argument("--controller", dest="issue_controller", action="store_true", help="spiffe://tessera/controller")
    who.add_argument("--estimator", dest="issue_estimator", action="store_true", help="spiffe://tessera/estimator")
    who.add_argument("--node", dest="issue_nodes", nargs="+", type=_node_id, metavar="ID",
                     help="spiffe://tessera/node/ID, one certificate per ID")
    p.add_argument("--host", action="append", default=[], metavar="HOST",
                   help="a DNS name or IP address the daemon serves on (repeatable; default: "
                        f"{' and '.join(DEFAULT_HOSTS)})")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="write the files here instead of DIR/<who> (one identity only)")
    p.add_argument("--days", type=_days, default=CERT_DAYS, help=f"validity (default {CERT_DAYS})")


def _local(parent: Any, name: str, func: Callable[..., int], help: str) -> argparse.ArgumentParser:
    """A command that works on files only: tessctl runs it without a controller."""
    p: argparse.ArgumentParser = parent.add_parser(name, help=help, description=help)
    p.set_defaults(func=func, local=True)
    return p


def cmd_pki_init(client: Any, args: argparse.Namespace, out: TextIO) -> int:
    ca = CertificateAuthority.init(args.dir, days=args.days)
    print(f"CA written to {ca.dir / 'ca.pem'} (key {ca.dir / 'ca.key'}, mode 0600)", file=out)
    return 0


def cmd_pki_issue(client: Any, args: argparse.Namespace, out: TextIO) -> int:
    if args.issue_controller:
        who = [identity.CONTROLLER]
    elif args.issue_estimator:
        who = [identity.ESTIMATOR]
    else:
        who = [identity.node(n) for n in dict.fromkeys(args.issue_nodes)]
    if args.out is not None and len(who) > 1:
        raise PkiError("--out: one identity only; without --out each node gets DIR/node-ID")
    ca = CertificateAuthority.load(args.dir)
    for ident in who:
        target = ca.issue(ident, args.host, out=args.out, days=args.days)
        print(f"{ident.uri}: {target}/cert.pem, key.pem, ca.pem (use as --tls-dir {target})", file=out)
    return 0
