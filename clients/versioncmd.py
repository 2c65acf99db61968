"""`tessctl version`: the client's version and build, and the controller's (tessera.v1.Info), as
`kubectl version` shows both; `--client` for the client's alone, with no call made.

The controller answers GetVersion without a token (docs/security.md). When it cannot be reached,
the client's version is printed first and the error after it (exit 1), as kubectl does.
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from tessera.clients import ctlconfig, output, terminal
from tessera.clients.sdk import Client, RpcError
from tessera.common.buildinfo import version_info
from tessera.v1 import info_pb2

HELP = "print the versions and builds of tessctl and of the controller"


def add_arguments(sub: Any, command: Any) -> None:
    p = command(sub, "version", cmd_version, HELP)
    p.add_argument("--client", action="store_true", help="the client's version only (no call to the controller)")
    p.set_defaults(local=True)  # connects itself, only without --client


def describe(v: info_pb2.VersionInfo) -> str:
    """`tessera-controller 0.1.0 (commit 1a2b3c4d5e6f, Python 3.11.2, grpc 1.85.1, protobuf 6.31.1)`."""
    if not v.python_version:  # an older controller's stand-in: nothing more is known
        return f"{v.component} {v.version}"
    commit = v.git_commit[:12] if v.git_commit else "unknown"
    return (f"{v.component} {v.version} (commit {commit}, Python {v.python_version}, grpc {v.grpc_version}, "
            f"protobuf {v.protobuf_version})")


def cmd_version(client: Client | None, args: argparse.Namespace, out: TextIO) -> int:
    mine = version_info("tessctl")
    if args.output != "json":
        terminal.println(out, f"Client: {describe(mine)}")
    server: info_pb2.VersionInfo | None = None
    if not args.client:
        s = ctlconfig.settings(args)
        with Client(s.controllers, getattr(args, "timeout", 10.0), token=s.token, ca=s.ca,
                    insecure=getattr(args, "insecure", False)) as c:
            try:
                server = c.version()
            except RpcError as exc:
                if exc.code != "UNIMPLEMENTED":
                    raise
                # A controller from before tessera.v1.Info: it answers, it cannot say its version.
                server = info_pb2.VersionInfo(component="tessera-controller", version="unknown (no tessera.v1.Info)")
        if args.output != "json":
            terminal.println(out, f"Server: {describe(server)} at {c.target}")
    if args.output == "json":
        doc: dict[str, Any] = {"client": output.to_dict(mine)}
        if server is not None:
            doc["server"] = output.to_dict(server)
        terminal.println(out, output.dumps(doc))
    return 0
