"""`--dashboard-addr` of tessera-controller, and the checks on it (docs/dashboard.md, "Security")."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn

from tessera.common.netaddr import is_loopback

__all__ = ["add_arguments", "check", "is_loopback"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dashboard-addr", default="", metavar="HOST:PORT",
                   help="serve the read-only web dashboard here (docs/dashboard.md; HTTPS with the controller's "
                        "certificate under --tls-dir, the API's tokens); off when empty. A host other than loopback "
                        "needs --tokens")


def check(args: argparse.Namespace, error: Callable[[str], NoReturn]) -> None:
    """Exit with a usage error for an address that is malformed, or that would show every tenant's
    jobs to whoever reaches it (a non-loopback host without --tokens)."""
    addr = args.dashboard_addr
    if not addr:
        return
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        error(f"--dashboard-addr: {addr!r} is not HOST:PORT (e.g. 127.0.0.1:8080; port 0 = any free port)")
    if not is_loopback(host) and not args.tokens:
        error(f"--dashboard-addr: {host} is reachable from other machines, and without --tokens the dashboard "
              "would show every tenant's jobs to anyone; give --tokens, or a loopback host (127.0.0.1)")
