"""`tessctl admin ...`: operator tools that work on files, not on a controller (docs/auth.md).

    tessctl admin token create --tokens-file F --name N --tenant T --role user|admin
    tessctl admin token list   --tokens-file F
    tessctl admin token revoke --tokens-file F --name N

Each group is one `_add_*` function under `add_arguments`, so other groups (the development PKI)
sit beside `token` without touching it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

from tessera.clients import output
from tessera.common.errors import InvalidInput
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

ADMIN_HELP = "operator tools on local files: API tokens"


class AdminUsageError(InvalidInput):
    """A bad `tessctl admin` request (a taken name, an unknown one): exit 1 with one line."""


def add_arguments(sub: Any, command: Any) -> None:
    """The `admin` command and its groups (command(parent, name, func, help))."""
    admin = command(sub, "admin", _needs_group, ADMIN_HELP)
    groups = admin.add_subparsers(dest="group", metavar="GROUP", required=True)
    _add_token(groups, command)


def _needs_group(client: Any, args: argparse.Namespace, out: TextIO) -> int:
    raise AssertionError("argparse requires a group")


def _add_token(groups: Any, command: Any) -> None:
    token = command(groups, "token", _needs_group, "API tokens in a controller's tokens file (--tokens)")
    ts = token.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = command(ts, "create", cmd_token_create,
                "make a token, print it once and add its SHA-256 to the tokens file (created 0600 if missing)")
    _tokens_file(p)
    p.add_argument("--name", required=True, help="who holds it: [A-Za-z0-9][A-Za-z0-9._@-]{0,62}, unique in the file")
    p.add_argument("--tenant", required=True, help="the tenant its calls act for: [a-z0-9][a-z0-9-]{0,62}")
    p.add_argument("--role", required=True, choices=ROLES, help="user: its tenant's jobs; admin: every tenant, nodes")
    p = command(ts, "list", cmd_token_list, "the names, tenants and roles in the tokens file")
    _tokens_file(p)
    p = command(ts, "revoke", cmd_token_revoke, "remove a token from the tokens file (the controller re-reads it)")
    _tokens_file(p)
    p.add_argument("--name", required=True, help="the token's name")


def _tokens_file(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens-file", required=True, type=Path, metavar="FILE",
                   help="the file the controller reads with --tokens")


def _read(path: Path, missing_ok: bool) -> tuple[TokenEntry, ...]:
    if missing_ok and not path.exists():
        return ()
    return read_tokens_file(path)


def cmd_token_create(client: Any, args: argparse.Namespace, out: TextIO) -> int:
    if not PRINCIPAL_RE.match(args.name):
        raise AdminUsageError("--name: must match [A-Za-z0-9][A-Za-z0-9._@-]{0,62}")
    if not TENANT_RE.fullmatch(args.tenant):
        raise AdminUsageError("--tenant: must match [a-z0-9][a-z0-9-]{0,62}")
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
    out.write(f"token {args.name!r} removed from {args.tokens_file}\n")
    return 0
