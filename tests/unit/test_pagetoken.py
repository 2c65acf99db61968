"""ListJobs continue tokens: round trip, and every kind of tampering refused naming the field."""

from __future__ import annotations

import base64

import pytest

from tessera.common.errors import InvalidArgument
from tessera.controller.core import pagetoken

KEY = b"k" * 32


def test_round_trip_binds_the_filters() -> None:
    tok = pagetoken.encode(KEY, [3, 1], "research", (1699740800.123456, "j-0123456789ab"))
    assert pagetoken.decode(KEY, tok, [1, 3], "research") == (1699740800.123456, "j-0123456789ab")
    assert tok.isascii() and "=" not in tok and len(tok) < 100


def _flip(token: str, at: int) -> str:
    raw = bytearray(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    raw[at] ^= 0x01
    return base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")


@pytest.mark.parametrize("mutate, reason", [
    (lambda t: _flip(t, 10), "not issued by this controller"),  # the submit time
    (lambda t: _flip(t, 20), "not issued by this controller"),  # the job id
    (lambda t: _flip(t, -1), "not issued by this controller"),  # the MAC
    (lambda t: t[:-4], "not issued by this controller"),
    (lambda t: "", "malformed"),
    (lambda t: "AAAA", "malformed"),
    (lambda t: "%%%not base64%%%", "malformed"),
    (lambda t: t + "=" * 3 + "x", "malformed"),
    (lambda t: "A" * 600, "longer than 512"),
])
def test_tampered_tokens_are_refused(mutate: object, reason: str) -> None:
    tok = pagetoken.encode(KEY, [], "", (5.0, "j-0123456789ab"))
    with pytest.raises(InvalidArgument) as ei:
        pagetoken.decode(KEY, mutate(tok), [], "")  # type: ignore[operator]
    assert ei.value.field == "continue_token" and reason in ei.value.reason


def test_other_key_or_other_filters_are_refused() -> None:
    tok = pagetoken.encode(KEY, [1], "a", (5.0, "j-1"))
    with pytest.raises(InvalidArgument, match="another key"):
        pagetoken.decode(b"x" * 32, tok, [1], "a")
    with pytest.raises(InvalidArgument, match="other filters"):
        pagetoken.decode(KEY, tok, [1], "b")  # another tenant's listing
    with pytest.raises(InvalidArgument, match="other filters"):
        pagetoken.decode(KEY, tok, [], "a")
