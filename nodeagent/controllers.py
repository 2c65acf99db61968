"""The controllers an agent may register with: one, or the several of a highly available controller
(`--controller a:port,b:port,c:port`, docs/ha.md).

The agent talks to one at a time. When a call fails (the controller is down, or it is a standby that
answered UNAVAILABLE "not the leader"), it moves on: to the leader a standby named in its
`tessera-leader` trailing metadata when that is one of the configured addresses, or the one on the
hint's host (the hint names the leader's client port, agents dial its agent port; a peer cannot send
the agent anywhere else), else to the next address in the list. The next Register or Heartbeat goes
there; the new leader's higher epoch is accepted by the agent's fence as any newer epoch is.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import grpc.aio
import structlog

from tessera.common import rpc
from tessera.common.identity import CONTROLLER
from tessera.common.tls import TlsConfig
from tessera.v1 import agent_pb2_grpc

log = structlog.get_logger("tessera.nodeagent.controllers")


def split_addresses(value: str) -> list[str]:
    """`a:1,b:2` -> ["a:1", "b:2"], blanks dropped, order kept, duplicates once."""
    out: list[str] = []
    for part in value.split(","):
        part = part.strip()
        if part and part not in out:
            out.append(part)
    return out


def hinted(hint: str | None, addresses: Sequence[str]) -> int | None:
    """Which of `addresses` the leader hint names: the same address, else the one address on the
    hint's host. The hint is the leader's advertised client address (host:50051) while agents dial
    the controllers' agent port (host:50054), so an exact match alone never happened. None: no hint,
    or no address (or more than one: controllers sharing a host) it can be taken to name."""
    if not hint:
        return None
    if hint in addresses:
        return list(addresses).index(hint)
    host = rpc.host_of(hint)
    same = [i for i, a in enumerate(addresses) if rpc.host_of(a) == host]
    return same[0] if len(same) == 1 else None


class ControllerSet:
    """The AgentRegistry stub of the controller currently in use; `failed` moves to another."""

    def __init__(self, addresses: Sequence[str], tls: TlsConfig | None = None) -> None:
        """`tls`: this node's certificate, verifying each controller's identity; None = plaintext
        (tessera-agent --insecure)."""
        if not addresses:
            raise ValueError("at least one controller address")
        self.addresses = list(addresses)
        self._tls = tls
        self._i = 0
        self._channel: grpc.aio.Channel = self._dial(self.addresses[0])
        self.stub = agent_pb2_grpc.AgentRegistryStub(self._channel)
        self._old: list[grpc.aio.Channel] = []

    @property
    def current(self) -> str:
        return self.addresses[self._i]

    def _dial(self, address: str) -> grpc.aio.Channel:
        if self._tls is None:
            return rpc.aio_channel(address, insecure=True)
        return rpc.aio_channel(address, tls=self._tls, peer=CONTROLLER)

    def failed(self, exc: grpc.RpcError) -> None:
        """After a failed call: use the hinted leader, or the next address (one address: stay)."""
        if len(self.addresses) == 1:
            return
        found = hinted(rpc.leader_hint(exc), self.addresses)
        target = found if found is not None else (self._i + 1) % len(self.addresses)
        if target == self._i:
            return
        self._i = target
        self._old.append(self._channel)  # closed in close(): a call may still be finishing on it
        self._channel = self._dial(self.current)
        self.stub = agent_pb2_grpc.AgentRegistryStub(self._channel)
        log.info("controller_switch", controller=self.current, hinted=found is not None)

    async def close(self) -> None:
        for ch in (*self._old, self._channel):
            await ch.close()
        self._old.clear()
