"""The controller's tokens file on real processes: refused when malformed, re-read when it changes,
failing closed while broken; and the unauthenticated mode, which must say so (docs/auth.md)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tessera.clients.sdk import Client, RpcError
from tessera.v1 import common_pb2 as P
from tests.procs import BIN, REPO, env, start_controller, wait_for


def tessctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "tessctl"), *args], capture_output=True, text=True, env=env(), cwd=REPO,
                          timeout=60, check=False)


def create_token(tokens: Path, name: str, tenant: str, role: str) -> str:
    cp = tessctl("admin", "token", "create", "--tokens-file", str(tokens), "--name", name, "--tenant", tenant,
                 "--role", role)
    assert cp.returncode == 0, cp.stderr
    token = cp.stdout.strip()
    assert token.startswith("tsr_") and len(token.splitlines()) == 1
    assert token not in tokens.read_text()
    return token


def code(client: Client) -> str:
    try:
        client.whoami()
    except RpcError as exc:
        return str(exc.code)
    return "OK"


def start_refused(tmp_path: Path, tokens: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "tessera-controller"), "--listen", "127.0.0.1:0", "--state-dir",
                           str(tmp_path / "state"), "--tokens", str(tokens), "--insecure"],
                          capture_output=True, text=True, env=env(), timeout=60, check=False)


def test_malformed_tokens_file_stops_the_controller_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "tokens.yaml"
    bad.write_text("tokens:\n  - name: ops\n    tenant: team-a\n    role: root\n    sha256: " + "ab" * 32 + "\n")
    bad.chmod(0o600)
    cp = start_refused(tmp_path, bad)
    assert cp.returncode == 1
    assert cp.stderr.strip() == (f"tessera-controller: error: {bad} line 4: field tokens[0].role: must be one of "
                                 "user, admin, got 'root'")
    bad.write_text("tokens:\n  - name: ops\n    tenant: team-a\n    role: user\n    sha256: tsr_abc\n")
    assert "line 5: field tokens[0].sha256: must be 64 lowercase hex digits" in start_refused(tmp_path, bad).stderr
    bad.write_text("tokens: []\nextra: 1\n")
    assert "line 2: field extra: unknown key" in start_refused(tmp_path, bad).stderr
    bad.chmod(0o666)
    bad.write_text("tokens: []\n")
    assert "writable by group or others" in start_refused(tmp_path, bad).stderr
    cp = start_refused(tmp_path, tmp_path / "missing.yaml")
    assert cp.returncode == 1 and "missing.yaml: cannot read" in cp.stderr and len(cp.stderr.splitlines()) == 1


def test_tokens_file_is_reread_when_it_changes_and_fails_closed_while_broken(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    admin = create_token(tokens, "root", "ops", "admin")
    assert oct(tokens.stat().st_mode & 0o777) == "0o600"
    ctl = start_controller(tmp_path / "state", "--tokens", str(tokens))
    try:
        with Client(ctl.address, token=admin) as root:
            assert root.whoami().principal == "root"
            carol = create_token(tokens, "carol", "team-c", "user")
            with Client(ctl.address, token=carol) as c:
                wait_for(lambda: code(c) == "OK", 20, "carol's new token accepted")
                assert c.whoami().tenant == "team-c"
                ctl.wait_event("tokens_loaded", tokens=2)
                cp = tessctl("admin", "token", "revoke", "--tokens-file", str(tokens), "--name", "carol")
                assert cp.returncode == 0, cp.stderr
                wait_for(lambda: code(c) == "UNAUTHENTICATED", 20, "carol's revoked token refused")
            good = tokens.read_text()
            tokens.write_text(good.replace("role: \"admin\"", "role: \"boss\""))
            wait_for(lambda: code(root) == "UNAVAILABLE", 20, "every call refused while the file is broken")
            ctl.wait_event("tokens_file_broken")
            tokens.write_text(good)
            wait_for(lambda: code(root) == "OK", 20, "calls accepted again once the file is fixed")
    finally:
        ctl.stop()


def test_an_open_stream_ends_when_its_token_is_revoked(tmp_path: Path) -> None:
    """A watch opened before the revocation sends nothing after it: its next message is refused."""
    tokens = tmp_path / "tokens.yaml"
    admin = create_token(tokens, "root", "ops", "admin")
    carol = create_token(tokens, "carol", "team-c", "user")
    ctl = start_controller(tmp_path / "state", "--tokens", str(tokens))
    spec = P.JobSpec(name="secret", tenant="team-c", model=P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4,
                     vocab_size=256, seq_length=64), global_batch_size=8, iterations=10, env={"API_KEY": "s3cr3t"})
    try:
        with Client(ctl.address, token=admin) as root, Client(ctl.address, token=carol) as c:
            updates = c.watch_jobs(timeout=60)
            while not next(updates).batch_end:
                pass
            cp = tessctl("admin", "token", "revoke", "--tokens-file", str(tokens), "--name", "carol")
            assert cp.returncode == 0, cp.stderr
            wait_for(lambda: code(c) == "UNAUTHENTICATED", 20, "carol's revoked token refused")
            root.submit(spec)
            with pytest.raises(RpcError) as err:
                next(updates)
            assert str(err.value.code) == "UNAUTHENTICATED"
    finally:
        ctl.stop()


def test_without_a_tokens_file_everyone_is_anonymous_and_the_log_says_so(tmp_path: Path) -> None:
    ctl = start_controller(tmp_path / "state", auth=False)
    try:
        assert "--tokens" not in ctl.argv and ctl.token is None
        warning = ctl.wait_event("insecure_api")
        assert warning["level"] == "warning"
        with Client(ctl.address) as c:
            me = c.whoami()
            assert (me.principal, me.tenant, me.role) == ("anonymous", "", "insecure")
            assert c.list() == []
    finally:
        ctl.stop()


def test_token_files_are_private(tmp_path: Path) -> None:
    tokens = tmp_path / "t.yaml"
    old = os.umask(0o000)  # even a permissive umask yields 0600
    try:
        create_token(tokens, "u1", "team-a", "user")
    finally:
        os.umask(old)
    assert tokens.stat().st_mode & 0o777 == 0o600
    cp = tessctl("admin", "token", "create", "--tokens-file", str(tokens), "--name", "u1", "--tenant", "team-a",
                 "--role", "user")
    assert cp.returncode == 1 and "already has a token named 'u1'" in cp.stderr
    listed = tessctl("admin", "token", "list", "--tokens-file", str(tokens), "-o", "json")
    assert listed.returncode == 0 and '"name": "u1"' in listed.stdout and "sha256" not in listed.stdout
