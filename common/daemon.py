"""The lifecycle every Tessera daemon shares: run an asyncio main with logging set up, say READY to
systemd, wait for SIGTERM/SIGINT, say STOPPING; a bind or state-dir failure is one line, exit 1."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from tessera.common import logs, notify


async def serve_until_signal(status: str) -> None:
    """Tell systemd READY (with `status`), ping its watchdog, and return on SIGTERM or SIGINT after
    telling it STOPPING."""
    watchdog = asyncio.create_task(notify.watchdog_loop())
    notify.notify(f"READY=1\nSTATUS={status}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    notify.notify("STOPPING=1")
    watchdog.cancel()


def run(prog: str, log_level: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Configure logging and run `main`; OSError (cannot bind, unwritable state) exits 1 with one line."""
    logs.configure(log_level)
    try:
        asyncio.run(main())
    except OSError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(1)
