"""tessctl's config file, contexts and the precedence flag > env > context > default (clients/config.py)."""

from __future__ import annotations

import io
import json
import stat
from pathlib import Path

import pytest

from tessera.clients import tessctl
from tessera.clients.config import (
    DEFAULT_CONTROLLER,
    Config,
    ConfigFileError,
    Settings,
    load_config,
    resolve,
)
from tessera.clients.tessctl import main

CONFIG = """\
# my clusters
current-context: prod
contexts:
  prod:
    controller: [ctl-1:50051, ctl-2:50051]
    ca: certs/ca.pem
    token_file: prod.token
  dev:
    controller: 127.0.0.1:6000
    token: tsr_devtoken   # inline
  bare: {}
"""

NONE = {"context": None, "controller": None, "token": None, "ca": None}


@pytest.fixture
def cfg_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    path.chmod(0o600)
    (tmp_path / "prod.token").write_text("tsr_prodtoken\n")
    (tmp_path / "prod.token").chmod(0o600)
    monkeypatch.setenv("TESSERA_CONFIG", str(path))
    for var in ("TESSERA_CONTROLLER", "TESSERA_TOKEN", "TESSERA_CA"):
        monkeypatch.delenv(var, raising=False)
    return path


def test_context_values_and_relative_paths(cfg_file: Path) -> None:
    cfg = load_config(cfg_file, explicit=True)
    assert cfg.current == "prod" and list(cfg.contexts) == ["prod", "dev", "bare"]
    s = resolve(NONE, {}, cfg)
    assert s.controllers == ("ctl-1:50051", "ctl-2:50051") and s.token == "tsr_prodtoken"
    assert s.ca == str(cfg_file.parent / "certs/ca.pem") and s.context == "prod"
    assert s.sources == {"controller": "context prod", "token": "context prod", "ca": "context prod"}
    dev = resolve({**NONE, "context": "dev"}, {}, cfg)
    assert (dev.controllers, dev.token, dev.ca) == (("127.0.0.1:6000",), "tsr_devtoken", None)
    bare = resolve({**NONE, "context": "bare"}, {}, cfg)
    assert (bare.controllers, bare.token, bare.sources["controller"]) == ((DEFAULT_CONTROLLER,), None, "default")


def test_flags_beat_env_beat_context_beat_default(cfg_file: Path) -> None:
    cfg = load_config(cfg_file, explicit=True)
    env = {"TESSERA_CONTROLLER": "env-host:1,env-host:2", "TESSERA_TOKEN": "tsr_env", "TESSERA_CA": "/env/ca"}
    s = resolve(NONE, env, cfg)
    assert (s.controllers, s.token, s.ca) == (("env-host:1", "env-host:2"), "tsr_env", "/env/ca")
    flags = {"context": "dev", "controller": "flag-host:9", "token": "tsr_flag", "ca": "/flag/ca"}
    s = resolve(flags, env, cfg)
    assert (s.controllers, s.token, s.ca) == (("flag-host:9",), "tsr_flag", "/flag/ca")
    assert s.sources == {"controller": "flag", "token": "flag", "ca": "flag"}
    s = resolve({**NONE, "token": "tsr_flag"}, {"TESSERA_CONTROLLER": "e:1"}, cfg)
    assert (s.controllers, s.token, s.ca) == (("e:1",), "tsr_flag", str(cfg_file.parent / "certs/ca.pem"))
    empty = resolve(NONE, {}, Config(""))
    assert (empty.controllers, empty.token, empty.ca, empty.context) == ((DEFAULT_CONTROLLER,), None, None, "")


def test_the_token_file_is_read_only_when_its_token_is_used(cfg_file: Path) -> None:
    (cfg_file.parent / "prod.token").unlink()
    cfg = load_config(cfg_file, explicit=True)
    assert resolve({**NONE, "token": "tsr_flag"}, {}, cfg).token == "tsr_flag"
    with pytest.raises(ConfigFileError, match="prod.token: cannot read the token"):
        resolve(NONE, {}, cfg)


def test_an_unknown_context_is_an_error(cfg_file: Path) -> None:
    with pytest.raises(ConfigFileError, match="--context: no context named 'qa'"):
        resolve({**NONE, "context": "qa"}, {}, load_config(cfg_file, explicit=True))


@pytest.mark.parametrize(("text", "message"), [
    ("contexts: {a: {controller: nohost}}\n", "line 1: field contexts.a.controller: 'nohost' is not host:port"),
    ("contexts: {a: {server: h:1}}\n", "line 1: field contexts.a.server: unknown key"),
    ("contexts: {a: {token: t, token_file: f}}\n", "field contexts.a.token: give token or token_file, not both"),
    ("current-context: b\ncontexts: {a: {}}\n", "line 1: field current-context: no context named 'b'"),
    ("users: []\n", "field users: unknown key"),
    ("contexts: {'a b': {}}\n", "a context name must match"),
])
def test_malformed_config_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigFileError) as ei:
        load_config(path, explicit=True)
    assert str(ei.value).startswith(str(path)) and message in str(ei.value)


def test_missing_files(tmp_path: Path) -> None:
    assert load_config(tmp_path / "none.yaml", explicit=False).contexts == {}
    with pytest.raises(ConfigFileError, match="cannot read"):
        load_config(tmp_path / "none.yaml", explicit=True)


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def test_config_view_redacts_tokens(cfg_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, text = run("config", "view", "--context", "dev")
    assert rc == 0 and "tsr_devtoken" not in text and "REDACTED" in text and "tsr_prodtoken" not in text
    rc, text = run("config", "view", "-o", "json", "--token", "tsr_secret_flag")
    doc = json.loads(text)
    assert rc == 0 and "tsr_secret_flag" not in text
    assert doc["contexts"]["dev"]["token"] == "REDACTED" and doc["contexts"]["prod"]["token_file"] == "prod.token"
    assert doc["effective"]["token"] == "REDACTED" and doc["effective"]["sources"]["token"] == "flag"
    assert doc["effective"]["controller"] == ["ctl-1:50051", "ctl-2:50051"]


def test_config_view_shows_the_file_when_its_settings_cannot_be_used(cfg_file: Path) -> None:
    """The current context's token file is missing: every command fails on it, and `view`, the way
    to see why, failed the same way before."""
    (cfg_file.parent / "prod.token").unlink()
    rc, text = run("config", "view", "-o", "json")
    doc = json.loads(text)
    assert rc == 1 and doc["contexts"]["prod"]["token_file"] == "prod.token"
    assert "prod.token: cannot read the token" in doc["effective"]["error"]


def test_get_contexts_and_use_context_keep_the_rest_of_the_file(cfg_file: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    rc, text = run("config", "get-contexts")
    lines = text.splitlines()
    assert rc == 0 and lines[0].split() == ["CURRENT", "NAME", "CONTROLLER", "CA", "TOKEN"]
    assert lines[1].split()[:3] == ["*", "prod", "ctl-1:50051,ctl-2:50051"] and "tsr_devtoken" not in text
    rc, _ = run("config", "use-context", "dev")
    assert rc == 0
    after = cfg_file.read_text()
    assert after == CONFIG.replace("current-context: prod", 'current-context: "dev"')  # comments kept
    assert stat.S_IMODE(cfg_file.stat().st_mode) == 0o600
    assert load_config(cfg_file, explicit=True).current == "dev"
    rc, _ = run("config", "use-context", "nope")
    assert rc == 1 and "no context named 'nope'" in capsys.readouterr().err
    assert cfg_file.read_text() == after


def test_a_readable_config_with_an_inline_token_warns(cfg_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg_file.chmod(0o644)
    assert run("config", "get-contexts")[0] == 0
    assert "holds a token and others may read it" in capsys.readouterr().err


def test_a_token_file_others_may_read_warns_once_and_still_works(cfg_file: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """As ssh with a key file: one warning naming the file, its mode and the fix; the token is used.
    Before: no warning at all (only an inline token in the config file was checked)."""
    token = cfg_file.parent / "prod.token"
    token.chmod(0o644)
    used: list[str | None] = []

    class Fake:
        def nodes(self) -> list[object]:
            return []

        def close(self) -> None:
            pass

    def connect(settings: Settings, *_: object, **__: object) -> Fake:
        used.append(settings.token)
        return Fake()

    monkeypatch.setattr(tessctl, "connect", connect)
    assert run("get", "nodes", "-o", "json") == (0, '{\n  "nodes": []\n}\n') and used == ["tsr_prodtoken"]
    assert capsys.readouterr().err == (f"tessctl: warning: token file {token} (context prod): others may read it "
                                       f"(mode 0644); chmod 600 {token}\n")
    rc, text = run("config", "view", "-o", "json")
    assert rc == 0 and json.loads(text)["effective"]["token"] == "REDACTED"
    assert capsys.readouterr().err == (f"tessctl: warning: token file {token} (context prod): others may read it "
                                       f"(mode 0644); chmod 600 {token}\n")
    token.chmod(0o640)
    assert run("config", "view")[0] == 0
    assert capsys.readouterr().err.count("(mode 0640); chmod 600") == 1
    token.chmod(0o600)
    assert run("config", "view")[0] == 0
    assert capsys.readouterr().err == ""


def test_a_token_file_not_used_is_not_checked(cfg_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (cfg_file.parent / "prod.token").chmod(0o644)
    assert run("config", "view", "--token", "tsr_flag")[0] == 0
    assert run("config", "view", "--context", "bare")[0] == 0
    assert capsys.readouterr().err == ""


def test_the_config_files_own_warning_is_said_once(cfg_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`config view` read the file twice and said its warning twice."""
    cfg_file.chmod(0o604)
    assert run("config", "view", "--context", "dev")[0] == 0
    assert capsys.readouterr().err == (f"tessctl: warning: {cfg_file} holds a token and others may read it "
                                       f"(mode 0604); chmod 600 {cfg_file}\n")
