"""What the SDK dials with: the README exports TESSERA_TOKEN and TESSERA_CA and then builds a
`Client` with neither argument; the token must come from the environment as the CA does (it did
not: every call was UNAUTHENTICATED), and an argument wins over the environment."""

from __future__ import annotations

import pytest

from tessera.clients import sdk


def test_the_token_defaults_to_tessera_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_TOKEN", "tsr_env")
    targets, metadata, tls = sdk.connection("h:1", None, None, insecure=True)
    assert targets == ["h:1"] and metadata == (("authorization", "Bearer tsr_env"),) and tls is None
    _, given, _ = sdk.connection("h:1", "tsr_arg", None, insecure=True)
    assert given == (("authorization", "Bearer tsr_arg"),)


def test_no_token_anywhere_sends_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TESSERA_TOKEN", raising=False)
    _, metadata, _ = sdk.connection("h:1", None, None, insecure=True)
    assert metadata == ()
