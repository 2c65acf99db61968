"""Bearer tokens of the Controller API, the principals they stand for, and their one file format.

A token is `tsr_` + 43 URL-safe characters (secrets.token_urlsafe(32): 256 random bits). The
tokens file keeps only each token's SHA-256: a plain hash is enough for a secret that random (no
dictionary to try), and whoever reads the file cannot call the API with it. `tessctl admin token
create` (tessera.clients.admin) writes the file; the controller reads it (`--tokens FILE`,
tessera.controller.auth). Both sides parse it here, with the hardened YAML reader, so a malformed
file reads `FILE line N: field F: why` wherever it is met. docs/auth.md describes the format.

    tokens:
      - name: alice          # who holds it: shown by WhoAmI and in the controller's audit log
        tenant: team-a       # the tenant its calls act for (the job file's tenant rule)
        role: user           # user | admin
        sha256: 9f86d0...    # hex SHA-256 of the token
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.common.jobspec import NAME_RE
from tessera.common.privatefile import others_may_replace, write_private
from tessera.common.yamlfile import (
    MAX_BYTES,
    InputFileError,
    load_yaml,
    parse_with_lines,
    refuse_unknown_keys,
)

TOKEN_PREFIX = "tsr_"
USER, ADMIN = "user", "admin"
ROLES = (USER, ADMIN)
# The role of every caller of a controller that runs without a tokens file: allowed everything.
INSECURE = "insecure"
MAX_TOKEN_CHARS = 256  # a presented token longer than this is refused before it is hashed
# The job file's tenant rule, which never admits a "/" (request ids are stored as tenant/id).
TENANT_RE = NAME_RE
PRINCIPAL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,62}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_ENTRY_KEYS = ("name", "tenant", "role", "sha256")


@dataclass(frozen=True)
class Principal:
    """Who a call comes from: a token's name, the tenant it acts for, its role."""

    name: str
    tenant: str
    role: str

    @property
    def sees_all(self) -> bool:
        """Admins (and everyone on an unauthenticated controller) act across tenants."""
        return self.role in (ADMIN, INSECURE)


# Every caller of a controller without a tokens file. No tenant: a job it submits without one gets
# the controller's default tenant.
ANONYMOUS = Principal("anonymous", "", INSECURE)


@dataclass(frozen=True)
class TokenEntry:
    name: str
    tenant: str
    role: str
    sha256: str

    def principal(self) -> Principal:
        return Principal(self.name, self.tenant, self.role)


class TokensFileError(InputFileError):
    """A tokens file that cannot be used: `FILE line N: field F: why`."""


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def match(entries: Iterable[TokenEntry], token: str) -> TokenEntry | None:
    """The entry `token` belongs to, or None. Every entry is compared in constant time, so how long
    the answer takes says nothing about how close a guess came."""
    if not token or len(token) > MAX_TOKEN_CHARS:
        return None
    digest = hash_token(token)
    found = None
    for e in entries:
        if hmac.compare_digest(e.sha256, digest):
            found = e
    return found


def parse_tokens(doc: Any) -> tuple[TokenEntry, ...]:
    """The entries of a tokens document (as read by the YAML reader); TokensFileError naming the field."""
    if doc is None:
        raise TokensFileError("", "empty; expected a mapping with a tokens: list")
    if not isinstance(doc, dict):
        raise TokensFileError("", "must be a mapping with a tokens: list")
    refuse_unknown_keys(doc, ("tokens",), "", TokensFileError)
    if "tokens" not in doc:
        raise TokensFileError("tokens", "required (a list; [] for none)")
    items = doc["tokens"]
    if not isinstance(items, list):
        raise TokensFileError("tokens", "must be a list ([] for none)")
    out: list[TokenEntry] = []
    names: set[str] = set()
    hashes: set[str] = set()
    for i, item in enumerate(items):
        at = f"tokens[{i}]"
        if not isinstance(item, dict):
            raise TokensFileError(at, "must be a mapping of name, tenant, role, sha256")
        refuse_unknown_keys(item, _ENTRY_KEYS, at, TokensFileError)
        values = {}
        for key in _ENTRY_KEYS:
            if key not in item:
                raise TokensFileError(f"{at}.{key}", "required")
            if not isinstance(item[key], str):
                raise TokensFileError(f"{at}.{key}", "must be a string (quote it)")
            values[key] = item[key]
        entry = TokenEntry(**values)
        _check_entry(entry, at)
        if entry.name in names:
            raise TokensFileError(f"{at}.name", f"{entry.name!r} is named twice")
        if entry.sha256 in hashes:
            raise TokensFileError(f"{at}.sha256", "the same token is listed twice")
        names.add(entry.name)
        hashes.add(entry.sha256)
        out.append(entry)
    return tuple(out)


def _check_entry(e: TokenEntry, at: str) -> None:
    if not PRINCIPAL_RE.fullmatch(e.name):
        raise TokensFileError(f"{at}.name", "must match [A-Za-z0-9][A-Za-z0-9._@-]{0,62}")
    if not TENANT_RE.fullmatch(e.tenant):
        raise TokensFileError(f"{at}.tenant", "must match [a-z0-9][a-z0-9-]{0,62} (the job file's tenant rule)")
    if e.role not in ROLES:
        raise TokensFileError(f"{at}.role", f"must be one of {', '.join(ROLES)}, got {e.role!r}")
    if not SHA256_RE.fullmatch(e.sha256):
        raise TokensFileError(f"{at}.sha256", "must be 64 lowercase hex digits (the SHA-256 of the token, "
                                              "never the token itself)")


def read_tokens_file(path: str | Path) -> tuple[TokenEntry, ...]:
    """Read and check a tokens file. Refused as well (whoever can write it, or replace it, can make
    themselves admin): a file group or others may write, one owned by another user than root or
    this process, and one in a folder group or others may write (without the sticky bit)."""
    file = str(path)
    try:
        with open(path, "rb") as f:
            st_file = os.fstat(f.fileno())
            mode, owner = st_file.st_mode, st_file.st_uid
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise TokensFileError("", f"cannot read: {exc.strerror or exc}", file=file) from None
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise TokensFileError("", f"writable by group or others (mode {stat.S_IMODE(mode):04o}); "
                                  "chmod 600 it", file=file)
    if owner not in (0, os.geteuid()):
        raise TokensFileError("", f"owned by uid {owner}, neither root nor this process (uid {os.geteuid()}): "
                                  "whoever owns it can make themselves admin", file=file)
    folder = os.path.dirname(os.path.realpath(path))
    st = os.stat(folder)
    if others_may_replace(st.st_mode):
        # Another user may rename their own file over this one (an audit's nobody became admin so).
        raise TokensFileError("", f"its folder {folder} is writable by group or others "
                                  f"(mode {stat.S_IMODE(st.st_mode):04o}): chmod go-w it", file=file)
    return parse_with_lines(load_yaml(raw, file, TokensFileError), file, parse_tokens)


def render_tokens_file(entries: Sequence[TokenEntry]) -> str:
    """The file for `entries`; every value quoted (JSON strings are YAML strings)."""
    head = ("# Tessera API tokens (docs/auth.md): the SHA-256 of each token, never the token itself.\n"
            "# Written by `tessctl admin token create`; the controller re-reads it when it changes.\n")
    if not entries:
        return head + "tokens: []\n"
    lines = [head + "tokens:"]
    for e in entries:
        lines.append(f"  - name: {json.dumps(e.name)}")
        lines += [f"    {k}: {json.dumps(getattr(e, k))}" for k in _ENTRY_KEYS[1:]]
    return "\n".join(lines) + "\n"


def write_tokens_file(path: str | Path, entries: Sequence[TokenEntry]) -> None:
    """Replace the file atomically (a reader sees the old or the new file, never half), mode 0600."""
    write_private(Path(path), render_tokens_file(entries))
