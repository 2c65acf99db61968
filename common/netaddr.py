"""Which listen addresses only this machine can reach: the rule every daemon's optional HTTP port
(the dashboard, /metrics) applies before it serves without credentials."""

from __future__ import annotations

import ipaddress

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (bracketed or not) or localhost."""
    host = host.strip("[]")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
