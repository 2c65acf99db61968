"""tessctl's settings: named contexts in a config file, overridden by the environment and by flags.

    current-context: prod
    contexts:
      prod:
        controller: [ctl-1:50051, ctl-2:50051]   # one host:port, or a list (standby controllers)
        ca: /etc/tessera/ca.pem                  # the CA that signed the controller's certificate
        token_file: ~/.config/tessera/prod.token # or token: tsr_... (then keep the file 0600)
      dev:
        controller: 127.0.0.1:50051

The file is $TESSERA_CONFIG, else ~/.config/tessera/config.yaml; it is read with the hardened YAML
reader, unknown keys refused. Each setting is taken from the first of: a flag (--controller,
--token, --ca), the environment (TESSERA_CONTROLLER, TESSERA_TOKEN, TESSERA_CA), the context
(--context, else current-context), the built-in default (127.0.0.1:50051, no token, no CA).
docs/cli.md and docs/auth.md describe it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.common.privatefile import write_private
from tessera.common.rpc import check_address
from tessera.common.yamlfile import InputFileError, read_and_parse, refuse_unknown_keys

DEFAULT_CONTROLLER = "127.0.0.1:50051"
CONFIG_ENV = "TESSERA_CONFIG"
ENV = {"controller": "TESSERA_CONTROLLER", "token": "TESSERA_TOKEN", "ca": "TESSERA_CA"}
CONTEXT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
ADDRESS_RE = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):\d{1,5}$")
_CONTEXT_KEYS = ("controller", "ca", "token", "token_file")


class ConfigFileError(InputFileError):
    """A config file (or a token file it names) that cannot be used: `FILE line N: field F: why`."""


@dataclass(frozen=True)
class Context:
    name: str
    controllers: tuple[str, ...] = ()
    ca: str = ""
    token: str = ""
    token_file: str = ""  # as written; resolved against the config file's folder


@dataclass(frozen=True)
class Config:
    path: str
    current: str = ""
    contexts: dict[str, Context] = field(default_factory=dict)


@dataclass(frozen=True)
class Settings:
    """What a command connects with, and where each part came from (flag, env, context, default)."""

    controllers: tuple[str, ...]
    token: str | None
    ca: str | None
    context: str
    sources: dict[str, str]
    token_file: str = ""  # the file the token was read from ("" when it came from no file)


def config_path(env: Mapping[str, str]) -> Path:
    return Path(env.get(CONFIG_ENV) or Path("~/.config/tessera/config.yaml").expanduser())


def parse_config(doc: Any, path: str = "") -> Config:
    if doc is None:
        return Config(path)
    if not isinstance(doc, dict):
        raise ConfigFileError("", "must be a mapping with contexts: and current-context:")
    refuse_unknown_keys(doc, ("current-context", "contexts"), "", ConfigFileError)
    raw = doc.get("contexts") or {}
    if not isinstance(raw, dict):
        raise ConfigFileError("contexts", "must be a mapping of context names to contexts")
    contexts = {}
    for name, body in raw.items():
        at = f"contexts.{name}"
        if not isinstance(name, str) or not CONTEXT_RE.fullmatch(name):
            raise ConfigFileError(at, "a context name must match [A-Za-z0-9][A-Za-z0-9._-]{0,62}")
        contexts[name] = _context(name, body, at)
    current = doc.get("current-context") or ""
    if not isinstance(current, str):
        raise ConfigFileError("current-context", "must be a context name")
    if current and current not in contexts:
        raise ConfigFileError("current-context", f"no context named {current!r}")
    return Config(path, current, contexts)


def _context(name: str, body: Any, at: str) -> Context:
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise ConfigFileError(at, f"must be a mapping of {', '.join(_CONTEXT_KEYS)}")
    refuse_unknown_keys(body, _CONTEXT_KEYS, at, ConfigFileError)
    for key in ("ca", "token", "token_file"):
        if key in body and not isinstance(body[key], str):
            raise ConfigFileError(f"{at}.{key}", "must be a string")
    if body.get("token") and body.get("token_file"):
        raise ConfigFileError(f"{at}.token", "give token or token_file, not both")
    ctl = body.get("controller", [])
    ctls = [ctl] if isinstance(ctl, str) else ctl
    if not isinstance(ctls, list) or not all(isinstance(c, str) for c in ctls):
        raise ConfigFileError(f"{at}.controller", "must be host:port or a list of host:port")
    for c in ctls:
        if not ADDRESS_RE.fullmatch(c):
            raise ConfigFileError(f"{at}.controller", f"{c!r} is not host:port")
    return Context(name, tuple(ctls), body.get("ca", ""), body.get("token", ""), body.get("token_file", ""))


def load_config(path: Path, explicit: bool) -> Config:
    """The config file at `path`; an empty Config when the default file does not exist (a file named
    by $TESSERA_CONFIG must exist)."""
    if not path.exists() and not explicit:
        return Config(str(path))
    return read_and_parse(path, lambda doc: parse_config(doc, str(path)), ConfigFileError)


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


def resolve(flags: Mapping[str, str | None], env: Mapping[str, str], cfg: Config) -> Settings:
    """The settings of one command: for each, the first of flag, environment, context, default.

    `flags` holds "context", "controller", "token", "ca" (None when not given). A --context that
    names no context is an error; a token file is read only when its token is the one used.
    """
    name = flags.get("context") or cfg.current
    if name and name not in cfg.contexts:
        where = f" in {cfg.path}" if cfg.path else ""
        raise ConfigFileError("", f"--context: no context named {name!r}{where}")
    ctx = cfg.contexts.get(name) if name else None
    sources: dict[str, str] = {}

    def pick(key: str, from_ctx: str | tuple[str, ...] | None) -> Any:
        if flags.get(key):
            sources[key] = "flag"
            return flags[key]
        if env.get(ENV[key]):
            sources[key] = f"env {ENV[key]}"
            return env[ENV[key]]
        if from_ctx:
            sources[key] = f"context {name}"
            return from_ctx
        sources[key] = "default"
        return None

    ctl = pick("controller", ctx.controllers if ctx else None)
    controllers = ctl if isinstance(ctl, tuple) else _split(ctl)
    what = {"flag": "--controller", "default": "controller"}.get(sources["controller"], sources["controller"])
    controllers = tuple(check_address(c, what) for c in controllers)
    token = pick("token", (ctx.token or ctx.token_file) if ctx else None)
    token_file = ""
    if token and ctx and sources["token"].startswith("context") and not ctx.token:
        token_file = str(_beside(cfg.path, ctx.token_file))
        token = read_token_file(Path(token_file))
    ca = pick("ca", ctx.ca if ctx else None)
    if ca and sources["ca"].startswith("context"):
        ca = str(_beside(cfg.path, ca))
    return Settings(controllers or (DEFAULT_CONTROLLER,), token or None, ca or None, name or "", sources,
                    token_file)


def _beside(config: str, path: str) -> Path:
    """`path` with ~ expanded; a relative one is taken from the config file's folder."""
    p = Path(path).expanduser()
    return p if p.is_absolute() or not config else Path(config).parent / p


def read_token_file(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError("", f"cannot read the token: {getattr(exc, 'strerror', None) or exc}",
                              file=str(path)) from None
    token = text.strip()
    if not token or len(token.split()) != 1:
        raise ConfigFileError("", "must hold one token on one line", file=str(path))
    return token


def readable_mode(path: Path) -> int | None:
    """The permission bits of `path` when others than the owner may read it (a file that holds a
    token should not), else None (also when it cannot be stat'ed: reading it says why)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None
    return mode if mode & (stat.S_IRGRP | stat.S_IROTH) else None


def set_current_context(path: Path, name: str) -> None:
    """Make `name` the current context of the file at `path`, changing that one line only (comments
    and layout are kept); the file is rewritten atomically, mode 0600."""
    cfg = load_config(path, explicit=True)
    if name not in cfg.contexts:
        raise ConfigFileError("", f"no context named {name!r} (known: {', '.join(cfg.contexts) or 'none'})",
                              file=str(path))
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    new = f"current-context: {json.dumps(name)}\n"
    for i, line in enumerate(lines):
        if re.match(r"^current-context\s*:", line):
            lines[i] = new
            break
    else:
        lines.insert(0, new)
    write_private(path, "".join(lines))


def redacted(cfg: Config) -> dict[str, Any]:
    """The file's settings as data, with every inline token replaced by REDACTED."""
    def one(c: Context) -> dict[str, Any]:
        out: dict[str, Any] = {"controller": list(c.controllers)}
        if c.ca:
            out["ca"] = c.ca
        if c.token:
            out["token"] = "REDACTED"
        if c.token_file:
            out["token_file"] = c.token_file
        return out

    return {"current-context": cfg.current, "contexts": {n: one(c) for n, c in cfg.contexts.items()}}
