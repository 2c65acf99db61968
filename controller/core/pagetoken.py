"""ListJobs continue tokens: opaque to clients, checked by the controller (docs/cli.md, "Pages").

A token holds the key of the last job of a page, (submit_time, id), and a digest of the filters it
was issued for, signed with HMAC-SHA256 under the controller's token key. A token that was altered,
issued under another key, or comes back with other filters is refused (InvalidArgument naming
`continue_token`), never half-trusted: the next page starts strictly after the key, whatever
happened to that job since (keyset paging).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct
from collections.abc import Iterable

from tessera.common.errors import InvalidArgument

VERSION = 1
MAX_TOKEN_CHARS = 512
_MAC_BYTES = 16
_HEAD = struct.Struct(">B8sd")  # version, filter digest, submit_time
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
FIELD = "continue_token"


def filter_digest(states: Iterable[int], tenant: str) -> bytes:
    text = ",".join(str(s) for s in sorted(set(states))) + "|" + tenant
    return hashlib.sha256(text.encode()).digest()[:8]


def encode(key: bytes, states: Iterable[int], tenant: str, after: tuple[float, str]) -> str:
    body = _HEAD.pack(VERSION, filter_digest(states, tenant), after[0]) + after[1].encode()
    mac = hmac.new(key, body, hashlib.sha256).digest()[:_MAC_BYTES]
    return base64.urlsafe_b64encode(body + mac).decode().rstrip("=")


def decode(key: bytes, token: str, states: Iterable[int], tenant: str) -> tuple[float, str]:
    """The (submit_time, id) a token continues after; InvalidArgument(continue_token) if it is not
    one this key issued for these filters."""
    if len(token) > MAX_TOKEN_CHARS:
        raise InvalidArgument(FIELD, f"longer than {MAX_TOKEN_CHARS} characters")
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument(FIELD, "malformed: pass back the token of the previous page unchanged") from None
    if len(raw) < _HEAD.size + 1 + _MAC_BYTES:
        raise InvalidArgument(FIELD, "malformed: pass back the token of the previous page unchanged")
    body, mac = raw[:-_MAC_BYTES], raw[-_MAC_BYTES:]
    if not hmac.compare_digest(mac, hmac.new(key, body, hashlib.sha256).digest()[:_MAC_BYTES]):
        raise InvalidArgument(FIELD, "not issued by this controller (altered, or signed under another key)")
    version, digest, submit_time = _HEAD.unpack_from(body)
    if version != VERSION:
        raise InvalidArgument(FIELD, f"version {version} is not understood")
    if not hmac.compare_digest(digest, filter_digest(states, tenant)):
        raise InvalidArgument(FIELD, "issued for other filters (states, tenant): keep them the same across pages")
    try:
        job_id = body[_HEAD.size:].decode()
    except UnicodeDecodeError:
        raise InvalidArgument(FIELD, "malformed") from None
    if not _ID_RE.fullmatch(job_id):
        raise InvalidArgument(FIELD, "malformed")
    return submit_time, job_id
