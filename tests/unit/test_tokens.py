"""Tokens, their hashes and the tokens-file parser (tessera.common.tokens)."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest

from tessera.common.jobspec import NAME_RE
from tessera.common.tokens import (
    TENANT_RE,
    TOKEN_PREFIX,
    TokenEntry,
    TokensFileError,
    hash_token,
    match,
    new_token,
    parse_tokens,
    read_tokens_file,
    render_tokens_file,
    write_tokens_file,
)
from tessera.common.yamlfile import load_yaml

H = "ab" * 32


def test_new_tokens_are_prefixed_random_and_hash_to_sha256() -> None:
    tokens = {new_token() for _ in range(200)}
    assert len(tokens) == 200
    for t in tokens:
        assert t.startswith(TOKEN_PREFIX) and len(t) == len(TOKEN_PREFIX) + 43
        assert hash_token(t) == hashlib.sha256(t.encode()).hexdigest() != t


def test_match_finds_only_the_exact_token() -> None:
    a, b = new_token(), new_token()
    entries = (TokenEntry("a", "team-a", "user", hash_token(a)), TokenEntry("b", "team-b", "admin", hash_token(b)))
    assert match(entries, a) == entries[0] and match(entries, b) == entries[1]
    for wrong in ("", a[:-1], a + "x", a.upper(), hash_token(a), "x" * 10_000):
        assert match(entries, wrong) is None


def test_tenant_rule_is_the_job_files() -> None:
    assert TENANT_RE is NAME_RE and not TENANT_RE.fullmatch("a/b")


def parse(text: str) -> tuple[TokenEntry, ...]:
    return parse_tokens(load_yaml(text, "t.yaml", TokensFileError))


def test_a_good_file_round_trips_through_render() -> None:
    entries = (TokenEntry("alice@example.com", "team-a", "user", H), TokenEntry("ops", "default", "admin", "cd" * 32))
    assert parse(render_tokens_file(entries)) == entries
    assert parse(render_tokens_file(())) == ()
    assert parse("tokens: []\n") == ()


@pytest.mark.parametrize(("text", "field", "reason"), [
    ("", "", "empty"),
    ("- a\n", "", "must be a mapping"),
    ("users: []\n", "users", "unknown key"),
    ("{}\n", "tokens", "required"),
    ("tokens: 3\n", "tokens", "must be a list"),
    ("tokens: [3]\n", "tokens[0]", "must be a mapping"),
    ("tokens: [{name: a, tenant: t, role: user}]\n", "tokens[0].sha256", "required"),
    (f"tokens: [{{name: a, tenant: t, role: user, sha256: {H}, token: x}}]\n", "tokens[0].token", "unknown key"),
    (f"tokens: [{{name: a, tenant: 12, role: user, sha256: {H}}}]\n", "tokens[0].tenant", "must be a string"),
    (f"tokens: [{{name: 'a b', tenant: t, role: user, sha256: {H}}}]\n", "tokens[0].name", "must match"),
    (f"tokens: [{{name: a, tenant: Team/A, role: user, sha256: {H}}}]\n", "tokens[0].tenant", "must match"),
    (f"tokens: [{{name: a, tenant: t, role: root, sha256: {H}}}]\n", "tokens[0].role", "must be one of user, admin"),
    ("tokens: [{name: a, tenant: t, role: user, sha256: tsr_plaintext}]\n", "tokens[0].sha256", "64 lowercase hex"),
    (f"tokens: [{{name: a, tenant: t, role: user, sha256: {H.upper()}}}]\n", "tokens[0].sha256", "64 lowercase hex"),
    ((f"tokens:\n- {{name: a, tenant: t, role: user, sha256: {H}}}\n- {{name: a, tenant: u, role: user, sha256: "
     f"{'cd' * 32}}}\n"), "tokens[1].name", "named twice"),
    ((f"tokens:\n- {{name: a, tenant: t, role: user, sha256: {H}}}\n- {{name: b, tenant: u, role: user, sha256: "
     f"{H}}}\n"), "tokens[1].sha256", "listed twice"),
])
def test_malformed_documents_name_the_field(text: str, field: str, reason: str) -> None:
    with pytest.raises(TokensFileError) as ei:
        parse(text)
    assert ei.value.field == field and reason in ei.value.reason


def test_file_errors_name_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(f"tokens:\n  - name: a\n    tenant: t\n    role: user\n    sha256: {H}\n"
                    "  - name: b\n    tenant: t\n    role: superuser\n    sha256: " + "cd" * 32 + "\n")
    path.chmod(0o600)
    with pytest.raises(TokensFileError) as ei:
        read_tokens_file(path)
    assert str(ei.value) == f"{path} line 8: field tokens[1].role: must be one of user, admin, got 'superuser'"
    path.write_text("tokens: [a: [b\n")
    with pytest.raises(TokensFileError, match=r"not valid YAML"):
        read_tokens_file(path)
    path.write_text("tokens: &a [*a]\n")  # hostile YAML is the reader's to refuse
    with pytest.raises(TokensFileError):
        read_tokens_file(path)


def test_a_file_others_may_write_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    write_tokens_file(path, [TokenEntry("a", "t", "user", H)])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_tokens_file(path)[0].name == "a"
    for mode in (0o620, 0o602):
        path.chmod(mode)
        with pytest.raises(TokensFileError, match="writable by group or others"):
            read_tokens_file(path)
    path.chmod(0o644)  # readable is fine: it holds hashes only
    assert read_tokens_file(path)[0].name == "a"


def test_a_file_another_user_owns_or_may_replace_is_refused(tmp_path: Path) -> None:
    """An audit's nobody renamed its own 0600 file over the tokens file in a 0777 folder, and within a
    second was admin while the real admin was UNAUTHENTICATED."""
    import os

    folder = tmp_path / "etc"
    folder.mkdir()
    path = folder / "tokens.yaml"
    write_tokens_file(path, [TokenEntry("a", "t", "user", H)])
    folder.chmod(0o777)
    with pytest.raises(TokensFileError, match="its folder .* is writable by group or others"):
        read_tokens_file(path)
    folder.chmod(0o1777)  # sticky, as /tmp: nobody cannot rename over a file it does not own
    assert read_tokens_file(path)[0].name == "a"
    folder.chmod(0o755)
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)
        with pytest.raises(TokensFileError, match="owned by uid 65534"):
            read_tokens_file(path)
