"""`tessctl config ...` and the one place tessctl's connection settings are resolved (clients/config.py
holds the file format and the precedence: flag > environment > context > default)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import yaml

from tessera.clients import output
from tessera.clients.config import (
    DEFAULT_CONTROLLER,
    ENV,
    Config,
    ConfigFileError,
    Settings,
    config_path,
    load_config,
    readable_mode,
    redacted,
    resolve,
    set_current_context,
)
from tessera.common.errors import InvalidArgument
from tessera.common.rpc import check_address

CONFIG_HELP = "the config file and its contexts (docs/cli.md): view, get-contexts, use-context"


def common_options(common: argparse.ArgumentParser) -> None:
    """The connection flags every command takes (SUPPRESS: one given before the subcommand is kept)."""
    s = argparse.SUPPRESS
    common.add_argument("--context", metavar="NAME", default=s,
                        help="context of the config file to use (default: its current-context)")
    common.add_argument("--controller", type=controller_flag, metavar="HOST:PORT[,HOST:PORT]", default=s,
                        help=f"controller address; several, comma-separated, for a highly available controller "
                             f"whose leader is followed (default: ${ENV['controller']}, the context's, "
                             f"{DEFAULT_CONTROLLER})")
    common.add_argument("--token", metavar="TOKEN", default=s,
                        help=f"API token (default: ${ENV['token']}, the context's token or token_file); other users "
                             "can see a flag in the process list: prefer the environment or the config file")
    common.add_argument("--ca", metavar="FILE", default=s,
                        help=f"CA certificate of the controller (default: ${ENV['ca']}, the context's ca)")


def controller_flag(text: str) -> str:
    """argparse type of --controller: each address checked as resolve() checks it, so a bad one
    is a usage error (exit 2); an address from the environment or a context is checked there (exit 1)."""
    for address in text.split(","):
        if address.strip():
            try:
                check_address(address, "--controller")
            except InvalidArgument as exc:
                raise argparse.ArgumentTypeError(exc.reason) from None
    return text


def read_config(env: Mapping[str, str]) -> Config:
    path = config_path(env)
    cfg = load_config(path, explicit=bool(env.get("TESSERA_CONFIG")))
    if any(c.token for c in cfg.contexts.values()):
        warn_if_readable(path, f"{path} holds a token and others may read it")
    return cfg


def warn_if_readable(path: Path, what: str) -> None:
    """As ssh does for a key file: one warning on stderr when others than the owner may read `path`;
    the command goes on (the owner may have reasons, and refusing would lock scripts out)."""
    mode = readable_mode(path)
    if mode is not None:
        print(f"tessctl: warning: {what} (mode {mode:04o}); chmod 600 {path}", file=sys.stderr)


def settings(args: argparse.Namespace, env: Mapping[str, str] | None = None, cfg: Config | None = None) -> Settings:
    """The controller(s), token and CA of this command line; `cfg`: the config file when already
    read (so its warnings are said once). Warns when the token file read is readable by others."""
    env = os.environ if env is None else env
    flags = {k: getattr(args, k, None) for k in ("context", "controller", "token", "ca")}
    s = resolve(flags, env, read_config(env) if cfg is None else cfg)
    if s.token_file:
        warn_if_readable(Path(s.token_file), f"token file {s.token_file} (context {s.context}): others may read it")
    return s


def add_arguments(sub: Any, command: Any) -> None:
    """`tessctl config view|get-contexts|use-context` (command(parent, name, func, help))."""
    cfg = command(sub, "config", _needs_action, CONFIG_HELP)
    cs = cfg.add_subparsers(dest="action", metavar="ACTION", required=True)
    command(cs, "view", cmd_view, "the config file (tokens redacted) and the settings this command line resolves to")
    command(cs, "get-contexts", cmd_get_contexts, "the contexts of the config file")
    p = command(cs, "use-context", cmd_use_context, "make a context the current one")
    p.add_argument("name", metavar="NAME")


def _needs_action(client: Any, args: argparse.Namespace, out: TextIO) -> int:
    raise AssertionError("argparse requires an action")


def cmd_view(client: Any, args: argparse.Namespace, out: TextIO) -> int:
    env = os.environ
    cfg = read_config(env)
    try:
        s = settings(args, env, cfg)
        effective: dict[str, Any] = {
            "context": s.context, "controller": list(s.controllers), "ca": s.ca or "",
            "token": "REDACTED" if s.token else "", "sources": s.sources}
    except (ConfigFileError, InvalidArgument) as exc:
        # What `view` is for: showing the file even when the settings it gives cannot be used (a
        # context's token file missing, say); exit 1, as every command with those settings would.
        effective = {"error": str(exc)}
    doc: dict[str, Any] = {"file": cfg.path, **redacted(cfg), "effective": effective}
    if args.output == "json":
        out.write(output.dumps(doc) + "\n")
    else:
        out.write(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    return 1 if "error" in effective else 0


def cmd_get_contexts(client: Any, args: argparse.Namespace, out: TextIO) -> int:
    cfg = read_config(os.environ)
    if args.output == "json":
        out.write(output.dumps({"current-context": cfg.current, "contexts": redacted(cfg)["contexts"]}) + "\n")
        return 0
    if not cfg.contexts:
        print(f"No contexts in {cfg.path}.", file=sys.stderr)
        return 0
    rows = []
    for name, c in cfg.contexts.items():
        token = "inline" if c.token else (f"file {c.token_file}" if c.token_file else "-")
        rows.append(("*" if name == cfg.current else "", name, ",".join(c.controllers) or "-", c.ca or "-", token))
    out.write(output.table(("CURRENT", "NAME", "CONTROLLER", "CA", "TOKEN"), rows) + "\n")
    return 0


def cmd_use_context(client: Any, args: argparse.Namespace, out: TextIO) -> int:
    path = config_path(os.environ)
    set_current_context(path, args.name)
    if args.output == "json":  # the keys of get-contexts and view
        out.write(output.dumps({"current-context": args.name, "file": str(path)}) + "\n")
    else:
        out.write(f"current context is now {args.name} ({path})\n")
    return 0
