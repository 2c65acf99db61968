"""The systemd notify protocol (sd_notify), spoken directly over NOTIFY_SOCKET.

A no-op when not started by systemd. WATCHDOG_USEC tells how often to ping.
"""

from __future__ import annotations

import os
import socket


def notify(state: str) -> bool:
    """Send one notify message ("READY=1", "WATCHDOG=1", "STOPPING=1", "STATUS=..."). True if sent."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    if path.startswith("@"):  # abstract namespace socket
        path = "\0" + path[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.connect(path)
        sock.sendall(state.encode())
    return True


def watchdog_interval() -> float | None:
    """Seconds between watchdog pings (half of WATCHDOG_USEC), or None when no watchdog is set."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 1e6 / 2


async def watchdog_loop() -> None:
    """Ping the systemd watchdog forever from the event loop: a stuck loop stops the pings."""
    import asyncio

    interval = watchdog_interval()
    if interval is None:
        return
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)
