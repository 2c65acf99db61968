"""Bounds on the calls no credential admits: the standard hooks (health, reflection, Info).

Every server rpc.aio_server builds serves the hooks (tessera.common.hooks), and the controller's
client port serves them to anyone who can connect: no token, no certificate. Their requests are
small, but gRPC would read each one up to the server's message limit (8 MiB on the controller), a
health Watch or a reflection stream may stay open for ever, and nothing else caps how many run at
once. An audit of the hooks found exactly that: many large or never-ending open calls made the
server hold as much as they chose.

So each server admits at most `max_unary` short calls (Check, GetVersion) and `max_streams` open
streams (Watch, reflection) of the hooks at once, and at most `per_peer` of both from one host
(the peer's address without its port). Callers on the server's own machine (loopback, a unix
socket) have `local_reserve` more places of each kind beyond those bounds: a probe run by systemd or
a local monitor still gets through while remote hosts hold every other place, which a few of them
could do (4 hosts x 16). A call over a bound is RESOURCE_EXHAUSTED before its
request is read (handlerwrap.read_after), and a call whose one request (Check, GetVersion, Watch) has not
arrived within `read_within_s` is DEADLINE_EXCEEDED, so a caller that sends slowly frees its slot. The hooks are
kept apart: a flood of open calls can make a health probe wait or fail, never an authenticated
call of the daemon's own services (heartbeats, the Controller API), which these bounds do not
count.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc.aio

from tessera.common.errors import ResourceExhausted
from tessera.common.handlerwrap import read_after

# Services of the hooks (tessera.common.hooks); grpcurl asks for either reflection version.
OPEN_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                 "grpc.reflection.v1.ServerReflection", "tessera.v1.Info")


@dataclass(frozen=True)
class OpenCallBounds:
    """How many calls of the hooks a server admits at once (docs/security.md)."""

    max_unary: int = 64
    max_streams: int = 64
    per_peer: int = 16
    read_within_s: float = 10.0
    local_reserve: int = 8


def peer_host(peer: str) -> str:
    """`ipv4:10.0.0.5:41234` -> `ipv4:10.0.0.5`, `ipv6:%5B::1%5D:5` -> `ipv6:%5B::1%5D` (grpcio's
    escaped brackets; plain ones alike); a unix socket as is."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6") and ":" in rest:
        return f"{kind}:{rest.rpartition(':')[0]}"
    return peer


def is_local(host: str) -> bool:
    """Whether a peer host (peer_host's form) is this machine: a loopback address, an IPv4 one
    mapped into IPv6 included, or a unix socket."""
    kind, _, addr = host.partition(":")
    if kind in ("unix", "unix-abstract"):
        return True
    if kind not in ("ipv4", "ipv6"):
        return False
    addr = addr.replace("%5B", "[").replace("%5D", "]").strip("[]").partition("%")[0]
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


class OpenCalls:
    """The count of open calls of the hooks, by kind and by peer host (a server's loop only)."""

    def __init__(self, bounds: OpenCallBounds) -> None:
        self.bounds = bounds
        self.unary = 0
        self.streams = 0
        self.by_peer: Counter[str] = Counter()

    def take(self, host: str, stream: bool) -> None:
        """Count a call in; ResourceExhausted (nothing counted) when a bound is reached."""
        b = self.bounds
        reserve = b.local_reserve if is_local(host) else 0
        if (self.streams if stream else self.unary) >= (b.max_streams if stream else b.max_unary) + reserve:
            what = f"{b.max_streams} open streams" if stream else f"{b.max_unary} short calls"
            what += f" (and {reserve} more for callers on its own machine)" if reserve else ""
            raise ResourceExhausted(f"this server is at its limit of {what} of health, reflection and Info at "
                                    "once; try again later (calls of the daemon's own services are not counted)")
        if self.by_peer[host] >= b.per_peer:
            raise ResourceExhausted(f"{host} already has {b.per_peer} calls of health, reflection and Info "
                                    "open on this server; end one first")
        if stream:
            self.streams += 1
        else:
            self.unary += 1
        self.by_peer[host] += 1

    def give(self, host: str, stream: bool) -> None:
        if stream:
            self.streams -= 1
        else:
            self.unary -= 1
        self.by_peer[host] -= 1
        if self.by_peer[host] <= 0:
            del self.by_peer[host]


class OpenCallLimit(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc.aio is untyped
    """Admit a call of OPEN_SERVICES only within `bounds` (see the module's text); other calls pass."""

    def __init__(self, bounds: OpenCallBounds | None = None, services: Iterable[str] = OPEN_SERVICES) -> None:
        self.calls = OpenCalls(bounds or OpenCallBounds())
        self._prefixes = tuple(f"/{s}/" for s in services)

    async def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(self._prefixes):
            return handler
        stream = bool(handler.request_streaming or handler.response_streaming)
        calls = self.calls

        def admit(context: Any) -> None:
            host = peer_host(str(context.peer() or ""))
            calls.take(host, stream)
            # Counted out however the call ends: answered, failed, cancelled or past its deadline.
            context.add_done_callback(lambda _call: calls.give(host, stream))

        within = None if handler.request_streaming else calls.bounds.read_within_s
        return read_after(handler, admit, read_within_s=within)
